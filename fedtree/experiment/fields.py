"""The runner's fields, declared with their types in every config, so that the command line can
set each of them on any config (``--config.checkpoint_every=5``, ``--config.local.steps=10``,
``--config.chunk_size=8``, ``--config.dtype=float64``).

ml_collections refuses to override a field a config does not list, and a field whose value is
``None`` has no type to parse a value into: :func:`declare_runner_fields` (called at the end of
every shipped config's ``get_config``) adds every missing runner field with its default and
turns ``None`` into a typed placeholder. Fields that take a number or a name (``chunk_size``,
``eval_chunk_size``) are declared as strings (``"8"``, ``"auto"``, ``"None"``), read back by
:func:`fedtree.experiment.context.number_or_name`.

Algorithm hyperparameters are not declared here: they are the run's (``config.runs.<label>``),
checked against the algorithm's factory by :mod:`fedtree.experiment.registry`.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from fedtree.core.loop import DIVERGENCE_BOUND

DTYPES = ("float32", "float64")
"""``config.dtype``: the dtype of every state (parameters, optimizer and client states) and of
the data's features; ``float64`` turns on JAX's 64-bit mode for the run."""

RUNNER_FIELDS: dict[str, tuple[type, object, str]] = {
  # name: (type, default, example value the command line may give)
  "seed": (int, 0, "3"),
  "rounds": (int, 1, "7"),
  "eval_every": (int, 1, "5"),
  "rounds_per_call": (int, 1, "2"),
  "chunk_size": (str, "auto", "8"),
  "eval_chunk_size": (str, None, "16"),
  "progress": (bool, True, "False"),
  "plots": (bool, True, "False"),
  "checkpoint_every": (int, 0, "5"),
  "keep_checkpoints": (int, 2, "3"),
  "mesh_shape": (int, None, "-1"),
  "memory_limit_bytes": (int, None, "1000000000"),
  "run_order": (tuple, None, "('zz',)"),   # the test puts a real label in
  "only": (str, None, "zz"),
  "init_params": (object, None, "/tmp/params.npz"),   # a path (any value: refused by name if not)
  "compute_dtype": (str, None, "bfloat16"),
  "dtype": (str, "float32", "float64"),
  "divergence_bound": (float, DIVERGENCE_BOUND, "1e10"),
  "target_accuracy": (float, None, "0.8"),
  "without_data": (str, None, "configs/quickstart.py"),   # the variant a missing-data refusal names
  "communication_budget_MB": (float, None, "200000.0"),   # a run over it says so (fedtree.experiment.llm)
}
"""Top-level runner fields: their type, the default a config that omits them gets, and an example
command-line value (tests/test_cli_fields.py sets each on every shipped config)."""

LOCAL_FIELDS: dict[str, tuple[type, object, str]] = {
  "optimizer": (str, "sgd", "adam"),
  "learning_rate": (float, 0.1, "0.02"),
  "batch_size": (int, 16, "4"),
  "epochs": (float, None, "0.5"),
  "steps": (int, None, "10"),
  "batch_order": (str, None, "sequential"),
}
"""``config.local``'s fields (the clients' optimizer and schedule)."""

NUMBER_OR_NAME = ("chunk_size", "eval_chunk_size")

SWEEP_FIELDS = {"seeds": 1, "params": "", "mode": "product", "select": "global/accuracy", "chunk": "all",
                "samples": 0, "sample_seed": 0, "rungs": "", "halving_rate": 3.0,
                "pbt_interval": 0, "pbt_fraction": 0.25, "pbt_perturb": 0.2, "pbt_resample": 0.0,
                "hyperband_min_rounds": 0}
"""``config.sweep``'s fields and their defaults: one seed, nothing swept, a grid of the listed
values run to the last round (a plain run; :mod:`fedtree.experiment.sweep` reads them, and
:mod:`fedtree.experiment.search` the random draws and the rungs)."""


def default_sweep(select: str = "global/accuracy") -> ml_collections.ConfigDict:
  """The ``config.sweep`` block every shipped config carries (:data:`SWEEP_FIELDS`), so that
  ``--config.sweep.seeds=4`` or ``--config.sweep.params=...`` work on the command line of any
  config. ``select``: the metric that names the best setting."""
  return ml_collections.ConfigDict({**SWEEP_FIELDS, "select": select})


def set_path(config, path: str, value) -> None:
  """``config.<path> = value`` for a dotted ``path`` (``"runs.fedprox.mu"``)."""
  *parents, leaf = path.split(".")
  node = config
  for part in parents:
    node = node[part]
  node[leaf] = value


def sweep_field(sw, name: str):
  """``config.sweep.<name>`` (``sw``: the section, or ``None``), else its declared default
  (:data:`SWEEP_FIELDS`)."""
  default = SWEEP_FIELDS[name]
  return default if sw is None else sw.get(name, default)


POPULATION_FIELDS: dict[str, tuple[type, object, str]] = {
  "mode": (str, "auto", "streamed"),
  "cache_bytes": (int, 0, "100000000"),
  "prefetch": (int, 2, "1"),
  "eval_clients": (int, 0, "500"),
  "eval_chunk": (int, 1000, "200"),
  "eval_seed": (int, 0, "1"),
}
"""``config.population``'s fields (a population read from a store, ``config.data.name="store"``:
:mod:`fedtree.experiment.population`)."""

RUN_FIELDS = ("rounds", "chunk_size", "compute_dtype")
"""Runner fields a run may set for itself (``config.runs.<label>.rounds``): :func:`run_field`."""


def field(config: ml_collections.ConfigDict, name: str):
  """``config.<name>`` of a runner field, or the default :data:`RUNNER_FIELDS` declares for it
  when ``config`` has none (a config that has not been through :func:`declare_runner_fields`):
  the one place a runner field's default is read."""
  return config.get(name, RUNNER_FIELDS[name][1])


def run_field(config: ml_collections.ConfigDict, run, name: str):
  """A field of :data:`RUN_FIELDS` for run ``run`` (``config.runs.<label>``): the run's value
  when it sets one, else the config's (:func:`field`)."""
  if name not in RUN_FIELDS:
    raise ValueError(f"{name!r} is not a field a run sets for itself; choose one of {RUN_FIELDS}")
  if run is not None and name in run:
    return run[name]
  return field(config, name)


def _declare(c: ml_collections.ConfigDict, fields: dict[str, tuple[type, object, str]]) -> None:
  for name, (kind, default, _) in fields.items():
    value = c.get(name, default)
    if name in NUMBER_OR_NAME and value is not None and not isinstance(value, str):
      value = str(value)  # an int: kept as its digits, so that a name can replace it too
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
      value = float(value)  # epochs=1 -> 1.0: --config.local.epochs=0.5 must parse
    if kind is tuple and isinstance(value, list):
      value = tuple(value)
    with c.ignore_type():
      c[name] = config_dict.placeholder(kind) if value is None else value


def declare_runner_fields(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``c`` with every runner field (:data:`RUNNER_FIELDS`, ``local``'s :data:`LOCAL_FIELDS`
  and ``sweep``) declared with its type; values the config sets are kept. Returns ``c``.

  Example:
    >>> c = ml_collections.ConfigDict(dict(seed=0, local=dict(learning_rate=0.1, epochs=1)))
    >>> c = declare_runner_fields(c)
    >>> c.local.epochs, c.checkpoint_every, c.chunk_size, c.dtype
    (1.0, 0, 'auto', 'float32')
    >>> c.local.steps = 10   # a typed placeholder: the command line can set it
    >>> c.local.steps
    10
  """
  _declare(c, RUNNER_FIELDS)
  if "local" not in c:
    c.local = ml_collections.ConfigDict()
  _declare(c.local, LOCAL_FIELDS)
  if "sweep" not in c:
    c.sweep = default_sweep()
  if "population" not in c:
    c.population = ml_collections.ConfigDict()
  _declare(c.population, POPULATION_FIELDS)
  return c
