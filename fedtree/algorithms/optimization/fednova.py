"""FedNova (Wang et al. 2020): clients' updates normalized by the steps they took, on any tree.

The client (:func:`fednova_update`, :func:`effective_steps`), the server rule (:func:`fednova_server`)
and the method (:func:`fednova`). The equations, ``aggregation`` and how FLGo and FedLab differ:
:doc:`FedNova on the optimization page <algorithms/optimization.md#fednova>`.

References:
  Wang et al., Tackling the objective inconsistency problem in heterogeneous federated
  optimization, NeurIPS 2020.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedtree.algorithms.host import Host, cannot, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import is_traced
from fedtree.core.local import ClientData, ClientRound, ClientUpdate, SGDCarry, make_sgd_step, run_local_steps
from fedtree.core.model import Model
from fedtree.core.server_rule import Inbox, ServerRule, per_node

AGGREGATIONS = ("answered", "population", "scaled")


def effective_steps(steps: jax.Array, momentum, max_steps: int) -> jax.Array:
  """``‖a‖₁`` of ``steps`` local SGD steps with heavy-ball momentum ``ρ``: step ``k`` (from 1) moves the
  model by ``Σ_{j<k} ρ^j`` times its gradient's share, so ``‖a‖₁ = Σ_{k=1}^{τ} (1 − ρ^k)/(1 − ρ)``
  (``τ`` for ``ρ = 0``; 0 for no step)."""
  dtype = jnp.result_type(float)   # float64 under --config.dtype=float64
  rho = jnp.asarray(momentum, dtype)
  k = jnp.arange(max(int(max_steps), 1))
  per_step = jnp.cumsum(rho ** k.astype(dtype))        # step k+1's coefficient Σ_{j<=k} ρ^j
  return jnp.sum(jnp.where(k < steps, per_step, 0.0))


def fednova_update(
  model: Model, optimizer: optax.GradientTransformation, *, momentum=0.0, batch_size: int, max_steps: int,
  compute_dtype=None,
) -> ClientUpdate:
  """FedNova's client (:doc:`docs <algorithms/optimization.md#fednova>`): local steps from the received model,
  the normalized model ``x − (x − y_i)/‖a_i‖₁`` sent up and ``weight · ‖a_i‖₁`` beside it.

  Args:
    model: the model.
    optimizer: the local optimizer (SGD with heavy-ball momentum ``momentum``).
    momentum: ``ρ`` of the local optimizer, in ``[0, 1)`` (may be traced).
    batch_size: minibatch size.
    max_steps: static scan length.
    compute_dtype: mixed-precision local steps (``None``: the params' dtype).
  """
  _check_momentum(momentum)
  step = make_sgd_step(model, optimizer, compute_dtype=compute_dtype)

  def apply(anchor, state, data: ClientData, num_steps, key, rnd: ClientRound):
    carry = SGDCarry(params=anchor, opt_state=optimizer.init(anchor), anchor=anchor)
    carry, loss = run_local_steps(step, carry, data, num_steps, key, batch_size=batch_size,
                                  max_steps=max_steps)
    a = effective_steps(jnp.minimum(num_steps, max_steps), momentum, max_steps)
    inverse = 1.0 / jnp.maximum(a, 1e-30)      # (a client that took no step sends x: its d_i is 0)
    sent = jax.tree.map(lambda x, y: x - (x - y) * inverse.astype(y.dtype), anchor, carry.params)
    return sent, state, loss, rnd.weight * a.astype(rnd.weight.dtype)

  return ClientUpdate(apply=apply, takes_round=True)


def fednova_server(*, aggregation: str = "answered") -> ServerRule:
  """FedNova's server: the aggregate of the normalized updates rescaled by ``τ_eff`` (``aggregation``:
  :doc:`docs <algorithms/optimization.md#fednova>`); reports ``tau_eff`` (its mean over the nodes)."""
  if aggregation not in AGGREGATIONS:
    raise ValueError(f"aggregation={aggregation!r}; choose one of {AGGREGATIONS}")

  def receive(inbox: Inbox, state):
    assert inbox.population_weight is not None   # (hierfavg gives it)
    answered = jnp.maximum(inbox.weight_sum, 1e-30)
    if aggregation == "answered":
      tau_eff = inbox.messages / answered
      factor = tau_eff
    else:
      total = jnp.maximum(inbox.population_weight, 1e-30)
      tau_eff = inbox.messages / total
      factor = tau_eff * inbox.weight_sum / total              # Σ_i p_i d_i = pseudo-gradient · W_S / W
      if aggregation == "scaled":
        factor = factor * inbox.population / jnp.maximum(inbox.reported, 1.0)
    return per_node(factor, inbox.pseudo_gradient), state, {"tau_eff": tau_eff}

  return ServerRule(init=lambda params, n: (), receive=receive, name="fednova")


def _check_momentum(momentum) -> None:
  if not is_traced(momentum) and not 0.0 <= float(momentum) < 1.0:
    raise ValueError(f"momentum={momentum!r} must be in [0, 1) (the local optimizer's heavy-ball momentum ρ)")


@method_over(hierfavg, cannot=(
  cannot("personal", "the normalization covers the whole model"),
  cannot("model_state", "the forward passes set it rather than a sum of steps FedNova could normalize; use a "
                        "model without BatchNorm (e.g. GroupNorm)"),
))
def fednova(
  host: Host,
  *,
  momentum: float = 0.0,
  aggregation: str = "answered",
  name: str = "fednova",
) -> FederatedAlgorithm:
  """FedNova on ``topology`` (default flat): the clients' updates normalized by ``‖a_i‖₁`` (their
  steps), averaged and rescaled by ``τ_eff = Σ_i p_i ‖a_i‖₁`` (:doc:`the method's page
  <algorithms/optimization.md#fednova>`).

  Args:
    momentum: the local optimizer's heavy-ball momentum ``ρ`` in ``[0, 1)`` (``‖a_i‖₁`` depends on
      it; give the ``ρ`` of ``local_optimizer``).
    aggregation: ``"answered"`` (paper), ``"population"`` or ``"scaled"``: the weights ``p_i`` (:doc:`docs
      <algorithms/optimization.md#fednova>`).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg` (``weighting``:
      ``"examples"``, the paper's ``p_i ∝ n_i``, or ``"uniform"``).

  Raises:
    ValueError: an ``aggregation`` that does not exist, ``momentum`` outside ``[0, 1)``, personal
      parameters, a model with BatchNorm statistics, or a ``server_rule``. A robust aggregator takes
      the normalized updates ``d_i``; ``τ_eff`` stays the weighted mean of the ``‖a_i‖₁``, which follow
      from the steps the server assigned (:doc:`docs <algorithms/optimization.md#fednova>`).

  Example:
    Clients with unequal data take one epoch each (unequal step counts):

    >>> alg = fednova(model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...               schedule=LocalSchedule(batch_size=8, epochs=1))
    >>> state, metrics = jax.jit(alg.round)(alg.init(jax.random.key(0)), data, jax.random.key(1))
    >>> bool(metrics["tau_eff"] > 1)
    True
  """
  if aggregation not in AGGREGATIONS:
    raise ValueError(f"{name}: aggregation={aggregation!r}; choose one of {AGGREGATIONS}")
  try:
    _check_momentum(momentum)
  except ValueError as e:
    raise ValueError(f"{name}: {e}") from None

  def objective(s: LocalSetup):
    return fednova_update(s.model, s.optimizer, momentum=momentum, batch_size=s.batch_size,
                          max_steps=s.max_steps, compute_dtype=s.compute_dtype)

  rule = fednova_server(aggregation=aggregation)
  return host.build(client_update=objective, server_rule=rule, name=name)
