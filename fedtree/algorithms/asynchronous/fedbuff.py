"""FedBuff (Nguyen et al. 2022): buffered asynchronous aggregation on the simulated clock of
:mod:`fedtree.toolbox.systems`, on any tree.

The staleness weights (:func:`staleness_factor`), the state (``FedBuffState``) and the method
(:func:`fedbuff`). The slots, the ring of versions, the tree and the failures: :doc:`FedBuff on the
asynchronous page <algorithms/asynchronous.md#fedbuff>`.

References:
  Nguyen et al., Federated learning with buffered asynchronous aggregation, AISTATS 2022.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from fedtree.algorithms.host.upper import UpperLevels, check_periods
from fedtree.core.aggregation import divide_by_weight, staleness_weight
from fedtree.core.algorithm import (
  FederatedAlgorithm,
  NodeModels,
  broadcast_tree,
  check_weighting,
  client_weights,
  initial_params,
  local_training,
  per_level,
)
from fedtree.core.checks import check_nonnegative, check_positive, named
from fedtree.core.data import FederatedData
from fedtree.core.local import ClientUpdate, LocalSchedule
from fedtree.core.model import Model
from fedtree.core.rng import stream
from fedtree.core.sampling import Cohort
from fedtree.core.server import init_nodes, update_nodes
from fedtree.core.tier import Clients, Down, Tier, TierResult, edge_metrics, train_cohort
from fedtree.core.topology import Topology
from fedtree.core.updates import (
  UpdatePath,
  UpdateState,
  aggregate_slots,
  init_update_state,
  path_stats,
  per_level_paths,
  send_down,
)
from fedtree.toolbox.systems import Systems, make_profile, uplink_bytes
from fedtree.toolbox.traffic import model_bytes

PyTree = Any
STALENESS = ("polynomial", "constant", "hinge")
SIMULTANEOUS = ("queue", "together", "drop")
UPDATE_FROM = ("start", "current")


def staleness_factor(tau: jax.Array, kind: str = "polynomial", *, exponent=0.5, hinge_a=10.0,
                     hinge_b: int = 4) -> jax.Array:
  """``s(τ)`` of FedAsync's staleness functions (Xie et al. 2019, Sec. 5.2): ``"polynomial"``
  ``(1 + τ)^-a`` (:func:`~fedtree.core.aggregation.staleness_weight`, FedBuff's),
  ``"constant"`` 1, ``"hinge"`` 1 for ``τ <= b`` else ``1 / (a (τ − b) + 1)``. Hyperparameters
  may be traced (sweeps); in the default float dtype (float64 under ``--config.dtype=float64``)."""
  if kind == "polynomial":
    return staleness_weight(tau, exponent)
  dtype = jnp.result_type(float)
  if kind == "constant":
    return jnp.ones(jnp.shape(tau), dtype)
  if kind == "hinge":
    late = jnp.maximum(tau - int(hinge_b), 0).astype(dtype)
    return jnp.where(tau <= int(hinge_b), 1.0, 1.0 / (jnp.asarray(hinge_a, dtype) * late + 1.0))
  raise ValueError(f"staleness={kind!r}; choose one of {STALENESS}")


@struct.dataclass
class FedBuffState:
  """The servers, their rings of recent models and the clients in flight.

  ``G`` is the number of the clients' parents (1 on a flat topology), ``M`` the concurrency of
  each, ``S = max_staleness + 1``.

  Attributes:
    round: ``int32[]`` server updates so far at every parent (their models' version).
    params: ``[G, ...]`` the clients' parents' models.
    opt_state: ``[G, ...]`` their server optimizers' states.
    history: ``[G * S, ...]`` every parent's last ``S`` models; parent ``g``'s version ``v`` in row
      ``g * S + v % S``.
    client: ``int32[G * M]`` the client in every slot (parent ``g``'s slots ``g * M ..``).
    version: ``int32[G * M]`` the version it started from.
    finish: ``float[G * M]`` the simulated second it reports (or fails).
    busy: ``bool[G * M]`` whether the slot holds a client.
    clock: ``float[]`` simulated seconds (the latest of the parents' clocks).
    cursor: ``int32[C]`` batch cursors (``"cyclic"``), else ``()``.
    update_state: the :class:`~fedtree.core.updates.UpdateState` of the clients' update path.
    node_clock: ``float[G]`` every parent's simulated seconds.
    steps: ``int32[G * M]`` the local steps of every slot's client (partial work lowers them).
    failed: ``bool[G * M]`` slots whose client fails (dropout, or a deadline it cannot meet).
    upper_params: the models of server levels ``0 .. depth-2`` (``[N_l, ...]`` each; ``()`` flat).
    upper_opt_state: their server optimizers' states.
  """

  round: jax.Array
  params: PyTree
  opt_state: PyTree
  history: PyTree
  client: jax.Array
  version: jax.Array
  finish: jax.Array
  busy: jax.Array
  clock: jax.Array
  cursor: Any = ()
  update_state: Any = ()
  node_clock: Any = ()
  steps: Any = ()
  failed: Any = ()
  upper_params: tuple = ()
  upper_opt_state: tuple = ()


def fedbuff(
  *,
  model: Model,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule,
  buffer_size: int,
  concurrency: int | None = None,
  topology: Topology | None = None,
  periods: int | Sequence[int] | None = None,
  server_optimizer: optax.GradientTransformation | None = None,
  max_staleness: int = 8,
  staleness_exponent: float = 0.5,
  staleness: str = "polynomial",
  hinge_a: float = 10.0,
  hinge_b: int = 4,
  simultaneous: str = "queue",
  update_from: str = "start",
  systems: Systems | None = None,
  weighting: str = "examples",
  compute_dtype: str | None = None,
  client_update: ClientUpdate | None = None,
  init_params: PyTree | None = None,
  update_paths: UpdatePath | None = None,
  name: str = "fedbuff",
) -> FederatedAlgorithm:
  """FedBuff at the clients' parents of ``topology`` (default: one server over all clients), the
  levels above aggregating as HierFAVG's every ``periods[l]`` rounds.

  Args:
    model: the model.
    data: the federated data.
    local_optimizer: the clients' optax optimizer.
    schedule: local epochs or steps and batch size.
    buffer_size: ``K``, client reports per server update (at every clients' parent).
    concurrency: clients in flight at every clients' parent (default ``buffer_size``); at least
      ``buffer_size``, at most the clients of the smallest group.
    topology: the tree (``None``: flat). Every clients' parent runs FedBuff on its own clients on
      its own clock; one round is one buffered update at every one of them.
    periods: rounds between aggregations of levels ``0 .. depth-2`` (as
      :func:`~fedtree.algorithms.host.hierfavg.hierfavg`'s): the level waits for its slowest
      descendant's clock (plus its transfers, :meth:`~fedtree.toolbox.systems.Systems.aggregation_seconds`),
      aggregates its children's models by their examples with ``server_optimizer`` (one, or one
      per level ``0 .. depth-1``) and sends its model down; the clients' parents adopt it as their
      new version (clients in flight keep theirs).
    server_optimizer: applied to the buffered pseudo-gradient (default ``sgd(1.0)``); one for
      every level or a sequence of one per level.
    max_staleness: oldest model version a client may start from and still count (the ring size
      less one); later reports are dropped.
    staleness_exponent: ``a`` in ``s(τ) = (1 + τ)^-a`` (0: no staleness weighting).
    staleness: the staleness function ``s(τ)`` (:data:`STALENESS`, :func:`staleness_factor`):
      ``"polynomial"`` (``(1 + τ)^-a``, ``a = staleness_exponent``), ``"constant"`` (1) or
      ``"hinge"`` (1 for ``τ <= b``, else ``1 / (a (τ − b) + 1)`` with ``a = hinge_a``,
      ``b = hinge_b``): FedAsync's three (Xie et al. 2019).
    hinge_a, hinge_b: the hinge's slope ``a > 0`` and threshold ``b >= 0`` (FedLab's 10 and 4).
    simultaneous: reports that arrive at the very moment of the ``buffer_size``-th (on a clock
      without systems every client of equal work arrives together): ``"queue"`` (default: they
      wait for the next server updates, one buffer each, ties broken by slot, each a version
      staler), ``"together"`` (they join this update: FLGo's FedAsync mixes everything that
      arrived at one moment in one step) or ``"drop"`` (they are discarded, their clients freed:
      FedLab's standalone FedAsync). ``clients_discarded`` counts the reports sent but not applied
      (these, and stale ones), which the byte columns count as sent.
    update_from: what a report's pseudo-gradient is taken against: ``"start"`` (the model version
      its client started from, ``Δ_i = x_τ − y_i``: FedBuff) or ``"current"`` (the parent's current
      model, ``x_t − y_i``: FedAsync's mixing ``x ← (1 − α s) x + α s y_i`` with ``sgd(α)``). The
      update path (clipping, compression) sees what the client sends, ``x_τ − y_i``; the server
      adds the known ``x_t − x_τ``.
    systems: device speeds, bandwidths and availability (:class:`~fedtree.toolbox.systems.Systems`)
      that set when each client reports. Its policy: ``wait_for_all`` or ``deadline`` (a
      per-client timeout, as FLSim's: a client that cannot report within ``seconds`` of its
      start fails then, or with ``partial`` does the steps that fit), each with ``dropout`` (a
      client fails with that probability; the server learns it when the client would have
      reported). A failed report takes its place among the ``buffer_size`` of its round and
      contributes nothing (``clients_dropped``; ``clients_partial`` counts partial work).
      ``over_selection`` is refused (``concurrency`` is FedBuff's over-selection). ``None``:
      one local step per second, free transfers, always on line.
    weighting: ``"examples"`` or ``"uniform"``: ``Δ = Σ_i w_i s(τ_i) Δ_i / Σ_i w_i``.
    compute_dtype: mixed-precision local training.
    client_update: a stateless local objective (default plain SGD by ``local_optimizer``).
    init_params: the model to start from (default ``model.init(key)``).
    update_paths: the clients' update path (:mod:`fedtree.core.updates`) at the clients' parents (the
      levels above take the weighted mean): client transforms on every update, and an aggregator (a
      robust one, or an omniscient attack in front of it) over each parent's buffer, every applied
      report's staleness-scaled update ``s(τ_i)(x_i − θ_i)`` weighted as the mean weighs it, and a
      downlink transform (every version delivered through it, each update taken against what its
      client received). No node stage (central noise would be added per server step to reports
      chosen by the devices' speeds, which no sampling accountant bounds).
    name: label for reports.

  Raises:
    ValueError: a buffer larger than the concurrency or a group, a negative
      ``max_staleness`` or exponent, bad ``periods``, or the over-selection policy.

  Example:
    Two server updates of 2 buffered reports each, 3 of the 5 clients in flight, on devices of
    different speeds:

    >>> from fedtree.toolbox.systems import Systems, make_profile
    >>> devices = Systems(profile=make_profile([1.0, 2.0, 4.0, 0.5, 8.0], np.full(5, 1e6)))
    >>> alg = fedbuff(model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...               schedule=LocalSchedule(batch_size=8, steps=2), buffer_size=2, concurrency=3,
    ...               systems=devices)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> int(state.round), float(state.clock) > 0
    (2, True)
  """
  topology = Topology.flat(data.num_clients) if topology is None else topology
  plan = _plan(model=model, data=data, local_optimizer=local_optimizer, schedule=schedule,
               buffer_size=buffer_size, concurrency=concurrency, topology=topology, periods=periods,
               server_optimizer=server_optimizer, max_staleness=max_staleness,
               staleness_exponent=staleness_exponent, staleness=staleness, hinge_a=hinge_a, hinge_b=hinge_b,
               simultaneous=simultaneous, update_from=update_from, systems=systems, weighting=weighting,
               compute_dtype=compute_dtype, client_update=client_update, update_paths=update_paths, name=name)
  return FederatedAlgorithm(init=functools.partial(_init, plan, init_params),
                            round=functools.partial(_round, plan), models=functools.partial(_models, plan),
                            name=name)


@dataclasses.dataclass(frozen=True)
class _Plan:
  """FedBuff's fixed pieces, checked once (``G`` parents, ``M`` slots each, a ring of ``S``)."""

  model: Model
  schedule: LocalSchedule
  topology: Topology
  buffer_size: int
  concurrency: int        # M
  ring: int               # S = max_staleness + 1
  max_staleness: int
  staleness: str          # the staleness function's kind
  staleness_exponent: Any
  hinge_a: Any
  hinge_b: int
  simultaneous: str
  update_from: str
  systems: Systems
  weighting: str
  server_optimizers: tuple
  tier: Tier
  path: UpdatePath | None
  upper: UpperLevels
  links: Any

  @property
  def num_clients(self) -> int:
    return self.topology.num_clients

  @property
  def num_groups(self) -> int:
    return self.topology.num_nodes(self.topology.depth - 1)

  @property
  def leaf(self) -> int:
    return self.topology.depth - 1

  @property
  def group(self) -> np.ndarray:
    """``int32[C]`` every client's parent."""
    return np.asarray(self.topology.parent(self.topology.depth), np.int32)

  @property
  def slot_group(self) -> np.ndarray:
    """``int32[G * M]`` every slot's parent."""
    return np.repeat(np.arange(self.num_groups, dtype=np.int32), self.concurrency)


def _check_sizes(topology: Topology, buffer_size, concurrency) -> tuple[int, int]:
  """``(buffer_size, concurrency)`` checked against the smallest group."""
  depth = topology.depth
  num_groups = topology.num_nodes(depth - 1)
  smallest = int(np.bincount(topology.parent(depth), minlength=num_groups).min())
  buffer_size = int(buffer_size)
  concurrency = buffer_size if concurrency is None else int(concurrency)
  where = "num_clients" if depth == 1 else "the smallest group's clients"
  if not 1 <= buffer_size <= smallest:
    raise ValueError(f"buffer_size={buffer_size} must be in 1..{smallest} ({where}: the number of clients "
                     f"under a parent)")
  if not buffer_size <= concurrency <= smallest:
    raise ValueError(f"concurrency={concurrency} must be in buffer_size..{where} ({buffer_size}..{smallest})")
  return buffer_size, concurrency


def _check_staleness(name: str, max_staleness, staleness_exponent, staleness, hinge_a, hinge_b, simultaneous,
                     update_from) -> None:
  if int(max_staleness) < 0:
    raise ValueError(f"max_staleness={max_staleness!r} must be >= 0")
  with named(name):
    check_nonnegative(staleness_exponent=staleness_exponent)
    check_positive(hinge_a=hinge_a)
  if staleness not in STALENESS:
    raise ValueError(f"{name}: staleness={staleness!r}; choose one of {STALENESS}")
  if int(hinge_b) < 0:
    raise ValueError(f"{name}: hinge_b={hinge_b!r} must be >= 0")
  if simultaneous not in SIMULTANEOUS:
    raise ValueError(f"{name}: simultaneous={simultaneous!r}; choose one of {SIMULTANEOUS}")
  if update_from not in UPDATE_FROM:
    raise ValueError(f"{name}: update_from={update_from!r}; choose one of {UPDATE_FROM}")


def _devices(systems: Systems | None, num_clients: int, depth: int, name: str = "fedbuff") -> Systems:
  """The systems model (default: one local step per second, free transfers, always on line); ``name``
  (the method's) in its refusal."""
  if systems is None:
    systems = Systems(profile=make_profile(np.ones(num_clients), np.ones(num_clients)), uplink_bytes=0.0,
                      downlink_bytes=0.0)
  systems.check(num_clients, depth)
  if systems.policy.kind == "over_selection":
    raise ValueError(f"{name} takes systems with the wait_for_all or deadline policy, got "
                     f"{systems.policy!r}: its concurrency (the clients in flight, of which the first to "
                     f"finish count) is its over-selection")
  return systems


def _plan(*, model, data, local_optimizer, schedule, buffer_size, concurrency, topology, periods,
          server_optimizer, max_staleness, staleness_exponent, staleness, hinge_a, hinge_b, simultaneous,
          update_from, systems, weighting, compute_dtype, client_update, update_paths, name) -> _Plan:
  """:func:`fedbuff`'s arguments checked (every refusal raised here) into its :class:`_Plan`."""
  data.validate(topology)
  depth = topology.depth
  leaf = depth - 1
  buffer_size, concurrency = _check_sizes(topology, buffer_size, concurrency)
  _check_staleness(name, max_staleness, staleness_exponent, staleness, hinge_a, hinge_b, simultaneous,
                   update_from)
  check_weighting(weighting)
  periods = check_periods(periods, depth)
  systems = _devices(systems, data.num_clients, depth, name)
  ring = int(max_staleness) + 1
  server_optimizers = per_level(optax.sgd(1.0) if server_optimizer is None else server_optimizer, depth,
                                "server_optimizer")
  client_update = local_training(client_update, model, local_optimizer, schedule, data,
                                 compute_dtype=compute_dtype, stateless_for=name)
  path = per_level_paths(update_paths, depth, algorithm=name, supported_levels=(leaf,))[leaf]
  if path is not None and path.node is not None:
    raise ValueError(f"{name} cannot run node transform {path.node.name!r} on its buffers: which reports a "
                     f"server step applies depends on the devices' simulated speeds, not on a uniform draw a "
                     f"sampling accountant could amplify by, and each is scaled by its staleness; privatize "
                     f"at the clients (privacy.mechanism='local')")
  num_groups = topology.num_nodes(leaf)
  if path is not None and path.aggregator.accumulate is not None:
    raise ValueError(f"{name} cannot use aggregator {path.aggregator.name!r}: it scales every update by its "
                     f"staleness before the sum, which a sum of encoded updates cannot do; it aggregates its "
                     f"clients by their weighted mean or a blockwise aggregator")
  robust = path is not None and path.aggregator.blockwise   # over each parent's buffer (_robust_update)
  return _Plan(
    model=model, schedule=schedule, topology=topology, buffer_size=buffer_size, concurrency=concurrency,
    ring=ring, max_staleness=int(max_staleness), staleness=staleness, staleness_exponent=staleness_exponent,
    hinge_a=hinge_a, hinge_b=int(hinge_b), simultaneous=simultaneous, update_from=update_from,
    systems=systems, weighting=weighting, server_optimizers=server_optimizers,
    tier=Tier(client_update, path=UpdatePath(client=path.client) if robust else path,
              parent_aligned=ring == 1 and num_groups == 1, batch_order=schedule.batch_order,
              batch_size=schedule.batch_size, keep_client_params=robust),
    path=path,
    upper=UpperLevels(topology=topology, periods=periods, server_optimizers=server_optimizers,
                      paths=(None,) * depth),
    links=systems.server_links([topology.num_nodes(lv) for lv in range(depth)]))


def _init(plan: _Plan, init_params, key) -> FedBuffState:
  p0 = initial_params(plan.model, key, init_params)
  params = broadcast_tree(p0, plan.topology)
  opt = tuple(init_nodes(o, p) for o, p in zip(plan.server_optimizers, params, strict=True))
  leaf, slots = plan.leaf, plan.num_groups * plan.concurrency
  return FedBuffState(
    round=jnp.zeros((), jnp.int32), params=params[leaf], opt_state=opt[leaf],
    history=jax.tree.map(lambda a: jnp.array(jnp.repeat(a, plan.ring, axis=0), copy=True), params[leaf]),
    client=jnp.zeros((slots,), jnp.int32), version=jnp.zeros((slots,), jnp.int32),
    finish=jnp.zeros((slots,), jnp.result_type(float)), busy=jnp.zeros((slots,), bool),
    clock=jnp.zeros((), jnp.result_type(float)), cursor=plan.schedule.init_cursor(plan.num_clients),
    update_state=init_update_state(plan.path, p0, plan.num_clients, plan.num_groups * plan.ring),
    node_clock=jnp.zeros((plan.num_groups,), jnp.result_type(float)), steps=jnp.zeros((slots,), jnp.int32),
    failed=jnp.zeros((slots,), bool), upper_params=tuple(params[:leaf]), upper_opt_state=tuple(opt[:leaf]),
  )


class _Slots(NamedTuple):
  """Every slot after its idle ones started new clients (``[G * M]`` each)."""

  client: jax.Array     # int32: the client in the slot
  version: jax.Array    # int32: the version it started from
  finish: jax.Array     # float: the simulated second it reports (or fails)
  steps: jax.Array      # int32: its local steps (partial work lowered)
  failed: jax.Array     # bool: it fails (dropout, or a deadline it cannot meet)
  busy: jax.Array       # bool: the slot holds a client


def _start_clients(plan: _Plan, state: FedBuffState, num_steps, key) -> _Slots:
  """Idle slots start new clients: uniform among their parent's clients on line and not in flight
  (the draw of :class:`~fedtree.core.sampling.CohortSampler`, busy and off-line clients last); the
  systems model says how much each does and when it reports (:meth:`Systems.attempt`)."""
  num_clients, systems = plan.num_clients, plan.systems
  group_j, slot_group = jnp.asarray(plan.group), jnp.asarray(plan.slot_group)
  sizes = np.bincount(plan.group, minlength=plan.num_groups)
  first = jnp.asarray(np.concatenate([[0], np.cumsum(sizes)[:-1]]), jnp.int32)   # where each parent's
  # clients start, sorted by parent
  u = jax.random.uniform(stream(key, "cohort"), (num_clients,))
  free = jnp.ones((num_clients,), bool).at[jnp.where(state.busy, state.client, num_clients)].set(
    False, mode="drop")
  if systems.availability is not None:
    free = free & systems.availability.at(jnp.take(state.node_clock, group_j))
  u = jnp.where(free, u, 2.0)
  order = jnp.lexsort((u, group_j))
  idle = ~state.busy
  rank = jnp.cumsum(idle.reshape(plan.num_groups, plan.concurrency).astype(jnp.int32), axis=1).reshape(-1) - 1
  new_client = jnp.take(order, jnp.take(first, slot_group) + jnp.where(idle, rank, 0))
  start = idle & (jnp.take(u, new_client) < 2.0)
  client = jnp.where(start, new_client, state.client).astype(jnp.int32)
  want = jnp.take(num_steps, client)
  up_b = uplink_bytes(plan.path, jax.tree.map(lambda a: a[0], state.params))
  comm = systems.client_seconds(client, jnp.zeros_like(want, jnp.result_type(float)),
                                model_bytes(state.params, stacked=True), uplink_bytes=up_b,
                                downlink_bytes=_down_bytes(plan, state.params))
  work = systems.attempt(want, jnp.take(systems.profile.speed, client), comm, stream(key, "systems"))
  return _Slots(
    client=client, version=jnp.where(start, state.round, state.version),
    finish=jnp.where(start, jnp.take(state.node_clock, slot_group) + work.seconds, state.finish),
    steps=jnp.where(start, work.steps, state.steps).astype(jnp.int32),
    failed=jnp.where(start, work.dropped | work.late, state.failed), busy=state.busy | start)


class _Reports(NamedTuple):
  report: jax.Array      # bool[G * M] the slots that report this round (or fail)
  discard: jax.Array     # bool[G * M] reports discarded (simultaneous="drop")
  fresh: jax.Array       # bool[G * M] reports within max_staleness
  ok: jax.Array          # bool[G * M] reports that are applied
  staleness: jax.Array   # int32[G * M] versions since each slot's client started
  node_clock: jax.Array  # float[G] every parent's clock at its buffer's last report


def _reports(plan: _Plan, state: FedBuffState, sl: _Slots) -> _Reports:
  """At every parent, the first ``buffer_size`` of its slots to finish report (or fail)."""
  slots = jnp.arange(plan.num_groups * plan.concurrency, dtype=jnp.int32)
  slot_group = jnp.asarray(plan.slot_group)
  order = jnp.lexsort((slots, jnp.where(sl.busy, sl.finish, jnp.inf), slot_group))
  pos = jnp.zeros_like(slots).at[order].set(slots) - slot_group * plan.concurrency
  report = sl.busy & (pos < plan.buffer_size)
  reached = jax.ops.segment_max(jnp.where(report, sl.finish, -jnp.inf), slot_group,
                                num_segments=plan.num_groups)
  discard = jnp.zeros_like(report)
  if plan.simultaneous != "queue":   # the others that arrive at the moment of the buffer's last report
    tied = sl.busy & ~report & (sl.finish <= jnp.take(reached, slot_group))
    discard = tied if plan.simultaneous == "drop" else discard
    report = report | tied
  staleness = state.round - sl.version
  fresh = report & (staleness <= plan.max_staleness)
  return _Reports(report, discard, fresh, fresh & ~sl.failed & ~discard, staleness,
                  jnp.maximum(state.node_clock, reached))


def _down_bytes(plan: _Plan, params):
  """The bytes of one model through the downlink transform (``None``: no transform, a whole model)."""
  if plan.path is None or plan.path.down is None:
    return None
  _, stats = plan.path.down.apply(jax.tree.map(lambda a: a[:1], params), jax.random.key(0))
  size = stats.get("bytes")
  return None if size is None else jnp.asarray(size, jnp.result_type(float))[0]


def _train(plan: _Plan, state: FedBuffState, sent, sl: _Slots, rep: _Reports, num_steps, w, data,
           key) -> TierResult:
  """The reporting slots train from the versions they started from as they received them (``sent``:
  the ring through the downlink transform; the ring's rows are the tier's parents)."""
  row = jnp.asarray(plan.slot_group) * plan.ring + jnp.mod(sl.version, plan.ring)
  cohort = Cohort(clients=sl.client, parent=row.astype(jnp.int32), valid=rep.ok)
  client_steps = num_steps.at[jnp.where(rep.ok, sl.client, plan.num_clients)].set(
    sl.steps.astype(num_steps.dtype), mode="drop")
  return train_cohort(plan.tier, Down(sent), cohort, data,
                      Clients(client_steps, w, cursor=state.cursor, update_state=state.update_state),
                      stream(key, "train"))


def _buffered_update(plan: _Plan, state: FedBuffState, sent, res: TierResult):
  """Every parent's server step on its buffer: ``Σ_v s(round - v) Σ_{i started at v} w_i Δ_i`` over
  ``Σ_i w_i`` (staleness is per version; with ``update_from="current"`` every update is taken against
  the current model, ``+ Σ_v s(τ_v) W_v (x_t − x̂_v)``, ``x̂_v`` version ``v`` as its clients received
  it: ``sent``)."""
  ring, num_groups = plan.ring, plan.num_groups
  row_version = state.round - jnp.mod(state.round - jnp.arange(ring), ring)
  scale = staleness_factor(state.round - row_version, plan.staleness, exponent=plan.staleness_exponent,
                           hinge_a=plan.hinge_a, hinge_b=plan.hinge_b)

  def per_parent(d):   # [G * S, ...] -> [G, ...], each version's rows scaled by its staleness
    if num_groups == 1:   # (summed over the leading axis: the flat runs' numbers, bitwise)
      return jnp.sum(d * scale.reshape((ring,) + (1,) * (d.ndim - 1)).astype(d.dtype), axis=0, keepdims=True)
    d = d.reshape((num_groups, ring) + d.shape[1:])
    return jnp.sum(d * scale.reshape((1, ring) + (1,) * (d.ndim - 2)).astype(d.dtype), axis=1)

  delta = jax.tree.map(per_parent, res.delta_sum)
  if plan.update_from == "current":
    drift = jax.tree.map(lambda h, p: (jnp.repeat(p, ring, axis=0) - h) * res.weight_sum.reshape(
      (-1,) + (1,) * (h.ndim - 1)).astype(h.dtype), sent, state.params)
    delta = jax.tree.map(jnp.add, delta, jax.tree.map(per_parent, drift))
  total = (jnp.sum(res.weight_sum, axis=0, keepdims=True) if num_groups == 1
           else jnp.sum(res.weight_sum.reshape(num_groups, ring), axis=1))
  return update_nodes(plan.server_optimizers[plan.leaf], state.params, state.opt_state,
                      divide_by_weight(delta, total), total > 0)


def _robust_update(plan: _Plan, state: FedBuffState, sent, res: TierResult, sl: _Slots, rep: _Reports, w,
                   key):
  """Every parent's server step on its buffer through the path's aggregator: each applied report's
  update ``s(τ_i) (x_i − θ_i)`` (``x_i`` the version it started from, or the current model with
  ``update_from="current"``) weighted ``w_i``, as :func:`_buffered_update`'s mean takes them.
  Returns the new params and optimizer state, and the aggregator's statistics."""
  path = plan.path
  assert path is not None and res.client_params is not None
  slot_group = jnp.asarray(plan.slot_group)
  if plan.update_from == "current":   # (θ_i as the server reconstructs it from what it sent: the mix)
    base = jax.tree.map(lambda p: jnp.take(p, slot_group, axis=0), state.params)
  else:
    row = slot_group * plan.ring + jnp.mod(sl.version, plan.ring)
    base = jax.tree.map(lambda h: jnp.take(h, row, axis=0), sent)   # the version as its client received it
  scale = staleness_factor(rep.staleness, plan.staleness, exponent=plan.staleness_exponent,
                           hinge_a=plan.hinge_a, hinge_b=plan.hinge_b)
  updates = jax.tree.map(lambda b, t: (b - t) * scale.reshape((-1,) + (1,) * (b.ndim - 1)).astype(b.dtype),
                         base, res.client_params)
  weights = jnp.where(rep.ok, jnp.take(w, sl.client), 0.0)
  delta_sum, total, _, stats = aggregate_slots(path, UpdateState(), state.params, updates, weights,
                                               slot_group, rep.ok, sl.client, plan.concurrency,
                                               stream(key, "aggregate"))
  params, opt_state = update_nodes(plan.server_optimizers[plan.leaf], state.params, state.opt_state,
                                   divide_by_weight(delta_sum, total), total > 0)
  return params, opt_state, path_stats(stats)


def _metrics(res: TierResult, sl: _Slots, rep: _Reports, num_steps) -> dict:
  fresh, report = rep.fresh, rep.report
  metrics = {
    **res.metrics(),
    "clients_stale": jnp.sum(report & ~fresh, dtype=jnp.int32),
    "clients_dropped": jnp.sum(report & sl.failed & ~rep.discard, dtype=jnp.int32),
    "clients_partial": jnp.sum(rep.ok & (sl.steps < jnp.take(num_steps, sl.client)), dtype=jnp.int32),
    "mean_staleness": jnp.sum(jnp.where(fresh, rep.staleness, 0)) / jnp.maximum(jnp.sum(fresh), 1),
    "max_staleness": jnp.max(jnp.where(fresh, rep.staleness, 0)),
  }
  # reports that trained and were sent but not applied (stale, or dropped on a simultaneous arrival): bytes
  metrics["clients_discarded"] = jnp.sum((report & ~fresh) | rep.discard, dtype=jnp.int32)
  metrics.update(edge_metrics("clients", res.messages() + metrics["clients_discarded"]))
  return metrics


def _upper(plan: _Plan, state: FedBuffState, leaf_params, leaf_opt, node_clock, w, r, key):
  """The levels above as HierFAVG's, every ``periods[l]`` rounds; a level that aggregates waits for
  its slowest child (the clients' parents' clocks meet there) and its transfers."""
  topology, depth = plan.topology, plan.topology.depth
  params = list(state.upper_params) + [leaf_params]
  opt_state = list(state.upper_opt_state) + [leaf_opt]
  params, opt_state, _, active, metrics = plan.upper.aggregate(params, opt_state, [UpdateState()] * depth,
                                                               w, r, key)
  for lv in range(depth - 2, -1, -1):   # a level that aggregated met its slowest child's clock
    mb = model_bytes(params[lv], stacked=True)
    ancestor = jnp.asarray(topology.ancestor(lv, depth - 1))
    meet = jax.ops.segment_max(node_clock, ancestor, num_segments=topology.num_nodes(lv))
    meet = meet + plan.systems.aggregation_seconds(lv, plan.links, mb, mb)
    node_clock = jnp.where(active[lv], jnp.take(meet, ancestor), node_clock)
  params, _, _ = plan.upper.send_down(params, active, key)
  return params, opt_state, node_clock, metrics


def _round(plan: _Plan, state: FedBuffState, data: FederatedData, key):
  num_steps = plan.schedule.num_steps(data.n_train)
  r = state.round + 1
  sl = _start_clients(plan, state, num_steps, key)
  rep = _reports(plan, state, sl)
  w = client_weights(data.n_train, plan.weighting)
  sent, down_stats = send_down(plan.path, state.history, stream(key, "down"))   # each version as received
  res = _train(plan, state, sent, sl, rep, num_steps, w, data, key)
  metrics = {**_metrics(res, sl, rep, num_steps), **path_stats(down_stats, "downlink_")}
  if plan.tier.keep_client_params:   # a robust aggregator over every parent's buffer
    leaf_params, leaf_opt, agg_metrics = _robust_update(plan, state, sent, res, sl, rep, w, key)
    metrics.update(agg_metrics)
  else:
    leaf_params, leaf_opt = _buffered_update(plan, state, sent, res)
  params, opt_state, node_clock, up_metrics = _upper(plan, state, leaf_params, leaf_opt, rep.node_clock, w, r,
                                                     key)
  leaf = plan.leaf
  rows = jnp.arange(plan.num_groups) * plan.ring + jnp.mod(r, plan.ring)
  history = jax.tree.map(lambda h, p: h.at[rows].set(p), state.history, params[leaf])
  clock = jnp.maximum(state.clock, jnp.max(node_clock))
  metrics.update({**up_metrics, "round_seconds": clock - state.clock, "sim_seconds": clock})
  new = FedBuffState(round=r, params=params[leaf], opt_state=opt_state[leaf], history=history,
                     client=sl.client, version=sl.version, finish=sl.finish, busy=sl.busy & ~rep.report,
                     clock=clock, cursor=res.cursor, update_state=res.update_state, node_clock=node_clock,
                     steps=sl.steps, failed=sl.failed, upper_params=tuple(params[:leaf]),
                     upper_opt_state=tuple(opt_state[:leaf]))
  return new, metrics


def _models(plan: _Plan, state: FedBuffState):
  out = {}
  for lv in range(plan.topology.depth):
    p = state.params if lv == plan.leaf else state.upper_params[lv]
    out["global" if lv == 0 else f"level{lv}"] = NodeModels(p, plan.topology.ancestor(lv))
  return out
