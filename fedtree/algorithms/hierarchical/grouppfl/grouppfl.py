"""Group personalized FL (Liu, Hui, Peng 2022, paper 000): global FL, then group FL, then local
personalization.

The stages (:func:`group_fedopt`, :func:`start_from`, :func:`finetune_stage`), their composition
(:class:`GroupPersonalizedFL`) and the method (:func:`grouppfl`): :doc:`the GroupPerFL page
<algorithms/grouppfl.md#the-stages>`.

References:
  Liu, Hui and Peng, Group personalized federated learning, 2022 (Meta AI).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms.hierarchical.grouppfl.costs import ClientCosts, counting
from fedtree.algorithms.host.hierfavg import hierfavg
from fedtree.core import metrics
from fedtree.core.algorithm import FederatedAlgorithm, NodeModels, Report, TreeState, sequential
from fedtree.core.data import FederatedData
from fedtree.core.finetune import best_rate, check_finetune, finetune_evaluate, take_rate
from fedtree.core.local import LocalSchedule, sgd_client_update, stack
from fedtree.core.metrics import EvalStats, summarize
from fedtree.core.model import Model
from fedtree.core.rng import stream
from fedtree.core.server import init_nodes, server_optimizer
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath
from fedtree.toolbox.traffic import model_bytes

PyTree = Any

STAGES = ("global", "group", "finetune")
METHODS = ("FL", "PerFL", "GroupFL", "GroupPerFL")


def group_cohort_sizes(groups: np.ndarray, cohort_size: int | None) -> list[int]:
  """``min(cohort_size, |g|)`` for every group (``None``/-1: the whole group)."""
  sizes = np.bincount(np.asarray(groups), minlength=int(np.max(groups)) + 1)
  if np.any(sizes == 0):
    raise ValueError(f"group labels must be 0..G-1 with no empty group; sizes are {sizes.tolist()}")
  one_int = isinstance(cohort_size, (int, np.integer)) and not isinstance(cohort_size, bool)
  if cohort_size is not None and not one_int:
    raise ValueError(f"cohort_size={cohort_size!r} must be one int >= 1 for every group (or -1 or None: "
                     "every client)")
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
  chunk_size: int | str | None = "auto",
  weighting: str = "examples",
  start_params: PyTree | None = None,
  compute_dtype: str | None = None,
  skip_nonfinite: bool = False,
  update_paths: UpdatePath | None = None,
  name: str = "group_fedopt",
) -> FederatedAlgorithm:
  """FedOpt inside every group at once: :func:`~fedtree.algorithms.host.hierfavg.hierfavg` on root
  -> groups -> clients whose root never aggregates (``top_level=1``), from ``start_params``,
  with the clients' costs counted.

  The state is HierFAVG's :class:`TreeState`: ``params = (root [1, ...], group models
  [G, ...])`` (the root only holds the start model), one server state per group in
  ``opt_state[1]`` and ``client_state = CountedState(inner=(), costs=ClientCosts)``. Every
  round each group samples its cohort, its clients train from the group model, and each group
  applies its own server optimizer to its own clients' mean pseudo-gradient; no group ever sees
  another's. ``start_params`` (one model) seeds every group; ``None`` uses ``model.init``. With
  all ``groups`` equal to 0 this is FedOpt (paper 000, Algorithm 1). ``compute_dtype``:
  mixed-precision local steps (``None``: the params' dtype). ``skip_nonfinite``: leave out
  clients whose update is not finite (weight 0, their cost counters unchanged), counted in the
  ``clients_skipped`` metric (see :func:`fedtree.core.tier.train_cohort`). ``update_paths``: the
  clients' update path into their group (:mod:`fedtree.core.updates`; one ``UpdatePath``, or
  ``{1: path}``).
  """
  groups = np.asarray(groups, np.int32)
  if groups.shape != (data.num_clients,):
    raise ValueError(
      f"groups has shape {groups.shape}; need one label per client ({data.num_clients})"
    )
  sizes = group_cohort_sizes(groups, cohort_size)
  max_steps = schedule.max_steps(data.max_train)
  update = counting(
    sgd_client_update(model, local_optimizer, batch_size=schedule.batch_size, max_steps=max_steps,
                      compute_dtype=compute_dtype),
    batch_size=schedule.batch_size, max_steps=max_steps,
  )
  alg = hierfavg(
    model=model, topology=Topology.from_labels(groups), data=data, local_optimizer=local_optimizer,
    schedule=schedule, server_optimizers=server_optimizer, top_level=1, cohort_size=sizes,
    chunk_size=chunk_size, weighting=weighting, client_update=update, init_params=start_params,
    skip_nonfinite=skip_nonfinite, update_paths=update_paths, name=name,
  )
  groups_j = jnp.asarray(groups)
  return alg._replace(models=lambda state: {"group": NodeModels(state.params[1], groups_j)})


# ------------------------------------------------------------------------ stages
def start_from(previous: TreeState, fresh: TreeState, server_optimizer) -> TreeState:
  """A stage's state started from ``previous``'s first group model (the global one), every
  group (and the root, which only holds it) getting a copy, fresh server states and zero
  costs (a :func:`sequential` handoff; costs of the stages are added in the report). Under
  ``batch_order="cyclic"`` every client's batch stream goes on where the previous stage left
  it."""
  p = jax.tree.map(lambda a: a[0], previous.params[1])
  params = tuple(stack(p, jax.tree.leaves(q)[0].shape[0]) for q in fresh.params)
  return fresh.replace(round=jnp.zeros((), jnp.int32), params=params,
                       opt_state=tuple(init_nodes(server_optimizer, q) for q in params),
                       client_state=jax.tree.map(jnp.zeros_like, fresh.client_state),
                       cursor=previous.cursor)


def finetune_stage(model: Model, params, model_of_client, costs: ClientCosts, data: FederatedData,
                   key, *, schedule: LocalSchedule, learning_rates: Sequence[float],
                   optimizer: str = "sgd", chunk_size: int | None = None):
  """Algorithm 3: every client fine-tunes its model (``params[model_of_client[c]]``) at every
  rate (one program). Returns ``(EvalStats [L, C], costs)``, costs = ``costs`` plus the epochs."""
  stats, epochs = finetune_evaluate(
    model, params, model_of_client, data, learning_rates=learning_rates, schedule=schedule,
    key=stream(key, "finetune"), optimizer=optimizer, chunk_size=chunk_size,
  )
  c = data.num_clients
  extra = ClientCosts(transfers=jnp.zeros((c,), jnp.result_type(float)), epochs=epochs,
                      rounds=jnp.zeros((c,), jnp.int32))
  return stats, costs + extra


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


# ------------------------------------------------------------------------ the composition
def _paper_server() -> optax.GradientTransformation:
  """Paper 000's server optimizer: FedAdam at η = 0.001."""
  return server_optimizer("fedadam", learning_rate=1e-3)


@dataclasses.dataclass(frozen=True)
class GroupPersonalizedFL:
  """GroupPerFL's hyperparameters (:doc:`docs <algorithms/grouppfl.md#the-stages>`); :meth:`algorithm`
  composes it.

  Attributes:
    global_rounds: T.
    group_rounds: T_g (0: the group stage leaves every group at the global model).
    global_server: server optimizer of stage 1 (default the paper's FedAdam, η_G = 0.001).
    group_server: server optimizer of every group in stage 2 (default FedAdam, η_g = 0.001).
    cohort_size: clients per round, per group in stage 2 (paper: 100; ``None`` or -1: all).
    finetune_epochs: K_l, the epochs of stage 3 (paper: 5).
    finetune_batch_size: its batch size (``None``: the local schedule's).
    finetune_schedule: the whole schedule of stage 3 instead (overrides the two above).
    finetune_rates: the swept η_{i,l} (paper: 0.001, 0.01, 0.1, 1.0).
    finetune_optimizer: optax name of the fine-tune optimizer (paper: SGD).
    select_by: how the reported rate of each fine-tuned method is picked (``loss``/``accuracy``).
    stages: which of ``global``, ``group``, ``finetune`` run (in that order).
    group_names: names of the groups for the tables (default ``g0, g1, ...``).
    histogram_metric: ``perplexity`` or ``accuracy``, the metric of the Fig. 1 histogram.
    histogram_group: the group whose clients the histogram shows (``None``: all clients;
      the paper shows its largest group, "general").
    compute_dtype: mixed-precision local steps of stages 1 and 2 (``None``: the params'
      dtype); the fine-tune stage runs in the params' dtype.
    skip_nonfinite: in stages 1 and 2, leave out clients whose update is not finite (see
      :func:`group_fedopt`); the fine-tune stage trains every client on its own.
    update_paths: the clients' update path (:mod:`fedtree.core.updates`) in stages 1 and 2
      (every client's update into the global model, then into its group's).
    label: run label (prefix of the report files).

  Example:
    One global round (FL) then one round per group (GroupFL), 2 groups of 3 and 2 clients:

    >>> schedule = LocalSchedule(batch_size=8, steps=1)
    >>> gp = GroupPersonalizedFL(
    ...   global_rounds=1, group_rounds=1, global_server=optax.adam(1e-3), group_server=optax.adam(1e-3),
    ...   cohort_size=None, finetune_schedule=schedule, finetune_rates=(0.1,), group_names=("a", "b"))
    >>> alg = gp.algorithm(model=model, data=data, groups=groups, local_optimizer=optax.sgd(0.1),
    ...                    schedule=schedule)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['FL', 'GroupFL']
  """

  global_rounds: int
  group_rounds: int = 0
  global_server: optax.GradientTransformation = dataclasses.field(default_factory=_paper_server)
  group_server: optax.GradientTransformation = dataclasses.field(default_factory=_paper_server)
  cohort_size: int | None = None
  finetune_epochs: float = 5.0
  finetune_batch_size: int | None = None
  finetune_schedule: LocalSchedule | None = None
  finetune_rates: tuple[float, ...] = (0.001, 0.01, 0.1, 1.0)
  finetune_optimizer: str = "sgd"
  select_by: str = "loss"
  stages: tuple[str, ...] = STAGES
  group_names: tuple[str, ...] | None = None
  histogram_metric: str = "perplexity"
  histogram_group: int | None = None
  compute_dtype: str | None = None
  skip_nonfinite: bool = False
  update_paths: UpdatePath | None = None
  label: str = "grouppfl"

  def __post_init__(self):
    for name in ("global_rounds", "group_rounds"):
      if int(getattr(self, name)) < 0:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
    bad = [s for s in self.stages if s not in STAGES]
    if bad or "global" not in self.stages:
      raise ValueError(f"stages={self.stages}: choose from {STAGES}, 'global' included")
    if self.finetune_schedule is None and not self.finetune_epochs > 0:
      raise ValueError(f"finetune_epochs={self.finetune_epochs} (K_l) must be > 0")
    if self.finetune_batch_size is not None and int(self.finetune_batch_size) < 1:
      raise ValueError(f"finetune_batch_size={self.finetune_batch_size} must be >= 1 (or None)")
    object.__setattr__(self, "finetune_rates",
                       check_finetune(self.finetune_schedule or LocalSchedule(batch_size=1),
                                      self.finetune_rates))
    if self.select_by not in ("loss", "accuracy"):
      raise ValueError(f"select_by={self.select_by!r}; choose 'loss' or 'accuracy'")
    if self.histogram_group is not None and int(self.histogram_group) < 0:
      raise ValueError(f"histogram_group={self.histogram_group} must be a group index >= 0")
    if self.histogram_metric not in ("perplexity", "accuracy"):
      raise ValueError(
        f"histogram_metric={self.histogram_metric!r}; choose 'perplexity' or 'accuracy'"
      )

  def algorithm(self, *, model: Model, data: FederatedData, groups: np.ndarray,
                local_optimizer: optax.GradientTransformation, schedule: LocalSchedule,
                chunk_size: int | str | None = "auto", eval_chunk_size: int | None = None,
                init_params: PyTree | None = None) -> FederatedAlgorithm:
    """GroupPerFL as one algorithm: the global stage (:func:`group_fedopt` with one group, T
    rounds) then the group stage (every group from the global model, T_g rounds) composed
    by :func:`fedtree.core.algorithm.sequential`, so the ordinary round loop runs, evaluates,
    checkpoints and resumes both; ``models()`` gives ``FL`` and ``GroupFL``. Its ``report``
    hook runs the fine-tune stage (vectorized over clients and rates) and returns the four
    methods' summaries with costs, the tables and the Fig. 1 histogram. ``init_params``
    (default ``model.init``) is where the global stage starts; the group stage starts from
    the global stage's result."""
    groups = np.asarray(groups, np.int32)
    names = self.group_names or tuple(f"g{i}" for i in range(int(groups.max()) + 1))
    if self.histogram_group is not None and not 0 <= self.histogram_group < len(names):
      raise ValueError(f"histogram_group={self.histogram_group} is not a group (0..{len(names) - 1})")
    c = data.num_clients
    ft_schedule = self.finetune_schedule or LocalSchedule(
      batch_size=schedule.batch_size if self.finetune_batch_size is None else int(self.finetune_batch_size),
      epochs=self.finetune_epochs)
    kw = dict(model=model, data=data, local_optimizer=local_optimizer, schedule=schedule,
              cohort_size=self.cohort_size, chunk_size=chunk_size, compute_dtype=self.compute_dtype,
              skip_nonfinite=self.skip_nonfinite, update_paths=self.update_paths)
    with_group = "group" in self.stages
    glob = group_fedopt(groups=np.zeros(c, np.int32), server_optimizer=self.global_server,
                        start_params=init_params, name=f"{self.label}/global", **kw)
    grp = group_fedopt(groups=groups, server_optimizer=self.group_server,
                       name=f"{self.label}/group", **kw)
    zeros = np.zeros(c, np.int32)

    def models(states):
      out = {"FL": NodeModels(states[0].params[1], zeros)}
      if with_group:
        out["GroupFL"] = NodeModels(states[1].params[1], groups)
      return out

    composed = sequential(
      [(glob, int(self.global_rounds)), (grp, int(self.group_rounds) if with_group else 0)],
      [lambda prev, fresh: start_from(prev, fresh, self.group_server)], models, name=self.label,
    )
    evaluator = metrics.make_evaluator(model, eval_chunk_size)

    def report(state, data, key, summaries):
      del summaries  # re-scored below with perplexities
      g_state, gr_state = state.stages
      costs_fl = g_state.client_state.costs
      stages = [("FL", "PerFL", g_state.params[1], zeros, costs_fl)]
      if with_group:
        stages.append(("GroupFL", "GroupPerFL", gr_state.params[1], groups,
                       costs_fl + gr_state.client_state.costs))
      out: dict[str, dict[str, Any]] = {}
      costs: dict[str, ClientCosts] = {}
      for plain, fine, params, moc, cost in stages:
        stats = evaluator(params, data.x_test, data.y_test, data.n_test, jnp.asarray(moc))
        out[plain], costs[plain] = summarize_stats(stats, groups), cost
        if "finetune" in self.stages:
          sweep, costs[fine] = finetune_stage(
            model, params, moc, cost, data, key, schedule=ft_schedule,
            learning_rates=self.finetune_rates, optimizer=self.finetune_optimizer,
            chunk_size=eval_chunk_size,
          )
          i = best_rate(sweep, self.select_by)
          out[fine] = summarize_stats(take_rate(sweep, i), groups)
          out[fine]["rate"] = self.finetune_rates[i]
          out[fine]["rate_sweep"] = {
            str(r): overall(take_rate(sweep, j)) for j, r in enumerate(self.finetune_rates)
          }
      for m in out:
        out[m]["costs"] = {k: float(v.mean()) for k, v in costs[m].host().items()}
        out[m]["client_costs"] = costs[m].host()
        out[m]["model_bytes"] = model_bytes(jax.tree.map(lambda p: p[0], g_state.params[1]))
      from fedtree.algorithms.hierarchical.grouppfl import report as pr

      text, files = pr.render_reports(
        out, groups=groups, group_names=names, histogram_metric=self.histogram_metric,
        histogram_group=self.histogram_group, prefix=self.label,
        data_counts=(np.asarray(data.n_train), np.asarray(data.n_test)),
      )
      return Report(out, text, files)

    return composed._replace(report=report)


def grouppfl(
  *,
  model: Model,
  data: FederatedData,
  groups: np.ndarray,
  local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule,
  global_rounds: int,
  chunk_size: int | str | None = "auto",
  eval_chunk_size: int | None = None,
  **hyperparameters,
) -> FederatedAlgorithm:
  """GroupPerFL (paper 000) as one algorithm, like every other method's factory:
  ``GroupPersonalizedFL(global_rounds=..., **hyperparameters).algorithm(...)``.

  Args:
    model, data, local_optimizer, schedule: as for :func:`~fedtree.algorithms.optimization.fedavg.fedavg`.
    groups: ``int[C]`` group label of every client (0..G-1).
    global_rounds: T, the rounds of the global stage.
    chunk_size: clients trained at once in stages 1 and 2.
    eval_chunk_size: clients evaluated and fine-tuned at once (``None``: all).
    **hyperparameters: the other fields of :class:`GroupPersonalizedFL` (its schema:
      ``group_rounds``, ``global_server``, ``finetune_epochs``, ``compute_dtype``, ...).

  Not sweepable (``config.sweep`` refuses it, see :doc:`docs <algorithms/grouppfl.md#the-stages>`): sweep it
  as separate runs.

  Example:
    >>> alg = grouppfl(model=model, data=data, groups=groups, local_optimizer=optax.sgd(0.1),
    ...                schedule=LocalSchedule(batch_size=8, steps=2), global_rounds=1, group_rounds=1)
    >>> state = loop.run(alg, data, num_rounds=alg.rounds, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['FL', 'GroupFL']
  """
  spec = GroupPersonalizedFL(global_rounds=global_rounds, **hyperparameters)
  return spec.algorithm(model=model, data=data, groups=groups, local_optimizer=local_optimizer,
                        schedule=schedule, chunk_size=chunk_size, eval_chunk_size=eval_chunk_size)
