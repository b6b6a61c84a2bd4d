"""FedBuff (Nguyen et al. 2022, "Federated learning with buffered asynchronous aggregation") on
the simulated clock of :mod:`fedtree.core.systems`.

``concurrency`` clients train at once, each from the model version it downloaded when it
started; the server applies an update as soon as ``buffer_size`` of them have reported (the
earliest to finish in simulated time), each update weighted by its staleness ``τ`` (server
versions since its client started) as ``s(τ) = (1 + τ)^-staleness_exponent`` (the paper's
``1/sqrt(1 + τ)`` by default), and the freed slots start new clients from the new model.

Everything has static shapes: the in-flight clients are ``[concurrency]`` slots (client, start
version, finish time), the models a slot may have started from are a ring of the last
``max_staleness + 1`` versions, and one algorithm round is one server update. A round trains
the reporting slots with :func:`fedtree.core.tier.train_cohort`, each from its version (the
ring's rows are the tier's "parents"), so a client's whole local training is simulated in the
round it reports. A client that would report more than ``max_staleness`` versions late is
dropped (``clients_stale``).

With ``buffer_size == concurrency`` every slot reports in every round, so every client starts
from the current model (``τ = 0``): FedBuff is then FedAvg with ``cohort_size = buffer_size``,
and with the same key draws the same clients and computes the same models (tested bitwise).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from fedtree.algorithms.bhfl.asynchrony import staleness_weight
from fedtree.core.aggregation import divide_by_weight
from fedtree.core.algorithm import (
  FederatedAlgorithm,
  NodeModels,
  check_weighting,
  client_weights,
  initial_params,
  local_training,
)
from fedtree.core.data import FederatedData
from fedtree.core.local import ClientUpdate, LocalSchedule, stack
from fedtree.core.model import Model
from fedtree.core.rng import stream
from fedtree.core.sampling import Cohort
from fedtree.core.server import init_nodes, update_nodes
from fedtree.core.systems import Systems, make_profile, model_bytes, uplink_bytes
from fedtree.core.tier import train_cohort
from fedtree.core.updates import UpdatePath, init_path_state, per_level_paths

PyTree = Any


@struct.dataclass
class FedBuffState:
  """The server, its ring of recent models and the clients in flight.

  Attributes:
    round: ``int32[]`` server updates so far (the current model's version).
    params: ``[1, ...]`` the server's model.
    opt_state: ``[1, ...]`` the server optimizer's state.
    history: ``[S, ...]`` the last ``S = max_staleness + 1`` models; version ``v`` in row ``v % S``.
    client: ``int32[M]`` the client in every slot.
    version: ``int32[M]`` the version it started from.
    finish: ``float32[M]`` the simulated second it reports.
    busy: ``bool[M]`` whether the slot holds a client.
    clock: ``float32[]`` simulated seconds.
    cursor: ``int32[C]`` batch cursors (``"cyclic"``), else ``()``.
    update_state: the :class:`~fedtree.core.updates.PathState` of the clients' update path.
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


def fedbuff(
  *,
  model: Model,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule,
  buffer_size: int,
  concurrency: int | None = None,
  server_optimizer: optax.GradientTransformation | None = None,
  max_staleness: int = 8,
  staleness_exponent: float = 0.5,
  systems: Systems | None = None,
  weighting: str = "examples",
  compute_dtype: str | None = None,
  client_update: ClientUpdate | None = None,
  init_params: PyTree | None = None,
  update_paths: UpdatePath | None = None,
  name: str = "fedbuff",
) -> FederatedAlgorithm:
  """FedBuff over all clients of ``data`` (one server).

  Args:
    model: the model.
    data: the federated data.
    local_optimizer: the clients' optax optimizer.
    schedule: local epochs or steps and batch size.
    buffer_size: ``K``, client updates per server update.
    concurrency: clients in flight (default ``buffer_size``); at least ``buffer_size``, at most
      the number of clients.
    server_optimizer: applied to the buffered pseudo-gradient (default ``sgd(1.0)``).
    max_staleness: oldest model version a client may start from and still count (the ring size
      less one); later reports are dropped.
    staleness_exponent: ``a`` in ``s(τ) = (1 + τ)^-a`` (0: no staleness weighting).
    systems: device speeds, bandwidths and availability (:class:`~fedtree.core.systems.Systems`)
      that set when each client reports; its policy must be ``wait_for_all`` without dropout
      (FedBuff has no round to put a deadline on). ``None``: one local step per second, free
      transfers, always on line.
    weighting: ``"examples"`` or ``"uniform"``: ``Δ = Σ_i w_i s(τ_i) Δ_i / Σ_i w_i``.
    compute_dtype: mixed-precision local training.
    client_update: a stateless local objective (default plain SGD by ``local_optimizer``).
    init_params: the model to start from (default ``model.init(key)``).
    update_paths: the clients' update path (:mod:`fedtree.core.updates`), client transforms only
      (each update is aggregated as it arrives: no blockwise aggregator, node or downlink stage).
    name: label for reports.

  Raises:
    ValueError: a buffer larger than the concurrency or the population, a negative
      ``max_staleness`` or exponent, or a policy other than waiting for all.

  Example:
    Two server updates of 2 buffered reports each, 3 of the 5 clients in flight, on devices of
    different speeds:

    >>> import jax, numpy as np, optax
    >>> from fedtree.core import loop
    >>> from fedtree.core.local import LocalSchedule
    >>> from fedtree.core.systems import Systems, make_profile
    >>> from fedtree.datasets.synthetic import grouped_synthetic
    >>> from fedtree.models import build_model
    >>> data, _ = grouped_synthetic(group_sizes=(3, 2), dim=8, num_classes=3)
    >>> model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
    >>> devices = Systems(profile=make_profile([1.0, 2.0, 4.0, 0.5, 8.0], np.full(5, 1e6)))
    >>> alg = fedbuff(model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...               schedule=LocalSchedule(batch_size=8, steps=2), buffer_size=2, concurrency=3,
    ...               systems=devices)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> int(state.round), float(state.clock) > 0
    (2, True)
  """
  num_clients = data.num_clients
  buffer_size = int(buffer_size)
  concurrency = buffer_size if concurrency is None else int(concurrency)
  if not 1 <= buffer_size <= num_clients:
    raise ValueError(f"buffer_size={buffer_size} must be in 1..{num_clients} (the number of clients)")
  if not buffer_size <= concurrency <= num_clients:
    raise ValueError(f"concurrency={concurrency} must be in buffer_size..num_clients "
                     f"({buffer_size}..{num_clients})")
  if int(max_staleness) < 0:
    raise ValueError(f"max_staleness={max_staleness!r} must be >= 0")
  if not float(staleness_exponent) >= 0:
    raise ValueError(f"staleness_exponent={staleness_exponent!r} must be >= 0")
  check_weighting(weighting)
  if systems is None:
    systems = Systems(profile=make_profile(np.ones(num_clients), np.ones(num_clients)), bytes_up=0.0,
                      bytes_down=0.0)
  systems.check(num_clients)
  if systems.policy.kind != "wait_for_all" or systems.policy.dropout:
    raise ValueError(f"fedbuff takes systems with the wait_for_all policy and no dropout, got "
                     f"{systems.policy!r}: clients report when they finish")
  ring = int(max_staleness) + 1
  exponent = float(staleness_exponent)
  server_optimizer = optax.sgd(1.0) if server_optimizer is None else server_optimizer
  client_update = local_training(client_update, model, local_optimizer, schedule, data,
                                 compute_dtype=compute_dtype, stateless_for=name)
  slots = jnp.arange(concurrency, dtype=jnp.int32)
  (path,) = per_level_paths(update_paths, 1, algorithm=name, blockwise=False, node=False, down=False)

  def init(key):
    p0 = stack(initial_params(model, key, init_params), 1)
    return FedBuffState(
      round=jnp.zeros((), jnp.int32), params=p0, opt_state=init_nodes(server_optimizer, p0),
      history=jax.tree.map(lambda a: jnp.array(jnp.broadcast_to(a, (ring,) + a.shape[1:]), copy=True), p0),
      client=jnp.zeros((concurrency,), jnp.int32), version=jnp.zeros((concurrency,), jnp.int32),
      finish=jnp.zeros((concurrency,), jnp.float32), busy=jnp.zeros((concurrency,), bool),
      clock=jnp.zeros((), jnp.float32), cursor=schedule.init_cursor(num_clients),
      update_state=init_path_state(path, jax.tree.map(lambda a: a[0], p0), num_clients, ring),
    )

  def round_fn(state: FedBuffState, data: FederatedData, key):
    num_steps = schedule.num_steps(data.n_train)
    # 1. Idle slots start new clients: uniform among those on line and not in flight (the
    #    draw of fedtree.core.sampling.CohortSampler, busy and off-line clients sorted last).
    u = jax.random.uniform(stream(key, "cohort"), (num_clients,))
    free = jnp.ones((num_clients,), bool).at[jnp.where(state.busy, state.client, num_clients)].set(
      False, mode="drop")
    if systems.availability is not None:
      free = free & systems.availability.at(state.clock)
    u = jnp.where(free, u, 2.0)
    order = jnp.lexsort((u, jnp.zeros((num_clients,), jnp.int32)))
    idle = ~state.busy
    rank = jnp.cumsum(idle.astype(jnp.int32)) - 1
    new_client = jnp.take(order, jnp.where(idle, rank, 0))
    start = idle & (jnp.take(u, new_client) < 2.0)
    client = jnp.where(start, new_client, state.client).astype(jnp.int32)
    seconds = systems.client_seconds(client, jnp.take(num_steps, client).astype(jnp.float32),
                                     model_bytes(state.params),
                                     up_bytes=uplink_bytes(path, jax.tree.map(lambda a: a[0], state.params)))
    finish = jnp.where(start, state.clock + seconds, state.finish)
    version = jnp.where(start, state.round, state.version)
    busy = state.busy | start
    # 2. The first buffer_size to finish report.
    order = jnp.lexsort((slots, jnp.where(busy, finish, jnp.inf)))
    report = busy & (jnp.zeros_like(slots).at[order].set(slots) < buffer_size)
    clock = jnp.maximum(state.clock, jnp.max(jnp.where(report, finish, -jnp.inf)))
    staleness = state.round - version
    fresh = report & (staleness <= max_staleness)
    # 3. Train them from the versions they started from (the ring rows are the tier's parents).
    w = client_weights(data.n_train, weighting)
    cohort = Cohort(clients=client, parent=jnp.mod(version, ring).astype(jnp.int32), valid=fresh)
    res = train_cohort(
      client_update, state.history, cohort, data, num_steps=num_steps, weights=w,
      key=stream(key, "train"), chunk_size=None, parent_aligned=ring == 1,
      batch_order=schedule.batch_order, batch_size=schedule.batch_size, cursor=state.cursor,
      path=path, path_state=state.update_state,
    )
    # Staleness is per version: Σ_v s(round - v) Σ_{i started at v} w_i Δ_i over Σ_i w_i.
    row_version = state.round - jnp.mod(state.round - jnp.arange(ring), ring)
    scale = staleness_weight(state.round - row_version, exponent)
    delta = jax.tree.map(
      lambda d: jnp.sum(d * scale.reshape((ring,) + (1,) * (d.ndim - 1)).astype(d.dtype), axis=0,
                        keepdims=True), res.delta_sum)
    total = jnp.sum(res.weight_sum, axis=0, keepdims=True)
    params, opt_state = update_nodes(server_optimizer, state.params, state.opt_state,
                                     divide_by_weight(delta, total), total > 0)
    version_now = state.round + 1
    history = jax.tree.map(lambda h, p: h.at[jnp.mod(version_now, ring)].set(p[0]), state.history, params)
    metrics = {
      **res.metrics(),
      "clients_stale": jnp.sum(report & ~fresh, dtype=jnp.int32),
      "mean_staleness": jnp.sum(jnp.where(fresh, staleness, 0)) / jnp.maximum(jnp.sum(fresh), 1),
      "max_staleness": jnp.max(jnp.where(fresh, staleness, 0)),
      "round_seconds": clock - state.clock,
      "sim_seconds": clock,
    }
    new = FedBuffState(round=version_now, params=params, opt_state=opt_state, history=history,
                       client=client, version=version, finish=finish, busy=busy & ~report, clock=clock,
                       cursor=res.cursor, update_state=res.path_state)
    return new, metrics

  def models(state: FedBuffState):
    return {"global": NodeModels(state.params, np.zeros(num_clients, np.int32))}

  return FederatedAlgorithm(init=init, round=round_fn, models=models, name=name)
