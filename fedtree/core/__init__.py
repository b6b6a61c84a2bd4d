"""The engine: everything an algorithm is built from, and nothing that reads a config.

* :mod:`~fedtree.core.algorithm`: :class:`FederatedAlgorithm`, :class:`NodeModels`,
  :class:`TreeState`, the states' row names (:class:`RowName`), :func:`sequential` and the
  small shared pieces (stacking over nodes, per-level values).
* :mod:`~fedtree.core.topology`, :mod:`~fedtree.core.data`: the tree as arrays, padded client data.
* :mod:`~fedtree.core.ragged`: clients of very different sizes in buckets.
* :mod:`~fedtree.core.local`: batching inside jit, the masked local loop, the
  :class:`~fedtree.core.local.ClientUpdate` seam every local objective plugs into.
* :mod:`~fedtree.core.tier`, :mod:`~fedtree.core.aggregation`, :mod:`~fedtree.core.server`,
  :mod:`~fedtree.core.sampling`: a tier as one vmapped program, ``segment_sum`` up the tree,
  per-node optax servers, static-shape cohorts.
* :mod:`~fedtree.core.updates`: the update path (what happens to the clients' updates between
  the tier and the server: the seam the toolbox's transforms plug into);
  :mod:`~fedtree.core.server_rule`: a server's own rule; :mod:`~fedtree.core.personal`: the
  shared and personal parts of a model.
* :mod:`~fedtree.core.sharding`, :mod:`~fedtree.core.tuning`: the client axis over devices,
  chunk sizes.
* :mod:`~fedtree.core.loop`: jitted (fused) rounds and the round loop.
* :mod:`~fedtree.core.sweep`: experiments (settings x seeds) of one algorithm as one algorithm.
* :mod:`~fedtree.core.metrics`, :mod:`~fedtree.core.finetune`: vectorized scoring (and the cluster
  metrics) and fine-tuning.
* :mod:`~fedtree.core.model`, :mod:`~fedtree.core.rng`, :mod:`~fedtree.core.checks`.

The capabilities' in-jit halves (privacy, robust aggregation, attacks, compression, traffic,
systems, LoRA) are a floor above, :mod:`fedtree.toolbox`; the engine imports none of them.

Submodules are imported explicitly (``from fedtree.core import tier``); this package imports
nothing on its own.
"""
