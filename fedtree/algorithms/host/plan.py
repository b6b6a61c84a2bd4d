"""The host's plan: every argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg` checked once
and turned into the fixed pieces its round's phases read (:mod:`~fedtree.algorithms.host.phases`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
import optax

from fedtree.algorithms.host.sampler import build_sampler, check_poisson_q
from fedtree.algorithms.host.upper import UpperLevels, check_periods
from fedtree.algorithms.host.wire import Extras
from fedtree.core.algorithm import ObjectiveFactory, check_weighting, local_training, per_level
from fedtree.core.data import FederatedData
from fedtree.core.local import ClientUpdate, LocalSchedule
from fedtree.core.membership import Membership, MobileSampler, mobile_sampler
from fedtree.core.model import Model
from fedtree.core.personal import Personal, Shares
from fedtree.core.sampling import CohortSampler, Strategy, sampling_strategy
from fedtree.core.server_rule import ServerRule, check_rule
from fedtree.core.tier import Tier
from fedtree.core.topology import Topology
from fedtree.core.updates import per_level_paths
from fedtree.toolbox.privacy import private_stages
from fedtree.toolbox.systems import Systems

PyTree = Any


@dataclasses.dataclass(frozen=True)
class HostPlan:
  """What a host's round reads, fixed for the run (built once by :func:`plan`).

  Attributes:
    name: the algorithm's name, in refusals and reports.
    model: the model every node holds.
    topology: the tree (clients are its leaves).
    schedule: the clients' local schedule.
    weighting: ``"examples"`` or ``"uniform"`` aggregation weights.
    server_optimizers: one optax optimizer per server level ``0 .. depth-1``.
    top_level: the highest level that aggregates.
    paths: the update path of every server level (``None``: the weighted mean).
    sampler: the clients' sampler (static cohort sizes per leaf parent).
    strategy: the sampling strategy over ``sampler`` (its draw, and the clients a round reads).
    tier: how the clients' tier trains (:class:`~fedtree.core.tier.Tier`).
    rule: the clients' parents' server rule, or ``None``.
    share: which leaves every level shares (:class:`~fedtree.core.personal.Shares`).
    wire: the clients' messages in bytes (:class:`~fedtree.algorithms.host.wire.Extras`).
    upper: the levels above the clients' parents (:class:`~fedtree.algorithms.host.upper.UpperLevels`).
    systems: devices, availability and the round policy, or ``None``.
    keep: clients kept per leaf parent under over-selection (``None`` otherwise).
    links: the server levels' bandwidths (:meth:`~fedtree.toolbox.systems.Systems.server_links`).
    population: ``float64[N]`` the clients under every leaf parent (exact; read in the round's float dtype).
    init_params: the model every node starts from (``None``: ``model.init(key)``).
    membership: the clients' edges round by round (:class:`~fedtree.core.membership.Membership`), or
      ``None``: the tree's, fixed; ``sampler`` is then a :class:`~fedtree.core.membership.MobileSampler`.
  """

  name: str
  model: Model
  topology: Topology
  schedule: LocalSchedule
  weighting: str
  server_optimizers: tuple
  top_level: int
  paths: tuple
  sampler: CohortSampler | MobileSampler
  strategy: Strategy | None
  tier: Tier
  rule: ServerRule | None
  share: Shares
  wire: Extras
  upper: UpperLevels
  systems: Systems | None
  keep: Any
  links: Any
  population: np.ndarray
  init_params: PyTree | None
  membership: Membership | None = None

  @property
  def depth(self) -> int:
    return self.topology.depth

  @property
  def leaf(self) -> int:
    """The clients' parents' level."""
    return self.topology.depth - 1

  @property
  def num_parents(self) -> int:
    return self.topology.num_nodes(self.leaf)


def _check_levels(topology: Topology, top_level, periods, update_paths, name: str):
  """``(top_level, periods, paths)`` checked against the tree."""
  depth = topology.depth
  periods = check_periods(periods, depth)
  if not 0 <= int(top_level) <= depth - 1:
    raise ValueError(f"top_level={top_level} must be a server level, 0..{depth - 1}")
  top_level = int(top_level)
  paths = per_level_paths(update_paths, depth, algorithm=name, supported_levels=range(top_level, depth))
  return top_level, periods, paths


def _check_rule_noise(rule: ServerRule | None, paths, leaf: int, name: str) -> None:
  """Noise above the clients' parents is bounded for a plain mean below it only."""
  if rule is None:
    return
  for lv in range(leaf):
    for stage in private_stages(paths[lv]):
      raise ValueError(f"{name}: differential privacy ({stage!r}) at level {lv}, above the clients' "
                       f"parents, with the server rule {rule.name!r} at the parents: what it keeps "
                       f"carries one client's update into later rounds, so the noise above them has no "
                       f"bounded sensitivity; add the noise at the clients' parents (noise_level=-1)")


def _cohorts(topology: Topology, systems: Systems | None, sampling: str, cohort_size, poisson_q, chunk_size):
  """``(sampler, keep, links)``: the clients' sampler, and where a systems model runs the round, the
  clients kept per parent (over-selection) and the server levels' links."""
  depth = topology.depth
  keep = links = None   # over-selection: sample more, keep the first cohort_size to finish
  if systems is not None:
    if sampling == "poisson" and systems.policy.kind == "over_selection":
      raise ValueError("sampling='poisson' with the systems policy 'over_selection': over-selection samples "
                       "ceil(factor k) clients to keep the first k to finish, a cohort of fixed size; use "
                       "sampling='uniform', or the policy wait_for_all or deadline")
    keep, cohort_size = systems.cohort_sizes(topology.parent(depth), cohort_size, depth)
    links = systems.server_links([topology.num_nodes(lv) for lv in range(depth)])
  sampler = build_sampler(topology.parent(depth), sampling=sampling, cohort_size=cohort_size,
                          poisson_q=poisson_q, chunk_size=chunk_size)
  return sampler, keep, links


def _check_membership(membership: Membership, topology: Topology, *, sampling: str, systems, server_rule,
                      paths: tuple, name: str) -> None:
  """Refuses, before anything compiles, what a moving membership cannot run with, by name."""
  membership.check(topology.num_clients, topology.num_nodes(topology.depth - 1))
  if sampling != "uniform":
    raise ValueError(f"{name}: sampling={sampling!r} under a moving membership: only a uniform draw among an "
                     f"edge's members of the round is defined (the others weigh or size every parent's "
                     f"fixed clients); use sampling='uniform'")
  if systems is not None:
    raise ValueError(f"{name}: a systems model (devices, deadlines, the clock) under a moving membership: "
                     f"its over-selection and its levels' links read every edge's fixed clients; run one or "
                     f"the other")
  if server_rule is not None and not server_rule.moves:
    raise ValueError(f"{name}: the server rule {server_rule.name!r} keeps its state, parcels or weights "
                     f"over every edge's fixed clients (fedtree.core.server_rule.ServerRule.moves), which a "
                     f"moving membership would hand clients it never counted; run {name} on a fixed tree")
  for lv in range(topology.depth - 1):   # (at the edges: each round one sampled Gaussian over its members)
    for stage in private_stages(paths[lv]):
      raise ValueError(f"{name}: differential privacy ({stage!r}) at level {lv}, above the edges, under a "
                       f"moving membership: its sensitivity weighs every edge by its fixed clients; add "
                       f"the noise at the edges (noise_level=-1)")


def plan(
  *, model: Model, topology: Topology, data: FederatedData,
  local_optimizer: optax.GradientTransformation | None,
  schedule: LocalSchedule, server_optimizers, periods, cohort_size, sampling: str, poisson_q, chunk_size,
  weighting: str, compute_dtype, client_update: ClientUpdate | ObjectiveFactory | None,
  server_rule: ServerRule | None, personal: Personal | None, local_learning_rate, init_params,
  skip_nonfinite: bool, top_level: int, update_paths, systems: Systems | None, candidates, name: str,
  membership: Membership | None = None,
) -> HostPlan:
  """:func:`~fedtree.algorithms.host.hierfavg.hierfavg`'s arguments (see its docstring) checked and
  turned into a :class:`HostPlan`; every refusal is raised here, before anything compiles."""
  data.validate(topology)
  depth = topology.depth
  top_level, periods, paths = _check_levels(topology, top_level, periods, update_paths, name)
  server_optimizers = per_level(optax.sgd(1.0) if server_optimizers is None else server_optimizers, depth,
                                "server_optimizers")
  check_weighting(weighting)
  strategy: Strategy | None = None
  sampler: CohortSampler | MobileSampler
  if membership is None:
    sampler, keep, links = _cohorts(topology, systems, sampling, cohort_size, poisson_q, chunk_size)
    strategy = sampling_strategy(sampler, sampling, data=data, model=model, candidates=candidates,
                                 online=None if systems is None else systems.online)
    aligned, block = sampler.parent_aligned, max(sampler.sizes)
  else:
    _check_membership(membership, topology, sampling=sampling, systems=systems, server_rule=server_rule,
                      paths=paths, name=name)
    check_poisson_q(sampling, poisson_q)
    sampler, keep, links = mobile_sampler(membership, cohort_size, chunk_size=chunk_size), None, None
    aligned, block = False, min(max(sampler.sizes), membership.max_load)
  client_update = local_training(client_update, model, local_optimizer, schedule, data,
                                 compute_dtype=compute_dtype, name=name)
  rule = check_rule(server_rule, name)
  _check_rule_noise(rule, paths, depth - 1, name)
  template = jax.eval_shape(model.init, jax.random.key(0)) if init_params is None else init_params
  share = Shares.of(personal, template, depth, name)
  if share.has_client_personal and client_update.personal_models is not None:
    raise ValueError(f"{name}: the local objective keeps personal models of its own, and personal "
                     f"parameters would be scored under the same name ('personal'); use one or the other")
  tier = Tier(client_update, path=paths[depth - 1], chunk_size=sampler.chunk_size,
              parent_aligned=aligned, batch_order=schedule.batch_order,
              batch_size=schedule.batch_size, skip_nonfinite=skip_nonfinite, block_size=block,
              learning_rate=local_learning_rate, personal=share.client_mask,
              keep_client_params=rule is not None and rule.up.slots,
              robust_messages=rule is not None and rule.up.robust,
              messages_with_update=rule is not None and rule.up.with_update,
              uniform_steps=schedule.same_for_all and systems is None)
  population = np.bincount(topology.parent(depth), minlength=topology.num_nodes(depth - 1)).astype(np.float64)
  return HostPlan(
    name=name, model=model, topology=topology, schedule=schedule, weighting=weighting,
    server_optimizers=server_optimizers, top_level=top_level, paths=paths, sampler=sampler, strategy=strategy,
    tier=tier, rule=rule, share=share,
    wire=Extras.of(client_update, rule, template, topology, data, share, local_learning_rate,
                   joint=tier.joint),
    upper=UpperLevels(topology=topology, periods=periods, server_optimizers=server_optimizers, paths=paths,
                      top_level=top_level, share=share),
    systems=systems, keep=keep, links=links, population=population, init_params=init_params,
    membership=membership)

