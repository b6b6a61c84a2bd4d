"""Run-config converters of the algorithm families whose factories take more than scalars
(an experiment-layer module per family, beside its algorithm package: they read config values,
which nothing below the experiment layer does). Each exports its ``SPEC``, which
:data:`fedtree.experiment.registry.SPECS` lists explicitly."""
