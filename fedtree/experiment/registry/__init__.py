"""Every algorithm a run config can name, and the one generic way from ``config.runs.<label>``
to that algorithm.

An algorithm's config schema is declared once, by its factory's keyword-only signature (typed
defaults; GroupPerFL: its frozen dataclass). :data:`SPECS` lists every algorithm explicitly
(no registry filled by import side effects); :func:`build_algorithm` maps a run's fields onto
the factory:

* the context supplies ``model``, ``data``, ``local_optimizer``, ``schedule``, the config's
  ``topology`` (when the factory requires one) and ``name`` (the run's ``algorithm``);
* a scalar parameter (``int``, ``float``, ``bool``, ``str``, ``None`` or tuples of them) is a
  run field of the same name, coerced to the annotated type;
* the non-scalar parameters (optimizers, per-level lists, latencies, proxy data) are set by
  small named converters (:class:`~fedtree.experiment.spec.Fields`) from config-only fields:
  the shared ones here, a family's own beside it in :mod:`fedtree.experiment.families` (B-HFL's
  seven, GroupPerFL's), whose ``SPEC`` this module lists;
* every other field is an error naming the run, the field and the allowed fields.

Common run fields, for every algorithm whose factory takes the parameter: ``cohort_size`` (per leaf
parent; -1 or absent: all), the sections of the capabilities the algorithm takes
(:data:`fedtree.experiment.capabilities.CAPABILITIES`: ``privacy``, ``attack``, ``aggregator``,
``compression`` for the algorithms that take ``update_paths``, ``systems`` for those that take
``systems``, ``adapters`` where the spec says so), ``chunk_size`` (an int, ``None``, ``"auto"`` or ``"tune"``;
default the config's, else ``"auto"``), ``compute_dtype`` (default the config's), ``init_params``
(the path of saved parameters to start from, default the config's ``init_params``:
:mod:`fedtree.experiment.params`; every algorithm takes it, GroupPerFL in its first stage),
``weighting``, ``server`` (one server optimizer config ``{name, **hparams}``) / ``servers`` (one
per server level), ``local_learning_rate`` (the methods over the HierFAVG host: this run's clients use
``config.local``'s optimizer at this rate, and are told it, as a benchmark's table tunes it per
method),
``periods``, ``tree`` (``"flat"`` or ``"config"``, for the methods whose tree is optional),
``objective`` (for the algorithms that take a ``client_update``: the local objective, ``{name,
**hyperparameters}``, see :func:`objective_from_config`), and the runner's ``rounds`` and
``label``.

Adding an algorithm: its factory (one file) and one :class:`AlgorithmSpec` line in
:data:`SPECS` (see ``CONTRIBUTING.md``). A run may also name a factory of the user's own module,
``algorithm: "my_methods.scaffold:scaffold"`` (or an :class:`AlgorithmSpec` there): its signature
is its schema exactly as for the built-in ones (:func:`spec_of`).

The modules: :mod:`~fedtree.experiment.registry.specs` (the table),
:mod:`~fedtree.experiment.registry.schema` and :mod:`~fedtree.experiment.registry.coercion` (a
factory's run fields and their types), :mod:`~fedtree.experiment.registry.converters`,
:mod:`~fedtree.experiment.registry.finetune` and :mod:`~fedtree.experiment.registry.objective` (the
fields no annotation types), :mod:`~fedtree.experiment.registry.runs` (a run checked and placed on
its tree), :mod:`~fedtree.experiment.registry.sections` (its capabilities' sections),
:mod:`~fedtree.experiment.registry.method_memory` (what methods hold beyond a client step) and
:mod:`~fedtree.experiment.registry.build` (the algorithm built).
"""

from fedtree.experiment.registry.build import BUILDERS, build_algorithm, factory_kwargs, wrapped_algorithm
from fedtree.experiment.registry.coercion import SCALARS, coerce, is_scalar
from fedtree.experiment.registry.converters import TREES
from fedtree.experiment.registry.finetune import FINETUNE_FIELDS, with_finetune
from fedtree.experiment.registry.objective import OBJECTIVE_CONTEXT, OBJECTIVES, objective_from_config
from fedtree.experiment.registry.runs import (
  memory_needs,
  own_context,
  resolved_context,
  run_context,
  run_topology,
  validate_run,
  validate_runs,
)
from fedtree.experiment.registry.schema import CONTEXT_PARAMS, NOT_CONFIGURABLE, RUNNER_FIELDS, Schema, schema
from fedtree.experiment.registry.sections import capability_arguments, wrapping
from fedtree.experiment.registry.specs import SPECS, algorithms_taking, factory_name, spec_of
from fedtree.experiment.spec import AlgorithmSpec, Fields, check_fields

__all__ = [
  "BUILDERS", "CONTEXT_PARAMS", "FINETUNE_FIELDS", "NOT_CONFIGURABLE", "OBJECTIVES", "OBJECTIVE_CONTEXT",
  "RUNNER_FIELDS", "SCALARS", "SPECS", "TREES", "AlgorithmSpec", "Fields", "Schema", "algorithms_taking",
  "build_algorithm", "capability_arguments", "check_fields", "coerce", "factory_kwargs", "factory_name",
  "is_scalar", "memory_needs", "objective_from_config", "own_context", "resolved_context", "run_context",
  "run_topology", "schema", "spec_of", "validate_run", "validate_runs", "with_finetune", "wrapped_algorithm",
  "wrapping",
]
