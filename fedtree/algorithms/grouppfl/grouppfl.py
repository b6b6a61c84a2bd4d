"""Group personalized FL (Liu, Hui, Peng 2022, "Group personalized federated learning",
paper 000): global FL → group FL fine-tuning → local personalization.

Three composable stages, each a vectorized federated process:

1. :func:`global_stage` (Algorithm 1): ``T`` rounds of FedAdam over all clients, cohorts of
   ``|I_t|`` clients, ``K`` local epochs of SGD (the config's local schedule).
2. :func:`group_stage` (Algorithm 2): every group starts from the global model and runs
   ``T_g`` rounds of the same process restricted to its clients, **all groups at once**: the
   groups are the parents of one tier (:func:`group_fedopt`), each with its own FedAdam
   state, one jitted step per round, and no cross-group mixing (a group's model only ever
   sees its own clients' pseudo-gradients).
3. :func:`finetune_stage` (Algorithm 3): every client fine-tunes ``K_l`` epochs from a seed
   model at each rate of a sweep in one program (:mod:`fedtree.core.finetune`).

:class:`GroupPersonalizedFL` chains them as the config says (``stages``) and reads the four
compared methods off one run: FL (global model), PerFL (global + fine-tune), GroupFL (group
models) and GroupPerFL (group + fine-tune), each evaluated per client and per group. It
writes the paper's per-group table (Tables 3/6), the histogram of per-client relative change
GroupPerFL vs PerFL (Fig. 1) and the cost table (Table 4) into the workdir; the costs are the
counters the simulation kept (:mod:`fedtree.algorithms.grouppfl.costs`), not formulas.

Global FL is :func:`group_fedopt` with a single group, so the stages share one code path.
Cohorts: ``min(cohort_size, |g|)`` clients of every group per round (paper: 100).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms.grouppfl.costs import ClientCosts, counting
from fedtree.core import loop, metrics
from fedtree.core.algorithm import FederatedAlgorithm, NodeModels, TreeState, client_weights
from fedtree.core.data import FederatedData
from fedtree.core.finetune import best_rate, check_finetune, finetune_evaluate, take_rate
from fedtree.core.local import LocalSchedule, sgd_client_update
from fedtree.core.metrics import EvalStats, summarize
from fedtree.core.model import Model
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.core.server import update_nodes
from fedtree.core.tier import train_cohort

PyTree = Any

STAGES = ("global", "group", "finetune")
METHODS = ("FL", "PerFL", "GroupFL", "GroupPerFL")


def group_cohort_sizes(groups: np.ndarray, cohort_size: int | None) -> list[int]:
  """``min(cohort_size, |g|)`` for every group (``None``/-1: the whole group)."""
  sizes = np.bincount(np.asarray(groups), minlength=int(np.max(groups)) + 1)
  if np.any(sizes == 0):
    raise ValueError(f"group labels must be 0..G-1 with no empty group; sizes are {sizes.tolist()}")
  if cohort_size is None or int(cohort_size) == -1:
    return sizes.tolist()
  if int(cohort_size) < 1:
    raise ValueError(f"cohort_size={cohort_size} must be >= 1 (or -1 for every client)")
  return np.minimum(sizes, int(cohort_size)).tolist()


def group_fedopt(
  *,
  model: Model,
  groups: np.ndarray,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule,
  server_optimizer: optax.GradientTransformation,
  cohort_size: int | None = None,
  chunk_size: int | None = None,
  weighting: str = "examples",
  start_params: PyTree | None = None,
  name: str = "group_fedopt",
) -> FederatedAlgorithm:
  """FedOpt inside every group at once: one tier whose parents are the groups.

  The state is a :class:`TreeState` with ``params = (group models [G, ...],)``,
  ``opt_state = (one server state per group [G, ...],)`` and ``client_state = ((),
  ClientCosts)``. Every round each group samples its cohort, its clients train from the group
  model, and each group applies its own server optimizer to its own clients' mean
  pseudo-gradient. ``start_params`` (one model) seeds every group; ``None`` uses
  ``model.init``. With all ``groups`` equal to 0 this is FedOpt (paper 000, Algorithm 1).
  """
  groups = np.asarray(groups, np.int32)
  if groups.shape != (data.num_clients,):
    raise ValueError(
      f"groups has shape {groups.shape}; need one label per client ({data.num_clients})"
    )
  num_groups = int(groups.max()) + 1
  sampler = cohort_sampler(groups, group_cohort_sizes(groups, cohort_size), chunk_size=chunk_size)
  max_steps = schedule.max_steps(data.max_train)
  update = counting(
    sgd_client_update(model, local_optimizer, batch_size=schedule.batch_size, max_steps=max_steps),
    batch_size=schedule.batch_size, max_steps=max_steps,
  )
  client_weights(jnp.zeros(1), weighting)
  groups_j = jnp.asarray(groups)

  def init(key):
    p = model.init(key) if start_params is None else start_params
    params = jax.tree.map(lambda a: jnp.broadcast_to(a, (num_groups,) + a.shape), p)
    return TreeState(
      round=jnp.zeros((), jnp.int32), params=(params,),
      opt_state=(jax.vmap(server_optimizer.init)(params),),
      client_state=update.init_state(p, data.num_clients),
    )

  def round_fn(state: TreeState, data: FederatedData, key):
    cohort = sampler(stream(key, "cohort"))
    res = train_cohort(
      update, state.params[0], cohort, data, num_steps=schedule.num_steps(data.n_train),
      weights=client_weights(data.n_train, weighting), key=stream(key, "train"),
      chunk_size=sampler.chunk_size, parent_aligned=sampler.parent_aligned, client_state=state.client_state,
    )
    params, opt_state = update_nodes(
      server_optimizer, state.params[0], state.opt_state[0], res.pseudo_gradient(),
      res.weight_sum > 0,
    )
    metrics = {
      "train_loss": res.loss_sum / jnp.maximum(res.num_trained, 1).astype(jnp.float32),
      "clients_trained": res.num_trained,
    }
    return state.replace(round=state.round + 1, params=(params,), opt_state=(opt_state,),
                         client_state=res.client_state), metrics

  def models(state):
    return {"group": NodeModels(state.params[0], groups_j)}

  return FederatedAlgorithm(init=init, round=round_fn, models=models, name=name)


# ------------------------------------------------------------------------ stages
def run_rounds(alg: FederatedAlgorithm, state, data: FederatedData, key, *, rounds: int,
               rounds_per_call: int = 1, reporter=None, label: str = ""):
  """``rounds`` rounds of ``alg`` from ``state`` (fused ``rounds_per_call`` at a time)."""
  if rounds < 0:
    raise ValueError(f"{label or alg.name}: rounds={rounds} must be >= 0")
  if rounds == 0:
    return state
  fuse = max(1, min(int(rounds_per_call), rounds))
  step = loop.compile_rounds(alg, fuse)
  if reporter is not None:
    reporter.start_run(label, rounds)
  target = int(state.round) + rounds
  t0 = time.perf_counter()
  while int(state.round) < target:
    todo = min(fuse, target - int(state.round))
    if todo != fuse:
      step = loop.compile_rounds(alg, todo)
    state, metrics = step(state, data, key)
    losses = np.asarray(metrics["train_loss"])
    if not np.all(np.isfinite(losses)):
      raise loop.NonFiniteLossError(
        f"{label or alg.name}: training loss is {losses[~np.isfinite(losses)][0]} by round "
        f"{int(state.round)}; lower the local learning rate or check the data"
      )
    if reporter is not None:
      reporter.log(label, int(state.round), {"train_loss": float(losses[-1]),
                                             "elapsed_s": time.perf_counter() - t0})
  if reporter is not None:
    reporter.end_run(label)
  return state


@dataclasses.dataclass(frozen=True)
class StageResult:
  """Models ``params [N, ...]`` with ``model_of_client [C]``, and the costs paid so far."""

  params: PyTree
  model_of_client: np.ndarray
  costs: ClientCosts


def global_stage(ctx, key, *, rounds: int, server_optimizer, cohort_size, reporter=None,
                 label="global", init_params=None) -> StageResult:
  """Algorithm 1: FedOpt over all clients (one group) for ``rounds`` rounds."""
  c = ctx.data.num_clients
  alg = group_fedopt(model=ctx.model, groups=np.zeros(c, np.int32), data=ctx.data,
                     local_optimizer=ctx.local_optimizer, schedule=ctx.schedule,
                     server_optimizer=server_optimizer, cohort_size=cohort_size,
                     chunk_size=ctx.chunk_size(), start_params=init_params,
                     name=label)
  state = alg.init(loop.init_key(key))
  state = run_rounds(alg, state, ctx.data, stream(key, "global_stage"), rounds=rounds,
                     rounds_per_call=int(ctx.config.get("rounds_per_call", 1)), reporter=reporter,
                     label=label)
  return StageResult(state.params[0], np.zeros(c, np.int32), state.client_state[1])


def group_stage(ctx, key, start: StageResult, groups: np.ndarray, *, rounds: int,
                server_optimizer, cohort_size, reporter=None, label="group") -> StageResult:
  """Algorithm 2: every group fine-tunes the (single) model of ``start`` by FedOpt, in
  parallel, for ``rounds`` rounds; costs add to ``start``'s."""
  seed = jax.tree.map(lambda a: a[0], start.params)
  alg = group_fedopt(model=ctx.model, groups=groups, data=ctx.data,
                     local_optimizer=ctx.local_optimizer, schedule=ctx.schedule,
                     server_optimizer=server_optimizer, cohort_size=cohort_size,
                     chunk_size=ctx.chunk_size(), start_params=seed, name=label)
  state = alg.init(key)
  state = run_rounds(alg, state, ctx.data, stream(key, "group_stage"), rounds=rounds,
                     rounds_per_call=int(ctx.config.get("rounds_per_call", 1)), reporter=reporter,
                     label=label)
  return StageResult(state.params[0], np.asarray(groups, np.int32),
                     start.costs + state.client_state[1])


def finetune_stage(ctx, key, start: StageResult, *, schedule: LocalSchedule,
                   learning_rates: Sequence[float], optimizer: str = "sgd"):
  """Algorithm 3: every client fine-tunes its model of ``start`` at every rate (one
  program). Returns ``(EvalStats [L, C], costs)``, costs = ``start``'s plus the epochs."""
  stats, epochs = finetune_evaluate(
    ctx.model, start.params, start.model_of_client, ctx.data, learning_rates=learning_rates,
    schedule=schedule, key=stream(key, "finetune"), optimizer=optimizer,
    chunk_size=ctx.config.get("eval_chunk_size", None),
  )
  c = ctx.data.num_clients
  extra = ClientCosts(transfers=jnp.zeros((c,), jnp.float32), epochs=epochs,
                      rounds=jnp.zeros((c,), jnp.int32))
  return stats, start.costs + extra


def summarize_stats(stats: EvalStats, groups: np.ndarray) -> dict[str, Any]:
  """:func:`fedtree.core.metrics.summarize` plus perplexities (``exp`` of the mean
  cross-entropy; ``inf`` where a diverged model's loss overflows) and per-client losses."""
  s = summarize(stats, groups)
  count = np.asarray(stats.count, np.float64)
  client_loss = np.where(count > 0, np.asarray(stats.loss_sum) / np.maximum(count, 1.0), np.nan)
  s["client_loss"] = client_loss
  with np.errstate(over="ignore", invalid="ignore"):
    s["client_perplexity"] = np.exp(client_loss)
    s["perplexity"] = float(np.exp(s["loss"]))
    s["group_perplexity"] = np.exp(s["group_loss"])
  return s


def overall(stats: EvalStats) -> dict[str, float]:
  """Example-weighted accuracy and loss over all clients."""
  count = max(float(np.sum(np.asarray(stats.count, np.float64))), 1.0)
  return {"accuracy": float(np.sum(np.asarray(stats.correct, np.float64)) / count),
          "loss": float(np.sum(np.asarray(stats.loss_sum, np.float64)) / count)}


# ------------------------------------------------------------------------ the pipeline
@dataclasses.dataclass(frozen=True)
class GroupPersonalizedFL:
  """The GroupPerFL pipeline (see the module docstring); a :class:`fedtree.experiment.runner.Pipeline`.

  Attributes:
    global_rounds: T.
    group_rounds: T_g (0: the group stage leaves every group at the global model).
    global_server: server optimizer of stage 1 (paper: FedAdam, η_G = 0.001).
    group_server: server optimizer of every group in stage 2 (paper: FedAdam, η_g).
    cohort_size: clients per round, per group in stage 2 (paper: 100; -1: all).
    finetune_schedule: K_l epochs and batch size of stage 3.
    finetune_rates: the swept η_{i,l} (paper: 0.001, 0.01, 0.1, 1.0).
    finetune_optimizer: optax name of the fine-tune optimizer (paper: SGD).
    select_by: how the reported rate of each fine-tuned method is picked (``loss``/``accuracy``).
    stages: which of ``global``, ``group``, ``finetune`` run (in that order).
    group_names: names of the groups for the tables (default ``g0, g1, ...``).
    histogram_metric: ``perplexity`` or ``accuracy``, the metric of the Fig. 1 histogram.
    histogram_group: the group whose clients the histogram shows (``None``: all clients;
      the paper shows its largest group, "general").
    label: run label.
  """

  global_rounds: int
  group_rounds: int
  global_server: optax.GradientTransformation
  group_server: optax.GradientTransformation
  cohort_size: int | None
  finetune_schedule: LocalSchedule
  finetune_rates: tuple[float, ...]
  finetune_optimizer: str = "sgd"
  select_by: str = "loss"
  stages: tuple[str, ...] = STAGES
  group_names: tuple[str, ...] | None = None
  histogram_metric: str = "perplexity"
  histogram_group: int | None = None
  label: str = "grouppfl"

  def __post_init__(self):
    for name in ("global_rounds", "group_rounds"):
      if int(getattr(self, name)) < 0:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
    bad = [s for s in self.stages if s not in STAGES]
    if bad or "global" not in self.stages:
      raise ValueError(f"stages={self.stages}: choose from {STAGES}, 'global' included")
    check_finetune(self.finetune_schedule, self.finetune_rates)
    if self.select_by not in ("loss", "accuracy"):
      raise ValueError(f"select_by={self.select_by!r}; choose 'loss' or 'accuracy'")
    if self.histogram_group is not None and int(self.histogram_group) < 0:
      raise ValueError(f"histogram_group={self.histogram_group} must be a group index >= 0")
    if self.histogram_metric not in ("perplexity", "accuracy"):
      raise ValueError(
        f"histogram_metric={self.histogram_metric!r}; choose 'perplexity' or 'accuracy'"
      )

  def run(self, ctx, key, reporter) -> dict[str, dict[str, Any]]:
    """Runs the stages; returns ``{method: summary}`` (with ``costs`` and, for fine-tuned
    methods, ``rate`` and ``rate_sweep``) and writes the reports when there is a workdir."""
    groups = np.asarray(ctx.groups, np.int32)
    evaluator = metrics.make_evaluator(ctx.model, ctx.config.get("eval_chunk_size", None))
    d = ctx.data
    out: dict[str, dict[str, Any]] = {}
    stats: dict[str, EvalStats] = {}
    costs: dict[str, ClientCosts] = {}

    def score(res: StageResult) -> EvalStats:
      return evaluator(res.params, d.x_test, d.y_test, d.n_test, jnp.asarray(res.model_of_client))

    def fine(res: StageResult, method: str):
      sweep, cost = finetune_stage(ctx, key, res, schedule=self.finetune_schedule,
                                   learning_rates=self.finetune_rates,
                                   optimizer=self.finetune_optimizer)
      i = best_rate(sweep, self.select_by)
      stats[method], costs[method] = take_rate(sweep, i), cost
      out[method] = summarize_stats(stats[method], groups)
      out[method]["rate"] = self.finetune_rates[i]
      out[method]["rate_sweep"] = {
        str(r): overall(take_rate(sweep, j)) for j, r in enumerate(self.finetune_rates)
      }

    g = global_stage(ctx, key, rounds=self.global_rounds, server_optimizer=self.global_server,
                     cohort_size=self.cohort_size, reporter=reporter, label=f"{self.label}/global")
    stats["FL"], costs["FL"] = score(g), g.costs
    out["FL"] = summarize_stats(stats["FL"], groups)
    if "finetune" in self.stages:
      fine(g, "PerFL")
    if "group" in self.stages:
      gr = group_stage(ctx, key, g, groups, rounds=self.group_rounds,
                       server_optimizer=self.group_server, cohort_size=self.cohort_size,
                       reporter=reporter, label=f"{self.label}/group")
      stats["GroupFL"], costs["GroupFL"] = score(gr), gr.costs
      out["GroupFL"] = summarize_stats(stats["GroupFL"], groups)
      if "finetune" in self.stages:
        fine(gr, "GroupPerFL")
    for m in out:
      out[m]["costs"] = {k: float(v.mean()) for k, v in costs[m].host().items()}
      out[m]["client_costs"] = costs[m].host()
    workdir = getattr(reporter, "workdir", None)
    from fedtree.algorithms.grouppfl import report as pr

    names = self.group_names or tuple(f"g{i}" for i in range(int(groups.max()) + 1))
    if self.histogram_group is not None and not 0 <= self.histogram_group < len(names):
      raise ValueError(
        f"histogram_group={self.histogram_group} is not a group (0..{len(names) - 1})"
      )
    text = pr.write_reports(workdir, out, groups=groups, group_names=names,
                            histogram_metric=self.histogram_metric,
                            histogram_group=self.histogram_group, prefix=self.label,
                            data_counts=(np.asarray(d.n_train), np.asarray(d.n_test)))
    reporter.print(text)
    return out
