"""FedDyn (Acar et al. 2021): a dynamic regularizer on every client's loss, on any tree.

The client (:func:`feddyn_update`, its regularizer :func:`dynamic`), the server rule
(:func:`feddyn_server`) and the method (:func:`feddyn`). The equations, the choices and the bugs
found in the peers' implementations: :doc:`FedDyn on the optimization page
<algorithms/optimization.md#feddyn>`.

References:
  Acar et al., Federated learning based on dynamic regularization, ICLR 2021 (Algorithm 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms.host import Host, cannot, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import check_nonnegative
from fedtree.core.local import (
  ClientData,
  ClientRound,
  ClientUpdate,
  Regularizer,
  SGDCarry,
  make_sgd_step,
  run_local_steps,
)
from fedtree.core.model import Model
from fedtree.core.server_rule import Downlink, Inbox, ServerRule, per_node, zeros_like_stacked


def dynamic() -> Regularizer:
  """FedDyn's ``(α_i/2) ‖θ − x‖² − ⟨∇L_i, θ⟩`` up to a constant, as ``(α_i/2) ‖θ‖² − ⟨b, θ⟩`` with
  ``(b, α_i)`` in the carry's anchor slot, ``b = α_i x + ∇L_i`` formed once per client: its gradient
  ``α_i θ − b = α_i (θ − x) − ∇L_i`` reads one model per step besides ``θ``, not two."""

  def reg(params, slot):
    b, a = slot

    def term(p, bb):
      return 0.5 * jnp.asarray(a, p.dtype) * jnp.sum(jnp.square(p)) - jnp.sum(p * bb.astype(p.dtype))

    return sum(jax.tree.leaves(jax.tree.map(term, params, b)))

  return reg


def feddyn_update(
  model: Model, optimizer: optax.GradientTransformation, *, alpha, batch_size: int, max_steps: int,
  alpha_scale: np.ndarray | None = None, compute_dtype=None,
) -> ClientUpdate:
  """FedDyn's client (:doc:`the method's page <algorithms/optimization.md#feddyn>`): local steps on the
  dynamically regularized loss from the received model, ``∇L_i`` kept as the client's state.

  Args:
    model: the model.
    optimizer: the local optimizer (SGD in the paper).
    alpha: ``α >= 0`` (may be traced).
    batch_size: minibatch size.
    max_steps: static scan length.
    alpha_scale: ``[C]`` client ``i``'s coefficient is ``α · alpha_scale[i]`` (``None``: ``α``).
    compute_dtype: mixed-precision local steps (``None``: the params' dtype).
  """
  check_nonnegative(alpha=alpha)
  step = make_sgd_step(model, optimizer, dynamic(), compute_dtype=compute_dtype)
  scale = None if alpha_scale is None else np.asarray(alpha_scale, np.float64)

  def apply(anchor, grad_l, data: ClientData, num_steps, key, rnd: ClientRound):
    dtype = jax.tree.leaves(anchor)[0].dtype   # float64 under x64: a float32 scale put α_i 5e-9 off
    a = alpha if scale is None else alpha * jnp.asarray(scale, dtype)[rnd.client]
    b = jax.tree.map(lambda x, g: jnp.asarray(a, x.dtype) * x + g, anchor, grad_l)
    carry = SGDCarry(params=anchor, opt_state=optimizer.init(anchor), anchor=(b, a))
    carry, loss = run_local_steps(step, carry, data, num_steps, key, batch_size=batch_size,
                                  max_steps=max_steps)
    theta = carry.params
    new = jax.tree.map(lambda g, t, x: g - jnp.asarray(a, t.dtype) * (t - x), grad_l, theta, anchor)
    return theta, new, loss, ()

  return ClientUpdate(apply=apply, init_state=zeros_like_stacked, takes_round=True)


def feddyn_server(*, alpha) -> ServerRule:
  """FedDyn's server state ``h`` (zeros at the start, never sent): moved by ``α`` times the
  reporting clients' share of the mean update over all clients, and ``h/α`` (0 where ``α = 0``)
  added to the pseudo-gradient (the new model ``mean θ_i − h/α``)."""
  check_nonnegative(alpha=alpha)

  def receive(inbox: Inbox, h):
    assert inbox.population_weight is not None   # (hierfavg gives it)
    share = inbox.weight_sum / jnp.maximum(inbox.population_weight, 1e-30)
    h = jax.tree.map(jnp.add, h, per_node(alpha * share, inbox.pseudo_gradient))
    positive = jnp.asarray(alpha) > 0
    inverse = jnp.where(positive, 1.0 / jnp.where(positive, alpha, 1.0), 0.0)
    out = jax.tree.map(lambda g, hh: g + hh * inverse.astype(hh.dtype), inbox.pseudo_gradient, h)
    return out, h, {}

  return ServerRule(init=zeros_like_stacked, receive=receive, name="feddyn",
                    down=Downlink(broadcast=lambda h: ()))  # h stays home


def _alpha_scale(host) -> np.ndarray:
  """``n̄_parent / n_i`` for every client (``n̄`` the mean examples of its parent's clients)."""
  data, topology = host["data"], host.get("topology")
  n = np.asarray(data.n_train, np.float64)
  parent = (np.zeros(n.shape[0], np.int64) if topology is None
            else np.asarray(topology.parent(topology.depth), np.int64))
  mean = np.bincount(parent, weights=n) / np.maximum(np.bincount(parent), 1)
  return mean[parent] / np.maximum(n, 1.0)


@method_over(hierfavg, cannot=(
  cannot("personal", "the dynamic regularizer and h cover the whole model"),
  cannot("model_state", "gradients do not train it, so neither a client's ∇L_i nor the server's h describes "
                        "it; use a model without BatchNorm (e.g. GroupNorm)"),
))
def feddyn(
  host: Host,
  *,
  alpha: float = 0.01,
  alpha_by_data_size: bool = False,
  weighting: str = "uniform",
  name: str = "feddyn",
) -> FederatedAlgorithm:
  """FedDyn on ``topology`` (default flat): clients minimize ``L_i(θ) − ⟨∇L_i, θ⟩ + (α/2) ‖θ − x‖²``
  and keep ``∇L_i``; their parent moves ``h`` and steps to ``mean θ_i − h/α`` (:doc:`the method's page
  <algorithms/optimization.md#feddyn>`).

  Args:
    alpha: ``α >= 0``, the dynamic regularizer's coefficient (traced: a sweep axis).
    alpha_by_data_size: client ``i``'s coefficient ``α n̄ / n_i`` (FL-bench's), else ``α`` (paper).
    weighting: ``"uniform"`` (paper) or ``"examples"`` weights of the models (and of ``h``'s move).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`.

  Raises:
    ValueError: a negative or non-finite ``α``, personal parameters, a model with BatchNorm
      statistics, or a ``server_rule``.

  Example:
    Two rounds of FedDyn over 5 clients, 3 sampled a round:

    >>> alg = feddyn(alpha=0.1, model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...              schedule=LocalSchedule(batch_size=8, steps=2), cohort_size=3)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> state.server_state["Dense_0"]["kernel"].shape, state.client_state["Dense_0"]["kernel"].shape
    ((1, 8, 3), (5, 8, 3))
  """
  try:
    check_nonnegative(alpha=alpha)
  except ValueError as e:
    raise ValueError(f"{name}: {e} (the dynamic regularizer's coefficient; 0 is FedAvg)") from None
  scale = _alpha_scale(host) if alpha_by_data_size else None

  def objective(s: LocalSetup):
    return feddyn_update(s.model, s.optimizer, alpha=alpha, batch_size=s.batch_size, max_steps=s.max_steps,
                         alpha_scale=scale, compute_dtype=s.compute_dtype)

  return host.build(client_update=objective, server_rule=feddyn_server(alpha=alpha), weighting=weighting,
                 name=name)
