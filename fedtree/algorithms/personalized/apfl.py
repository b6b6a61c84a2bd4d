"""APFL (Deng, Kamani and Mahdavi 2020): every client mixes a local model with the global one by a
learned weight, on any tree.

The state (``APFLState``), the client (``apfl_update``) and the method (``apfl``). The equations and
how FedTorch, PFLlib, FL-bench and FLGo differ: :doc:`APFL on the mixtures page
<algorithms/mixtures.md#apfl>`.

References:
  Deng, Kamani and Mahdavi, Adaptive personalized federated learning, 2020 (Algorithm 1).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from fedtree.algorithms.host import Host, cannot, hierfavg, method_over
from fedtree.core.algorithm import ClientModels, FederatedAlgorithm, LocalSetup, NodeModels
from fedtree.core.checks import check_nonnegative, check_positive, check_unit_interval, is_traced
from fedtree.core.local import ClientData, ClientUpdate, make_data_loss, run_local_steps, stack
from fedtree.core.membership import clients_parent_rows
from fedtree.core.model import Model
from fedtree.core.topology import Topology

PyTree = Any
ALPHA_SCHEDULES = ("every_step", "first_step")


@struct.dataclass
class APFLState:
  """APFL's persistent client state.

  Attributes:
    personal: ``[C, ...]`` every client's local model ``v_i``.
    alpha: ``[C]`` every client's mixing weight ``α_i`` (the params' float dtype).
  """

  personal: PyTree
  alpha: jax.Array


def mix(alpha, v: PyTree, w: PyTree) -> PyTree:
  """``α v + (1 − α) w`` leaf by leaf (``alpha`` a scalar, or ``[C]`` over stacked ``[C, ...]``
  models), in the models' dtypes."""
  def one(a, b):
    al = jnp.asarray(alpha).astype(a.dtype).reshape(jnp.shape(alpha) + (1,) * (a.ndim - jnp.ndim(alpha)))
    return al * a + (1 - al) * b
  return jax.tree.map(one, v, w)


def apfl_update(
  model: Model, optimizer: optax.GradientTransformation, *, alpha: float, adaptive: bool = True,
  alpha_lr: float, alpha_decay: float = 0.0, alpha_schedule: str = "every_step", batch_size: int,
  max_steps: int, personal_optimizer: optax.GradientTransformation | None = None, compute_dtype=None,
) -> ClientUpdate:
  """APFL's client (:doc:`docs <algorithms/mixtures.md#apfl>`): ``w``, ``v_i`` and ``α_i`` step on the same
  minibatch from the same iterate; ``w`` is sent up, ``(v_i, α_i)`` kept (:class:`APFLState`).

  Args:
    model: the model.
    optimizer: the local optimizer of ``w`` (and of ``v_i`` unless ``personal_optimizer``).
    alpha: ``α_i`` at the start, in ``[0, 1]``.
    adaptive: learn ``α_i`` (the paper's adaptive APFL), else keep it at ``alpha``.
    alpha_lr: ``η_α``, the step size of ``α_i``.
    alpha_decay: ``c`` of an extra ``c α`` in ``α``'s gradient (0: the paper; 0.02: FedTorch, PFLlib,
      FL-bench).
    alpha_schedule: ``"every_step"`` (the paper) or ``"first_step"`` (the first local step of a round
      only: FedTorch).
    batch_size: minibatch size.
    max_steps: static scan length.
    personal_optimizer: optimizer of ``v_i`` (default ``optimizer``).
    compute_dtype: mixed-precision forward and backward passes (``None``: the params' dtype).
  """
  check_unit_interval(alpha=alpha)
  check_nonnegative(alpha_decay=alpha_decay)
  if adaptive:
    check_positive(alpha_lr=alpha_lr)
  if alpha_schedule not in ALPHA_SCHEDULES:
    raise ValueError(f"alpha_schedule={alpha_schedule!r}; choose one of {ALPHA_SCHEDULES}")
  personal_optimizer = optimizer if personal_optimizer is None else personal_optimizer
  loss_fn = make_data_loss(model, compute_dtype)
  grad_fn = jax.value_and_grad(loss_fn)

  def step(carry, batch, rng):
    t, w, ow, v, ov, a = carry
    loss, gw = grad_fn(w, batch, rng)
    _, gbar = grad_fn(mix(a, v, w), batch, rng)          # ∇f(v̄) at the step's iterate
    gv = jax.tree.map(lambda g: a.astype(g.dtype) * g, gbar)
    uw, ow = optimizer.update(gw, ow, w)
    uv, ov = personal_optimizer.update(gv, ov, v)
    if adaptive:
      ga = optax.tree.vdot(jax.tree.map(jnp.subtract, v, w), gbar) + alpha_decay * a
      stepped = jnp.clip(a - alpha_lr * ga.astype(a.dtype), 0.0, 1.0).astype(a.dtype)
      a = stepped if alpha_schedule == "every_step" else jnp.where(t == 0, stepped, a)
    return (t + 1, optax.apply_updates(w, uw), ow, optax.apply_updates(v, uv), ov, a), loss

  def apply(anchor, state: APFLState, data: ClientData, num_steps, key):
    carry = (jnp.zeros((), jnp.int32), anchor, optimizer.init(anchor), state.personal,
             personal_optimizer.init(state.personal), state.alpha)
    carry, loss = run_local_steps(step, carry, data, num_steps, key, batch_size=batch_size,
                                  max_steps=max_steps)
    _, w, _, v, _, a = carry
    return w, APFLState(personal=v, alpha=a), loss

  def init_state(params, num_clients):
    dtype = jnp.result_type(*jax.tree.leaves(params))
    return APFLState(personal=stack(params, num_clients),
                     alpha=jnp.full((num_clients,), alpha, dtype))

  return ClientUpdate(apply=apply, init_state=init_state)


@method_over(hierfavg, cannot=(
  cannot("personal", "every client already keeps a whole local model v_i, mixed with the global one"),
))
def apfl(
  host: Host,
  *,
  alpha: float = 0.5,
  adaptive: bool = True,
  alpha_lr: float | None = None,
  alpha_decay: float = 0.0,
  alpha_schedule: str = "every_step",
  personal_optimizer: optax.GradientTransformation | None = None,
  weighting: str = "uniform",
  name: str = "apfl",
) -> FederatedAlgorithm:
  """APFL on ``topology`` (default flat): every client trains the global model ``w``, its local
  model ``v_i`` and its mixing weight ``α_i``, and is scored with ``α_i v_i + (1 − α_i) w``
  (:doc:`the method's page <algorithms/mixtures.md#apfl>`).

  Args:
    alpha: every client's ``α_i`` at the start (the fixed ``α`` with ``adaptive=False``), in
      ``[0, 1]``; 0.5 is FL-bench's default, FLGo starts at 0.01.
    adaptive: learn ``α_i`` by its gradient (adaptive APFL), else keep ``alpha``.
    alpha_lr: ``η_α`` (default: ``local_learning_rate``, the paper's one step size).
    alpha_decay: an extra ``alpha_decay · α`` in ``α``'s gradient (0.02: FedTorch, PFLlib, FL-bench).
    alpha_schedule: ``"every_step"`` (paper) or ``"first_step"`` (FedTorch: once a round).
    personal_optimizer: optimizer of the local models ``v_i`` (default the local optimizer).
    weighting: ``"uniform"`` (paper) or ``"examples"`` (PFLlib, FL-bench, FLGo) weights of ``w``.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`.

  Raises:
    ValueError: ``alpha`` outside ``[0, 1]``, an unknown ``alpha_schedule``, a negative
      ``alpha_decay``, adaptive APFL without a step size, personal parameters, or a model with
      BatchNorm statistics.

  Example:
    Two rounds of adaptive APFL over 5 clients: the global model and every client's mixture:

    >>> alg = apfl(model=model, data=data, local_optimizer=optax.sgd(0.1), local_learning_rate=0.1,
    ...            schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state)), state.client_state.alpha.shape
    (['global', 'personal'], (5,))
  """
  rate = host.get("local_learning_rate") if alpha_lr is None else alpha_lr
  if adaptive and rate is None:
    raise ValueError(f"{name}: adaptive=True steps α by η_α and needs a step size: pass alpha_lr= or "
                     f"local_learning_rate= (from a config: local.learning_rate), or adaptive=False")
  if adaptive and alpha_lr is None and not is_traced(rate) and not float(rate) > 0:
    raise ValueError(f"{name}: alpha_lr defaults to the local learning rate, local_learning_rate={rate!r} "
                     f"(from a config: local.learning_rate), which must be > 0 to step α; set alpha_lr= "
                     f"or adaptive=False")
  data = host["data"]
  topology = host.get("topology") or Topology.flat(data.num_clients)

  def objective(s: LocalSetup):
    return apfl_update(s.model, s.optimizer, alpha=alpha, adaptive=adaptive,
                       alpha_lr=rate if adaptive else 0.0, alpha_decay=alpha_decay,
                       alpha_schedule=alpha_schedule, batch_size=s.batch_size, max_steps=s.max_steps,
                       personal_optimizer=personal_optimizer, compute_dtype=s.compute_dtype)

  alg = host.replace(topology=topology).build(client_update=objective, weighting=weighting, name=name)

  def personal(state, clients):   # every client's (clients None) or those clients' mixture
    w = clients_parent_rows(topology, topology.depth - 1, host.get("membership"), state.round,
                            state.params[-1], clients)
    own = mix(state.client_state.alpha, state.client_state.personal, w)
    return {"personal": NodeModels(own, np.arange(jax.tree.leaves(w)[0].shape[0], dtype=np.int32))}

  inner = alg.client_sets()

  def sets(state, clients):
    return {**inner.sets(state, clients), **personal(state, clients)}

  def models(state):
    return {**inner.nodes(state), **sets(state, None)}

  return alg._replace(models=models, client_models=ClientModels(models, sets, inner.nodes))
