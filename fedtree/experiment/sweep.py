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
that concern it (``local.*`` and other global paths, and ``runs.<its label>.*``). Every
algorithm is ``FederatedAlgorithm(init, round)`` with explicit keys, so the experiments are
one ``jax.vmap`` over ``(hyperparameters, state, key)`` with the data broadcast: the algorithm
is built *inside* the traced function from a copy of the config whose swept fields hold traced
scalars (never Python constants), by the ordinary builder
(:func:`fedtree.experiment.registry.build_algorithm`). Experiment ``(setting, seed j)`` is
exactly the run with ``config.seed + j`` and the setting's values done alone (tests check it).

The stacked state (:class:`SweepState`) is one bigger pytree run by the one round loop
:func:`fedtree.core.loop.run` (so evaluation cadence, checkpoints, exact resume, stop requests
and divergence checks are those of a single run; a state leaf's bad row is the experiment).

A field that changes shapes or Python control flow (:data:`SHAPE_FIELDS`, anything under
``data``, ``topology``, ``model``) is refused up front by name; a builder that needs a concrete
value of a swept field (a ``ConcretizationTypeError`` or ``TracerBoolConversionError`` while
tracing) is turned into a ``ValueError`` naming the field and the algorithm.

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
import functools
import inspect
import itertools
import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedtree.core import loop
from fedtree.core.algorithm import FederatedAlgorithm

MODES = ("product", "zip")
SHAPE_FIELDS = frozenset({
  "cohort_size", "chunk_size", "num_clusters", "clusters", "hidden", "periods", "rounds", "steps",
  "epochs", "batch_size", "team_iters", "inner_steps", "global_rounds", "group_rounds",
  "buffer_sizes", "proxy_examples", "proxy_steps", "proxy_batch_size", "proxy_levels",
  "residual_k", "num_clients", "group_sizes", "stages", "eval_chunk_size", "rounds_per_call",
  "eval_every", "seed", "warmup_rounds", "split_rounds",
})
"""Leaf names that change shapes or Python control flow: never swept."""
SHAPE_PREFIXES = ("data.", "topology.", "model.", "sweep.", "mesh_shape")
"""Config subtrees that change shapes: never swept."""


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


def _swept_field(config, path: str):
  """The current value of the swept field ``path``: the config's, or for ``runs.<label>.<name>``
  a parameter of the run's algorithm that the run leaves at its default (its schema,
  :func:`fedtree.experiment.registry.schema`), the factory's default."""
  try:
    return _get_path(config, path)
  except ValueError:
    parts = path.split(".")
    runs = config.get("runs", None)
    if len(parts) != 3 or parts[0] != "runs" or runs is None or parts[1] not in runs:
      raise
    from fedtree.experiment import registry

    algorithm = runs[parts[1]].get("algorithm", None)
    if algorithm not in registry.SPECS:
      raise
    sch = registry.schema(registry.SPECS[algorithm])
    hint = sch.scalars.get(parts[2], None)
    if hint is None:
      numeric = sorted(n for n, h in sch.scalars.items() if _numeric_hint(h))
      raise ValueError(
        f"config.sweep.params names {path!r}, which is not a config field nor a numeric parameter of "
        f"algorithm {algorithm!r} (its numeric parameters: {numeric})"
      ) from None
    if not _numeric_hint(hint):
      raise ValueError(f"config.sweep.params[{path!r}]: {parts[2]!r} of algorithm {algorithm!r} is a "
                       f"{hint}, not a number; only numeric fields can be swept") from None
    default = sch.params[parts[2]].default
    return None if default is inspect.Parameter.empty else default


def _numeric_hint(hint) -> bool:
  import types
  import typing

  args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
  return any(a in (int, float) for a in args)


def _set_path(config, path: str, value) -> None:
  *parents, leaf = path.split(".")
  node = config
  for part in parents:
    node = node[part]
  node[leaf] = value


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
    if leaf in SHAPE_FIELDS or path.startswith(SHAPE_PREFIXES):
      raise ValueError(
        f"config.sweep.params[{path!r}]: {leaf!r} changes array shapes or the program's control "
        f"flow and cannot be an experiment axis; sweep it as separate runs (config.runs) instead"
      )
    if path.startswith("runs.") and path.count(".") < 2:
      raise ValueError(f"config.sweep.params[{path!r}] must name a field of a run, e.g. "
                       f"'runs.<label>.mu'")
    current = _swept_field(config, path)
    if isinstance(current, (bool, str)) or hasattr(current, "keys") or (
        current is not None and not isinstance(current, (int, float, np.number))):
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


# ------------------------------------------------------------------------ the stacked program
@flax.struct.dataclass
class SweepState:
  """The state of ``E`` experiments of one run.

  Attributes:
    round: ``int32[]`` rounds completed (the same for every experiment).
    inner: the algorithm's state with a leading experiment axis ``[E, ...]`` on every leaf.
    keys: ``uint32[E, 2]`` every experiment's root key (key data of ``jax.random.key(seed)``).
    hparams: ``{path: float32[E]}`` every experiment's swept values.
  """

  round: jax.Array
  inner: Any
  keys: jax.Array
  hparams: dict


def config_builder(config: ml_collections.ConfigDict, label: str, ctx,
                   build_algorithm: Callable) -> Callable[[dict], FederatedAlgorithm]:
  """``build(hparams) -> algorithm`` of run ``label`` with the swept fields set to ``hparams``
  (traced scalars inside a trace, Python floats outside), through the ordinary builder."""
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


def _explain(e: Exception, label: str, algorithm: str, paths: Sequence[str]) -> ValueError:
  return ValueError(
    f"run {label!r} (algorithm {algorithm!r}) cannot sweep {list(paths)} in one program: its "
    f"builder needs a concrete value of a swept field ({type(e).__name__}: {str(e).splitlines()[0]}); "
    "sweep these values as separate runs instead"
  )


def stacked_algorithm(build: Callable[[dict], FederatedAlgorithm], *, label: str, algorithm: str,
                      paths: Sequence[str]) -> FederatedAlgorithm:
  """One :class:`FederatedAlgorithm` over :class:`SweepState`: ``round`` runs a round of every
  experiment (``vmap`` over hyperparameters, states and keys; data broadcast). Its ``init``
  is unused (see :func:`init_state`); the key ``round`` receives is ignored (each experiment
  folds the round into its own key, as :func:`fedtree.core.loop.run` does for a single run)."""

  def one(hp, state, data, key_data):
    key = jax.random.wrap_key_data(key_data)
    try:
      return build(hp).round(state, data, jax.random.fold_in(key, state.round))
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
            jax.errors.TracerIntegerConversionError) as e:
      raise _explain(e, label, algorithm, paths) from e

  def round_(st: SweepState, data, _key):
    inner, metrics = jax.vmap(one, in_axes=(0, 0, None, 0))(st.hparams, st.inner, data, st.keys)
    client = metrics.pop("nonfinite_client", None)
    out = {f"{k}@{e}": v[e] for k, v in metrics.items() for e in range(v.shape[0])}
    # Any experiment's non-finite loss or client update stops the sweep, naming the experiment
    # (the loop maps it to its setting and seed) and the client.
    bad = jnp.zeros(st.keys.shape[0], bool)
    if "train_loss" in metrics:
      out["train_loss"] = jnp.sum(metrics["train_loss"])
      bad = bad | ~jnp.isfinite(metrics["train_loss"])
    if client is not None:
      bad = bad | (client >= 0)
      out["nonfinite_client"] = jnp.where(bad.any(), client[jnp.argmax(bad)], -1)
    out["nonfinite_experiment"] = jnp.where(bad.any(), jnp.argmax(bad), -1).astype(jnp.int32)
    return SweepState(round=st.round + 1, inner=inner, keys=st.keys, hparams=st.hparams), out

  def models(_st):
    raise NotImplementedError("evaluate a sweep's experiments one by one (fedtree.experiment.sweep)")

  return FederatedAlgorithm(init=None, round=round_, models=models, name=f"{algorithm}[sweep]")


def init_state(build: Callable[[dict], FederatedAlgorithm], hparams: dict, seeds: Sequence[int], *,
               label: str, algorithm: str) -> SweepState:
  """The initial :class:`SweepState` of experiments with ``hparams`` (``{path: float[E]}``)
  and seeds (``int[E]``): experiment ``e`` starts from ``init(init_key(key(seeds[e])))``."""
  key_data = jnp.stack([jax.random.key_data(jax.random.key(int(s))) for s in seeds])
  hp = {p: jnp.asarray(v, jnp.float32) for p, v in hparams.items()}
  inner = _jitted_init(build, label, algorithm, tuple(sorted(hparams)))(hp, key_data)
  return SweepState(round=jnp.zeros((), jnp.int32), inner=inner, keys=key_data, hparams=hp)


@functools.lru_cache(maxsize=16)
def _jitted_init(build, label: str, algorithm: str, paths: tuple):
  """The jitted, vmapped ``init`` of ``build`` (one compile per build function and shape)."""

  def one(h, kd):
    try:
      return build(h).init(loop.init_key(jax.random.wrap_key_data(kd)))
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
            jax.errors.TracerIntegerConversionError) as e:
      raise _explain(e, label, algorithm, list(paths)) from e

  return jax.jit(jax.vmap(one))


def experiment(st: SweepState, e: int):
  """The state of experiment ``e`` alone (its ``round`` is the sweep's)."""
  return jax.tree.map(lambda x: x[e], st.inner)


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
  """One row per setting, ``mean ± std`` over seeds of every final metric."""
  metrics = list(metrics or sorted({k for r in rows for k in r["mean"]}))
  head = ["setting", "seeds", *metrics]
  body = [[r["name"], str(r["seeds"]),
           *(f"{r['mean'][m]:.4f} ± {r['std'][m]:.4f}" if m in r["mean"] else "-" for m in metrics)]
          for r in rows]
  widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
  line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
  sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
  return "\n".join([f"sweep of run {label!r} (mean ± std over seeds)", line(head), sep,
                    *(line(b) for b in body)])


def write_outputs(workdir: str | None, label: str, rows: list[dict], select: str) -> dict:
  """``summary`` entry of the run (rows and the best setting), and its PNG in the workdir."""
  b = best(rows, select)
  out = {"select": select, "best": None if b is None else {"setting": b["setting"], "name": b["name"],
                                                           "mean": b["mean"][select],
                                                           "std": b["std"][select]},
         "settings": rows}
  if workdir:
    try:
      from fedtree.evaluation import plots

      with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
      plots.plot_sweep(records, os.path.join(workdir, f"sweep_{label}.png"), run=label,
                       metric=select)
      if any("epsilon" in r["mean"] for r in rows):   # a privacy sweep: accuracy against ε
        plots.plot_privacy_utility(rows, os.path.join(workdir, f"privacy_{label}.png"), run=label,
                                   metric=select)
    except (ImportError, OSError, ValueError) as e:  # no matplotlib, or nothing to plot
      print(f"sweep plot of {label!r} not written: {e}")
  return out


def dumps(obj) -> str:
  def clean(o):
    if isinstance(o, dict):
      return {str(k): clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
      return [clean(v) for v in o]
    if isinstance(o, float) and not math.isfinite(o):
      return None
    return o
  return json.dumps(clean(obj), indent=2)


# ------------------------------------------------------------------------ running (the runner's part)
def run_sweep(label: str, run_cfg, ctx, reporter, *, workdir: str | None, should_stop=None,
              build_algorithm: Callable | None = None, budget=None) -> dict[str, Any]:
  """Every experiment of run ``label`` (settings x seeds), chunk after chunk through one
  compiled function (the memory of a chunk of experiments checked first against ``budget``,
  a :class:`fedtree.experiment.memory.Budget`); logs a ``metrics.jsonl`` row per experiment
  and evaluation round (with ``setting`` and ``seed``), prints the mean ± std table, writes
  the PNG and returns the run's ``summary.json`` entry (rows per setting and the best by
  ``config.sweep.select``)."""
  from fedtree import evaluation
  from fedtree.core.metrics import make_evaluator
  from fedtree.experiment import results

  if build_algorithm is None:
    from fedtree.experiment.registry import build_algorithm
  config = ctx.config
  sw = config.sweep
  settings = settings_of(config, label)
  n_seeds = int(sw.get("seeds", 1) or 1)
  seed0 = int(config.seed)
  exps = [(i, seed0 + j) for i in range(len(settings)) for j in range(n_seeds)]
  paths = sorted(settings[0])
  build = config_builder(config, label, ctx, build_algorithm)
  concrete = [build(s) for s in settings]  # Python values: for evaluation, and early errors
  algo_name = str(run_cfg.algorithm)
  if concrete[0].rounds is not None:
    raise ValueError(
      f"run {label!r} (algorithm {algo_name!r}) is a fixed-length composition of stages "
      "(fedtree.core.algorithm.sequential); a sweep cannot stack it yet: sweep it as separate runs"
    )
  stacked = stacked_algorithm(build, label=label, algorithm=algo_name, paths=paths)
  spent = privacy_metrics(config, label, settings, ctx)   # ε per setting (host), or None
  num_rounds = int(run_cfg.get("rounds", config.rounds))
  positive = results.positive_classes_from_config(config, ctx.data.num_classes)
  evaluator = make_evaluator(ctx.model, config.get("eval_chunk_size", None), confusion=positive is not None)
  size = chunk_size(config, len(exps), ctx)
  if budget is not None:  # the stacked state and working set of a chunk of experiments, before compiling
    shapes = jax.eval_shape(concrete[0].init, loop.init_key(jax.random.key(seed0)))
    reporter.print(budget.check(label, shapes, ctx.chunk_size(run_cfg), experiments=size,
                                chunk_name="sweep.chunk" if size > 1 else "chunk_size"))
  chunks = [exps[k:k + size] for k in range(0, len(exps), size)]
  finals: dict[int, dict[str, float]] = {}
  every = int(config.get("checkpoint_every", 0) or 0)
  for k, chunk in enumerate(chunks):
    real = len(chunk)
    padded = chunk + [chunk[-1]] * (size - real)  # one shape for every chunk: one compile
    hp = {p: np.asarray([settings[i][p] for i, _ in padded], np.float32) for p in paths}
    state = init_state(build, hp, [s for _, s in padded], label=label, algorithm=algo_name)
    name = label if len(chunks) == 1 else f"{label}#chunk{k}"
    ckpt = None
    if workdir and every:
      from fedtree.experiment.checkpoint import Checkpointer

      ckpt = Checkpointer(os.path.join(workdir, "checkpoints", name), every=every,
                          keep=int(config.get("keep_checkpoints", 2)))
      restored = ckpt.restore(state, warn=reporter.print)
      if restored is not None:
        state = restored
        reporter.print(f"{name}: resumed from the checkpoint of round {int(state.round)}")
    evals: dict[int, dict[int, dict[str, float]]] = {}

    def evaluate(st, r, chunk=chunk, evals=evals):
      evals[r] = {}
      for e, (i, seed) in enumerate(chunk):
        summaries = evaluation.evaluate_models(
          concrete[i], experiment(st, e), ctx.model, ctx.run_data, groups=ctx.groups,
          evaluator=evaluator, positive_classes=positive)
        results.check_summaries(f"{label}[{setting_name(settings[i])},seed={seed}]", r, summaries)
        evals[r][e] = {f"{m}/{s}": sm[s] for m, sm in summaries.items()
                       for s in results.SUMMARY_METRICS if s in sm}
        if spent is not None and spent[i] is not None:
          evals[r][e].update(spent[i](r))
      return {}

    def log(r, host, chunk=chunk, evals=evals, name=name, base=k * size):
      for e, (i, seed) in enumerate(chunk):
        row = {m.split("@")[0]: v for m, v in host.items() if m.endswith(f"@{e}")}
        row.update(evals.get(r, {}).get(e, {}))
        row.update(setting=settings[i], seed=seed, experiment=base + e)
        reporter.log(name, r, row, tensorboard_run=f"{label}/{setting_name(settings[i])}/seed{seed}")

    def name_row(e, chunk=chunk, base=k * size):  # padded rows repeat the chunk's last experiment
      e = min(e, len(chunk) - 1)
      i, seed = chunk[e]
      return f"experiment {base + e} (setting {setting_name(settings[i])}, seed {seed})"

    reporter.start_run(name, num_rounds, from_round=int(state.round))
    try:
      state = loop.run(
        stacked, ctx.run_data, num_rounds=num_rounds, key=jax.random.key(0), state=state,
        rounds_per_call=int(config.rounds_per_call), eval_every=int(config.eval_every),
        on_eval=evaluate, on_metrics=log, should_stop=should_stop, label=name, name_row=name_row,
        on_call=(lambda s, r, c=ckpt: c.maybe_save(s, force=r == num_rounds)) if ckpt else None,
      )
    finally:
      if ckpt is not None:
        ckpt.close()
      reporter.end_run(name)
    if int(state.round) < num_rounds:
      raise results.RunStopped(f"sweep {name!r} stopped at round {int(state.round)} of {num_rounds}")
    if num_rounds not in evals:
      evaluate(state, num_rounds)
    for e in range(real):
      finals[k * size + e] = evals[num_rounds][e]
  per_setting = [[finals[x] for x, (i, _) in enumerate(exps) if i == s] for s in range(len(settings))]
  rows = aggregate(settings, per_setting)
  select = str(sw.get("select", "global/accuracy"))
  reporter.result(format_table(label, rows))
  out = write_outputs(reporter.workdir, label, rows, select)  # None off process 0
  if out["best"] is not None:
    reporter.result(f"best setting of {label!r} by {select}: {out['best']['name']} "
                    f"({out['best']['mean']:.4f} ± {out['best']['std']:.4f})")
  return {"sweep": out}
