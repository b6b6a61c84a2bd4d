"""From a config to results: data, tree, model, every run of the config, reports.

``train_and_evaluate(config, workdir)`` is what ``python -m fedtree.main`` calls. A config
names the data, the tree, the model, the local training and one or more *runs*
(``config.runs.<label>``), each an algorithm from :data:`fedtree.algorithms.BUILDERS` with
its hyperparameters; all runs see the same data, tree, initial model and seed, and the
final table compares them.

A builder returns a :class:`~fedtree.core.algorithm.FederatedAlgorithm` (multi-stage
methods such as GroupPerFL are one too, composed by :func:`fedtree.core.algorithm.sequential`),
run here by the one round loop :func:`fedtree.core.loop.run` with periodic evaluation,
checkpoints and exact resume; its optional ``report`` hook returns extra tables and files,
which this layer prints (stdout) and writes (workdir).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from fedtree import evaluation
from fedtree.core import loop, tuning
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.data import FederatedData, as_device, check_model_inputs, check_model_outputs
from fedtree.core.local import LocalSchedule
from fedtree.core.metrics import FAIRNESS_STATS, make_evaluator
from fedtree.core.sharding import agreed, barrier, client_mesh, local_copy, shard_data
from fedtree.core.sweep import by_experiment
from fedtree.core.sweep import sweep as stacked_sweep
from fedtree.core.topology import Topology
from fedtree.core.traffic import Traffic, model_bytes
from fedtree.evaluation import central_blocks
from fedtree.experiment import memory, privacy
from fedtree.experiment.builders import local_optimizer_from_config, schedule_from_config
from fedtree.experiment.reporting import Reporter
from fedtree.experiment.results import (  # noqa: F401  (re-exported: runner.RunStopped, ...)
  SUMMARY_METRICS,
  DivergedError,
  RunStopped,
  check_summaries,
  evaluation_options,
  kept_on_stop,
  positive_classes_from_config,
)
from fedtree.experiment.robust import block_estimate, poisoned_data
from fedtree.models import Model, build_model


@dataclasses.dataclass(frozen=True)
class Context:
  """Everything a builder needs, shared by all runs of a config.

  Attributes:
    config: the whole config.
    data: device-resident federated data, local to this process: what builders read on the
      host (sizes, validation, proxy sets) and what a run uses without a mesh.
    groups: ``int[C]`` group (level-1 node) of every client, for per-group reports.
    topology: the tree.
    model: the model.
    local_optimizer: the clients' optax optimizer (``config.local``).
    schedule: local epochs/steps and batch size (``config.local``).
    central_test: ``(x, y)`` of a central test set when the data has one, else ``None``.
    auto_chunk: what ``chunk_size="auto"`` means for this model (a
      :func:`fedtree.core.tuning.chunk_policy`; ``None``: the per-backend default).
    init_params: the parameters every run starts from (``config.init_params``, loaded and
      checked by :func:`fedtree.experiment.params.load_params`); ``None``: ``model.init``.
    group_names: the data's name of every group (``None``: unnamed).
    vocab: the token of every id of a text dataset (``None``: not text); ``config.pretrain``
      encodes its pretraining text with it (:mod:`fedtree.experiment.pretrain`).
    sharded_data: ``data`` with its client axis over the run's mesh (``config.mesh_shape``,
      :func:`fedtree.core.sharding.shard_data`), which rounds and evaluation run on; ``None``
      without a mesh. Across processes (``--multihost``) its arrays span devices this process
      cannot read, which is why builders keep reading :attr:`data`.
    data_info: what the data loader said about the data (:mod:`fedtree.experiment.data`).
    run_overrides: ``None`` for the config's context; for a run that sets its own ``data`` or
      ``model`` (:func:`run_context`), the ``(data, model)`` fields it set.
  """

  config: ml_collections.ConfigDict
  data: FederatedData
  groups: np.ndarray
  topology: Topology
  model: Model
  local_optimizer: optax.GradientTransformation
  schedule: LocalSchedule
  central_test: tuple[np.ndarray, np.ndarray] | None = None
  auto_chunk: tuning.ChunkPolicy | None = None
  init_params: Any = None
  group_names: tuple[str, ...] | None = None
  vocab: tuple[str, ...] | None = None
  sharded_data: FederatedData | None = None
  data_info: Any = None
  run_overrides: Any = None

  def for_run(self, run) -> Context:
    """The context run ``run`` (a ``config.runs.<label>``) builds and is evaluated in
    (:func:`run_context`: its own data and model, when it sets them)."""
    return run_context(self, run)

  @property
  def run_data(self) -> FederatedData:
    """The data rounds and evaluation run on: :attr:`sharded_data`, else :attr:`data`."""
    return self.data if self.sharded_data is None else self.sharded_data

  def initial_params(self, run: ml_collections.ConfigDict | None = None, label: str = "<label>"):
    """The parameters ``run`` (``config.runs.<label>``) starts from: its ``init_params`` path
    when it sets one (loaded and checked against the model), else the config's
    (:attr:`init_params`), else ``None``."""
    path = run.get("init_params", None) if run is not None else None
    if path is None:
      return self.init_params
    from fedtree.experiment.params import load_params

    return load_params(_path(path, f"config.runs.{label}.init_params"), self.model)

  def run_topology(self, label: str, run: ml_collections.ConfigDict) -> Topology:
    """The tree run ``label``'s algorithm is built on
    (:func:`fedtree.experiment.registry.run_topology`), which its capabilities read."""
    from fedtree.experiment.registry import run_topology

    return run_topology(label, run, self)

  def chunk_size(self, run: ml_collections.ConfigDict | None = None):
    """The chunk size of ``run`` (its ``chunk_size``, else the config's, else ``"auto"``),
    with ``"auto"`` sized for this model."""
    value = self.config.get("chunk_size", "auto")
    if run is not None:
      value = run.get("chunk_size", value)
    value = number_or_name(value)
    return self.auto_chunk if value == "auto" and self.auto_chunk is not None else value


def _path(value, where: str) -> str:
  if not isinstance(value, (str, os.PathLike)):
    raise ValueError(f"{where}={value!r}; it must be the path of a .npz file or an orbax directory")
  return os.fspath(value)


def number_or_name(value):
  """A field that takes a number or a name, as the command line gives it: ``"8"`` -> 8,
  ``"None"``/``"none"`` -> ``None``; anything else unchanged."""
  if isinstance(value, str):
    if value.strip().lstrip("+-").isdigit():
      return int(value)
    if value.strip().lower() == "none":
      return None
  return value


# ------------------------------------------------------------------------ building blocks
def load_data(cfg: ml_collections.ConfigDict) -> tuple[FederatedData, np.ndarray, Any]:
  """``(data, group labels, central test or None)`` from ``config.data``."""
  from fedtree.experiment.data import load

  return load(cfg)


def build_topology(cfg: ml_collections.ConfigDict, groups: np.ndarray, num_clients: int,
                   label_columns: np.ndarray | None = None) -> Topology:
  """``config.topology.kind``: ``groups`` (root -> data groups -> clients), ``flat``,
  ``sizes`` (``config.topology.sizes``, nested), or ``columns`` (the data's ``label_columns``,
  coarsest first: root -> regions -> ... -> clients)."""
  kind = cfg.kind
  if kind == "columns":
    if label_columns is None:
      raise ValueError("config.topology.kind='columns' needs data that name label columns "
                       "(data.name='hf' with tree_columns, or 'arrays' with [L, C] groups); use 'groups'")
    return Topology.from_label_columns(list(label_columns))
  if kind == "groups":
    return Topology.from_labels(groups)
  if kind == "flat":
    return Topology.flat(num_clients)
  if kind == "sizes":
    topo = Topology.from_sizes(_to_nested(cfg.sizes))
    if topo.num_clients != num_clients:
      raise ValueError(
        f"config.topology.sizes describes {topo.num_clients} clients but the data has {num_clients}"
      )
    return topo
  raise ValueError(f"config.topology.kind={kind!r}; choose 'groups', 'flat', 'sizes' or 'columns'")


def _to_nested(v):
  if isinstance(v, (list, tuple)):
    return [_to_nested(x) for x in v]
  return int(v)


def make_context(config: ml_collections.ConfigDict, *, data_config=None, model_config=None,
                 loaded=None) -> Context:
  """The context of ``config``: its data (``config.data``, or ``data_config``; ``loaded``: the
  ``(data, groups, central test, info)`` already loaded), tree, model (``config.model``, or
  ``model_config``), local optimizer and schedule, and initial parameters."""
  from fedtree.experiment.data import load_with_info, model_options

  data_config = config.data if data_config is None else data_config
  model_config = config.model if model_config is None else model_config
  data, groups, central, info = load_with_info(data_config) if loaded is None else loaded
  topology = build_topology(config.topology, groups, data.num_clients, info.label_columns)
  data.validate(topology).check_values()
  model_cfg = model_options(dict(model_config), info)  # e.g. the char table of embedding="chars"
  name = model_cfg.pop("name")
  model = build_model(name, example_shape=data.example_shape, num_classes=data.num_classes, **model_cfg)
  if str(config.get("dtype", "float32")) == "float64":
    data, central, model = as_float64(data, central, model)
  check_model_inputs(model, data)
  check_model_outputs(model, data)
  evaluation_options(config, num_classes=data.num_classes, has_central=central is not None,
                     has_local=int(np.asarray(data.n_test).sum()) > 0)
  local_optimizer = local_optimizer_from_config(config.local)
  schedule = schedule_from_config(config.local)
  init_params = None
  if config.get("init_params", None) is not None:
    from fedtree.experiment.params import load_params

    init_params = load_params(_path(config.init_params, "config.init_params"), model)
  memory.check_data(data, config)   # a population too large is refused here, not killed in the copy
  return Context(
    config=config, data=as_device(data), groups=np.asarray(groups), topology=topology, model=model,
    local_optimizer=local_optimizer, schedule=schedule, central_test=central,
    auto_chunk=tuning.chunk_policy(model, local_optimizer, data.example_shape, schedule.batch_size),
    init_params=init_params, group_names=info.group_names, vocab=info.vocab, data_info=info,
  )


RUN_OVERRIDES = ("data", "model")
"""The sections of the config a run may override with its own fields (merged over them)."""


def run_context(ctx: Context, run) -> Context:
  """The context run ``run`` (a ``config.runs.<label>``) trains and is evaluated in: ``ctx``, or,
  when the run sets ``data`` and/or ``model`` (fields merged over ``config.data`` /
  ``config.model``: e.g. ``data: {partition: "shards"}`` for a pathological split, ``model:
  {norm: "batch"}`` for FedBN's BatchNorm), a context with that data (loaded again, its tree from
  ``config.topology``) and that model. One config can then compare methods on several splits of a
  dataset, or give one method the model it needs. A run's own context is returned unchanged (the
  runner makes it once, the registry's builders receive it).

  Raises:
    ValueError: the run's data or model cannot be built (the message says which section).
  """
  given = {k: run.get(k, None) for k in RUN_OVERRIDES}
  given = {k: (v.to_dict() if hasattr(v, "to_dict") else dict(v)) for k, v in given.items() if v is not None}
  if not given or ctx.run_overrides is not None:
    return ctx
  config = ctx.config
  if "data" in given:
    loaded = None
  else:
    from fedtree.experiment.data import DataInfo

    info = ctx.data_info if ctx.data_info is not None else DataInfo()
    loaded = (ctx.data, ctx.groups, ctx.central_test, info)
  data_cfg = ml_collections.ConfigDict({**config.data.to_dict(), **given.get("data", {})})
  model_cfg = {**config.model.to_dict(), **given.get("model", {})}
  in_memory = ctx.init_params is not None and config.get("init_params", None) is None   # e.g. pretrained
  if in_memory and "model" in given:
    raise ValueError(f"its own model ({given['model']}) cannot start from the parameters every other run "
                     f"starts from (they are the config's model's, e.g. a pretrained base); drop its model")
  try:
    built = make_context(config, data_config=data_cfg, model_config=model_cfg, loaded=loaded)
  except TypeError as e:   # a field the dataset or the model does not take
    raise ValueError(f"its {' and '.join(sorted(given))} ({given}): {e}") from e
  if in_memory:   # the same model on other data: the same start
    built = dataclasses.replace(built, init_params=ctx.init_params)
  return dataclasses.replace(built, run_overrides=(given.get("data"), given.get("model")))


def as_float64(data: FederatedData, central, model: Model):
  """``config.dtype="float64"``: the data's float features and the model's initial parameters
  in float64 (every state follows: optimizer and client states are built from the parameters).
  Needs JAX's 64-bit mode (:func:`precision`)."""
  if not jax.config.jax_enable_x64:
    raise ValueError("config.dtype='float64' needs JAX's 64-bit mode: run through python -m "
                     "fedtree.main, or call train_and_evaluate, which turn it on")

  def f64(x):
    x = np.asarray(x)
    return x.astype(np.float64) if np.issubdtype(x.dtype, np.floating) else x

  data = data.replace(x_train=f64(data.x_train), x_test=f64(data.x_test))
  if central is not None:
    central = (f64(central[0]), central[1])
  init = model.init

  def cast(p):   # dictionaries keep their (flax creation) order: fedtree.core.model.layer_order reads it
    if hasattr(p, "items"):
      return {k: cast(v) for k, v in p.items()}
    return jax.tree.map(lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a, p)

  def init64(key):
    return cast(init(key))

  float_input = np.issubdtype(np.dtype(model.input_dtype), np.floating)
  input_dtype = "float64" if float_input else model.input_dtype
  return data, central, model._replace(init=init64, input_dtype=input_dtype)


def precision(config: ml_collections.ConfigDict):
  """The context a run of ``config`` runs in: JAX's 64-bit mode for ``config.dtype="float64"``
  (nothing for ``"float32"``; ``JAX_ENABLE_X64=1`` alone leaves every state float32)."""
  from fedtree.experiment.fields import DTYPES

  dtype = str(config.get("dtype", "float32"))
  if dtype not in DTYPES:
    raise ValueError(f"config.dtype={dtype!r}; choose one of {DTYPES}")
  return jax.enable_x64(True) if dtype == "float64" else contextlib.nullcontext()


# ------------------------------------------------------------------------ running
SWEEP_BYTES = ("uplink_MB", "downlink_MB")
"""The byte totals (:mod:`fedtree.core.traffic`) a sweep's table reports per setting (every edge
of the tree; the per-edge totals are in each experiment's ``metrics.jsonl`` rows)."""


class Experiment(NamedTuple):
  """One experiment of a sweep as the runner reports it.

  Attributes:
    name: names it in errors (``"experiment 2 (setting lr=0.1, seed 0)"``).
    row: fields added to each of its ``metrics.jsonl`` rows (``setting``, ``seed``, ``experiment``).
    tensorboard_run: its TensorBoard run (one curve per experiment).
    round_metrics: ``r -> {name: number}`` added to its rows (its setting's ε after ``r`` rounds).
  """

  name: str
  row: dict[str, Any]
  tensorboard_run: str
  round_metrics: Callable[[int], dict[str, Any]] | None = None


def run_algorithm(
  algorithm: FederatedAlgorithm, ctx: Context, key: jax.Array, reporter: Reporter, *,
  num_rounds: int, eval_every: int, rounds_per_call: int, label: str,
  checkpoint_dir: str | None = None, checkpoint_every: int = 0, keep_checkpoints: int = 2,
  should_stop=None, round_metrics=None, adapters=None, backdoor=None,
  experiments: list[Experiment] | None = None, max_abs: float | None = loop.DIVERGENCE_BOUND,
) -> tuple[Any, dict[str, dict[str, Any]]]:
  """Rounds with evaluation every ``eval_every`` rounds (:func:`fedtree.core.loop.run`);
  returns (state, final summaries), the summaries passed through ``algorithm.report`` when
  the algorithm has one (its text printed, its files written into the workdir).

  With ``checkpoint_dir`` and ``checkpoint_every > 0`` the state is saved every
  ``checkpoint_every`` rounds and at the end (the last ``keep_checkpoints`` kept), and a run
  resumes the newest checkpoint there that restores and whose state is within ``max_abs`` (the
  divergence bound, :func:`fedtree.core.loop.run`: a diverged state is never saved, nor resumed).
  ``should_stop()`` is polled after every compiled call; when it returns ``True`` the state
  reached is checkpointed and the run raises :class:`RunStopped` saying what is kept.
  ``round_metrics(r) -> {name: number}`` adds host-computed numbers to round
  ``r``'s row and to every final summary (the privacy spent: ``epsilon``).
  ``adapters`` (a :class:`~fedtree.core.lora.LoRA` spec): the algorithm's
  models are adapters on the frozen base its state holds (:func:`fedtree.core.lora.frozen_base`),
  scored with the base as an argument (:func:`fedtree.core.lora.base_evaluator`). ``backdoor``:
  the ``(x, y, n)`` test split whose accuracy is the attack success rate
  (:func:`fedtree.datasets.poison.backdoor_test_split`), reported beside accuracy.

  With ``experiments``, ``algorithm`` is a sweep (:func:`fedtree.core.sweep.sweep`) of those
  experiments: every experiment's models are checked and logged as a row of its own (with
  its ``row`` fields, under its TensorBoard run), divergence errors name the experiment, the
  summaries are keyed ``"<model>@<e>"`` (:func:`fedtree.core.sweep.by_experiment` splits them)
  and no ``report`` is made.
  """
  if eval_every < 1:
    raise ValueError(f"eval_every={eval_every} must be >= 1")
  if rounds_per_call < 1:
    raise ValueError(f"rounds_per_call={rounds_per_call} must be >= 1")
  positive = positive_classes_from_config(ctx.config, ctx.data.num_classes)
  opts = evaluation_options(ctx.config, num_classes=ctx.data.num_classes,
                            has_central=ctx.central_test is not None,
                            has_local=int(np.asarray(ctx.data.n_test).sum()) > 0)
  scoring = {"ignore_labels": opts.ignore_labels, "top_k": opts.top_k}
  evaluator = make_evaluator(ctx.model, ctx.config.get("eval_chunk_size", None),
                             confusion=positive is not None, **scoring)
  central = None
  if opts.central:
    assert ctx.central_test is not None  # evaluation_options checked it
    central = tuple(jnp.asarray(a) for a in central_blocks(*ctx.central_test))
  evaluator_for = None
  if adapters is not None:
    from fedtree.core.lora import base_evaluator

    evaluator_for = base_evaluator(ctx.model, adapters, ctx.config.get("eval_chunk_size", None),
                                   confusion=positive is not None, **scoring)
  state = algorithm.init(loop.init_key(key))
  initial = model_fingerprints(algorithm.models(state))
  ckpt = None
  if checkpoint_dir and checkpoint_every:
    from fedtree.experiment.checkpoint import Checkpointer

    ckpt = Checkpointer(checkpoint_dir, every=checkpoint_every, keep=keep_checkpoints)
    restored = ckpt.restore(state, warn=reporter.print, check=lambda s: loop.diverged_part(s, max_abs))
    if restored is not None:
      state = restored
      reporter.print(f"{label}: resumed from the checkpoint of round {int(state.round)} in {checkpoint_dir}")
  summaries: dict[str, dict[str, Any]] = {}

  def flat(sm: dict[str, dict[str, Any]], suffix: str = "") -> dict[str, Any]:
    return {f"{name}/{m}{suffix}": v for name, s in sm.items() for m, v in round_metrics_of(s).items()}

  def evaluate(s, r):
    nonlocal summaries
    summaries = evaluation.evaluate_models(
      algorithm, s, ctx.model, ctx.run_data, groups=ctx.groups,
      evaluator=evaluator if evaluator_for is None else evaluator_for(s.base),
      positive_classes=positive, backdoor=backdoor, top_k=opts.top_k, central=central,
    )
    if experiments is None:
      check_summaries(label, r, summaries)
      return flat(summaries)
    row = {}
    for e, (exp, sm) in enumerate(zip(experiments, by_experiment(summaries, len(experiments)), strict=True)):
      check_summaries(f"{label}[{exp.name}]", r, sm)
      row.update(flat(sm, f"@{e}"))
    return row

  t0 = time.perf_counter()
  # bytes on every edge, per experiment of a sweep (each its own compressor settings)
  traffics = [Traffic(message_bytes(ctx.model, adapters)) for _ in (experiments or [None])]

  def count(first_round, metrics):
    if experiments is None:
      traffics[0].add_rounds(first_round, metrics)
      return
    for t, m in zip(traffics, by_experiment(metrics, len(experiments)), strict=True):
      t.add_rounds(first_round, m)

  def log(r, host):
    host = {**host, "elapsed_s": time.perf_counter() - t0}
    if experiments is None:
      extra = round_metrics(r) if round_metrics is not None else {}
      reporter.log(label, r, {**host, **extra, **traffics[0].row()})
      return
    for exp, t, row in zip(experiments, traffics, by_experiment(host, len(experiments)), strict=True):
      extra = exp.round_metrics(r) if exp.round_metrics is not None else {}
      reporter.log(label, r, {**row, "elapsed_s": host["elapsed_s"], **extra, **t.row(), **exp.row},
                   tensorboard_run=exp.tensorboard_run)

  def name_row(e):  # rows past the experiments pad the last chunk of a sweep: they repeat its last
    return experiments[min(e, len(experiments) - 1)].name

  def save(s, r):
    ckpt.maybe_save(s, force=r == num_rounds)

  reporter.start_run(label, num_rounds, from_round=int(state.round))
  if int(state.round):   # resumed: the bytes of the rounds before, from the row of that round
    for e, t in enumerate(traffics):
      row = reporter.row(label, int(state.round),
                         None if experiments is None else {"experiment": experiments[e].row["experiment"]})
      if row is not None:
        t.restore(row)
  try:
    state = loop.run(
      algorithm, ctx.run_data, num_rounds=num_rounds, key=key, rounds_per_call=rounds_per_call,
      state=state, eval_every=eval_every, on_eval=evaluate, on_metrics=log,
      on_rounds=count,
      on_call=save if ckpt is not None else None, should_stop=should_stop, label=label,
      name_row=name_row if experiments is not None else None,
      max_abs=max_abs,
    )
    if int(state.round) < num_rounds:
      raise RunStopped(f"{'run' if experiments is None else 'sweep'} {label!r} stopped at round "
                       f"{int(state.round)} of {num_rounds}"
                       f"{kept_on_stop(ckpt, state)}")
  finally:
    if ckpt is not None:
      ckpt.close()
    reporter.end_run(label)
  if not summaries:  # resumed a finished run: evaluate once
    evaluate(state, int(state.round))
  if algorithm.report is not None and experiments is None:
    # a report reads its state and data on the host: this process's copies (gathered when the
    # state spans processes)
    rep = algorithm.report(local_copy(state), ctx.data, key, summaries)
    if rep.text:
      reporter.result(rep.text)
    reporter.write_files(rep.files)
    summaries = rep.summaries
  final = model_fingerprints(algorithm.models(state))
  for name, s in summaries.items():  # a model still at its initial parameters is not a result
    if name in initial and name in final:
      s["trained"] = bool(final[name] != initial[name])
  if round_metrics is not None:
    summaries = {name: {**s, **round_metrics(int(state.round))} for name, s in summaries.items()}
  if experiments is None and traffics[0].counted:   # every model of the run: the run's traffic
    summaries = {name: {**s, **traffics[0].summary()} for name, s in summaries.items()}
  elif experiments is not None:   # "<model>@<e>": experiment e's traffic (padding rows: none)
    def with_bytes(name: str, s: dict[str, Any]) -> dict[str, Any]:
      _, sep, e = name.rpartition("@")
      ok = sep and e.isdigit() and int(e) < len(traffics) and traffics[int(e)].counted
      return {**s, **traffics[int(e)].summary()} if ok else s

    summaries = {name: with_bytes(name, s) for name, s in summaries.items()}
  return state, summaries


_TOPK = re.compile(r"(central_)?top\d+_accuracy")


def round_metrics_of(summary: dict[str, Any]) -> dict[str, Any]:
  """What a model's evaluation puts in its ``metrics.jsonl`` row: the :data:`SUMMARY_METRICS` it
  has, and the spread of its per-client metric (``fairness``,
  :func:`fedtree.core.metrics.client_distribution`) as ``<metric>_<stat>``, e.g.
  ``accuracy_p10``, ``accuracy_worst10_mean``, ``accuracy_gini`` (``perplexity_...`` for a
  language model): fairness over rounds, in the rows and TensorBoard; and its top-k accuracies
  (``top5_accuracy``, ``central_top5_accuracy``: ``config.metrics.top_k``)."""
  out = {m: summary[m] for m in SUMMARY_METRICS if m in summary}
  out.update({m: v for m, v in summary.items() if _TOPK.fullmatch(m)})
  fair = summary.get("fairness", None)
  if isinstance(fair, dict) and fair.get("clients"):
    out.update({f"{fair['metric']}_{k}": fair[k] for k in FAIRNESS_STATS if k in fair})
  return out


def message_bytes(model, adapters=None) -> int:
  """The bytes of one model a node sends uncompressed: the model's parameters, or with
  ``adapters`` (a :class:`~fedtree.core.lora.LoRA` spec) the adapters alone (the frozen base is on
  every client before round 0 and never sent). Nothing is allocated."""
  params = jax.eval_shape(model.init, jax.random.key(0))
  if adapters is not None:
    from fedtree.core.lora import init_adapters

    params = jax.eval_shape(lambda k: init_adapters(adapters, params, k), jax.random.key(0))
  return model_bytes(params)


def model_fingerprints(models: dict[str, Any]) -> dict[str, tuple[float, ...]]:
  """``{name: (sum, sum of squares) of every leaf}`` of ``algorithm.models(state)``: equal
  before and after a run when the model never changed (e.g. the root of a tree whose root
  never aggregated within the run)."""
  out = {}
  for name, params in models.items():
    leaves = [jnp.asarray(x, jnp.float32) for x in jax.tree.leaves(params)]
    out[name] = tuple(float(v) for x in leaves for v in (jnp.sum(x), jnp.sum(x * x)))
  return out


def worst_tenth(summaries: dict[str, dict[str, Any]]) -> dict[str, float]:
  """``{"<model>/<metric>_worst10_mean": value}``: every model's mean over its worst 10 % of clients
  (:func:`fedtree.core.metrics.client_distribution`), the fairness figure a sweep's table keeps."""
  out = {}
  for m, v in summaries.items():
    fair = v.get("fairness", None)
    if isinstance(fair, dict) and fair.get("clients"):
      out[f"{m}/{fair['metric']}_worst10_mean"] = fair["worst10_mean"]
  return out


class SweepPlan(NamedTuple):
  """Run ``label``'s sweep, resolved and checked before anything trains or is written
  (:func:`plan_sweep`); :func:`run_sweep` runs it.

  Attributes:
    shown: every setting as the config gives it (rows, names and the table).
    settings: every setting as the builder traces it (a target ε calibrated to its noise).
    exps: ``(setting index, seed)`` of every experiment.
    build: the builder of one experiment (:func:`fedtree.experiment.sweep.config_builder`).
    explain: what a builder's trace error becomes (:func:`fedtree.experiment.sweep.explain`).
    spent: per setting, its ε after ``r`` rounds (host), or ``None`` without privacy.
    num_rounds: the rounds of every experiment.
    size: experiments per compiled call (``config.sweep.chunk``).
    note: the memory line of a chunk (:meth:`fedtree.experiment.memory.Budget.check`), or ``""``.
  """

  shown: list[dict[str, float]]
  settings: list[dict[str, float]]
  exps: list[tuple[int, int]]
  build: Callable
  explain: Callable
  spent: list | None
  num_rounds: int
  size: int
  note: str

  @property
  def chunks(self) -> list[list[int]]:
    """The experiments of every compiled call, ``size`` at a time."""
    n = len(self.exps)
    return [list(range(k, min(k + self.size, n))) for k in range(0, n, self.size)]

  def stacked(self, chunk: list[int], algo_name: str) -> FederatedAlgorithm:
    """The experiments ``chunk`` as one algorithm (:func:`fedtree.core.sweep.sweep`)."""
    paths = sorted(self.settings[0])
    return stacked_sweep(self.build, {p: [self.settings[self.exps[x][0]][p] for x in chunk] for p in paths},
                         [self.exps[x][1] for x in chunk], name=f"{algo_name}[sweep]",
                         explain=self.explain, pad_to=self.size)


def plan_sweep(label: str, run_cfg: ml_collections.ConfigDict, ctx: Context, *,
               budget: memory.Budget | None = None, trace: bool = True) -> SweepPlan:
  """Run ``label``'s sweep (the settings x seeds of ``config.sweep``) resolved and checked:
  every setting built with Python values, a fixed-length composition refused, the memory of a
  chunk checked against ``budget`` and, with ``trace``, the first chunk's stacked program traced
  (:func:`trace_rounds`: what a builder refuses only for a traced value, such as a swept top-k
  fraction). Nothing is compiled or written."""
  from fedtree.experiment import sweep
  from fedtree.experiment.registry import build_algorithm

  config = ctx.config
  shown = sweep.settings_of(config, label)   # as given: rows, names and the table
  config, settings = sweep.calibrated(config, label, shown, ctx)   # what the builder traces
  n_seeds = int(config.sweep.get("seeds", 1) or 1)
  seed0 = int(config.seed)
  exps = [(i, seed0 + j) for i in range(len(settings)) for j in range(n_seeds)]
  build = sweep.config_builder(config, label, ctx, build_algorithm)
  first = build(settings[0])  # Python values: early errors, before anything is traced
  for s in settings[1:]:
    build(s)
  algo_name = str(run_cfg.algorithm)
  if first.rounds is not None:
    raise ValueError(
      f"run {label!r} (algorithm {algo_name!r}) is a fixed-length composition of stages "
      "(fedtree.core.algorithm.sequential); a sweep cannot stack it yet: sweep it as separate runs"
    )
  spent = sweep.privacy_metrics(config, label, settings, ctx)   # ε per setting (host), or None
  num_rounds = int(run_cfg.get("rounds", config.rounds))
  size = sweep.chunk_size(config, len(exps), ctx)
  note = ""
  if budget is not None:  # the stacked state and working set of a chunk of experiments, before compiling
    shapes = jax.eval_shape(first.init, loop.init_key(jax.random.key(seed0)))
    note = budget.check(label, shapes, ctx.chunk_size(run_cfg), experiments=size,
                        chunk_name="sweep.chunk" if size > 1 else "chunk_size")
  plan = SweepPlan(shown=shown, settings=settings, exps=exps, build=build,
                   explain=sweep.explain(label, algo_name, sorted(settings[0])), spent=spent,
                   num_rounds=num_rounds, size=size, note=note)
  if trace:
    trace_rounds(plan.stacked(plan.chunks[0], algo_name), ctx.run_data, jax.random.key(seed0),
                 num_rounds=num_rounds, config=config)
  return plan


def trace_rounds(algorithm: FederatedAlgorithm, data: FederatedData, key: jax.Array, *,
                 num_rounds: int, config: ml_collections.ConfigDict) -> None:
  """Traces, without compiling or running, the first compiled call :func:`fedtree.core.loop.run`
  makes for ``algorithm`` (the same jitted function, from the loop's cache, so the run does not
  trace it again): whatever a round refuses only while it is traced (a multi-Krum ``f`` too large
  for the cohort, a swept value that must be a constant) is raised here, before the workdir is
  written."""
  n = max(1, min(int(config.rounds_per_call), int(config.eval_every), int(num_rounds) or 1))
  state = jax.eval_shape(algorithm.init, loop.init_key(key))
  step = loop.compile_rounds(algorithm, n, check_state=True, max_abs=divergence_bound(config))
  step.trace(state, data, key)


def run_sweep(label: str, run_cfg: ml_collections.ConfigDict, ctx: Context, reporter: Reporter, *,
              workdir: str | None, should_stop=None, budget: memory.Budget | None = None,
              backdoor=None, plan: SweepPlan | None = None) -> dict[str, Any]:
  """Every experiment of run ``label`` (the settings x seeds of ``config.sweep``,
  :mod:`fedtree.experiment.sweep`) as stacked programs (:func:`fedtree.core.sweep.sweep`),
  chunk after chunk (``config.sweep.chunk``, one compile), each run by :func:`run_algorithm`
  like a single run (``plan``: the sweep as :func:`plan_sweep` checked it; default: planned
  here, the memory of a chunk checked against ``budget``). Logs a
  ``metrics.jsonl`` row per experiment and evaluation round (with ``setting`` and ``seed``),
  prints the mean ± std table, writes the PNG and returns the run's ``summary.json`` entry
  (rows per setting and the best by ``config.sweep.select``). ``backdoor``: as
  :func:`run_algorithm`'s (every experiment's ``attack_success_rate`` in its rows)."""
  from fedtree.experiment import sweep

  config = ctx.config
  if plan is None:
    plan = plan_sweep(label, run_cfg, ctx, budget=budget, trace=False)
  shown, settings, exps = plan.shown, plan.settings, plan.exps
  if settings is not shown:
    reporter.print(f"privacy: {label}'s noise multipliers calibrated per setting: " + ", ".join(
      f"{sweep.setting_name(a)}: z={b[f'runs.{label}.privacy.noise_multiplier']:.4f}"
      for a, b in zip(shown, settings, strict=True)))
  if plan.note:
    reporter.print(plan.note)
  algo_name = str(run_cfg.algorithm)
  seed0 = int(config.seed)
  every = int(config.get("checkpoint_every", 0) or 0)
  chunks = plan.chunks
  finals: dict[int, dict[str, float]] = {}
  untrained: set[str] = set()
  spent = plan.spent
  for k, chunk in enumerate(chunks):
    name = label if len(chunks) == 1 else f"{label}#chunk{k}"
    stacked = plan.stacked(chunk, algo_name)
    experiments = [Experiment(
      name=f"experiment {x} (setting {sweep.setting_name(shown[exps[x][0]])}, seed {exps[x][1]})",
      row={"setting": shown[exps[x][0]], "seed": exps[x][1], "experiment": x},
      tensorboard_run=f"{label}/{sweep.setting_name(shown[exps[x][0]])}/seed{exps[x][1]}",
      round_metrics=None if spent is None else spent[exps[x][0]],
    ) for x in chunk]
    _, summaries = run_algorithm(
      stacked, ctx, jax.random.key(seed0), reporter, num_rounds=plan.num_rounds,
      eval_every=int(config.eval_every), rounds_per_call=int(config.rounds_per_call), label=name,
      checkpoint_dir=os.path.join(workdir, "checkpoints", name) if workdir and every else None,
      checkpoint_every=every, keep_checkpoints=int(config.get("keep_checkpoints", 2)),
      should_stop=should_stop, experiments=experiments, backdoor=backdoor,
      max_abs=divergence_bound(config),
    )
    for x, sm in zip(chunk, by_experiment(summaries, len(chunk)), strict=True):
      untrained.update(m for m, v in sm.items() if v.get("trained") is False)   # not a result
      finals[x] = {f"{m}/{s}": v[s] for m, v in sm.items() if v.get("trained") is not False
                   for s in SUMMARY_METRICS if s in v}
      finals[x].update(worst_tenth({m: v for m, v in sm.items() if v.get("trained") is not False}))
      finals[x].update({k: v for k, v in next(iter(sm.values()), {}).items() if k in SWEEP_BYTES})
      if spent is not None and spent[exps[x][0]] is not None:   # ε of this setting (host)
        finals[x].update(spent[exps[x][0]](plan.num_rounds))
  per_setting = [[finals[x] for x, (i, _) in enumerate(exps) if i == s] for s in range(len(settings))]
  rows = sweep.aggregate(shown, per_setting)
  select = str(config.sweep.get("select", "global/accuracy"))
  reporter.result(sweep.format_table(label, rows))
  if untrained:
    reporter.result(f"(left out, never trained within the run: its parameters are still the initial "
                    f"ones: {', '.join(f'{label} {m}' for m in sorted(untrained))})")
  out = sweep.write_outputs(reporter.workdir, label, rows, select)  # None off process 0
  out["untrained"] = sorted(untrained)
  if out["best"] is not None:
    spread = f" ± {out['best']['std']:.4f}" if int(config.sweep.get("seeds", 1) or 1) > 1 else ""
    reporter.result(f"best setting of {label!r} by {select}: {out['best']['name']} "
                    f"({out['best']['mean']:.4f}{spread})")
  return {"sweep": out}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | None, *,
                       overwrite: bool = False, should_stop=None) -> dict[str, Any]:
  """Runs every run of ``config``; writes ``metrics.jsonl`` and ``summary.json`` to ``workdir``.

  A workdir remembers the fingerprint of its config (``fingerprint.json``; fields that do not
  change results, such as ``rounds`` or ``progress``, are left out, so a run can be extended):
  a different config is refused unless ``overwrite``, which clears the workdir's metrics,
  checkpoints and summaries first. ``should_stop`` (polled after every compiled call) stops
  the run cleanly (:class:`RunStopped`). Returns ``{run label: {model name: summary}}``.

  Example:
    One round of FedAvg on 5 synthetic clients (the final table goes to stdout):

    >>> import tempfile
    >>> import ml_collections
    >>> config = ml_collections.ConfigDict(dict(
    ...   seed=0, rounds=1, eval_every=1, rounds_per_call=1, progress=False, plots=False,
    ...   data=dict(name="grouped_synthetic", group_sizes=(3, 2), dim=8, num_classes=3),
    ...   topology=dict(kind="groups"), model=dict(name="logreg"),
    ...   local=dict(optimizer="sgd", learning_rate=0.1, batch_size=8, steps=1),
    ...   runs=dict(fedavg=dict(algorithm="fedavg"))))
    >>> results = train_and_evaluate(config, tempfile.mkdtemp())
    <BLANKLINE>
    Final evaluation ...
    >>> sorted(results["fedavg"])
    ['global']
  """
  config = prepare_config(config)
  validate_config(config)
  with precision(config):
    return _train_and_evaluate(config, workdir, overwrite=overwrite, should_stop=should_stop)


def prepare_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of ``config`` with every runner field declared (defaults for those it omits,
  :func:`fedtree.experiment.fields.declare_runner_fields`) and the number-or-name fields read
  (``chunk_size="8"`` -> 8): what the runner, the workdir's ``config.json`` and the fingerprint
  see, whether the config came from a file, the command line or Python."""
  import copy

  from fedtree.experiment.fields import NUMBER_OR_NAME, declare_runner_fields

  if isinstance(config, ml_collections.FrozenConfigDict):
    config = ml_collections.ConfigDict(config)
  config = copy.deepcopy(config)
  config.unlock()
  declare_runner_fields(config)
  with config.ignore_type():
    for name in NUMBER_OR_NAME:
      config[name] = number_or_name(config[name])
  return config


def _train_and_evaluate(config, workdir, *, overwrite, should_stop) -> dict[str, Any]:
  from fedtree.experiment import sweep
  from fedtree.experiment.registry import adapters_from_config, build_algorithm

  swept = sweep.sweep_config(config) is not None
  # Several processes (--multihost) run this same function: all of them train and check the
  # workdir, process 0 alone writes rows, tables, summary and plots (checkpoints are written
  # by all, each its shards, through orbax).
  primary = jax.process_index() == 0
  should_stop = agreed(should_stop)   # a signal that reached one process stops all at one round
  if workdir:  # a workdir of another config is refused before the data are loaded
    check_workdir(workdir, config, overwrite=overwrite)
  ctx = make_context(config)
  mesh = None
  if config.get("mesh_shape", None) is not None:  # the client axis over devices (fedtree.core.sharding)
    mesh = client_mesh(config.mesh_shape)
    ctx = dataclasses.replace(ctx, sharded_data=shard_data(ctx.data, mesh))
  root = jax.random.key(int(config.seed))
  budget = memory.Budget.of(ctx)
  runs = selected_runs(config)
  # Every run (and every setting of a sweep) is built, its memory checked and its first compiled
  # call traced (not compiled) before the first one trains or anything is written: a bad value in
  # the last run, or one a round refuses only while it is traced, is refused up front.
  pretraining = None
  if config.get("pretrain", None) is not None:   # checked and its text read; trained below
    from fedtree.experiment.pretrain import prepare_pretrain

    pretraining = prepare_pretrain(ctx)
  positive_classes_from_config(config, ctx.data.num_classes)
  built: dict[str, Any] = {}
  notes: dict[str, str] = {}
  plans: dict[str, SweepPlan] = {}
  with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
    for label, run_cfg in runs:
      run_ctx, _ = _poisoned(ctx, run_cfg, mesh)
      if swept:
        plans[label] = plan_sweep(label, run_cfg, run_ctx, budget=budget)
        continue
      algorithm = build_algorithm(label, run_cfg, run_ctx)
      notes[label] = budget.check(label, jax.eval_shape(algorithm.init, loop.init_key(root)),
                                  ctx.chunk_size(run_cfg), block=block_estimate(run_cfg, ctx, label),
                                  extra_data_bytes=memory.copied_bytes(run_ctx.data, ctx.data))
      adapters_from_config(label, run_cfg)
      privacy.round_metrics(label, run_cfg, ctx)
      rounds = algorithm.rounds if algorithm.rounds is not None else run_cfg.get("rounds", config.rounds)
      trace_rounds(algorithm, run_ctx.run_data, root, num_rounds=int(rounds), config=config)
      built[label] = algorithm
  if workdir:
    # every process reads the workdir before process 0 writes it (all refuse alike), and
    # none opens it before process 0 has prepared it
    barrier("fedtree: workdir checked")
    if primary:
      write_workdir(workdir, config, overwrite=overwrite)
    barrier("fedtree: workdir prepared")
  reporter = Reporter(workdir, show_progress=config.get("progress", True)) if primary else Reporter.silent()
  if workdir:
    reporter.print(f"fedtree: workdir {os.path.abspath(workdir)}")
  else:
    reporter.print("warning: no workdir given: metrics, checkpoints and the summary are not saved "
                   "(pass --workdir=DIR)")
  results: dict[str, Any] = {}
  if config.get("pretrain", None) is not None:  # a pretrained base, trained now (issue 26)
    from fedtree.experiment.pretrain import pretrain_context

    ctx, results["pretrained"] = pretrain_context(ctx, reporter.print, prepared=pretraining)
    built.clear()   # the runs start from the pretrained base: built again on it below
    plans.clear()
    budget = memory.Budget.of(ctx)
  try:
    for label, run_cfg in runs:
      run_ctx, backdoor = _poisoned(ctx, run_cfg, mesh)
      if swept:  # settings x seeds of this run as one program (fedtree.experiment.sweep)
        with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
          results[label] = run_sweep(label, run_cfg, run_ctx, reporter, workdir=workdir,
                                     should_stop=should_stop, budget=budget, backdoor=backdoor,
                                     plan=plans.pop(label, None))
        continue
      with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        algorithm = built.pop(label) if label in built else build_algorithm(label, run_cfg, run_ctx)
        reporter.print(notes.pop(label))
        rounds = algorithm.rounds if algorithm.rounds is not None else run_cfg.get("rounds", config.rounds)
        _, summaries = run_algorithm(
          algorithm, run_ctx, root, reporter, num_rounds=int(rounds),
          eval_every=int(config.eval_every), rounds_per_call=int(config.rounds_per_call),
          label=label,
          checkpoint_dir=os.path.join(workdir, "checkpoints", label) if workdir else None,
          checkpoint_every=int(config.get("checkpoint_every", 0) or 0),
          keep_checkpoints=int(config.get("keep_checkpoints", 2)), should_stop=should_stop,
          round_metrics=privacy.round_metrics(label, run_cfg, run_ctx),
          adapters=adapters_from_config(label, run_cfg),
          backdoor=backdoor,
          max_abs=divergence_bound(config),
        )
      results[label] = summaries
    if not swept:
      reporter.summary_table(results, groups=ctx.groups, group_names=ctx.group_names)
    elif len(results) > 1:   # the runs side by side: every model's mean ± std over seeds
      reporter.result(sweep.runs_table(results))
    if workdir and primary:
      tmp = os.path.join(workdir, "summary.json.tmp")
      with open(tmp, "w") as f:
        json.dump(_jsonable(results), f, indent=2)
      os.replace(tmp, os.path.join(workdir, "summary.json"))
      _write_plots(workdir, config, reporter)
    if workdir and primary:
      reporter.print(workdir_listing(workdir))
  finally:
    reporter.close()
  return results


def divergence_bound(config: ml_collections.ConfigDict) -> float | None:
  """``config.divergence_bound`` (default :data:`fedtree.core.loop.DIVERGENCE_BOUND`; ``None``: no
  bound, finiteness only)."""
  bound = config.get("divergence_bound", loop.DIVERGENCE_BOUND)
  return None if bound is None else float(bound)


def _poisoned(ctx: Context, run_cfg, mesh) -> tuple[Context, Any]:
  """The context run ``run_cfg`` trains in (its own data and model, :func:`run_context`; its
  attackers' data poisoned when its ``attack`` is a data attack,
  :func:`fedtree.experiment.robust.poisoned_data`) and its backdoor test split."""
  own = run_context(ctx, run_cfg)
  if own is not ctx and mesh is not None:
    own = dataclasses.replace(own, sharded_data=shard_data(own.data, mesh))
  ctx = own
  data, backdoor = poisoned_data(run_cfg, ctx)
  if data is ctx.data:
    return ctx, None
  data = as_device(data)
  sharded = shard_data(data, mesh) if mesh is not None else None
  return dataclasses.replace(ctx, data=data, sharded_data=sharded), backdoor


PLOT_EXTRA = 'pip install -e ".[plot]"'
"""What installs the optional plotting library (matplotlib)."""


def _write_plots(workdir: str, config: ml_collections.ConfigDict, reporter: Reporter) -> None:
  """The run's pictures (``plot_*.png``, :func:`fedtree.evaluation.plots.write_run_plots`) in
  ``workdir``, after the results are written; skipped with one line naming the extra to install
  when matplotlib is absent (or cannot be imported), and when ``config.plots`` is False."""
  import importlib.util

  if not config.get("plots", True):
    return
  missing = f"note: matplotlib is not installed, so no plot_*.png ({PLOT_EXTRA})"
  if importlib.util.find_spec("matplotlib") is None:
    reporter.print(missing)
    return
  from fedtree.evaluation.plots import write_run_plots

  try:
    written = write_run_plots(workdir)
  except ImportError as e:   # a broken install: the results are written, the pictures are not
    reporter.print(f"{missing}: {e}")
    return
  if written:
    reporter.print("plots: " + ", ".join(os.path.abspath(p) for p in written))


def workdir_listing(workdir: str) -> str:
  """What ``workdir`` holds, one full path a line (folders with a trailing ``/``): the results
  of every run of the config, its metrics, summaries, reports, plots, checkpoints."""
  root = os.path.abspath(workdir)
  names = sorted(os.listdir(root))
  lines = [f"fedtree: the workdir {root} holds:"]
  for name in names:
    if name.endswith(".tmp"):
      continue
    path = os.path.join(root, name)
    lines.append(f"  {path}{'/' if os.path.isdir(path) else ''}")
  return "\n".join(lines)


FINGERPRINT_IGNORES = ("rounds", "progress", "checkpoint_every", "keep_checkpoints", "eval_chunk_size",
                       "rounds_per_call", "run_order", "plots", "memory_limit_bytes", "mesh_shape",
                       "only", "divergence_bound")
"""Top-level config fields that do not change a run's results (left out of its fingerprint)."""


def config_fingerprint(config: ml_collections.ConfigDict) -> str:
  """A hash of everything in ``config`` that changes results."""
  import hashlib

  d = json.loads(config.to_json_best_effort(sort_keys=True))
  for k in FINGERPRINT_IGNORES:
    d.pop(k, None)
  return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


WORKDIR_OUTPUTS = ("metrics.jsonl", "summary.json", "checkpoints", "tensorboard", "fingerprint.json")


def prepare_workdir(workdir: str, config: ml_collections.ConfigDict, *, overwrite: bool) -> None:
  """Creates ``workdir``, refuses one that holds a different config's run (unless
  ``overwrite``: its outputs are removed), and records the config and its fingerprint:
  :func:`check_workdir`, then :func:`write_workdir`."""
  check_workdir(workdir, config, overwrite=overwrite)
  write_workdir(workdir, config, overwrite=overwrite)


def check_workdir(workdir: str, config: ml_collections.ConfigDict, *, overwrite: bool) -> None:
  """Raises ``ValueError`` for a ``workdir`` that is a file, or that holds a run of a different
  config (its ``fingerprint.json``) unless ``overwrite``. Reads only."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f"--workdir={workdir} is a file, not a folder")
  path = os.path.join(workdir, "fingerprint.json")
  new = config_fingerprint(config)
  old = None
  if os.path.exists(path):
    try:
      with open(path) as f:
        old = json.load(f).get("fingerprint")
    except (OSError, ValueError):
      old = "unreadable"
  if old is not None and old != new and not overwrite:
    keys = _difference_keys(workdir, config)
    if keys == []:  # the same config, fingerprinted before a runner field was added: resumable
      return
    raise ValueError(
      f"--workdir={workdir} holds a run of a different config ({_describe(workdir, config, keys)}; "
      f"fingerprint {old}, this config {new}); resuming would mix the two. Use another "
      "--workdir, or --overwrite to delete its results and start fresh"
    )


def _flat(d, prefix="config") -> dict[str, Any]:
  if isinstance(d, dict):
    out = {}
    for k, v in d.items():
      out.update(_flat(v, f"{prefix}.{k}"))
    return out
  return {prefix: d}


ABSENT = "<absent>"


def _runner_default(key: str):
  from fedtree.experiment.fields import LOCAL_FIELDS, RUNNER_FIELDS

  parts = key.split(".")
  if len(parts) == 2 and parts[1] in RUNNER_FIELDS:
    return RUNNER_FIELDS[parts[1]][1]
  if len(parts) == 3 and parts[1] == "local" and parts[2] in LOCAL_FIELDS:
    return LOCAL_FIELDS[parts[2]][1]
  return ABSENT


def _same(key: str, a, b) -> bool:
  """``a`` (the workdir's ``config.json``) and ``b`` (this config) at ``key`` are the same
  setting: equal (1 and 1.0 alike, not True and 1), absent and None, or absent and the default
  of a runner field added since (:mod:`fedtree.experiment.fields`)."""
  if a == b and isinstance(a, bool) == isinstance(b, bool):
    return True
  if {type(a), type(b)} <= {type(None), str} and {a, b} <= {None, ABSENT}:
    return True
  return a == ABSENT and b == _runner_default(key)


def _difference_keys(workdir: str, config: ml_collections.ConfigDict) -> list[str] | None:
  """The result-changing fields in which ``config`` differs from the workdir's ``config.json``
  (``None``: that file is missing or unreadable)."""
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      old = _flat(json.load(f))
  except (OSError, ValueError):
    return None
  new = _flat(json.loads(config.to_json_best_effort()))
  ignored = {f"config.{k}" for k in FINGERPRINT_IGNORES}
  return sorted(k for k in set(old) | set(new)
                if not _same(k, old.get(k, ABSENT), new.get(k, ABSENT))
                and not any(k == i or k.startswith(i + ".") for i in ignored))


def _describe(workdir: str, config: ml_collections.ConfigDict, keys: list[str] | None) -> str:
  """``keys`` as ``run 'hierfavg': config.runs.hierfavg.periods is [10] there, [3] here; ...``."""
  if keys is None:
    return "its config.json is missing or unreadable"
  if not keys:
    return "see its config.json"
  with open(os.path.join(workdir, "config.json")) as f:
    old = _flat(json.load(f))
  new = _flat(json.loads(config.to_json_best_effort()))
  parts = []
  for k in keys[:3]:
    run = k.split(".")[2] if k.startswith("config.runs.") else None
    where = f"run {run!r}: " if run else ""
    parts.append(f"{where}{k} is {old.get(k, ABSENT)!r} there, {new.get(k, ABSENT)!r} here")
  more = f" and {len(keys) - 3} more fields" if len(keys) > 3 else ""
  return "; ".join(parts) + more


def write_workdir(workdir: str, config: ml_collections.ConfigDict, *, overwrite: bool) -> None:
  """Creates ``workdir`` (removing its outputs first when ``overwrite``) and writes the
  config and its fingerprint."""
  import shutil

  os.makedirs(workdir, exist_ok=True)
  if overwrite:
    for name in WORKDIR_OUTPUTS:
      p = os.path.join(workdir, name)
      if os.path.isdir(p):
        shutil.rmtree(p)
      elif os.path.exists(p):
        os.remove(p)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
  with open(os.path.join(workdir, "fingerprint.json"), "w") as f:
    json.dump({"fingerprint": config_fingerprint(config), "ignored_fields": list(FINGERPRINT_IGNORES)}, f)


def ordered_runs(config: ml_collections.ConfigDict) -> list[tuple[str, ml_collections.ConfigDict]]:
  """``config.runs`` in ``config.run_order`` (a sequence of labels), else alphabetically (a
  ConfigDict does not keep insertion order)."""
  order = config.get("run_order", None)
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
  only = config.get("only", None)
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

  for field in ("seed", "rounds", "eval_every", "data", "topology", "model", "local", "runs"):
    if field not in config:
      raise ValueError(f"config has no field {field!r}; see configs/quickstart.py for a full config")
  if int(config.rounds) < 0:
    raise ValueError(f"config.rounds={config.rounds} must be >= 0")
  for field, low in (("eval_every", 1), ("rounds_per_call", 1), ("checkpoint_every", 0),
                     ("keep_checkpoints", 1)):
    value = config.get(field, low)
    if value is None or int(value) < low:
      raise ValueError(f"config.{field}={value!r} must be an int >= {low}")
  check_values(config)
  bound = config.get("divergence_bound", None)
  if bound is not None and not (isinstance(bound, (int, float)) and not isinstance(bound, bool)
                                and np.isfinite(bound) and bound > 0):
    raise ValueError(f"config.divergence_bound={bound!r} must be a finite number > 0 (the largest "
                     "|value| a state may hold), or None for no bound")
  from fedtree.experiment.fields import DTYPES

  if str(config.get("dtype", "float32")) not in DTYPES:
    raise ValueError(f"config.dtype={config.get('dtype')!r}; choose one of {DTYPES}")
  if len(config.runs) == 0:
    raise ValueError("config.runs is empty: name at least one run")
  selected_runs(config)
  validate_runs(config)
  from fedtree.experiment.sweep import validate as validate_sweep

  validate_sweep(config)


def _jsonable(obj):
  if isinstance(obj, dict):
    return {str(k): _jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_jsonable(v) for v in obj]
  if isinstance(obj, (np.ndarray, jnp.ndarray)):
    return _jsonable(np.asarray(obj).tolist())
  if isinstance(obj, (np.floating, float)):
    return None if not np.isfinite(obj) else float(obj)
  if isinstance(obj, np.integer):
    return int(obj)
  return obj
