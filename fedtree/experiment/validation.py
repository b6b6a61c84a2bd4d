"""A config read and checked before anything is loaded, built or written: every runner field
declared (:func:`prepare_config`), the runs in their order (:func:`selected_runs`), and one-line
refusals of what no run can use (:func:`validate_config`)."""

from __future__ import annotations

import copy

import ml_collections
import numpy as np

from fedtree.experiment.context import number_or_name
from fedtree.experiment.fields import DTYPES, NUMBER_OR_NAME, declare_runner_fields, field


def prepare_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of ``config`` with every runner field declared (defaults for those it omits,
  :func:`fedtree.experiment.fields.declare_runner_fields`) and the number-or-name fields read
  (``chunk_size="8"`` -> 8): what the runner, the workdir's ``config.json`` and the fingerprint
  see, whether the config came from a file, the command line or Python."""
  if isinstance(config, ml_collections.FrozenConfigDict):
    config = ml_collections.ConfigDict(config)
  config = copy.deepcopy(config)
  config.unlock()
  declare_runner_fields(config)
  with config.ignore_type():
    for name in NUMBER_OR_NAME:
      config[name] = number_or_name(config[name])
  return config


def ordered_runs(config: ml_collections.ConfigDict) -> list[tuple[str, ml_collections.ConfigDict]]:
  """``config.runs`` in ``config.run_order`` (a sequence of labels), else alphabetically (a
  ConfigDict does not keep insertion order)."""
  order = field(config, "run_order")
  if not order:
    return list(config.runs.items())
  order = [str(o) for o in order]
  unknown = [o for o in order if o not in config.runs]
  if unknown:
    raise ValueError(f"config.run_order names {unknown}, not among config.runs {sorted(config.runs)}")
  return [(o, config.runs[o]) for o in order] + [(k, v) for k, v in config.runs.items() if k not in order]


def selected_runs(config: ml_collections.ConfigDict) -> list[tuple[str, ml_collections.ConfigDict]]:
  """:func:`ordered_runs`, restricted to ``config.only`` when set (labels separated by commas:
  ``--config.only=fedavg,hierfavg`` runs those two of the config's runs)."""
  runs = ordered_runs(config)
  only = field(config, "only")
  if only is None or not str(only).strip():
    return runs
  wanted = [w.strip() for w in str(only).split(",") if w.strip()]
  unknown = [w for w in wanted if w not in config.runs]
  if unknown:
    raise ValueError(f"config.only={only!r} names {unknown}, not among the config's runs "
                     f"{sorted(config.runs)}")
  return [(k, v) for k, v in runs if k in wanted]


POSITIVE_INTS = {
  "data": ("dim", "num_classes", "features", "frames", "num_speakers", "num_clients", "group_sizes"),
  "model": ("hidden",),
}
"""Fields (or every entry of a sequence field) that must be ints >= 1 when a config sets them."""


NON_NEGATIVE_INTS = {"data": ("seed",)}


def _walk(node, path: str):
  if hasattr(node, "items"):
    for k, v in node.items():
      yield from _walk(v, f"{path}.{k}")
  elif isinstance(node, (list, tuple)):
    for i, v in enumerate(node):
      yield from _walk(v, f"{path}[{i}]")
  else:
    yield path, node


def check_values(config: ml_collections.ConfigDict) -> None:
  """One-line refusals of values no run can use: a NaN or infinite number anywhere (a learning
  rate, a hyperparameter), sizes and counts below 1 (:data:`POSITIVE_INTS`), a negative data
  seed, a ``sizes`` tree without sizes."""
  for path, value in _walk(config, "config"):
    if isinstance(value, float) and not np.isfinite(value):
      raise ValueError(f"{path}={value!r} must be a finite number")
  for table, low in ((POSITIVE_INTS, 1), (NON_NEGATIVE_INTS, 0)):
    for section, names in table.items():
      cfg = config.get(section, None) or {}
      for name in names:
        value = cfg.get(name, None)
        if value is None:
          continue
        for v in (value if isinstance(value, (list, tuple)) else (value,)):
          if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
            what = "every entry an int" if isinstance(value, (list, tuple)) else "an int"
            raise ValueError(f"config.{section}.{name}={value!r} must be {what} >= {low}")
  topology = config.get("topology", None) or {}
  if topology.get("kind", None) == "sizes" and topology.get("sizes", None) is None:
    raise ValueError("config.topology.kind='sizes' needs config.topology.sizes, the nested client "
                     "counts of the tree (e.g. ((3, 2), (4,)))")


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Early, named errors for the common config mistakes."""
  from fedtree.experiment.registry import validate_runs

  for name in ("seed", "rounds", "eval_every", "data", "topology", "model", "local", "runs"):
    if name not in config:
      raise ValueError(f"config has no field {name!r}; see configs/quickstart.py for a full config")
  if int(config.rounds) < 0:
    raise ValueError(f"config.rounds={config.rounds} must be >= 0")
  for name, low in (("eval_every", 1), ("rounds_per_call", 1), ("checkpoint_every", 0),
                    ("keep_checkpoints", 1)):
    value = field(config, name)
    if value is None or int(value) < low:
      raise ValueError(f"config.{name}={value!r} must be an int >= {low}")
  check_values(config)
  bound = field(config, "divergence_bound")
  if bound is not None and not (isinstance(bound, (int, float)) and not isinstance(bound, bool)
                                and np.isfinite(bound) and bound > 0):
    raise ValueError(f"config.divergence_bound={bound!r} must be a finite number > 0 (the largest "
                     "|value| a state may hold), or None for no bound")
  if str(field(config, "dtype")) not in DTYPES:
    raise ValueError(f"config.dtype={field(config, 'dtype')!r}; choose one of {DTYPES}")
  if len(config.runs) == 0:
    raise ValueError("config.runs is empty: name at least one run")
  selected_runs(config)
  validate_runs(config)
  from fedtree.experiment.sweep import validate as validate_sweep

  validate_sweep(config)

