"""From a config to results: data, tree, model, every run of the config, reports.

``train_and_evaluate(config, workdir)`` is what ``python -m fedtree.main`` calls. A config
names the data, the tree, the model, the local training and one or more *runs*
(``config.runs.<label>``), each an algorithm from :data:`fedtree.algorithms.BUILDERS` with
its hyperparameters; all runs see the same data, tree, initial model and seed, and the
final table compares them.

A builder returns either a :class:`~fedtree.core.algorithm.FederatedAlgorithm` (run here
round by round, with periodic evaluation) or a :class:`Pipeline`, an object with its own
``run(context, key, reporter) -> {model_name: summary}`` (multi-stage methods such as
GroupPerFL).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from fedtree import evaluation
from fedtree.core import loop, tuning
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.data import FederatedData, as_device
from fedtree.core.local import LocalSchedule
from fedtree.core.metrics import make_evaluator
from fedtree.core.topology import Topology
from fedtree.experiment.builders import local_optimizer_from_config, schedule_from_config
from fedtree.experiment.reporting import Reporter
from fedtree.models import Model, build_model


@dataclasses.dataclass(frozen=True)
class Context:
  """Everything a builder needs, shared by all runs of a config.

  Attributes:
    config: the whole config.
    data: device-resident federated data.
    groups: ``int[C]`` group (level-1 node) of every client, for per-group reports.
    topology: the tree.
    model: the model.
    local_optimizer: the clients' optax optimizer (``config.local``).
    schedule: local epochs/steps and batch size (``config.local``).
    central_test: ``(x, y)`` of a central test set when the data has one, else ``None``.
    auto_chunk: what ``chunk_size="auto"`` means for this model (a
      :func:`fedtree.core.tuning.chunk_policy`; ``None``: the per-backend default).
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

  def chunk_size(self, run: ml_collections.ConfigDict | None = None):
    """The chunk size of ``run`` (its ``chunk_size``, else the config's, else ``"auto"``),
    with ``"auto"`` sized for this model."""
    value = self.config.get("chunk_size", "auto")
    if run is not None:
      value = run.get("chunk_size", value)
    return self.auto_chunk if value == "auto" and self.auto_chunk is not None else value


class Pipeline(Protocol):
  """A multi-stage method that runs itself."""

  def run(self, ctx: Context, key: jax.Array, reporter: Reporter) -> dict[str, dict[str, Any]]: ...


# ------------------------------------------------------------------------ building blocks
def load_data(cfg: ml_collections.ConfigDict) -> tuple[FederatedData, np.ndarray, Any]:
  """``(data, group labels, central test or None)`` from ``config.data``."""
  from fedtree.experiment.data import load

  return load(cfg)


def build_topology(cfg: ml_collections.ConfigDict, groups: np.ndarray, num_clients: int) -> Topology:
  """``config.topology.kind``: ``groups`` (root -> data groups -> clients), ``flat``, or
  ``sizes`` (``config.topology.sizes``, nested)."""
  kind = cfg.kind
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
  raise ValueError(f"config.topology.kind={kind!r}; choose 'groups', 'flat' or 'sizes'")


def _to_nested(v):
  if isinstance(v, (list, tuple)):
    return [_to_nested(x) for x in v]
  return int(v)


def make_context(config: ml_collections.ConfigDict) -> Context:
  data, groups, central = load_data(config.data)
  topology = build_topology(config.topology, groups, data.num_clients)
  data.validate(topology)
  model_cfg = dict(config.model)
  name = model_cfg.pop("name")
  model = build_model(name, example_shape=data.example_shape, num_classes=data.num_classes, **model_cfg)
  local_optimizer = local_optimizer_from_config(config.local)
  schedule = schedule_from_config(config.local)
  return Context(
    config=config, data=as_device(data), groups=np.asarray(groups), topology=topology, model=model,
    local_optimizer=local_optimizer, schedule=schedule, central_test=central,
    auto_chunk=tuning.chunk_policy(model, local_optimizer, data.example_shape, schedule.batch_size),
  )


# ------------------------------------------------------------------------ running
def run_algorithm(
  algorithm: FederatedAlgorithm, ctx: Context, key: jax.Array, reporter: Reporter, *,
  num_rounds: int, eval_every: int, rounds_per_call: int, label: str,
  checkpoint_dir: str | None = None, checkpoint_every: int = 0,
) -> tuple[Any, dict[str, dict[str, Any]]]:
  """Rounds with evaluation every ``eval_every`` rounds; returns (state, final summaries).

  With ``checkpoint_dir`` and ``checkpoint_every > 0`` the state is saved every
  ``checkpoint_every`` rounds and at the end, and a run finds and resumes its latest
  checkpoint there.
  """
  if eval_every < 1:
    raise ValueError(f"eval_every={eval_every} must be >= 1")
  fuse = max(1, min(rounds_per_call, eval_every))
  if eval_every % fuse:
    raise ValueError(f"eval_every={eval_every} must be a multiple of rounds_per_call={fuse}")
  positive = positive_classes_from_config(ctx.config, ctx.data.num_classes)
  evaluator = make_evaluator(ctx.model, ctx.config.get("eval_chunk_size", None),
                             confusion=positive is not None)
  state = algorithm.init(loop.init_key(key))
  ckpt = None
  if checkpoint_dir and checkpoint_every:
    from fedtree.experiment.checkpoint import Checkpointer

    ckpt = Checkpointer(checkpoint_dir, every=checkpoint_every)
    if ckpt.latest_round() is not None:
      state = ckpt.restore(state)
      reporter.print(f"{label}: resumed from the checkpoint of round {int(state.round)} in {checkpoint_dir}")
  step = loop.compile_rounds(algorithm, fuse)
  summaries: dict[str, dict[str, Any]] = {}
  reporter.start_run(label, num_rounds)
  t0 = time.perf_counter()
  while int(state.round) < num_rounds:
    todo = min(fuse, num_rounds - int(state.round))
    if todo != fuse:
      step = loop.compile_rounds(algorithm, todo)
    state, metrics = step(state, ctx.data, key)
    r = int(state.round)
    losses = np.asarray(metrics["train_loss"])
    if not np.all(np.isfinite(losses)):
      raise loop.NonFiniteLossError(
        f"run {label!r}: training loss is {losses[~np.isfinite(losses)][0]} by round {r}; lower "
        f"config.local.learning_rate ({ctx.config.local.learning_rate}) or check the data"
      )
    host = {k: float(np.asarray(v)[-1]) for k, v in metrics.items()}
    if r % eval_every == 0 or r == num_rounds:
      summaries = evaluation.evaluate_models(
        algorithm, state, ctx.model, ctx.data, groups=ctx.groups, evaluator=evaluator,
        positive_classes=positive,
      )
      for name, s in summaries.items():
        for metric in ("accuracy", "loss", "false_accept_rate", "false_reject_rate",
                       "intra_cluster_accuracy", "inter_cluster_accuracy", "num_clusters",
                       "adjusted_rand_index"):
          if metric in s:
            host[f"{name}/{metric}"] = s[metric]
    host["elapsed_s"] = time.perf_counter() - t0
    reporter.log(label, r, host)
    if ckpt is not None:
      ckpt.maybe_save(state, force=r == num_rounds)
  if ckpt is not None:
    ckpt.close()
  if not summaries:  # resumed a finished run: evaluate once
    summaries = evaluation.evaluate_models(
      algorithm, state, ctx.model, ctx.data, groups=ctx.groups, evaluator=evaluator,
      positive_classes=positive,
    )
  reporter.end_run(label)
  return state, summaries


def positive_classes_from_config(config: ml_collections.ConfigDict, num_classes: int | None = None):
  """The keyword (positive) class mask of ``config.metrics`` (``class_names`` and
  ``negative_classes``, e.g. FedKWS-UI's silence and unknown), or ``None`` when the config
  asks for no false-accept/reject rates."""
  metrics = config.get("metrics", None)
  if metrics is None or metrics.get("negative_classes", None) is None:
    return None
  from fedtree.core.metrics import keyword_split

  if metrics.get("class_names", None) is None:
    raise ValueError("config.metrics.negative_classes needs config.metrics.class_names")
  mask = keyword_split(tuple(metrics.class_names), tuple(metrics.negative_classes))
  if num_classes is not None and len(mask) != num_classes:
    raise ValueError(
      f"config.metrics.class_names has {len(mask)} names but the data has {num_classes} classes"
    )
  return mask


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | None) -> dict[str, Any]:
  """Runs every run of ``config``; writes ``metrics.jsonl`` and ``summary.json`` to ``workdir``.

  Returns ``{run label: {model name: summary}}``.
  """
  from fedtree.experiment.registry import build_algorithm

  validate_config(config)
  if workdir:
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json_best_effort(indent=2))
  ctx = make_context(config)
  mesh = None
  if config.get("mesh_shape", None) is not None:  # the client axis over devices (fedtree.core.sharding)
    from fedtree.core.sharding import client_mesh, shard_data

    mesh = client_mesh(config.mesh_shape)
    ctx = dataclasses.replace(ctx, data=shard_data(ctx.data, mesh))
  reporter = Reporter(workdir, show_progress=config.get("progress", True))
  root = jax.random.key(int(config.seed))
  results: dict[str, Any] = {}
  for label, run_cfg in ordered_runs(config):
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
      built = build_algorithm(label, run_cfg, ctx)
      if isinstance(built, FederatedAlgorithm):
        _, summaries = run_algorithm(
          built, ctx, root, reporter, num_rounds=int(run_cfg.get("rounds", config.rounds)),
          eval_every=int(config.eval_every), rounds_per_call=int(config.rounds_per_call),
          label=label,
          checkpoint_dir=os.path.join(workdir, "checkpoints", label) if workdir else None,
          checkpoint_every=int(config.get("checkpoint_every", 0) or 0),
        )
      else:
        summaries = built.run(ctx, root, reporter)
    results[label] = summaries
  reporter.summary_table(results, groups=ctx.groups)
  if workdir:
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump(_jsonable(results), f, indent=2)
  reporter.close()
  return results


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


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Early, named errors for the common config mistakes."""
  from fedtree.experiment.registry import validate_runs

  for field in ("seed", "rounds", "eval_every", "data", "topology", "model", "local", "runs"):
    if field not in config:
      raise ValueError(f"config has no field {field!r}; see configs/quickstart.py for a full config")
  if int(config.rounds) < 0:
    raise ValueError(f"config.rounds={config.rounds} must be >= 0")
  if len(config.runs) == 0:
    raise ValueError("config.runs is empty: name at least one run")
  ordered_runs(config)
  validate_runs(config)


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
