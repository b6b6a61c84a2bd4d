"""fedtree and the centralized JAX bound on a :class:`~benchmarks.workloads.Workload`.

Both fuse ``rounds`` rounds into one compiled call (``fedtree.core.loop.compile_rounds``):
the first call compiles and is timed apart; later calls are the measurement. Nothing leaves
the device inside a call: sampling, batching, training, aggregation and the server update
are one XLA program.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.workloads import Workload, make_arrays
from fedtree.algorithms import fedavg, hierfavg
from fedtree.core import sharding, tuning
from fedtree.core.algorithm import TreeState
from fedtree.core.data import FederatedData
from fedtree.core.local import (
  ClientUpdate,
  LocalSchedule,
  SGDCarry,
  make_sgd_step,
  run_local_steps,
  sgd_client_update,
)
from fedtree.core.loop import compile_rounds
from fedtree.core.topology import Topology
from fedtree.models import Model, build_model


def jax_model(w: Workload, conv_impl: str = "auto") -> Model:
  """The JAX model of ``w``; ``conv_impl`` picks the CNN's convolution (``fedtree.models.Conv``)."""
  kwargs = {"hidden": (200, 200)} if w.model == "mlp" else {"conv_impl": conv_impl}
  return build_model(w.model, example_shape=w.example_shape, num_classes=w.num_classes, **kwargs)


def federated_data(w: Workload, mesh=None) -> FederatedData:
  x, y = make_arrays(w)
  c = w.num_clients
  data = FederatedData(
    x_train=jnp.asarray(x), y_train=jnp.asarray(y), n_train=jnp.full((c,), w.examples, jnp.int32),
    x_test=jnp.zeros((c, 1) + w.example_shape, jnp.float32), y_test=jnp.zeros((c, 1), jnp.int32),
    n_test=jnp.ones((c,), jnp.int32), num_classes=w.num_classes,
  )
  del x, y
  return sharding.shard_data(data, mesh) if mesh is not None else data


def tree_topology(num_clients: int, depth: int, fanout: int = 10) -> Topology:
  """Root and ``depth - 1`` server levels of ``fanout`` children each above the clients."""
  if depth == 1:
    return Topology.flat(num_clients)
  leaves = fanout * 2 ** (depth - 2)        # 10, 20, 40 leaf parents: 10 edges, then halving

  def build(level, per):
    if level == depth - 1:
      return per
    return [build(level + 1, per) for _ in range(2)]

  per = num_clients // leaves
  return Topology.from_sizes([build(1, per) for _ in range(fanout)])


def personal_head_update(model: Model, optimizer, *, batch_size: int, max_steps: int,
                         head: str = "Dense_2") -> ClientUpdate:
  """FedPer-style client with persistent state: its own last layer ``head`` (kept per client,
  ``[C, ...]``); the body is trained from the server model and averaged, the head stays home."""
  step = make_sgd_step(model, optimizer)

  def apply(anchor, state, data, num_steps, key):
    start = {**anchor, head: state}
    carry = SGDCarry(params=start, opt_state=optimizer.init(start), anchor=start)
    carry, loss = run_local_steps(step, carry, data, num_steps, key, batch_size=batch_size,
                                  max_steps=max_steps)
    sent = {**carry.params, head: anchor[head]}  # the head is not shared
    return sent, carry.params[head], loss

  return ClientUpdate(apply)


def build_fedtree(w: Workload, data: FederatedData, *, chunk_size: Any = "auto",
                  compute_dtype=None, depth: int | None = None, persistent_state: bool = False,
                  conv_impl: str = "auto", **host):
  """The fedtree algorithm of ``w`` (FedAvg, or HierFAVG when ``w.edges``/``depth``) and chunk.

  ``host``: further arguments of the host (:func:`~fedtree.algorithms.host.hierfavg.hierfavg`), e.g.
  ``init_params``, ``weighting``, ``personal`` or ``update_paths``.
  """
  model = jax_model(w, conv_impl)
  schedule = LocalSchedule(batch_size=w.batch_size, epochs=None, steps=w.local_steps)
  opt = optax.sgd(w.lr)
  depth = depth or (2 if w.edges else 1)
  topo = None
  if depth > 1:
    topo = (Topology.from_sizes([w.num_clients // w.edges] * w.edges) if w.edges and depth == 2
            else tree_topology(w.num_clients, depth))
  cohort = w.cohort
  if topo is not None and cohort is not None:
    cohort = max(1, w.cohort // topo.num_nodes(topo.depth - 1))
  if chunk_size == "auto":  # what the experiment runner does: sized for the model on CPU
    policy = tuning.chunk_policy(model, opt, w.example_shape, w.batch_size)
    groups = [w.cohort_size]
    if topo is not None:
      counts = topo.leaf_counts(topo.depth - 1)
      groups = counts if cohort is None else np.minimum(cohort, counts)
    chunk_size = policy(w.cohort_size, sharding.mesh_size(), groups)
  update = None
  if persistent_state:
    update = personal_head_update(model, opt, batch_size=w.batch_size, max_steps=w.local_steps)
  elif compute_dtype is not None:
    update = sgd_client_update(model, opt, batch_size=w.batch_size, max_steps=w.local_steps,
                               compute_dtype=compute_dtype)
  if depth == 1:
    alg = fedavg(model=model, data=data, local_optimizer=opt, schedule=schedule,
                 server_optimizer=optax.sgd(w.server_lr), cohort_size=w.cohort,
                 chunk_size=chunk_size, client_update=update, **host)
  else:
    alg = hierfavg(model=model, topology=topo, data=data, local_optimizer=opt, schedule=schedule,
                   server_optimizers=optax.sgd(w.server_lr), periods=1, cohort_size=cohort,
                   chunk_size=chunk_size, client_update=update, **host)
  if persistent_state:
    base_init = alg.init

    def init(key):
      state = base_init(key)
      head = state.params[-1]["Dense_2"]
      heads = jax.tree.map(
        lambda a: jnp.broadcast_to(a[0], (w.num_clients,) + a.shape[1:]).copy(), head
      )
      return state.replace(client_state=heads)

    alg = alg._replace(init=init, round=_with_client_state(alg, data, model, w, chunk_size, update))
  return alg, chunk_size


def _with_client_state(alg, data, model, w, chunk_size, update):
  """FedAvg round threading per-client state through ``train_cohort`` (scale demo)."""
  from fedtree.core.rng import stream
  from fedtree.core.sampling import cohort_sampler
  from fedtree.core.server import update_nodes
  from fedtree.core.tier import Clients, Down, Tier, train_cohort

  sampler = cohort_sampler(np.zeros(w.num_clients, np.int64), w.cohort, chunk_size=chunk_size)
  server = optax.sgd(w.server_lr)
  steps = jnp.full((w.num_clients,), w.local_steps, jnp.int32)

  def round_fn(state: TreeState, data, key):
    cohort = sampler(stream(key, "cohort"))
    res = train_cohort(Tier(update, chunk_size=sampler.chunk_size), Down(state.params[0]), cohort, data,
                       Clients(steps, data.n_train.astype(jnp.float32), state=state.client_state),
                       stream(key, "train"))
    params, opt_state = update_nodes(server, state.params[0], state.opt_state[0],
                                     res.pseudo_gradient(), res.weight_sum > 0)
    metrics = {"train_loss": res.loss_sum / jnp.maximum(res.num_trained, 1),
               "clients_trained": res.num_trained}
    return state.replace(round=state.round + 1, params=(params,), opt_state=(opt_state,),
                         client_state=res.client_state), metrics

  return round_fn


def time_fused(step, state, data, key, repeats: int) -> tuple[Any, float, float, float]:
  """``(state, compile_and_first_call_s, best_call_s, final_loss)`` of a fused-round step."""
  t = time.perf_counter()
  state, m = step(state, data, key)
  jax.block_until_ready(m)
  first = time.perf_counter() - t
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    state, m = step(state, data, key)
    jax.block_until_ready(m)
    best = min(best, time.perf_counter() - t)
  return state, first, best, float(np.asarray(m["train_loss"])[-1])


def run_fedtree(w: Workload, *, rounds: int, repeats: int = 2, chunk_size: Any = "auto",
                compute_dtype=None, depth: int | None = None, persistent_state: bool = False,
                mesh_devices: int | None = None, conv_impl: str = "auto") -> dict:
  """Throughput of fedtree on ``w``: ``rounds`` rounds fused per call, best of ``repeats``.

  ``mesh_devices`` shards the clients over that many host devices on CPU; on an accelerator
  backend it is ignored (one device). Besides the timings the result records what the GPU
  defaults promise: ``compiles`` (entries in the fused step's jit cache after all calls: 1
  means nothing recompiled), ``server_dtypes`` (the server state's float dtypes: float32
  also when local training runs in bfloat16) and ``warnings`` (e.g. unusable donations).
  """
  import warnings

  if jax.default_backend() != "cpu":
    mesh_devices = None
  mesh = sharding.client_mesh(mesh_devices) if mesh_devices else None
  ctx = jax.set_mesh(mesh) if mesh is not None else _null()
  with ctx, warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    data = federated_data(w, mesh)
    alg, chunk = build_fedtree(w, data, chunk_size=chunk_size, compute_dtype=compute_dtype,
                               depth=depth, persistent_state=persistent_state, conv_impl=conv_impl)
    step = compile_rounds(alg, rounds)
    state = alg.init(jax.random.key(w.seed))
    state, first, best, loss = time_fused(step, state, data, jax.random.key(w.seed + 1), repeats)
  cache_size = getattr(step, "_cache_size", None)
  client_bytes = tuning.client_step_bytes(jax_model(w, conv_impl), optax.sgd(w.lr), w.example_shape,
                                          w.batch_size)
  return dict(seconds_per_round=best / rounds, compile_s=first - best, final_loss=loss,
              chunk_size=chunk, rounds_timed=rounds, devices=mesh_devices or 1,
              compute_dtype=compute_dtype or "float32", conv_impl=conv_impl,
              backend=jax.default_backend(), device_kind=jax.devices()[0].device_kind,
              compiles=cache_size() if callable(cache_size) else None, client_step_bytes=client_bytes,
              server_dtypes=sorted({str(a.dtype) for a in jax.tree.leaves(state.params)
                                    if jnp.issubdtype(a.dtype, jnp.floating)}),
              warnings=sorted({str(c.message)[:200] for c in caught}),
              client_state_mb=sum(a.nbytes for a in jax.tree.leaves(state.client_state)) / 2**20)


def run_central(w: Workload, *, rounds: int, repeats: int = 2, conv_impl: str = "auto") -> dict:
  """The zero-overhead bound: one model trained on the same examples of a round, batch
  ``cohort x batch_size``, ``local_steps`` steps per round (same sampling, same gathers)."""
  model = jax_model(w, conv_impl)
  x, y = make_arrays(w)
  x, y = jnp.asarray(x), jnp.asarray(y)
  opt = optax.sgd(w.lr)
  k, b, steps, c = w.cohort_size, w.batch_size, w.local_steps, w.num_clients

  def loss_fn(p, xb, yb, rng):
    logits = model.apply(p, xb, train=True, rng=rng)
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), yb).mean()

  def one_round(carry, _):
    params, opt_state, key = carry
    key, kc, kd = jax.random.split(key, 3)
    cohort = jax.random.permutation(kc, c)[:k] if k < c else jnp.arange(c)
    xs = jnp.take(x, cohort, axis=0)[:, : steps * b]
    ys = jnp.take(y, cohort, axis=0)[:, : steps * b]
    xs = jnp.swapaxes(xs.reshape((k, steps, b) + xs.shape[2:]), 0, 1).reshape(
      (steps, k * b) + xs.shape[2:])
    ys = jnp.swapaxes(ys.reshape(k, steps, b), 0, 1).reshape(steps, k * b)

    def sgd_step(c2, batch):
      p, s = c2
      xb, yb, t = batch
      loss, g = jax.value_and_grad(loss_fn)(p, xb, yb, jax.random.fold_in(kd, t))
      u, s = opt.update(g, s, p)
      return (optax.apply_updates(p, u), s), loss

    (params, opt_state), losses = jax.lax.scan(sgd_step, (params, opt_state),
                                               (xs, ys, jnp.arange(steps)))
    return (params, opt_state, key), losses.mean()

  @jax.jit
  def step(carry, _data, _key):
    carry, losses = jax.lax.scan(one_round, carry, None, length=rounds)
    return carry, {"train_loss": losses}

  params = model.init(jax.random.key(w.seed))
  carry = (params, opt.init(params), jax.random.key(w.seed + 1))
  _, first, best, loss = time_fused(step, carry, None, None, repeats)
  return dict(seconds_per_round=best / rounds, compile_s=first - best, final_loss=loss,
              rounds_timed=rounds, backend=jax.default_backend(), conv_impl=conv_impl)


class _null:
  def __enter__(self):
    return None

  def __exit__(self, *a):
    return False
