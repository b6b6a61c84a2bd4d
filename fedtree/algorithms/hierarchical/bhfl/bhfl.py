"""B-HFL: bidirectional hierarchical FL on trees of any depth (paper 001, Cambridge), every node of the
tree keeping its own model and every merge partial.

The method (:func:`bhfl`), its proxy data (``ProxyData``), state (``BHFLState``) and the table by level
(``level_table``). The round step by step and every choice where the paper is vague: :doc:`the B-HFL
page <algorithms/bhfl.md#the-round-in-detail>`.

References:
  Paper 001 (Cambridge; the paper's text is Romanian).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from fedtree.algorithms.hierarchical.bhfl.asynchrony import Latency, first_arrivals, segment_rank
from fedtree.core.aggregation import divide_by_weight, staleness_weight, weighted_mean, weighted_segment_sum
from fedtree.core.algorithm import (
  CLIENT_ROWS,
  UNNAMED,
  FederatedAlgorithm,
  NodeModels,
  Report,
  RowName,
  check_weighting,
  client_weights,
  initial_params,
  node_rows,
  path_rows,
  per_level,
)
from fedtree.core.checks import check_nonnegative
from fedtree.core.data import FederatedData
from fedtree.core.local import (
  ClientData,
  ClientUpdate,
  LocalSchedule,
  SGDCarry,
  check_client_update,
  make_sgd_step,
  run_local_steps,
  sgd_client_update,
  stack,
)
from fedtree.core.metrics import evaluate
from fedtree.core.model import Model
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.core.server import down_nodes, init_nodes, select_nodes, update_nodes
from fedtree.core.tier import Clients, Down, Tier, edge_metrics, train_cohort
from fedtree.core.topology import Topology
from fedtree.core.updates import (
  UpdatePath,
  aggregate_slots,
  init_update_state,
  path_metrics,
  path_stats,
  per_level_paths,
  send_down,
  transform_children,
)
from fedtree.toolbox.privacy import private_stages

PyTree = Any


# ------------------------------------------------------------------------ pieces
@struct.dataclass
class ProxyData:
  """Proxy (public) training data held by some nodes of one level.

  Attributes:
    x: ``[P, M, ...]`` features of the ``P`` data-holding nodes.
    y: ``int32[P, M]`` labels.
    n: ``int32[P]`` real examples per holder.
    node: ``int32[P]`` index (within the level) of each holder (static, distinct).
  """

  x: jax.Array
  y: jax.Array
  n: jax.Array
  node: tuple = struct.field(pytree_node=False, default=())


def proxy_from_clients(data: FederatedData, topology: Topology, level: int, num_examples: int,
                       *, seed: int = 0) -> ProxyData:
  """**(choice)** Stand-in proxy data: every node of ``level`` holds ``num_examples`` examples
  drawn without replacement from the pooled training data of the clients in its subtree."""
  if num_examples < 1:
    raise ValueError(f"proxy num_examples={num_examples} must be >= 1")
  if not 0 <= level < topology.depth:
    raise ValueError(f"proxy level={level}: only server levels 0..{topology.depth - 1} hold data")
  data.require_padded("B-HFL's stand-in proxy data (proxy_examples > 0)")
  rng = np.random.default_rng(seed)
  x_tr, y_tr, n_tr = (np.asarray(a) for a in (data.x_train, data.y_train, data.n_train))
  anc = topology.ancestor(level)
  xs, ys, ns = [], [], []
  for node in range(topology.num_nodes(level)):
    pool = [(c, i) for c in np.flatnonzero(anc == node) for i in range(n_tr[c])]
    pick = rng.choice(len(pool), size=min(num_examples, len(pool)), replace=False)
    xs.append(np.stack([x_tr[pool[j][0], pool[j][1]] for j in pick]))
    ys.append(np.asarray([y_tr[pool[j][0], pool[j][1]] for j in pick], np.int32))
    ns.append(len(pick))
  m = max(ns)
  pad = lambda a: np.concatenate([a, np.zeros((m - len(a),) + a.shape[1:], a.dtype)])
  return ProxyData(x=jnp.asarray(np.stack([pad(a) for a in xs])),
                   y=jnp.asarray(np.stack([pad(a) for a in ys])),
                   n=jnp.asarray(np.asarray(ns, np.int32)),
                   node=tuple(range(topology.num_nodes(level))))


@struct.dataclass
class Pending:
  """Updates of the nodes of one level waiting at their parents.

  Attributes:
    update: ``[N, ...]`` the node's last update ``u = Θ_parent - θ`` (params-shaped).
    has: ``bool[N]`` an update is waiting (sent and not yet used).
    arrival: ``float[N]`` its arrival time (rounds).
    version: ``int32[N]`` the parent's aggregation count when it was sent.
  """

  update: PyTree
  has: jax.Array
  arrival: jax.Array
  version: jax.Array


class Level(NamedTuple):
  """One level's part of B-HFL's state, as a round works on it (level 0: the root, ``depth``:
  the clients): one record per level instead of parallel lists indexed by level.

  Attributes:
    params: ``[N_l, ...]`` the level's models.
    up: ``[N_l, ...]`` up-optimizer states (server levels; ``None`` for the clients).
    version: ``int32[N_l]`` aggregations done (server levels; ``None`` for the clients).
    down: ``[N_l, ...]`` down-optimizer states (levels ``>= 1``; ``None`` for the root).
    pending: the level's updates waiting at its parents (levels ``>= 1``; ``None`` for the root).
    aggregated: ``bool[N_l]`` the nodes that aggregated this round (server levels, once
      :func:`bhfl`'s aggregate-up phase has run).
  """

  params: PyTree
  up: Any = None
  version: jax.Array | None = None
  down: Any = None
  pending: Pending | None = None
  aggregated: jax.Array | None = None


@struct.dataclass
class BHFLState:
  """State of B-HFL.

  Attributes:
    round: ``int32[]`` rounds done.
    params: per level ``0 .. depth`` (clients last) stacked models ``[N_l, ...]``.
    up_state: per server level ``0 .. depth-1``, up-optimizer states ``[N_l, ...]``.
    down_state: per level ``1 .. depth`` (index ``l-1``), down-optimizer states ``[N_l, ...]``.
    pending: per level ``1 .. depth`` (index ``l-1``), a :class:`Pending`.
    version: per server level, ``int32[N_l]`` aggregations done.
    residual_state: ``[E·K, ...]`` the root's optimizer state per residual link, or ``()``.
    direct_state: ``[E, ...]`` the edges' down state of the root→edge link, or ``()``.
    cursor: ``int32[C]`` the clients' batch cursors under ``batch_order="cyclic"`` (else ``()``).
    update_state: the :class:`~fedtree.core.updates.UpdateState` of the clients' update path.
  """

  round: jax.Array
  params: tuple
  up_state: tuple
  down_state: tuple
  pending: tuple
  version: tuple
  residual_state: Any = ()
  direct_state: Any = ()
  cursor: Any = ()
  update_state: Any = ()

  def row_names(self) -> BHFLState:
    """Rows of every part (:class:`fedtree.core.algorithm.RowName`): level ``l``'s nodes, the
    clients at the last level, the root's residual links and the root→edge links."""
    depth = len(self.params) - 1
    level = lambda lv: CLIENT_ROWS if lv == depth else node_rows(lv)  # noqa: E731
    return self.replace(
      round=UNNAMED, params=tuple(level(lv) for lv in range(depth + 1)),
      up_state=tuple(node_rows(lv) for lv in range(depth)),
      down_state=tuple(level(lv) for lv in range(1, depth + 1)),
      pending=tuple(level(lv) for lv in range(1, depth + 1)),
      version=tuple(node_rows(lv) for lv in range(depth)),
      residual_state=RowName("residual link", "the root's residual state"),
      direct_state=RowName("edge", "the root→edge down state"), cursor=CLIENT_ROWS,
      update_state=path_rows(self.update_state, CLIENT_ROWS, node_rows(depth - 1)),
    )


# ------------------------------------------------------------------------ validation
def check_node_periods(periods, topology: Topology) -> tuple[np.ndarray, ...]:
  """Periods ``T_n`` of every server node: one int, one per level, or per node.

  ``periods`` is ``None`` (every round), an int (all nodes), or a sequence of ``depth``
  entries (levels ``0 .. depth-1``), each an int or a sequence of that level's node count.
  """
  depth = topology.depth
  if periods is None:
    periods = 1
  if isinstance(periods, (int, np.integer)):
    periods = [int(periods)] * depth
  periods = list(periods)
  if len(periods) != depth:
    raise ValueError(
      f"periods={periods} has {len(periods)} entries for {depth} server levels (0..{depth - 1}); "
      f"give one int, one per server level, or per node"
    )
  out = []
  for lv, p in enumerate(periods):
    n = topology.num_nodes(lv)
    arr = np.asarray(p, dtype=np.int64)
    if arr.ndim == 0:
      arr = np.full(n, int(arr))
    if arr.shape != (n,):
      raise ValueError(f"periods[{lv}] has {arr.size} entries for the {n} nodes of level {lv}")
    if arr.min() < 1:
      raise ValueError(f"periods[{lv}] contains {int(arr.min())}; every period must be >= 1")
    out.append(arr.astype(np.int32))
  return tuple(out)


def check_buffer_sizes(buffer_sizes, topology: Topology, cohort_per_edge: np.ndarray) -> tuple:
  """Static buffer size ``b`` per server level (``None``: synchronous, all arrived updates)."""
  depth = topology.depth
  sizes = per_level(buffer_sizes, depth, "buffer_sizes")
  out = []
  for lv, b in enumerate(sizes):
    if b is None or (isinstance(b, (int, np.integer)) and int(b) == -1):
      out.append(None)
      continue
    b = int(b)
    avail = cohort_per_edge if lv == depth - 1 else topology.num_children(lv)
    what = "sampled clients (cohort)" if lv == depth - 1 else "children"
    if b < 1 or b > int(avail.min()):
      raise ValueError(
        f"buffer_sizes[{lv}]={b} cannot work: a node of level {lv} has as few as "
        f"{int(avail.min())} {what}; choose 1 <= b <= {int(avail.min())} or None (synchronous)"
      )
    out.append(b)
  return tuple(out)


# ------------------------------------------------------------------------ the algorithm
def bhfl(
  *,
  model: Model,
  topology: Topology,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule,
  up_optimizers: optax.GradientTransformation | Sequence | None = None,
  down_optimizers: optax.GradientTransformation | Sequence | None = None,
  periods=None,
  cohort_size: int | Sequence[int] | None = None,
  chunk_size: int | str | None = "auto",
  weighting: str = "examples",
  compute_dtype: str | None = None,
  client_update: ClientUpdate | None = None,
  init_params: PyTree | None = None,
  proxy: Mapping[int, ProxyData] | None = None,
  proxy_optimizer: optax.GradientTransformation | None = None,
  proxy_schedule: LocalSchedule | None = None,
  residual_k: int = 0,
  residual_optimizer: optax.GradientTransformation | None = None,
  residual_down: bool = False,
  residual_down_optimizer: optax.GradientTransformation | None = None,
  buffer_sizes=None,
  latencies: Latency | Sequence[Latency] | None = None,
  staleness_exponent: float = 0.0,
  skip_nonfinite: bool = False,
  update_paths: UpdatePath | None = None,
  name: str = "bhfl",
) -> FederatedAlgorithm:
  """B-HFL on ``topology`` (:doc:`docs <algorithms/bhfl.md#the-round-in-detail>`).

  Args:
    model: the model every node holds.
    topology: the tree; its leaves are the clients (rows of ``data``).
    data: the federated data (static shapes, validation).
    local_optimizer: the clients' optax optimizer.
    schedule: local epochs or steps, batch size and batch order (``"cyclic"``: every client's
      cursor lives in ``BHFLState.cursor``).
    up_optimizers: ``η↑`` optimizer of every server level, or one per level ``0..depth-1``
      (default FedAvg, ``sgd(1.0)``).
    down_optimizers: ``η↓`` optimizer of every non-root level, or one per level
      ``1..depth`` (clients last; default ``sgd(1.0)``, full replacement).
    periods: ``T_n`` (see :func:`check_node_periods`); default 1.
    cohort_size: clients sampled per edge server each round (``None``: all).
    chunk_size: clients trained at once; ``None``: the whole cohort; ``"auto"``: the
      per-backend default.
    weighting: ``"examples"`` or ``"uniform"`` weights of children (by their subtrees).
    compute_dtype: mixed-precision default local training (``None``: the params' dtype).
    client_update: must start from the client's own model (``starts_from_own_model``, e.g.
      ``fedprox_update(..., persistent=True)``; default
      :func:`fedtree.core.local.sgd_client_update` with ``persistent=True``); an objective
      that starts from the downloaded model is refused.
    init_params: the model every node starts from (default ``model.init(key)``).
    proxy: ``{level: ProxyData}`` for internal nodes holding data.
    proxy_optimizer: optimizer of proxy training (default ``local_optimizer``).
    proxy_schedule: steps/batch of proxy training (default ``schedule``).
    residual_k: top-K clients per edge forwarded to the root (0: no residual links).
    residual_optimizer: the optimizer of every residual link (default ``sgd(1.0)``).
    residual_down: edges also merge the root's model directly (needs depth >= 3).
    residual_down_optimizer: the down optimizer of that link (default ``sgd(0.5)``).
    buffer_sizes: ``b`` per server level (``None`` = synchronous), one value or ``depth``.
    latencies: :class:`Latency` of the nodes of every level ``1..depth`` (one, or ``depth``).
    staleness_exponent: ``a`` in the staleness weight ``(1 + s)^-a``.
    skip_nonfinite: a client whose update is not finite sends nothing and keeps its model, as
      if not sampled (its examples still weigh its ancestors at the levels above, as
      HierFAVG's do); counted in the ``clients_skipped`` metric (see
      :func:`fedtree.core.tier.train_cohort`).
    update_paths: the update path at the edge servers (:mod:`fedtree.core.updates`): a client
      transform on the update every client sends (the client keeps its own untransformed model); the
      aggregator (a robust one, an omniscient attack in front of it) over the updates each edge takes
      from its buffer, weighted by staleness as the mean is; a node transform on each edge's
      aggregate; a downlink transform on the models the edges send their clients. Central noise at
      the edges is refused by name (an edge's sum mixes updates of earlier rounds, scaled by their
      staleness, which the per-round accounting does not bound); local noise runs.
    name: label for reports.

  Raises:
    ValueError: periods, buffer sizes, ``residual_k`` or proxy data that cannot work with
      the tree.

  Example:
    Partial merges downwards (η↓ = 0.5) on root -> 2 edges -> 5 clients:

    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=2))
    >>> alg = bhfl(topology=Topology.from_labels(groups), local_optimizer=optax.sgd(0.1),
    ...            down_optimizers=optax.sgd(0.5), **common)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> int(state.round)
    2
  """
  data.validate(topology)
  depth = topology.depth
  up_opts = per_level(optax.sgd(1.0) if up_optimizers is None else up_optimizers, depth,
                      "up_optimizers")
  down_opts = per_level(optax.sgd(1.0) if down_optimizers is None else down_optimizers, depth,
                        "down_optimizers")
  periods = check_node_periods(periods, topology)
  check_weighting(weighting)
  sampler = cohort_sampler(topology.parent(depth), cohort_size, chunk_size=chunk_size)
  num_edges = topology.num_nodes(depth - 1)
  cohort_per_edge = np.asarray(sampler.sizes, np.int64)
  buffers = check_buffer_sizes(buffer_sizes, topology, cohort_per_edge)
  lats = per_level(Latency() if latencies is None else latencies, depth, "latencies")
  check_nonnegative(staleness_exponent=staleness_exponent)
  residual_k = _check_residual(residual_k, residual_down, buffers, cohort_per_edge, depth)
  residual_opt = optax.sgd(1.0) if residual_optimizer is None else residual_optimizer
  direct_opt = optax.sgd(0.5) if residual_down_optimizer is None else residual_down_optimizer
  proxy = _check_proxy(proxy, topology)
  proxy_opt = local_optimizer if proxy_optimizer is None else proxy_optimizer
  proxy_sched = schedule if proxy_schedule is None else proxy_schedule
  proxy_step = make_sgd_step(model, proxy_opt)
  max_steps = schedule.max_steps(data.max_train)
  client_update = _client_update(client_update, model, local_optimizer, schedule, max_steps, compute_dtype)
  check_client_update(client_update, "bhfl", own_model=True)
  tier = Tier(client_update, chunk_size=sampler.chunk_size, parent_aligned=sampler.parent_aligned,
              batch_order=schedule.batch_order, batch_size=schedule.batch_size, skip_nonfinite=skip_nonfinite)
  path = per_level_paths(update_paths, depth, algorithm=name, supported_levels=(depth - 1,))[depth - 1]
  _check_edge_path(path, name)
  parents = [None] + [np.asarray(topology.parent(lv)) for lv in range(1, depth + 1)]
  ancestors = [np.asarray(topology.ancestor(lv)) for lv in range(depth + 1)]
  nums = [topology.num_nodes(lv) for lv in range(depth + 1)]
  num_clients = topology.num_clients
  num_links = num_edges * residual_k
  edge_block = int(np.bincount(np.asarray(topology.parent(depth)), minlength=num_edges).max())
  plan = _Plan(
    depth=depth, parents=parents, ancestors=ancestors, nums=nums, sampler=sampler, schedule=schedule,
    tier=tier, path=path, edge_block=edge_block, lats=lats, periods=periods, buffers=buffers,
    staleness_exponent=staleness_exponent, proxy=proxy, proxy_sched=proxy_sched, proxy_opt=proxy_opt,
    proxy_step=proxy_step, residual_k=residual_k, num_links=num_links, residual_opt=residual_opt,
    direct_opt=direct_opt, residual_down=residual_down, down_opts=down_opts, up_opts=up_opts, model=model,
    init_params=init_params, num_clients=num_clients, weighting=weighting, skip_nonfinite=skip_nonfinite,
    topology=topology)
  return FederatedAlgorithm(init=functools.partial(_init, plan), round=functools.partial(_round_fn, plan),
                            models=functools.partial(_models, plan), name=name)


def _check_edge_path(path: UpdatePath | None, name: str) -> None:
  """Refuses central noise at the edge servers by name (see :func:`bhfl`'s ``update_paths``)."""
  if path is not None and path.node is not None and private_stages(UpdatePath(node=path.node)):
    raise ValueError(f"{name}: central differential privacy ({path.node.name!r}) at the edge servers: an "
                     f"edge's sum mixes updates trained in earlier rounds, each scaled by its staleness, "
                     f"which the per-round accounting does not bound; use mechanism='local'")


def _check_residual(residual_k, residual_down, buffers, cohort_per_edge, depth: int) -> int:
  """``residual_k`` checked against the edges' cohorts (or buffers) and the tree's depth."""
  residual_k = int(residual_k)
  if residual_k < 0:
    raise ValueError(f"residual_k={residual_k} must be >= 0")
  if residual_k:
    limit = int(cohort_per_edge.min()) if buffers[depth - 1] is None else buffers[depth - 1]
    if residual_k > limit:
      raise ValueError(
        f"residual_k={residual_k} cannot work: an edge server aggregates as few as {limit} "
        f"client updates per round (cohort or buffer size); choose residual_k <= {limit}"
      )
    if depth < 2:
      raise ValueError("residual links need a tree with edge servers below the root (depth >= 2)")
  if residual_down and depth < 3:
    raise ValueError(
      f"residual_down links the root to the edge servers directly, which needs depth >= 3; "
      f"the tree has depth {depth} (its edges are already the root's children)"
    )
  return residual_k


def _check_proxy(proxy, topology: Topology) -> dict:
  """Proxy data per server level, each naming distinct nodes of its level."""
  depth = topology.depth
  proxy = dict(proxy or {})
  for lv, pd in proxy.items():
    if not 0 <= int(lv) < depth:
      raise ValueError(f"proxy data at level {lv}: only server levels 0..{depth - 1} hold data")
    nodes = np.asarray(pd.node)
    if nodes.size != pd.x.shape[0] or len(set(nodes.tolist())) != nodes.size or (
        nodes.size and (nodes.min() < 0 or nodes.max() >= topology.num_nodes(int(lv)))):
      raise ValueError(
        f"proxy data at level {lv}: node={pd.node} must list {pd.x.shape[0]} distinct nodes "
        f"of 0..{topology.num_nodes(int(lv)) - 1}"
      )
  return proxy


def _client_update(client_update, model, local_optimizer, schedule, max_steps, compute_dtype):
  """The clients' update (default: plain SGD that keeps each client's own model)."""
  if client_update is None:
    client_update = sgd_client_update(
      model, local_optimizer, batch_size=schedule.batch_size, max_steps=max_steps, persistent=True,
      compute_dtype=compute_dtype,
    )
  elif compute_dtype is not None:
    raise ValueError(
      f"compute_dtype={compute_dtype!r} configures B-HFL's default local training; with an explicit "
      f"client_update, pass compute_dtype to the objective's factory instead"
    )
  return client_update


@dataclasses.dataclass(frozen=True)
class _Plan:
  """B-HFL's fixed pieces, checked once by :func:`bhfl` (its arguments, validated, and what the
  round derives from the tree: every level's parents, ancestors and node counts)."""

  depth: Any
  parents: Any
  ancestors: Any
  nums: Any
  sampler: Any
  schedule: Any
  tier: Any
  path: Any
  edge_block: Any    # the most clients under one edge: an edge's buffer holds at most one update of each
  lats: Any
  periods: Any
  buffers: Any
  staleness_exponent: Any
  proxy: Any
  proxy_sched: Any
  proxy_opt: Any
  proxy_step: Any
  residual_k: Any
  num_links: Any
  residual_opt: Any
  direct_opt: Any
  residual_down: Any
  down_opts: Any
  up_opts: Any
  model: Any
  init_params: Any
  num_clients: Any
  weighting: Any
  skip_nonfinite: Any
  topology: Any


def _init(plan: _Plan, key):
  p0 = initial_params(plan.model, key, plan.init_params)
  params = tuple(stack(p0, plan.nums[lv]) for lv in range(plan.depth + 1))
  pending = tuple(
    Pending(update=jax.tree.map(jnp.zeros_like, params[lv]), has=jnp.zeros((plan.nums[lv],), bool),
            arrival=jnp.zeros((plan.nums[lv],), jnp.result_type(float)),
            version=jnp.zeros((plan.nums[lv],), jnp.int32))
    for lv in range(1, plan.depth + 1)
  )
  return BHFLState(
    round=jnp.zeros((), jnp.int32), params=params,
    up_state=tuple(init_nodes(plan.up_opts[lv], params[lv]) for lv in range(plan.depth)),
    down_state=tuple(init_nodes(plan.down_opts[lv - 1], params[lv]) for lv in range(1, plan.depth + 1)),
    pending=pending, version=tuple(jnp.zeros((plan.nums[lv],), jnp.int32) for lv in range(plan.depth)),
    residual_state=init_nodes(plan.residual_opt, stack(p0, plan.num_links)) if plan.num_links else (),
    direct_state=init_nodes(plan.direct_opt, params[plan.depth - 1]) if plan.residual_down else (),
    cursor=plan.schedule.init_cursor(plan.num_clients),
    update_state=init_update_state(plan.path, p0, plan.num_clients, plan.nums[plan.depth - 1]),
  )


def _take(tree, idx):
  return jax.tree.map(lambda a: jnp.take(a, jnp.asarray(idx), axis=0), tree)


def _send(p: Pending, mask, update, arrival, version) -> Pending:
  return Pending(
    update=select_nodes(mask, update, p.update), has=p.has | mask,
    arrival=jnp.where(mask, arrival, p.arrival), version=jnp.where(mask, version, p.version),
  )


def _proxy_train(plan: _Plan, lv, params_lv, active, key):
  pd = plan.proxy[lv]
  nodes = np.asarray(pd.node, np.int32)
  start = _take(params_lv, nodes)
  steps = plan.proxy_sched.num_steps(pd.n)
  ms = plan.proxy_sched.max_steps(pd.x.shape[1])

  def one(p, x, y, n, s, k):
    carry = SGDCarry(params=p, opt_state=plan.proxy_opt.init(p), anchor=p)
    carry, loss = run_local_steps(plan.proxy_step, carry, ClientData(x, y, n), s, k,
                                  batch_size=plan.proxy_sched.batch_size, max_steps=ms)
    return carry.params, loss

  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.asarray(nodes))
  new, loss = jax.vmap(one)(start, pd.x, pd.y, pd.n, steps, keys)
  act = jnp.take(active, jnp.asarray(nodes))
  new = select_nodes(act, new, start)
  params_lv = jax.tree.map(lambda a, v: a.at[jnp.asarray(nodes)].set(v), params_lv, new)
  return params_lv, jnp.sum(jnp.where(act, loss, 0.0)), jnp.sum(act.astype(jnp.int32))


def _levels_of(plan: _Plan, state: BHFLState) -> list[Level]:
  return [Level(params=state.params[lv],
                up=state.up_state[lv] if lv < plan.depth else None,
                version=state.version[lv] if lv < plan.depth else None,
                down=state.down_state[lv - 1] if lv else None,
                pending=state.pending[lv - 1] if lv else None)
          for lv in range(plan.depth + 1)]

# ------------------------------------------------------------------------ the round, in phases

def _train_clients(plan: _Plan, levels: list[Level], cursor, update_state, data: FederatedData, w_client,
                   t0, lat_key, key, metrics):
  """Clients train from their own models; their updates (through the update path's client
  stage: what each sends of its update, it keeps its own model) head to their edge servers."""
  edge, clients = levels[plan.depth - 1], levels[plan.depth]
  cohort = plan.sampler(stream(key, "cohort"))
  steps = plan.schedule.num_steps(data.n_train)
  res = train_cohort(plan.tier, Down(edge.params), cohort, data,
                     Clients(steps, w_client, state=clients.params, cursor=cursor), stream(key, "train"))
  trained = res.reported   # the cohort, less the clients skipped for a non-finite update
  u = jax.tree.map(jnp.subtract, _take(edge.params, plan.parents[plan.depth]), res.client_state)
  if plan.path is not None:
    u, update_state, sums = transform_children(
      plan.path, update_state, u, jnp.asarray(plan.parents[plan.depth]), w_client, trained,
      plan.nums[plan.depth - 1], stream(key, "update"))
    metrics.update(path_metrics(sums, res.num_trained, {}, {}))
  arrival = t0 + plan.lats[plan.depth - 1].sample(jax.random.fold_in(lat_key, plan.depth), plan.num_clients)
  version = jnp.take(edge.version, jnp.asarray(plan.parents[plan.depth]))
  pending = _send(clients.pending, trained, u, arrival, version)
  levels[plan.depth] = clients._replace(params=res.client_state, pending=pending)
  return levels, res, update_state


def _edge_path(plan: _Plan) -> UpdatePath | None:
  """The update path when the edges aggregate through its aggregator or node stage, else ``None``."""
  path = plan.path
  return None if path is None or path.sums_by_mean else path


def _edge_aggregate(plan: _Plan, edge_params, update, wt, use, update_state, key, metrics):
  """Every edge's aggregate of the updates it takes (``use``) through the path's aggregator and node
  stage, the staleness-scaled weights ``wt`` as the mean's. Returns ``(delta [E, ...], update_state)``."""
  path = _edge_path(plan)
  assert path is not None
  delta_sum, total, update_state, stats = aggregate_slots(
    path, update_state, edge_params, update, wt, jnp.asarray(plan.parents[plan.depth]), use,
    jnp.arange(plan.num_clients, dtype=jnp.int32), plan.edge_block, stream(key, "aggregate"))
  metrics.update(path_stats(stats))
  return divide_by_weight(delta_sum, total), update_state


def _aggregate_level(plan: _Plan, levels: list[Level], lv: int, r, t0, w_child, lat_key, key, metrics,
                     update_state):
  """Server level ``lv`` aggregates the updates of its children that arrived (period,
  buffer and staleness rules; the edges through the update path's aggregator and node stage),
  steps its up optimizer, trains on its proxy data, and sends its own update to its parent.
  Returns the levels, the children's updates it used and the path's state."""
  node, child = levels[lv], levels[lv + 1]
  par = jnp.asarray(plan.parents[lv + 1])
  p = child.pending
  period_ok = (r % jnp.asarray(plan.periods[lv])) == 0
  eligible = p.has & (p.arrival < t0 + 1.0) & jnp.take(period_ok, par)
  sel = first_arrivals(p.arrival, eligible, plan.parents[lv + 1], plan.nums[lv], plan.buffers[lv])
  count = jax.ops.segment_sum(sel.astype(jnp.int32), par, num_segments=plan.nums[lv])
  agg = period_ok & (count >= (1 if plan.buffers[lv] is None else plan.buffers[lv]))
  use = sel & jnp.take(agg, par)
  stale = jnp.take(node.version, par) - p.version
  wt = jnp.where(use, w_child * staleness_weight(stale, plan.staleness_exponent), 0.0)
  if lv == plan.depth - 1 and _edge_path(plan) is not None:
    delta, update_state = _edge_aggregate(plan, node.params, p.update, wt, use, update_state, key, metrics)
  else:
    delta, _ = weighted_mean(p.update, wt, par, plan.nums[lv])
  params, up = update_nodes(plan.up_opts[lv], node.params, node.up, delta, agg)
  send_time = jnp.maximum(
    jax.ops.segment_max(jnp.where(use, p.arrival, -jnp.inf), par, num_segments=plan.nums[lv]), t0)
  fdtype = jnp.result_type(float)
  n_used = jnp.maximum(jnp.sum(use.astype(jnp.int32)), 1).astype(fdtype)
  metrics[f"aggregated_l{lv}"] = jnp.sum(agg.astype(jnp.int32))
  if lv >= 1:   # every node that aggregated sends its update up (bytes: toolbox.traffic)
    metrics[f"level{lv - 1}_children_sent"] = metrics[f"aggregated_l{lv}"]
  metrics[f"staleness_l{lv}"] = jnp.sum(jnp.where(use, stale, 0)).astype(fdtype) / n_used
  if lv in plan.proxy:
    params, pl, pn = _proxy_train(plan, lv, params, agg, jax.random.fold_in(stream(key, "proxy"), lv))
    metrics[f"proxy_loss_l{lv}"] = pl / jnp.maximum(pn, 1).astype(fdtype)
  node = node._replace(params=params, up=up, version=node.version + agg.astype(jnp.int32),
                       aggregated=agg)
  if lv >= 1:
    parent = levels[lv - 1]
    u = jax.tree.map(jnp.subtract, _take(parent.params, plan.parents[lv]), params)
    arrival = send_time + plan.lats[lv - 1].sample(jax.random.fold_in(lat_key, lv), plan.nums[lv])
    node = node._replace(pending=_send(node.pending, agg, u, arrival,
                                      jnp.take(parent.version, jnp.asarray(plan.parents[lv]))))
  levels[lv], levels[lv + 1] = node, child._replace(pending=p.replace(has=p.has & ~use))
  return levels, p, use, update_state


def _residual_links(plan: _Plan, p: Pending, use):
  """The ``residual_k`` largest updates each edge server used, one per residual link."""
  par = plan.parents[plan.depth]
  sq = sum(jnp.sum(jnp.square(a.reshape(a.shape[0], -1)), axis=1) for a in jax.tree.leaves(p.update))
  rank = segment_rank(-sq, use, par, plan.nums[plan.depth - 1])
  link = jnp.where(use & (rank < plan.residual_k), jnp.asarray(par) * plan.residual_k + rank, plan.num_links)
  update = jax.tree.map(lambda a: a[:plan.num_links], weighted_segment_sum(
    p.update, jnp.ones((plan.num_clients,), jnp.result_type(float)), link, plan.num_links + 1))
  has = jax.ops.segment_sum(jnp.ones((plan.num_clients,), jnp.int32), link,
                            num_segments=plan.num_links + 1)[:plan.num_links] > 0
  return update, has


def _aggregate_up(plan: _Plan, levels: list[Level], r, t0, w_nodes, lat_key, key, metrics, update_state):
  """Leaf-to-root: every server level aggregates, the edges first."""
  residual = None
  for lv in range(plan.depth - 1, -1, -1):
    levels, used, use, update_state = _aggregate_level(plan, levels, lv, r, t0, w_nodes[lv + 1], lat_key, key,
                                                       metrics, update_state)
    if plan.residual_k and lv == plan.depth - 1:
      residual = _residual_links(plan, used, use)
  return levels, residual, update_state


def _residual_into_root(plan: _Plan, levels: list[Level], residual_state, residual, metrics):
  """The root steps its residual optimizer on every residual link that carried an update."""
  if not plan.residual_k:
    return levels, residual_state
  res_update, res_has = residual
  root = levels[0]
  steps, new_s = jax.vmap(plan.residual_opt.update)(res_update, residual_state,
                                               _take(root.params, np.zeros(plan.num_links, np.int32)))
  residual_state = select_nodes(res_has, new_s, residual_state)
  mean_step, _ = weighted_mean(steps, res_has.astype(jnp.result_type(float)),
                               jnp.zeros((plan.num_links,), jnp.int32), 1)
  levels[0] = root._replace(params=jax.tree.map(jnp.add, root.params, mean_step))
  metrics["residual_links_used"] = jnp.sum(res_has.astype(jnp.int32))
  if plan.depth >= 2:   # a residual link is one more message into the root
    metrics["level0_children_sent"] = metrics["level0_children_sent"] + metrics["residual_links_used"]
  return levels, residual_state


def _merge_down(plan: _Plan, levels: list[Level], direct_state, metrics, key):
  """Root-to-leaf: every node that received its parent's new model merges it through its
  down optimizer (a node receives when its parent aggregated or received this round; a client, its
  edge's model through the update path's downlink transform); the models sent down every edge are
  counted (:mod:`fedtree.toolbox.traffic`)."""
  sent = levels[0].aggregated
  for lv in range(plan.depth):
    child, node = lv + 1, levels[lv + 1]
    recv = jnp.take(sent, jnp.asarray(plan.parents[child]))
    source = levels[lv].params
    if child == plan.depth:   # what the edges send their clients
      source, down_stats = send_down(plan.path, source, stream(key, "down"))
      metrics.update(path_stats(down_stats, "downlink_"))
    params, down = down_nodes(plan.down_opts[lv], node.params, node.down,
                              _take(source, plan.parents[child]), recv)
    received = jnp.sum(recv.astype(jnp.int32))   # models sent down this edge (toolbox.traffic)
    metrics["clients_received" if child == plan.depth else f"level{lv}_children_received"] = received
    if plan.residual_down and child == plan.depth - 1:
      direct = jnp.broadcast_to(levels[0].aggregated[0], (plan.nums[child],))
      params, direct_state = down_nodes(
        plan.direct_opt, params, direct_state, _take(levels[0].params, np.zeros(plan.nums[child], np.int32)),
        direct)
      recv = recv | direct
      key0 = "level0_children_received"
      metrics[key0] = metrics.get(key0, 0) + jnp.sum(direct.astype(jnp.int32))
    levels[child] = node._replace(params=params, down=down)
    if child < plan.depth:
      sent = node.aggregated | recv
  return levels, direct_state


def _round_fn(plan: _Plan, state: BHFLState, data: FederatedData, key):
  r = state.round + 1
  t0 = state.round.astype(jnp.result_type(float))
  w_client = client_weights(data.n_train, plan.weighting)
  w_nodes = [jax.ops.segment_sum(w_client, jnp.asarray(plan.ancestors[lv]), num_segments=plan.nums[lv])
             for lv in range(plan.depth)] + [w_client]
  lat_key = stream(key, "latency")
  metrics: dict[str, jax.Array] = {}
  levels = _levels_of(plan, state)
  levels, res, update_state = _train_clients(plan, levels, state.cursor, state.update_state, data, w_client,
                                            t0, lat_key, key, metrics)
  levels, residual, update_state = _aggregate_up(plan, levels, r, t0, w_nodes, lat_key, key, metrics,
                                                 update_state)
  levels, residual_state = _residual_into_root(plan, levels, state.residual_state, residual, metrics)
  levels, direct_state = _merge_down(plan, levels, state.direct_state, metrics, key)
  metrics.update(res.metrics(plan.skip_nonfinite))
  # the models that went up and down every edge (toolbox.traffic): a level's children sent what
  # aggregated (and the residual links), received what its down-merges delivered
  metrics.update(edge_metrics("clients", res.messages(), metrics["clients_received"]))
  for lv in range(plan.depth - 1):
    sent = metrics[f"level{lv}_children_sent"]
    metrics.update(edge_metrics(f"level{lv}", sent, metrics.get(f"level{lv}_children_received", sent)))
  return BHFLState(
    round=r, params=tuple(lvl.params for lvl in levels),
    up_state=tuple(lvl.up for lvl in levels[:plan.depth]), down_state=tuple(lvl.down for lvl in levels[1:]),
    pending=tuple(lvl.pending for lvl in levels[1:]),
    version=tuple(lvl.version for lvl in levels[:plan.depth]),
    residual_state=residual_state, direct_state=direct_state, cursor=res.cursor,
    update_state=update_state,
  ), metrics


def _models(plan: _Plan, state: BHFLState):
  return {level_name(lv, plan.depth): NodeModels(state.params[lv], plan.topology.ancestor(lv))
          for lv in range(plan.depth + 1)}


def level_name(level: int, depth: int) -> str:
  """``root`` (level 0), ``level<l>`` for inner levels, ``client`` (the leaves)."""
  return "root" if level == 0 else "client" if level == depth else f"level{level}"


# ------------------------------------------------------------------------ evaluation by level
def central_test_set(data: FederatedData, central_test=None) -> tuple[np.ndarray, np.ndarray]:
  """The dataset's central test set, or **(choice)** the union of the clients' test data."""
  if central_test is not None:
    return np.asarray(central_test[0]), np.asarray(central_test[1])
  x, y, n = (np.asarray(a) for a in (data.x_test, data.y_test, data.n_test))
  mask = np.arange(x.shape[1])[None, :] < n[:, None]
  return x[mask], y[mask]


def level_table(model: Model, params_by_level: Sequence[PyTree], topology: Topology,
                data: FederatedData, central_test=None,
                chunk_size: int | None = None, summaries: Mapping[str, Mapping] | None = None) -> list[dict]:
  """One row per level: every node's model on its subtree's clients and on the central set.

  ``subtree_accuracy``: example-weighted accuracy of each client's level-``l`` ancestor on
  that client's test data (every node on every client of its subtree);
  ``subtree_client_mean``: the same, averaged per client; ``central_accuracy`` /
  ``central_loss``: mean over the nodes of the level of each node's accuracy / loss on the
  central test set (``central_min`` / ``central_max`` the spread).

  ``summaries``: the run's evaluation of B-HFL's ``models()`` (each level's nodes on their
  subtrees' clients, keyed by :func:`level_name`): the subtree columns are read from it
  (``accuracy``, ``client_mean_accuracy``) instead of scoring the levels again.
  """
  xc, yc = central_test_set(data, central_test)
  xc, yc = jnp.asarray(xc), jnp.asarray(yc)
  score = jax.jit(lambda p, x, y, n, m: evaluate(model, p, x, y, n, model_of_client=m,
                                                 chunk_size=chunk_size))
  rows = []
  for lv, params in enumerate(params_by_level):
    done = (summaries or {}).get(level_name(lv, topology.depth), None)
    if done is not None:
      subtree, client_mean = float(done["accuracy"]), float(done["client_mean_accuracy"])
    else:
      stats = score(params, data.x_test, data.y_test, data.n_test,
                    jnp.asarray(topology.ancestor(lv)))
      correct, count = np.asarray(stats.correct), np.asarray(stats.count)
      has = count > 0
      subtree = float(correct.sum() / max(count.sum(), 1))
      client_mean = float(np.mean(correct[has] / count[has])) if has.any() else float("nan")
    n_nodes = topology.num_nodes(lv)
    cx = jnp.broadcast_to(xc[None], (n_nodes,) + xc.shape)
    cy = jnp.broadcast_to(yc[None], (n_nodes,) + yc.shape)
    cn = jnp.full((n_nodes,), xc.shape[0], jnp.int32)
    cstats = score(params, cx, cy, cn, jnp.arange(n_nodes, dtype=jnp.int32))
    cacc = np.asarray(cstats.correct) / np.maximum(np.asarray(cstats.count), 1)
    closs = np.asarray(cstats.loss_sum) / np.maximum(np.asarray(cstats.count), 1)
    rows.append(dict(
      level=lv, name=level_name(lv, topology.depth), nodes=n_nodes,
      subtree_accuracy=subtree, subtree_client_mean=client_mean,
      central_accuracy=float(cacc.mean()), central_min=float(cacc.min()),
      central_max=float(cacc.max()), central_loss=float(closs.mean()),
    ))
  return rows


def format_level_table(label: str, rows: Sequence[dict]) -> str:
  """Markdown table of :func:`level_table` rows."""
  head = ("| level | nodes | own-subtree clients acc | client mean | central acc (mean) "
          "| central min..max | central loss |")
  lines = [f"### B-HFL by level: {label}", "", head, "|" + "---|" * 7]
  for r in rows:
    lines.append(
      f"| {r['level']} ({r['name']}) | {r['nodes']} | {r['subtree_accuracy']:.4f} | "
      f"{r['subtree_client_mean']:.4f} | {r['central_accuracy']:.4f} | "
      f"{r['central_min']:.4f}..{r['central_max']:.4f} | {r['central_loss']:.4f} |"
    )
  return "\n".join(lines)


def with_level_report(algorithm: FederatedAlgorithm, model: Model, topology: Topology, *,
                      central_test=None, chunk_size: int | None = None,
                      label: str | None = None) -> FederatedAlgorithm:
  """``algorithm`` with a ``report`` hook giving the table by level (:func:`level_table`, its
  subtree columns read from the run's own evaluation of the levels, only the central set
  scored here): printed, written as ``bhfl_levels_<label>.{json,md}``, and its central
  accuracies added to the summaries as ``<level>@central``."""
  label = label or algorithm.name

  def report(state, data, key, summaries):
    del key
    rows = level_table(model, state.params, topology, data, central_test, chunk_size, summaries=summaries)
    text = format_level_table(label, rows)
    out = dict(summaries)
    for r in rows:
      out[f"{r['name']}@central"] = dict(accuracy=r["central_accuracy"], loss=r["central_loss"],
                                         client_mean_accuracy=float("nan"))
    files = {f"bhfl_levels_{label}.json": json.dumps(rows, indent=2),
             f"bhfl_levels_{label}.md": text + "\n"}
    return Report(out, "\n" + text, files)

  return algorithm._replace(report=report)
