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
drives it as it drives a single run (:func:`fedtree.experiment.sweep_driver.run_sweep`, chunk after
chunk through :func:`fedtree.experiment.run_loop.run_algorithm`), so evaluation cadence,
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
from fedtree.experiment import search
from fedtree.experiment.capability import RunContext
from fedtree.experiment.fields import SWEEP_FIELDS, default_sweep, set_path, sweep_field  # noqa: F401  (declared there)

MODES = ("product", "zip")
SHAPE_PREFIXES = ("data.", "topology.", "model.", "sweep.", "mesh_shape")
"""Config subtrees that change shapes: never swept."""
SCHEDULE_FIELDS = frozenset(f.name for f in dataclasses.fields(LocalSchedule))
"""``config.local`` fields of the local schedule (step counts, batch shapes): never swept."""


# ------------------------------------------------------------------------ config -> settings
def params_of(sw) -> dict[str, Any]:
  """``config.sweep.params`` as ``{dotted path: [values]}``, from a string
  ``"local.learning_rate=0.01,0.1;runs.fedprox.mu=0,0.1"`` (the command-line form) or a
  (nested) dict ``{"local": {"learning_rate": (0.01, 0.1)}}`` (ConfigDict keys cannot hold dots);
  a value ``loguniform(a,b)``, ``uniform(a,b)`` or ``choice(...)`` is a distribution for random
  search (:class:`fedtree.experiment.search.Distribution`, drawn ``config.sweep.samples`` times)."""
  raw = sweep_field(sw, "params")
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
      dist = search.parse_distribution(vals, path.strip())
      if dist is not None:
        out[path.strip()] = dist
        continue
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
      elif isinstance(v, str) and search.parse_distribution(v, path) is not None:
        out[path] = search.parse_distribution(v, path)
      else:
        out[path] = [v] if isinstance(v, (int, float, str)) else list(v)

  walk(raw, "")
  return out


def sweep_config(config: ml_collections.ConfigDict):
  """``config.sweep`` when it asks for more than one experiment per run, else ``None``."""
  sw = config.get("sweep", None)
  if sw is None:
    return None
  seeds = int(sweep_field(sw, "seeds") or 1)
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


def _swept_field(config, path: str, capabilities) -> tuple[Any, Any]:
  """``(current value, annotation or None)`` of the swept field ``path``.

  The value is the config's; for ``runs.<label>.<name>`` naming a parameter of the run's
  algorithm, the annotation is the factory's (:func:`fedtree.experiment.registry.schema`) and
  a parameter the run leaves at its default has the factory's default as its value; for a field
  of a capability's section (``runs.<label>.compression.uplink.bits``), the annotation is the
  one the capability reads from the factory its section names (its ``hint``), and a field it
  calibrates may be swept in place of the one the run gives (a target ε); ``capabilities``: the
  config's (:func:`fedtree.experiment.capabilities.of_config`)."""
  from fedtree.experiment import registry
  from fedtree.experiment.capability import plain
  from fedtree.experiment.registry.coercion import type_hints

  parts = path.split(".")
  runs = config.get("runs", None)
  of_run = len(parts) >= 3 and parts[0] == "runs" and runs is not None and parts[1] in runs
  run = runs[parts[1]] if of_run else None
  cap = capabilities.get(parts[2]) if run is not None and len(parts) >= 4 else None
  if cap is not None and run.get(cap.name, None):
    section = plain(run[cap.name])
    if cap.calibration is not None and parts[3:] == [cap.calibration.swept]:
      # a run given the traced field may sweep the calibrated one instead (:func:`calibrated`)
      return float(section.get(cap.calibration.swept, 1.0)), None
    value = _get_path(config, path)
    return value, cap.hint(tuple(parts[3:]), section) if cap.hint is not None else None
  spec = None
  if len(parts) == 3 and run is not None:
    try:
      spec = registry.spec_of(run.get("algorithm", None))
    except (KeyError, ValueError):
      spec = None
  try:
    value = _get_path(config, path)
  except ValueError:
    if spec is None:
      raise
    value = inspect.Parameter.empty
  if spec is None:
    return value, None
  sch = registry.schema(spec)
  hint = type_hints(spec.factory).get(parts[2], None) if parts[2] in sch.params else None
  if value is inspect.Parameter.empty:
    if parts[2] not in sch.scalars:
      swept = sorted(n for n, h in sch.scalars.items() if _kind(None, h) == "float")
      raise ValueError(
        f"config.sweep.params names {path!r}, which is not a config field nor a numeric parameter of "
        f"algorithm {run.algorithm!r} (its numeric parameters: {swept})"
      ) from None
    value = sch.params[parts[2]].default
    value = None if value is inspect.Parameter.empty else value
  return value, hint


def _kind(value, hint) -> str:
  """What a swept field is, by its factory annotation when it has one, else by its value:
  ``"float"`` (an experiment axis: a traced scalar; an annotation admitting ``float`` or a
  ``jax.Array``, such as Krum's ``f: int | jax.Array``), ``"shape"`` (an int: a count or a size,
  which changes array shapes or Python control flow), ``"other"`` (not a number)."""
  if hint is not None:
    from fedtree.experiment.registry.coercion import union_args

    args = union_args(hint)
    return "float" if float in args or jax.Array in args else "shape" if int in args else "other"
  if isinstance(value, (float, np.floating)):
    return "float"
  if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
    return "shape"
  return "other"


def _type_name(hint) -> str:
  from fedtree.experiment.registry.coercion import type_name

  return hint.__name__ if isinstance(hint, type) else type_name(hint)


_set_path = set_path   # (the name this module's callers and tests use)


def _calibrations(capabilities, label: str):
  """``[(section name, Calibration, swept path, traced path)]`` of run ``label``'s ``capabilities``."""
  return [(name, cap.calibration, f"runs.{label}.{name}.{cap.calibration.swept}",
           f"runs.{label}.{name}.{cap.calibration.traced}")
          for name, cap in capabilities.items() if cap.calibration is not None]


def _setting_context(ctx, label: str, run, shared=None):
  """The context run ``label``'s setting ``run`` (its config with the setting's values) is built
  in: the run's resolved context (a :class:`~fedtree.experiment.capability.RunContext`) with the
  setting's fields, on ``shared`` when given, its tree, factory and capabilities kept (a setting
  changes no shape, section or algorithm); for a shared context, ``shared`` (else ``ctx``) as it is,
  the run resolved on it by the builder."""
  if not isinstance(ctx, RunContext):
    return ctx if shared is None else shared
  out = ctx.with_run(run)
  return out if shared is None else out.on(shared)


def calibrated(config: ml_collections.ConfigDict, label: str, settings: list[dict], ctx
               ) -> tuple[ml_collections.ConfigDict, list[dict]]:
  """``(config, settings)`` to build run ``label``'s sweep from: a swept field a capability
  calibrates on the host (:class:`~fedtree.experiment.capability.Calibration`: a privacy section's
  ``target_epsilon``) becomes a swept field the builder traces (its ``noise_multiplier``), each
  setting's value computed on the host as a single run with that value computes it (the field
  the config gives in its place is replaced). Other settings pass through unchanged; the table
  and rows keep the settings as given (:func:`calibration_notes` says what was chosen). ``ctx``:
  the run's context (:func:`fedtree.experiment.registry.resolved_context`), or a shared one."""
  from fedtree.experiment import registry

  rctx = registry.run_context(ctx, label, config.runs[label])
  for name, cal, path, traced in _calibrations(rctx.capabilities, label):
    if not settings or path not in settings[0]:
      continue
    if traced in settings[0]:
      raise ValueError(f"config.sweep.params sweeps both {path!r} and {traced!r}: a {cal.swept} sets the "
                       f"{cal.traced}; sweep one of them")
    base = config.to_dict()
    section = {k: v for k, v in base["runs"][label][name].items()
               if k not in (cal.swept, cal.traced)}   # the swept field replaces either
    values = []
    for setting in settings:
      cfg = ml_collections.ConfigDict(base, type_safe=False)
      cfg.runs[label][name] = dict(section)
      for p, value in setting.items():
        _set_path(cfg, p, value)
      run = cfg.runs[label]
      values.append(float(cal.value(run[name].to_dict(), rctx.with_run(run))))
    config = ml_collections.ConfigDict(base, type_safe=False)
    config.runs[label][name] = {**section, cal.traced: values[0]}
    settings = [{**{p: v for p, v in s.items() if p != path}, traced: v}
                for s, v in zip(settings, values, strict=True)]
  return config, settings


def calibration_notes(capabilities, label: str, shown: list[dict], settings: list[dict]) -> list[str]:
  """A line for every field of run ``label``'s sweep that its ``capabilities`` calibrate
  (:func:`calibrated`), naming each setting's traced value (``privacy: dp's noise multipliers
  calibrated per setting: ...``)."""
  notes = []
  for name, cal, path, traced in _calibrations(capabilities, label):
    if shown and path in shown[0] and traced in settings[0]:
      notes.append(f"{name}: {label}'s {cal.what} calibrated per setting: " + ", ".join(
        f"{setting_name(a)}: {cal.symbol}={b[traced]:.4f}" for a, b in zip(shown, settings, strict=True)))
  return notes


def setting_metrics(config: ml_collections.ConfigDict, label: str, settings: list[dict], ctx):
  """Per setting of run ``label``, its capabilities' per-round metrics ``r -> {name: number}``
  (:func:`fedtree.experiment.run.round_metrics` of the run with the setting's values, on the
  host: a swept ``noise_multiplier`` gives each setting its ε), or ``None`` when no capability of
  the run reports any; ``ctx``: the run's context, or a shared one."""
  from fedtree.experiment.run import round_metrics

  if round_metrics(label, config.runs[label], _setting_context(ctx, label, config.runs[label])) is None:
    return None
  shared = ctx.shared if isinstance(ctx, RunContext) else ctx
  out = []
  for setting in settings:
    cfg = copy.deepcopy(config)
    for path, value in setting.items():
      _set_path(cfg, path, value)
    own = _setting_context(ctx, label, cfg.runs[label], dataclasses.replace(shared, config=cfg))
    out.append(round_metrics(label, cfg.runs[label], own))
  return out


def validate(config: ml_collections.ConfigDict) -> None:
  """Named errors for an unknown or non-numeric path, a shape-changing field, an empty list,
  a ``zip`` of lists of different lengths, an unknown mode, or fewer than one seed."""
  from fedtree.experiment.capabilities import of_config

  sw = config.get("sweep", None)
  if sw is None:
    return
  seeds = sweep_field(sw, "seeds")
  if seeds is None or int(seeds) < 1:
    raise ValueError(f"config.sweep.seeds={seeds!r} must be an int >= 1")
  mode = sweep_field(sw, "mode")
  if mode not in MODES:
    raise ValueError(f"config.sweep.mode={mode!r}; choose one of {MODES}")
  params = params_of(sw)
  samples = sweep_field(sw, "samples")
  if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 0:
    raise ValueError(f"config.sweep.samples={samples!r} must be an int >= 0 (0: the grid of the listed "
                     "values)")
  seed = sweep_field(sw, "sample_seed")
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
    raise ValueError(f"config.sweep.sample_seed={seed!r} must be an int")
  capabilities = of_config(config) if params else {}   # (read once for every swept path)
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
    current, hint = _swept_field(config, path, capabilities)
    kind = _kind(current, hint)
    if path.startswith("local.") and leaf in SCHEDULE_FIELDS:
      hint, kind = LocalSchedule.__annotations__[leaf], "shape"
    if kind == "shape":
      what = (f"the int {current!r}" if hint is None else "a field of the static LocalSchedule"
              if path.startswith("local.") else f"annotated {_type_name(hint)}")
      raise ValueError(
        f"config.sweep.params[{path!r}]: {leaf!r} ({what}) changes array shapes or the program's "
        f"control flow and cannot be an experiment axis; sweep it as separate runs (config.runs) "
        f"instead" + (" (a rate written as an int: write it as a float)" if hint is None else "")
      )
    if kind == "other":
      if hint is not None:
        algorithm = config.runs[path.split(".")[1]].algorithm
        raise ValueError(f"config.sweep.params[{path!r}]: {leaf!r} of algorithm {algorithm!r} is a "
                         f"{_type_name(hint)}, not a number; only numeric fields can be swept")
      raise ValueError(f"config.sweep.params[{path!r}]: the field is {current!r}, not a number; "
                       "only numeric fields can be swept")
    if isinstance(values, search.Distribution):
      values.check(path)
      if not samples and not sweep_field(sw, "hyperband_min_rounds"):
        raise ValueError(f"config.sweep.params[{path!r}]={values} is a distribution: set "
                         f"config.sweep.samples to the number of settings to draw from it (random search), "
                         f"or list its values")
      continue
    if not values:
      raise ValueError(f"config.sweep.params[{path!r}] is empty: give at least one value")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float, np.number))]
    if bad:
      raise ValueError(f"config.sweep.params[{path!r}] holds non-numeric values {bad}")
  if samples and mode == "zip":
    raise ValueError("config.sweep.mode='zip' takes lists of values together; random search "
                     f"(config.sweep.samples={samples}) draws every setting: choose mode='product' or "
                     "samples=0")
  if samples and not params:
    raise ValueError(f"config.sweep.samples={samples} draws settings from config.sweep.params, which is "
                     "empty")
  search.halving_of(sw)   # the rungs' and the rate's syntax (the rounds: each run's, in its plan)
  search.pbt_of(sw, eval_every=int(config.get("eval_every", 1)))
  search.hyperband_of(sw)
  if mode == "zip":
    lengths = {p: len(v) for p, v in params.items()}
    if len(set(lengths.values())) > 1:
      raise ValueError(f"config.sweep.mode='zip' needs lists of one length; got lengths {lengths}")
  chunk = _chunk_value(sw)
  if chunk not in (None, "auto") and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
    raise ValueError(f"config.sweep.chunk={chunk!r}; choose 'all', 'auto' or an int >= 1")


def _chunk_value(sw):
  chunk = sweep_field(sw, "chunk")
  if isinstance(chunk, str):
    if chunk.strip().isdigit():
      return int(chunk)
    if chunk.strip().lower() in ("all", "none", ""):
      return None
  return chunk


def settings_of(config: ml_collections.ConfigDict, label: str) -> list[dict[str, float]]:
  """The settings (``{path: value}``) of run ``label``: its swept paths combined by
  ``config.sweep.mode``, or with ``config.sweep.samples`` drawn at random from every swept path's
  distribution (:func:`fedtree.experiment.search.draw`; a setting drawn twice runs once), or with
  ``config.sweep.hyperband_min_rounds`` every Hyperband bracket's draws, one bracket after another
  (:func:`fedtree.experiment.search.bracket_settings`);
  ``[{}]`` when nothing concerns it."""
  sw = config.get("sweep", None)
  params = params_of(sw)
  mine = {p: v for p, v in params.items()
          if not p.startswith("runs.") or p.split(".")[1] == label}
  if not mine:
    return [{}]
  paths = sorted(mine)
  if sweep_field(sw, "hyperband_min_rounds"):   # every bracket's draws, bracket after bracket
    from fedtree.experiment.fields import run_field

    rounds = int(run_field(config, config.runs[label], "rounds"))
    brackets = search.hyperband_of(sw, rounds, label) or []
    per = search.bracket_settings(params, paths, brackets, int(sweep_field(sw, "sample_seed") or 0))
    return [s for settings in per for s in settings]
  samples = int(sweep_field(sw, "samples") or 0)
  if samples:   # random search: drawn over every swept path, then this run's (so each run sees one draw)
    drawn = search.draw(params, samples, int(sweep_field(sw, "sample_seed") or 0))
    out: list[dict[str, float]] = []
    for setting in drawn:
      own = {p: setting[p] for p in paths}
      if own not in out:
        out.append(own)
    return out
  if sweep_field(sw, "mode") == "zip":
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
  ordinary builder: the builder :func:`fedtree.core.sweep.sweep` stacks. ``ctx``: the run's context
  (:func:`fedtree.experiment.registry.resolved_context`: every setting keeps its tree, factory and
  capabilities), or a shared one the builder resolves the run on."""
  from fedtree.experiment.builders import local_optimizer_from_config

  base = config.to_dict()
  shared = ctx.shared if isinstance(ctx, RunContext) else ctx

  def build(hparams: dict) -> FederatedAlgorithm:
    if not hparams:
      return build_algorithm(label, config.runs[label], _setting_context(ctx, label, config.runs[label]))
    cfg = ml_collections.ConfigDict(base, type_safe=False)
    for path, value in hparams.items():
      _set_path(cfg, path, value)
    local_opt = shared.local_optimizer
    if any(p.startswith("local.") for p in hparams):
      local_opt = local_optimizer_from_config(cfg.local)
    sub = dataclasses.replace(shared, config=cfg, local_optimizer=local_opt)
    return build_algorithm(label, cfg.runs[label], _setting_context(ctx, label, cfg.runs[label], sub))

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


FAIRNESS_FINALS = ("worst10_mean", "gini")
"""The statistics of the per-client spread (:func:`fedtree.core.metrics.client_distribution`) a
sweep's table reports per setting: the mean of the worst 10 % of the clients and the Gini coefficient."""
REACHED = "rounds_to_target"
"""A final metric that is NaN for the seeds that never reached the target accuracy: its mean and std
are over the seeds that did, and the row counts them (``reached``)."""


def final_extras(models: dict[str, dict[str, Any]]) -> dict[str, float]:
  """An experiment's final metrics beside the summary metrics: every model's fairness statistics
  (``<model>/accuracy_worst10_mean``, ``<model>/accuracy_gini``) and, with a target accuracy,
  ``<model>/rounds_to_target`` (NaN: never reached)."""
  out = {}
  for m, v in models.items():
    fair = v.get("fairness", None)
    if isinstance(fair, dict) and fair.get("clients"):
      out.update({f"{m}/{fair['metric']}_{k}": fair[k] for k in FAIRNESS_FINALS
                  if fair.get(k) is not None})
    if "target_accuracy" in v:
      r = v.get(REACHED)
      out[f"{m}/{REACHED}"] = float("nan") if r is None else float(r)
  return out


def aggregate(settings: list[dict], per_exp: list[list[dict]]) -> list[dict[str, Any]]:
  """Mean and std over seeds of every final metric, per setting: ``per_exp[i][j]`` is setting
  ``i``'s seed ``j``'s ``{model/metric: value}``. Rows ``{setting, name, mean: {..}, std: {..}}``
  (and ``reached: {..}``, the seeds that reached the target, for the :data:`REACHED` metrics)."""
  rows = []
  for s, runs in zip(settings, per_exp, strict=True):
    keys = sorted({k for r in runs for k in r})
    mean, std, reached = {}, {}, {}
    for k in keys:
      vals = np.asarray([r.get(k, np.nan) for r in runs], np.float64)
      if k.endswith(REACHED):   # over the seeds that reached the target (NaN if none did)
        reached[k] = int(np.sum(~np.isnan(vals)))
        vals = vals[~np.isnan(vals)] if reached[k] else vals
      mean[k] = float(np.mean(vals))
      std[k] = 0.0 if np.all(vals == vals[0]) else float(np.std(vals))   # (ε = inf for z = 0: no NaN)
    row = {"setting": s, "name": setting_name(s), "seeds": len(runs), "mean": mean, "std": std}
    if reached:
      row["reached"] = reached
    rows.append(row)
  return rows


def _cell(row: dict, metric: str) -> str:
  """``mean ± std`` of ``metric`` in a row of :func:`aggregate` (rounds with one decimal and the
  seeds that reached the target when not all did, ``-`` when none; MB with two decimals)."""
  if metric not in row["mean"] or (metric.endswith(REACHED) and row.get("reached", {}).get(metric, 1) == 0):
    return "-"
  mean, std = row["mean"][metric], row["std"][metric]
  if metric.endswith(REACHED):
    seen = row.get("reached", {}).get(metric, row["seeds"])
    return f"{mean:.1f} ± {std:.1f}" + ("" if seen == row["seeds"] else f" ({seen}/{row['seeds']} seeds)")
  digits = 2 if metric.endswith("MB") else 3
  return f"{mean:.{digits}f} ± {std:.{digits}f}"


SHORT = {"accuracy_worst10_mean": "worst 10%", "accuracy_gini": "gini", "uplink_MB": "up MB",
         "downlink_MB": "down MB", REACHED: "rounds to target"}
"""Column headers of :func:`format_runs_table` (the metric's own name otherwise)."""


def _header(metric: str, models: set[str]) -> str:
  model, _, name = metric.rpartition("/")
  short = SHORT.get(name, name)
  return f"{model}/{short}" if model and len(models) > 1 else short


def format_runs_table(results: dict[str, Any], metrics: Sequence[str]) -> str:
  """One table across the swept runs of a config (``config.sweep.columns``): a row per run and
  setting, ``mean ± std`` over seeds of ``metrics`` (headed by their short names, :data:`SHORT`,
  without the model when all are one model's). A related-work table (configs/baselines.py)."""
  body = []
  for label, out in results.items():
    for row in out.get("sweep", {}).get("settings", []):
      name = label if row["name"] == "default" else f"{label} [{row['name']}]"
      body.append([name, str(row["seeds"]), *(_cell(row, m) for m in metrics)])
  models = {m.rpartition("/")[0] for m in metrics if "/" in m}
  head = ["run", "seeds", *(_header(m, models) for m in metrics)]
  widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
  line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
  return "\n".join(["", "runs (mean ± std over seeds)", line(head), line(["-" * w for w in widths]),
                    *(line(b) for b in body)])


def best(rows: list[dict], select: str) -> dict | None:
  """The row whose mean ``select`` is best (``None`` if no row has it)."""
  have = [r for r in rows if select in r["mean"] and np.isfinite(r["mean"][select])]
  if not have:
    return None
  key = (lambda r: r["mean"][select]) if lower_is_better(select) else (lambda r: -r["mean"][select])
  return min(have, key=key)


def format_table(label: str, rows: list[dict], metrics: Sequence[str] | None = None) -> str:
  """One row per setting, ``mean ± std`` over seeds of every final metric (the value alone for a
  setting run with one seed: it has no spread); with successive halving, the round each setting
  reached (``rounds``), its metrics those of that round."""
  metrics = list(metrics or sorted({k for r in rows for k in r["mean"]}))
  head = ["setting", "seeds", *metrics]

  def cell(r: dict, m: str) -> str:
    if m not in r["mean"]:
      return "-"
    digits = 0 if m == "client_updates" else 4   # a count
    mean, std = r["mean"][m], r["std"][m]
    return f"{mean:.{digits}f}" if r["seeds"] == 1 or std == 0 else f"{mean:.{digits}f} ± {std:.{digits}f}"

  halving = any("rounds" in r for r in rows)   # successive halving: the round each setting reached
  if halving:
    head.insert(2, "rounds")
  body = [[r["name"], str(r["seeds"]), *([str(r.get("rounds", "-"))] if halving else []),
           *(cell(r, m) for m in metrics)] for r in rows]
  widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
  line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
  sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
  what = "one seed" if all(r["seeds"] == 1 for r in rows) else "mean ± std over seeds"
  return "\n".join([f"sweep of run {label!r} ({what})", line(head), sep,
                    *(line(b) for b in body)])


def write_best(workdir: str, label: str, row: dict, select: str, config, study: str,
               run_label: str | None = None) -> None:
  """``best_<label>.py`` in ``workdir``: the config of run ``run_label`` (default ``label``) with the
  setting of ``row`` (a row of :func:`aggregate`) applied
  (:func:`fedtree.experiment.search.best_config_text`), its docstring naming the ``study`` and the
  row's ``select`` figure."""
  spread = f" ± {row['std'][select]:.4f}" if row["seeds"] > 1 else ""
  why = (f"The best setting of {study} by {select}: {row['name']} ({row['mean'][select]:.4f}{spread} over "
         f"{row['seeds']} seed{'s' if row['seeds'] > 1 else ''}), written by fedtree.")
  with open(os.path.join(workdir, f"best_{label}.py"), "w") as f:
    f.write(search.best_config_text(config, run_label or label, row["setting"], why))


def write_outputs(workdir: str | None, label: str, rows: list[dict], select: str, *, config=None,
                  paths: Sequence[str] = (), records: Sequence[dict] = (),
                  run_label: str | None = None) -> dict:
  """``summary`` entry of the run (rows and the best setting), and in the workdir its PNG and, given
  the ``config``, what a study keeps (:mod:`fedtree.experiment.search`): ``tuning_<label>.csv``
  (``records``: the run's ``metrics.jsonl`` rows; ``paths``: the swept paths) and
  ``best_<label>.py``. With successive halving the best is among the settings that reached the
  last round. ``run_label``: the run's label in the config when ``label`` names a part of it (a
  Hyperband bracket's files)."""
  last = max((x.get("rounds", 0) for x in rows), default=0)
  b = best([r for r in rows if r.get("rounds", None) in (None, last)], select)
  if workdir and config is not None:
    search.write_tabular(os.path.join(workdir, f"tuning_{label}.csv"), search.tabular(records, paths), paths)
    if b is not None and paths:   # (a sweep of seeds alone has no setting to choose)
      write_best(workdir, label, b, select, config, f"sweep run {label!r}", run_label)
  out = {"select": select, "best": None if b is None else {"setting": b["setting"], "name": b["name"],
                                                           "mean": b["mean"][select],
                                                           "std": b["std"][select]},
         "settings": rows}
  if workdir and b is None:   # e.g. the root of a tree whose root never aggregates
    print(f"sweep plot of {label!r} not written: no setting reports {select!r} (a model that never "
          "trained is left out)", file=sys.stderr)
  elif workdir:
    try:
      from fedtree.experiment import plots

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


def _mean_std(row: dict, key: str) -> str:
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
        body.append([label, row["name"], m, metric, _mean_std(row, f"{m}/{metric}"),
                     _mean_std(row, f"{m}/{metric}_worst10_mean"),
                     *(f"{mean[k]:.3f}" if k in mean else "-" for k in ("uplink_MB", "downlink_MB"))])
  if not body:
    return ""
  widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
  line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
  count = "/".join(str(n) for n in sorted(seeds))
  return "\n".join([f"every swept run (mean ± std over {count} seeds; worst 10 %: the mean over a model's "
                    f"worst tenth of clients)", line(head), *(line(b) for b in body)])
