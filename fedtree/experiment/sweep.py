"""Experiments as an array axis: seeds and hyperparameter sweeps of a run in one compiled program.

``config.sweep`` (all optional)::

  sweep.seeds = 4                      # every setting over seeds config.seed .. config.seed + 3
  sweep.params = "local.learning_rate=0.01,0.1;runs.fedprox.mu=0,0.1"   # or a nested dict:
                                       # {"local": {"learning_rate": (0.01, 0.1)}, ...}
  sweep.mode = "product"               # or "zip" (lists of the same length, taken together)
  sweep.select = "global/accuracy"     # the metric that names the best setting (higher is better;
                                       # a name ending in "loss"/"perplexity"/"rate": lower)
  sweep.chunk = "all"                  # experiments per compiled call: "all", an int, "auto"

A run's experiments are ``(setting, seed)`` pairs, settings restricted to the swept paths
that concern it (``local.*`` and other global paths, and ``runs.<its label>.*``). This module
turns the config into those settings and a builder (:func:`config_builder`: the ordinary
builder, :func:`fedtree.experiment.registry.build_algorithm`, on a copy of the config whose
swept fields hold the given values), and the final metrics into the mean ± std table. The
stacked program is the engine's combinator :func:`fedtree.core.sweep.sweep`, and the runner
drives it as it drives a single run (:func:`fedtree.experiment.runner.run_sweep`, chunk after
chunk through :func:`fedtree.experiment.runner.run_algorithm`), so evaluation cadence,
checkpoints, exact resume, stop requests and divergence checks are those of a single run.
Experiment ``(setting, seed j)`` is exactly the run with ``config.seed + j`` and the setting's
values done alone (tests check it).

What can be swept is read from the factories' signatures: a ``runs.<label>.<name>`` that is a
parameter of the run's algorithm is swept when its annotation admits a ``float`` (a traced
scalar reaches the factory) and refused by name when it is an ``int`` without ``float`` (a
count or a size: it changes shapes or Python control flow); any other field (``local.*``, a
field a converter reads such as ``runs.<label>.server.learning_rate``, or a nested field of a
run such as ``runs.<label>.privacy.noise_multiplier``) by its value in the config: a float is
swept, an int refused (as are the fields of the static local schedule, ``local.steps``,
``local.epochs``, ``local.batch_size``..., :class:`fedtree.core.local.LocalSchedule`).
Anything under ``data``, ``topology``, ``model`` is refused up front. A
builder that needs a concrete value of a swept field (a ``ConcretizationTypeError`` or
``TracerBoolConversionError`` while tracing) is turned into a ``ValueError`` naming the field
and the algorithm (:func:`explain`).

Support (tests/test_sweep.py): seeds of FedAvg, FedOpt, HierFAVG, FedProx, Ditto, pFedMe,
Per-FedAvg, pFedMT, B-HFL, CFL, IFCA, AWCFL, MCFL and FedKWS-UI stack (each experiment equals
its run done alone); swept hyperparameters tested: ``local.learning_rate``, a server optimizer's
``learning_rate``, AWCFL's ``beta``. GroupPerFL is refused: it is a fixed-length composition
of stages (:func:`fedtree.core.algorithm.sequential`) whose per-stage fine-tuning and
selection report run on the host after the rounds; sweep it as separate runs. An algorithm's
``report`` hook (e.g. B-HFL's table by level) is not called for a sweep's experiments.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.local import LocalSchedule

MODES = ("product", "zip")
SHAPE_PREFIXES = ("data.", "topology.", "model.", "sweep.", "mesh_shape")
"""Config subtrees that change shapes: never swept."""
SCHEDULE_FIELDS = frozenset(f.name for f in dataclasses.fields(LocalSchedule))
"""``config.local`` fields of the local schedule (step counts, batch shapes): never swept."""


# ------------------------------------------------------------------------ config -> settings
def default_sweep(select: str = "global/accuracy") -> ml_collections.ConfigDict:
  """The ``config.sweep`` block every shipped config carries: one seed, nothing swept (a plain
  run), so that ``--config.sweep.seeds=4`` or ``--config.sweep.params=...`` work on the command
  line of any config. ``select``: the metric that names the best setting."""
  return ml_collections.ConfigDict(dict(seeds=1, params="", mode="product", select=select, chunk="all"))


def params_of(sw) -> dict[str, list]:
  """``config.sweep.params`` as ``{dotted path: [values]}``, from a string
  ``"local.learning_rate=0.01,0.1;runs.fedprox.mu=0,0.1"`` (the command-line form) or a
  (nested) dict ``{"local": {"learning_rate": (0.01, 0.1)}}`` (ConfigDict keys cannot hold dots)."""
  raw = sw.get("params", None) if sw is not None else None
  if raw is None or (isinstance(raw, str) and not raw.strip()):
    return {}
  if isinstance(raw, str):
    out = {}
    for part in raw.split(";"):
      if not part.strip():
        continue
      if "=" not in part:
        raise ValueError(f"config.sweep.params: {part!r} is not 'path=v1,v2,...'")
      path, vals = part.split("=", 1)
      items = [v.strip() for v in vals.strip().strip("()[]").split(",") if v.strip()]
      try:
        out[path.strip()] = [float(v) for v in items]
      except ValueError:
        raise ValueError(f"config.sweep.params[{path.strip()!r}] holds non-numeric values {items}") from None
    return out
  out = {}

  def walk(node, prefix):
    for k, v in (node.items() if hasattr(node, "items") else ()):
      path = f"{prefix}{k}"
      if hasattr(v, "items"):
        walk(v, path + ".")
      else:
        out[path] = [v] if isinstance(v, (int, float, str)) else list(v)

  walk(raw, "")
  return out


def sweep_config(config: ml_collections.ConfigDict):
  """``config.sweep`` when it asks for more than one experiment per run, else ``None``."""
  sw = config.get("sweep", None)
  if sw is None:
    return None
  seeds = int(sw.get("seeds", 1) or 1)
  if seeds <= 1 and not params_of(sw):
    return None
  return sw


def _get_path(config, path: str):
  node = config
  for part in path.split("."):
    if not hasattr(node, "keys") or part not in node:
      raise ValueError(f"config.sweep.params names {path!r}, which is not a config field "
                       f"({part!r} is not among {sorted(node.keys()) if hasattr(node, 'keys') else []})")
    node = node[part]
  return node


def _swept_field(config, path: str) -> tuple[Any, Any]:
  """``(current value, annotation or None)`` of the swept field ``path``.

  The value is the config's; for ``runs.<label>.<name>`` naming a parameter of the run's
  algorithm, the annotation is the factory's (:func:`fedtree.experiment.registry.schema`) and
  a parameter the run leaves at its default has the factory's default as its value."""
  parts = path.split(".")
  runs = config.get("runs", None)
  if (len(parts) == 4 and parts[0] == "runs" and parts[2:] == ["privacy", "target_epsilon"]
      and runs is not None and parts[1] in runs and runs[parts[1]].get("privacy", None)):
    # a run given a noise_multiplier may sweep ε targets instead (:func:`calibrated`)
    return float(runs[parts[1]].privacy.get("target_epsilon", 1.0)), None
  spec = None
  if len(parts) == 3 and parts[0] == "runs" and runs is not None and parts[1] in runs:
    from fedtree.experiment import registry

    spec = registry.SPECS.get(runs[parts[1]].get("algorithm", None), None)
  try:
    value = _get_path(config, path)
  except ValueError:
    if spec is None:
      raise
    value = inspect.Parameter.empty
  if spec is None:
    return value, None
  from fedtree.experiment import registry

  sch = registry.schema(spec)
  hint = registry._hints(spec.factory).get(parts[2], None) if parts[2] in sch.params else None
  if value is inspect.Parameter.empty:
    if parts[2] not in sch.scalars:
      swept = sorted(n for n, h in sch.scalars.items() if _kind(None, h) == "float")
      raise ValueError(
        f"config.sweep.params names {path!r}, which is not a config field nor a numeric parameter of "
        f"algorithm {runs[parts[1]].algorithm!r} (its numeric parameters: {swept})"
      ) from None
    value = sch.params[parts[2]].default
    value = None if value is inspect.Parameter.empty else value
  return value, hint


def _traced_int(path: str) -> bool:
  """Whether ``path`` is an int field of a run's update section that its builder takes traced
  (``runs.<label>.compression.uplink.bits``; :data:`fedtree.experiment.updates.TRACED_INTS`)."""
  from fedtree.experiment.updates import TRACED_INTS

  parts = path.split(".")
  return (len(parts) > 3 and parts[0] == "runs" and parts[-1] in TRACED_INTS.get(parts[2], ()))


def _kind(value, hint) -> str:
  """What a swept field is, by its factory annotation when it has one, else by its value:
  ``"float"`` (an experiment axis: a traced scalar), ``"shape"`` (an int: a count or a size,
  which changes array shapes or Python control flow), ``"other"`` (not a number)."""
  if hint is not None:
    from fedtree.experiment.registry import _union_args

    args = _union_args(hint)
    return "float" if float in args else "shape" if int in args else "other"
  if isinstance(value, (float, np.floating)):
    return "float"
  if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
    return "shape"
  return "other"


def _type_name(hint) -> str:
  from fedtree.experiment.registry import _type_name

  return hint.__name__ if isinstance(hint, type) else _type_name(hint)


def _set_path(config, path: str, value) -> None:
  *parents, leaf = path.split(".")
  node = config
  for part in parents:
    node = node[part]
  node[leaf] = value


def calibrated(config: ml_collections.ConfigDict, label: str, settings: list[dict],
               ctx) -> tuple[ml_collections.ConfigDict, list[dict]]:
  """``(config, settings)`` to build run ``label``'s sweep from: a swept
  ``runs.<label>.privacy.target_epsilon`` becomes a swept ``noise_multiplier``, each setting's
  ``z`` calibrated on the host (:func:`fedtree.experiment.privacy.plan`, as a single run with that
  ε calibrates; a ``noise_multiplier`` in the section is replaced), since calibration is a search
  no traced ε can drive. Other settings pass through unchanged; the table and rows keep the
  settings as given (ε targets)."""
  path = f"runs.{label}.privacy.target_epsilon"
  if not settings or path not in settings[0]:
    return config, settings
  z_path = f"runs.{label}.privacy.noise_multiplier"
  if z_path in settings[0]:
    raise ValueError(f"config.sweep.params sweeps both {path!r} and {z_path!r}: a target ε sets the "
                     f"noise multiplier; sweep one of them")
  from fedtree.experiment import privacy
  from fedtree.experiment.run_context import run_context

  base = config.to_dict()
  section = {k: v for k, v in base["runs"][label]["privacy"].items()
             if k not in ("target_epsilon", "noise_multiplier")}   # the swept target replaces either
  zs = []
  for setting in settings:
    cfg = ml_collections.ConfigDict(base, type_safe=False)
    cfg.runs[label].privacy = dict(section)
    for p, value in setting.items():
      _set_path(cfg, p, value)
    run = cfg.runs[label]
    zs.append(privacy.plan(run.privacy.to_dict(), run_context(ctx, label, run), run=run, params={},
                           verbose=False).noise_multiplier)
  out = ml_collections.ConfigDict(base, type_safe=False)
  out.runs[label].privacy = {**section, "noise_multiplier": float(zs[0])}
  return out, [{**{p: v for p, v in s.items() if p != path}, z_path: float(z)}
               for s, z in zip(settings, zs, strict=True)]


def privacy_metrics(config: ml_collections.ConfigDict, label: str, settings: list[dict], ctx):
  """Per setting of run ``label``, its privacy accounting ``r -> {"epsilon": ε after r rounds}``
  (:func:`fedtree.experiment.privacy.round_metrics` of the run with the setting's values, on the
  host: a swept ``noise_multiplier`` gives each setting its ε), or ``None`` for a run without a
  ``privacy`` section."""
  from fedtree.experiment import privacy

  if not config.runs[label].get("privacy", None):
    return None
  out = []
  for setting in settings:
    cfg = copy.deepcopy(config)
    for path, value in setting.items():
      _set_path(cfg, path, value)
    out.append(privacy.round_metrics(label, cfg.runs[label], ctx))
  return out


def validate(config: ml_collections.ConfigDict) -> None:
  """Named errors for an unknown or non-numeric path, a shape-changing field, an empty list,
  a ``zip`` of lists of different lengths, an unknown mode, or fewer than one seed."""
  sw = config.get("sweep", None)
  if sw is None:
    return
  seeds = sw.get("seeds", 1)
  if seeds is None or int(seeds) < 1:
    raise ValueError(f"config.sweep.seeds={seeds!r} must be an int >= 1")
  mode = sw.get("mode", "product")
  if mode not in MODES:
    raise ValueError(f"config.sweep.mode={mode!r}; choose one of {MODES}")
  params = params_of(sw)
  for path, values in params.items():
    leaf = path.rsplit(".", 1)[-1]
    parts = path.split(".")
    run_section = len(parts) > 3 and parts[0] == "runs" and parts[2] in ("data", "model")   # a run's own
    if path.startswith(SHAPE_PREFIXES) or run_section:
      raise ValueError(
        f"config.sweep.params[{path!r}]: {leaf!r} changes array shapes or the program's control "
        f"flow and cannot be an experiment axis; sweep it as separate runs (config.runs) instead"
      )
    if path.startswith("runs.") and path.count(".") < 2:
      raise ValueError(f"config.sweep.params[{path!r}] must name a field of a run, e.g. "
                       f"'runs.<label>.mu'")
    current, hint = _swept_field(config, path)
    kind = _kind(current, hint)
    if kind == "shape" and _traced_int(path):   # e.g. compression bits: the builder takes it traced
      kind = "float"
    if path.startswith("local.") and leaf in SCHEDULE_FIELDS:
      hint, kind = LocalSchedule.__annotations__[leaf], "shape"
    if kind == "shape":
      what = (f"the int {current!r}" if hint is None else "a field of the static LocalSchedule"
              if path.startswith("local.") else f"annotated {_type_name(hint)}")
      raise ValueError(
        f"config.sweep.params[{path!r}]: {leaf!r} ({what}) changes array shapes or the program's "
        f"control flow and cannot be an experiment axis; sweep it as separate runs (config.runs) "
        f"instead (a rate written as an int: write it as a float)"
      )
    if kind == "other":
      if hint is not None:
        algorithm = config.runs[path.split(".")[1]].algorithm
        raise ValueError(f"config.sweep.params[{path!r}]: {leaf!r} of algorithm {algorithm!r} is a "
                         f"{_type_name(hint)}, not a number; only numeric fields can be swept")
      raise ValueError(f"config.sweep.params[{path!r}]: the field is {current!r}, not a number; "
                       "only numeric fields can be swept")
    if not values:
      raise ValueError(f"config.sweep.params[{path!r}] is empty: give at least one value")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float, np.number))]
    if bad:
      raise ValueError(f"config.sweep.params[{path!r}] holds non-numeric values {bad}")
  if mode == "zip":
    lengths = {p: len(v) for p, v in params.items()}
    if len(set(lengths.values())) > 1:
      raise ValueError(f"config.sweep.mode='zip' needs lists of one length; got lengths {lengths}")
  chunk = _chunk_value(sw)
  if chunk not in (None, "auto") and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
    raise ValueError(f"config.sweep.chunk={chunk!r}; choose 'all', 'auto' or an int >= 1")


def _chunk_value(sw):
  chunk = sw.get("chunk", None) if sw is not None else None
  if isinstance(chunk, str):
    if chunk.strip().isdigit():
      return int(chunk)
    if chunk.strip().lower() in ("all", "none", ""):
      return None
  return chunk


def settings_of(config: ml_collections.ConfigDict, label: str) -> list[dict[str, float]]:
  """The settings (``{path: value}``) of run ``label``: its swept paths combined by
  ``config.sweep.mode`` (``[{}]`` when nothing concerns it)."""
  sw = config.get("sweep", None)
  params = params_of(sw)
  mine = {p: v for p, v in params.items()
          if not p.startswith("runs.") or p.split(".")[1] == label}
  if not mine:
    return [{}]
  paths = sorted(mine)
  if (sw.get("mode", "product") if sw is not None else "product") == "zip":
    combos = zip(*(mine[p] for p in paths), strict=True)
  else:
    combos = itertools.product(*(mine[p] for p in paths))
  return [{p: float(v) for p, v in zip(paths, combo, strict=True)} for combo in combos]


def setting_name(setting: dict[str, float]) -> str:
  """``{"runs.fedprox.mu": 0.1}`` -> ``"mu=0.1"`` (the last path part; the full path if two
  swept fields share it)."""
  if not setting:
    return "default"
  leaves = [p.rsplit(".", 1)[-1] for p in setting]
  return ",".join(f"{p.rsplit('.', 1)[-1] if leaves.count(p.rsplit('.', 1)[-1]) == 1 else p}={v:g}"
                  for p, v in setting.items())


# ------------------------------------------------------------------------ the builder
def config_builder(config: ml_collections.ConfigDict, label: str, ctx,
                   build_algorithm: Callable) -> Callable[[dict], FederatedAlgorithm]:
  """``build(hparams) -> algorithm`` of run ``label`` with the swept fields set to ``hparams``
  (``{dotted path: value}``: traced scalars inside a trace, Python floats outside), through the
  ordinary builder: the builder :func:`fedtree.core.sweep.sweep` stacks."""
  from fedtree.experiment.builders import local_optimizer_from_config

  base = config.to_dict()

  def build(hparams: dict) -> FederatedAlgorithm:
    if not hparams:
      return build_algorithm(label, config.runs[label], ctx)
    cfg = ml_collections.ConfigDict(base, type_safe=False)
    for path, value in hparams.items():
      _set_path(cfg, path, value)
    local_opt = ctx.local_optimizer
    if any(p.startswith("local.") for p in hparams):
      local_opt = local_optimizer_from_config(cfg.local)
    sub = dataclasses.replace(ctx, config=cfg, local_optimizer=local_opt)
    return build_algorithm(label, cfg.runs[label], sub)

  return build


def explain(label: str, algorithm: str, paths: Sequence[str]) -> Callable[[Exception], ValueError]:
  """What a builder's trace error (it needs a concrete value of a swept field) becomes: a
  ``ValueError`` naming the run, its algorithm and the swept paths."""

  def to_error(e: Exception) -> ValueError:
    return ValueError(
      f"run {label!r} (algorithm {algorithm!r}) cannot sweep {list(paths)} in one program: its "
      f"builder needs a concrete value of a swept field ({type(e).__name__}: {str(e).splitlines()[0]}); "
      "sweep these values as separate runs instead"
    )

  return to_error


def chunk_size(config, num_experiments: int, ctx=None) -> int:
  """Experiments per compiled call: ``config.sweep.chunk`` (``None``: all; ``"auto"``: all
  that fit in a quarter of the device memory, from the bytes of one experiment's state times
  the working set of a local step, see :func:`fedtree.core.tuning.client_step_bytes`)."""
  chunk = _chunk_value(config.get("sweep", None))
  if chunk is None:
    return num_experiments
  if chunk == "auto":
    return num_experiments if ctx is None else min(num_experiments, _auto_chunk(ctx, num_experiments))
  return max(1, min(int(chunk), num_experiments))


def _auto_chunk(ctx, n: int) -> int:
  from fedtree.core import tuning

  try:
    step = tuning.client_step_bytes(ctx.model, ctx.local_optimizer, ctx.data.example_shape,
                                    ctx.schedule.batch_size)
  except Exception:  # noqa: BLE001  (no estimate: run everything at once)
    return n
  dev = jax.devices()[0]
  stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
  limit = (stats or {}).get("bytes_limit", 8 << 30)
  clients = int(ctx.data.num_clients)
  per_exp = max(1, step * clients)  # every client's model and optimizer state, once per experiment
  return max(1, min(n, int(limit // 4 // per_exp)))


# ------------------------------------------------------------------------ results
def lower_is_better(metric: str) -> bool:
  return metric.rsplit("/", 1)[-1].endswith(("loss", "perplexity", "rate"))


def aggregate(settings: list[dict], per_exp: list[list[dict]]) -> list[dict[str, Any]]:
  """Mean and std over seeds of every final metric, per setting: ``per_exp[i][j]`` is setting
  ``i``'s seed ``j``'s ``{model/metric: value}``. Rows ``{setting, name, mean: {..}, std: {..}}``."""
  rows = []
  for s, runs in zip(settings, per_exp, strict=True):
    keys = sorted({k for r in runs for k in r})
    mean, std = {}, {}
    for k in keys:
      vals = np.asarray([r.get(k, np.nan) for r in runs], np.float64)
      mean[k] = float(np.mean(vals))
      std[k] = 0.0 if np.all(vals == vals[0]) else float(np.std(vals))   # (ε = inf for z = 0: no NaN)
    rows.append({"setting": s, "name": setting_name(s), "seeds": len(runs), "mean": mean, "std": std})
  return rows


def best(rows: list[dict], select: str) -> dict | None:
  """The row whose mean ``select`` is best (``None`` if no row has it)."""
  have = [r for r in rows if select in r["mean"] and np.isfinite(r["mean"][select])]
  if not have:
    return None
  key = (lambda r: r["mean"][select]) if lower_is_better(select) else (lambda r: -r["mean"][select])
  return min(have, key=key)


def format_table(label: str, rows: list[dict], metrics: Sequence[str] | None = None) -> str:
  """One row per setting, ``mean ± std`` over seeds of every final metric (the value alone for a
  setting run with one seed: it has no spread)."""
  metrics = list(metrics or sorted({k for r in rows for k in r["mean"]}))
  head = ["setting", "seeds", *metrics]

  def cell(r: dict, m: str) -> str:
    if m not in r["mean"]:
      return "-"
    return f"{r['mean'][m]:.4f}" if r["seeds"] == 1 else f"{r['mean'][m]:.4f} ± {r['std'][m]:.4f}"

  body = [[r["name"], str(r["seeds"]), *(cell(r, m) for m in metrics)] for r in rows]
  widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
  line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
  sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
  what = "one seed" if all(r["seeds"] == 1 for r in rows) else "mean ± std over seeds"
  return "\n".join([f"sweep of run {label!r} ({what})", line(head), sep,
                    *(line(b) for b in body)])


def write_outputs(workdir: str | None, label: str, rows: list[dict], select: str) -> dict:
  """``summary`` entry of the run (rows and the best setting), and its PNG in the workdir."""
  b = best(rows, select)
  out = {"select": select, "best": None if b is None else {"setting": b["setting"], "name": b["name"],
                                                           "mean": b["mean"][select],
                                                           "std": b["std"][select]},
         "settings": rows}
  if workdir and b is None:   # e.g. the root of a tree whose root never aggregates
    print(f"sweep plot of {label!r} not written: no setting reports {select!r} (a model that never "
          "trained is left out)", file=sys.stderr)
  elif workdir:
    try:
      from fedtree.evaluation import plots

      with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
      plots.plot_sweep(records, os.path.join(workdir, f"sweep_{label}.png"), run=label,
                       metric=select)
      if any("epsilon" in r["mean"] for r in rows):   # a privacy sweep: accuracy against ε
        plots.plot_privacy_utility(rows, os.path.join(workdir, f"privacy_{label}.png"), run=label,
                                   metric=select)
    except ImportError:  # no matplotlib: the table and summary are the results
      print(f'note: matplotlib is not installed, so no sweep_{label}.png (pip install -e ".[plot]")',
            file=sys.stderr)
    except (OSError, ValueError) as e:  # nothing to plot
      print(f"sweep plot of {label!r} not written: {e}", file=sys.stderr)
  return out


def _cell(row: dict, key: str) -> str:
  return f"{row['mean'][key]:.4f} ± {row['std'][key]:.4f}" if key in row["mean"] else "-"


def runs_table(results: dict[str, Any]) -> str:
  """The swept runs of a config side by side (printed after the last one): a row per run, setting
  and model, with the model's accuracy (perplexity for a language model) and its mean over the worst
  10 % of clients, ``mean ± std`` over seeds, and the run's megabytes each way (every edge of the
  tree, per experiment). ``results``: ``{run label: {"sweep": write_outputs(...)}}`` (other entries
  are skipped)."""
  head = ["run", "setting", "model", "metric", "mean ± std", "worst 10 % mean ± std", "up MB", "down MB"]
  body, seeds = [], set()
  for label, entry in results.items():
    out = entry.get("sweep", None) if isinstance(entry, dict) else None
    if not out:
      continue
    for row in out["settings"]:
      seeds.add(row["seeds"])
      mean = row["mean"]
      models = sorted({k.split("/", 1)[0] for k in mean if "/" in k})
      for m in models:
        metric = "perplexity" if f"{m}/perplexity" in mean else "accuracy"
        if f"{m}/{metric}" not in mean:
          continue
        body.append([label, row["name"], m, metric, _cell(row, f"{m}/{metric}"),
                     _cell(row, f"{m}/{metric}_worst10_mean"),
                     *(f"{mean[k]:.3f}" if k in mean else "-" for k in ("uplink_MB", "downlink_MB"))])
  if not body:
    return ""
  widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
  line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
  count = "/".join(str(n) for n in sorted(seeds))
  return "\n".join([f"every swept run (mean ± std over {count} seeds; worst 10 %: the mean over a model's "
                    f"worst tenth of clients)", line(head), *(line(b) for b in body)])
