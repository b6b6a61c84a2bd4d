"""HierFAVG (Liu et al. 2020) on trees of any depth, with FedAvg and FedOpt (Reddi et al. 2021) as its
one-tier case: the host every method of the family runs on.

The round in equations: :doc:`the HierFAVG page <algorithms/hierarchical.md>`.

References:
  Liu, Zhang, Song and Letaief, Client-edge-cloud hierarchical federated learning, 2020.
  Reddi et al., Adaptive federated optimization, ICLR 2021.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import optax

from fedtree.algorithms.host import phases
from fedtree.algorithms.host.plan import HostPlan, plan
from fedtree.core.algorithm import ClientModels, FederatedAlgorithm, ObjectiveFactory, Reads, TreeState
from fedtree.core.data import FederatedData
from fedtree.core.local import ClientUpdate, LocalSchedule
from fedtree.core.membership import Membership
from fedtree.core.model import Model
from fedtree.core.personal import Personal
from fedtree.core.server_rule import ServerRule
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath, path_stats
from fedtree.toolbox.systems import Systems

PyTree = Any


def hierfavg(
  *,
  model: Model,
  topology: Topology,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation | None = None,
  schedule: LocalSchedule,
  server_optimizers: optax.GradientTransformation | Sequence[optax.GradientTransformation] = None,
  periods: int | Sequence[int] | None = None,
  cohort_size: int | Sequence[int] | None = None,
  sampling: str = "uniform",
  poisson_q: float | None = None,
  chunk_size: int | str | None = "auto",
  weighting: str = "examples",
  compute_dtype: str | None = None,
  client_update: ClientUpdate | ObjectiveFactory | None = None,
  server_rule: ServerRule | None = None,
  personal: Personal | None = None,
  local_learning_rate: float | None = None,
  init_params: PyTree | None = None,
  skip_nonfinite: bool = False,
  top_level: int = 0,
  update_paths: UpdatePath | Mapping[int, UpdatePath | None] | Sequence[UpdatePath | None] | None = None,
  systems: Systems | None = None,
  candidates: int | None = None,
  membership: Membership | None = None,
  name: str = "hierfavg",
) -> FederatedAlgorithm:
  """HierFAVG / hierarchical FedOpt on ``topology``: the host every method of this family is a
  composition over (see :func:`~fedtree.algorithms.host.method.method_over`).

  Args:
    model: the model every node holds.
    topology: the tree; clients are its leaves, rows of ``data``.
    data: the federated data (for static shapes and validation).
    local_optimizer: the clients' optax optimizer (needed by the default local training; an
      objective may ignore it).
    schedule: local epochs or steps, batch size and batch order (``"shuffled"``, the
      default; ``"fixed"``; ``"cyclic"``, a per-client cursor kept in ``TreeState.cursor``:
      see :mod:`fedtree.core.local`).
    server_optimizers: one optax optimizer for every server level, or one per level
      ``0 .. depth-1`` (default FedAvg, ``sgd(1.0)``).
    periods: rounds between aggregations of levels ``0 .. depth-2``.
    cohort_size: clients sampled per leaf-parent node each round (``None``: all); with Poisson
      sampling, the slots per leaf parent (the most clients it may draw; ``None``: the smallest
      count whose overflow probability per round is at most 1e-12).
    sampling: how a leaf parent's cohort is drawn (:mod:`fedtree.core.sampling`): ``"uniform"``
      (``cohort_size`` clients per leaf parent, without replacement); ``"poisson"`` (every client
      independently with probability ``poisson_q``, in static shapes: padded slots masked; a draw
      that exceeds a parent's slots is an error at run time naming ``q`` and the slot count,
      raised from a host callback inside the jitted round); ``"data_size"`` (successive sampling
      proportional to the clients' examples); ``"available"`` (uniform among the clients on line
      at the round's start: needs ``systems`` with ``availability``); ``"power_of_choice"`` (Cho et
      al. 2022: ``candidates`` clients per leaf parent drawn proportionally to their examples, the
      ``cohort_size`` of highest loss under their parent's model kept; padded or ragged data,
      scored ``chunk_size`` candidates at a time on ragged data).
    poisson_q: ``q`` in (0, 1], with ``sampling="poisson"``.
    chunk_size: clients trained at once (memory bound): an int, ``None`` (the whole cohort)
      or ``"auto"`` (the per-backend default, :mod:`fedtree.core.tuning`).
    weighting: ``"examples"`` or ``"uniform"`` aggregation weights.
    compute_dtype: mixed-precision local training (``None``: the params' dtype): of the default
      local training, or of an objective given as a factory.
    client_update: the local objective: a :class:`~fedtree.core.local.ClientUpdate`, or a factory
      ``f(LocalSetup) -> ClientUpdate`` built here from the model, ``local_optimizer``, the
      schedule and ``compute_dtype`` (:func:`fedtree.core.algorithm.local_training`; default
      plain SGD by ``local_optimizer``; see :mod:`fedtree.objectives`). Its persistent per-client
      state (``init_state``) lives in ``TreeState.client_state``, only the clients that trained
      update it, and its ``personal_models`` are scored as ``personal``. An update that
      ``takes_round`` is told its index, its parent's broadcast, the sampled fraction, its weight
      and ``local_learning_rate``, and may send a message beside its model to ``server_rule``.
    server_rule: what the clients' parents keep beyond their optax state, broadcast beside their
      model and update from their clients' messages (:mod:`fedtree.core.server_rule`: SCAFFOLD's
      control variate, FedDyn's ``h``, Mime's optimizer state; with a ``gather`` pass, from
      messages the clients send before training, Mime's control variate), in
      ``TreeState.server_state``; the levels above aggregate models as HierFAVG. A rule may send
      every sampled child a parcel of its own before the round's training (``down.parcels``: FedAMP's
      cloud models, FedFomo's candidates, pFedHN's generated weights) and receive every child's
      sent model (``up.slots``). ``None``: nothing more than the model.
    personal: parameters that stay with each client, or are shared only within the subtrees of a
      level (:mod:`fedtree.core.personal`, path patterns): never broadcast over nor aggregated
      above their level, not counted in bytes, kept in ``TreeState.personal``; each client is
      scored with its own combination (``personal``), and the levels that do not aggregate every
      parameter are not reported as models. ``None``: every parameter shared.
    local_learning_rate: the local learning rate an update that ``takes_round`` is told
      (:attr:`~fedtree.core.local.ClientRound.learning_rate`; the experiment layer passes
      ``config.local.learning_rate``).
    init_params: the model to start every node from (default ``model.init(key)``).
    skip_nonfinite: leave out clients whose update is not finite (weight 0) instead of
      letting them poison the mean; their count is the ``clients_skipped`` metric (see
      :func:`fedtree.core.tier.train_cohort`). A skipped client drops out of its parent's
      mean only: at the levels above, the parent's weight still counts the client's examples
      (as it counts those of an unsampled client).
    top_level: the highest level that aggregates (``0``: the root, HierFAVG). The levels above
      it never do, so every subtree of level ``top_level`` learns on its own from the start
      model: ``top_level=1`` on root -> groups -> clients is FedOpt in every group at once
      (GroupPerFL's group stage, :func:`fedtree.algorithms.hierarchical.grouppfl.group_fedopt`). The
      models of the levels above (the start model) are not in ``models()``, and their
      ``periods`` entries are not used.
    update_paths: what the updates go through between a child's training and its parent's
      server optimizer (:mod:`fedtree.core.updates`: client transforms such as clipping or
      compression, a robust aggregator, a node transform such as central noise, a downlink
      transform): one :class:`~fedtree.core.updates.UpdatePath` for the clients' tier, or one
      per server level (``{level: path}``; level ``l``'s path is how it aggregates its children
      and what it sends them). ``None``: the weighted mean, as in the paper. Paths act on the
      shared parameters' delta only; messages beside it reach the server rule as they are.
    systems: devices, availability and a round policy (:mod:`fedtree.toolbox.systems`): sampled
      clients that are off line, fail, miss the deadline or are over-selected do not report, and
      partial work lowers their step counts; the state's ``clock`` advances by each round's
      simulated duration, reported as ``round_seconds`` and ``sim_seconds`` (with
      ``clients_unavailable``, ``clients_dropped``, ``clients_partial``). Over-selection samples
      ``ceil(factor · cohort_size)`` clients of every leaf parent (at most its group). ``None``:
      every sampled client finishes, no clock.
    candidates: power-of-choice candidates per leaf parent (default twice the cohort, at most
      the group).
    membership: the clients' edges (the clients' parents) round by round, and which edges are up
      (:class:`~fedtree.core.membership.Membership`; built by :mod:`fedtree.toolbox.mobility`'s
      mobility models, traces, failures and association policies): aggregation, every edge's cohort
      (``cohort_size`` among its members of the round, at most that many), its update path and the
      weights above it follow the round's membership, inside the compiled round (no recompile); a
      client's own state travels with it, an edge's model and optimizer state stay; a client of a
      down edge waits, a down edge neither aggregates nor receives. The rounds report
      ``handovers``, ``edges_down`` and ``edge_clients_max`` (the most clients an edge took in).
      Refused with another sampling than ``"uniform"``, a systems model, a server rule that does not
      move (:attr:`~fedtree.core.server_rule.ServerRule.moves`) or differential privacy above the
      edges (each calibrated on fixed members). ``None``: the tree's, fixed.
    name: label for reports.

  Example:
    A root over the 2 groups (edge servers) of 3 and 2 clients, one round:

    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=1))
    >>> alg = hierfavg(topology=Topology.from_labels(groups), local_optimizer=optax.sgd(0.1), **common)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['global', 'level1']
  """
  host = plan(
    model=model, topology=topology, data=data, local_optimizer=local_optimizer, schedule=schedule,
    server_optimizers=server_optimizers, periods=periods, cohort_size=cohort_size, sampling=sampling,
    poisson_q=poisson_q, chunk_size=chunk_size, weighting=weighting, compute_dtype=compute_dtype,
    client_update=client_update, server_rule=server_rule, personal=personal,
    local_learning_rate=local_learning_rate, init_params=init_params, skip_nonfinite=skip_nonfinite,
    top_level=top_level, update_paths=update_paths, systems=systems, candidates=candidates, name=name,
    membership=membership)
  reads = None
  if host.rule is None or (host.rule.down.parcels is None and not host.rule.up.slots):
    # (a rule's parcels and slots read other clients' state than the cohort's: no window)
    needs_state = host.strategy is not None and host.strategy.needs_state
    reads = Reads(functools.partial(phases.reads, host), needs_state=needs_state)
  models = functools.partial(phases.models, host)
  return FederatedAlgorithm(init=functools.partial(phases.init, host),
                            round=functools.partial(host_round, host), models=models, name=name, reads=reads,
                            client_models=ClientModels(models, functools.partial(phases.client_models, host),
                                                         functools.partial(phases.node_models, host)))


def host_round(plan: HostPlan, state: TreeState, data: FederatedData, key) -> tuple[TreeState, dict]:
  """One round of the host, in its phases (:mod:`~fedtree.algorithms.host.phases`)."""
  r = state.round + 1
  sent, down_stats = phases.downlink(plan, state, key)
  drawn = phases.draw(plan, state, data, down_stats, key)
  w = phases.weights(plan, state, data, drawn)
  down, server_state, parcels, position = phases.exchange(plan, state, drawn, w, sent, data, key)
  res = phases.train(plan, state, drawn, w, down, data, key)
  metrics = {**res.metrics(plan.tier.skip_nonfinite), **path_stats(down_stats, "downlink_"), **parcels.stats}
  metrics.update(plan.wire.byte_metrics(metrics))
  pseudo_gradient, server_state, rule_metrics = phases.take_in(plan, state, drawn, w, res, down, position,
                                                               server_state)
  params, opt_state = phases.server_step(plan, state, pseudo_gradient, res)
  update_state = list(state.update_state)
  update_state[plan.leaf] = res.update_state
  params, opt_state, update_state, active, level_stats, up_metrics = phases.upper_levels(
    plan, params, opt_state, update_state, w, r, key, drawn)
  if plan.membership is not None:
    metrics.update(phases.membership_metrics(plan, drawn, r))
  clock, clock_metrics = phases.clock(plan, state, drawn, params, active, level_stats)
  new = state.replace(round=r, params=tuple(params), opt_state=tuple(opt_state),
                      client_state=res.client_state, cursor=res.cursor, update_state=tuple(update_state),
                      clock=clock, server_state=server_state, personal=plan.share.pack(res.personal_params))
  return new, {**metrics, **rule_metrics, **up_metrics, **clock_metrics}
