"""FedNova (Wang et al. 2020, "Tackling the objective inconsistency problem in heterogeneous
federated optimization"), normalized averaging, on any tree, built on the server-rule seam
(:mod:`fedtree.core.server_rule`).

Clients take different numbers of local steps ``τ_i``: epochs over unequal data, per-client step
counts (``LocalSchedule(steps=(...))``), or the partial work of slow devices (``systems=``). FedAvg
then weighs the clients that took more steps more, and converges to the stationary point of a
different objective. FedNova writes a client's update as ``x − y_i = η G_i a_i`` (its stochastic
gradients ``G_i`` combined by ``a_i``) and averages the normalized updates ``d_i = (x − y_i) /
‖a_i‖₁`` instead, rescaled by the effective number of steps ``τ_eff``:

  ``x ← x − τ_eff Σ_i p_i d_i``,  ``τ_eff = Σ_i p_i ‖a_i‖₁``.

``‖a_i‖₁`` comes from the steps the client actually took (after any partial work), for the local
optimizer in use: ``τ_i`` for plain SGD, and ``Σ_{k=1}^{τ_i} (1 − ρ^k) / (1 − ρ)`` for SGD with
heavy-ball momentum ``ρ`` (``optax.sgd(η, momentum=ρ)``, PyTorch's ``SGD(momentum=ρ)``: the
paper's ``a_i`` for momentum; give the same ``ρ`` as ``momentum=``; from a config the registry
reads it from ``config.local``). A client sends its normalized model ``x − d_i`` and
``w_i ‖a_i‖₁`` beside it (4 bytes, which the byte columns count); the server rescales the
aggregate of the ``d_i`` (after the update path: clipping, noise and compression act on the
normalized updates) by ``τ_eff`` before its optax server optimizer (``sgd(1.0)``: the paper's
step). With equal step counts and plain SGD every ``‖a_i‖₁`` is ``τ`` and FedNova is FedAvg.

**On a tree** the normalization happens at the clients' parents, where the clients' step counts
differ; the levels above aggregate models as HierFAVG every ``periods[l]`` rounds, where every
child node took the same number of server steps (one a round) since the last aggregation, the
case in which FedNova is FedAvg.

**Choices and other implementations** (``p_i`` from the host's ``weighting``: ``"examples"``, the
paper's ``n_i / n``, or ``"uniform"``), ``aggregation``:

* ``"answered"`` (default, the paper's with full participation): ``p_i = w_i / Σ_{j∈S} w_j`` over the
  clients ``S`` that answered. With ``weighting="examples"`` this is FLGo's default (its
  ``aggregate='other'``); with ``weighting="uniform"`` FLGo's and FedLab's ``'uniform'``
  (``τ_eff`` the mean ``τ_i``, the mean ``d_i``), and FedLab's ``'weighted_com'`` when every sampled
  client answers.
* ``"population"``: ``p_i = w_i / Σ_j w_j`` over all ``N`` clients of the parent, not renormalized over
  those that answered (FLGo's ``'weighted_com'`` with ``weighting="examples"``).
* ``"scaled"``: as ``"population"`` with ``Σ_i p_i d_i`` multiplied by ``N/|S|`` and ``τ_eff`` not (FLGo's
  ``'weighted_scale'`` with ``weighting="examples"``; its step is ``|S|/N`` of ``"answered"``'s in
  expectation).

FedLab's ``'weighted_scale'`` sets ``p_i = 1/m`` (``m`` the clients per round) and then multiplies by
``N/|S|``, so when every sampled client answers its step is ``N/m`` times the paper's (``"answered"``
with uniform weights): weights that sum to ``N/m``, an evident bug, not reproduced. FedLab's
clients report ``τ = len(loader) · epochs``, their nominal count; FLGo's report the steps they
worked (``_working_amount``, under its systems' partial work), as fedtree's do.

Refused by name: a robust (blockwise) aggregator (``τ_eff`` averages the clients' reported
``‖a_i‖₁`` outside it, so one client's report would scale every step), personal parameters (the
normalization covers the whole model), a model with BatchNorm statistics (they are set by the
forward passes, not a sum of steps to normalize), and a ``server_rule`` of the caller's. Under
differential privacy the ``‖a_i‖₁`` reach the server unprivatized: with a fixed ``steps`` schedule
and no partial work they are public (``τ_eff`` is then a constant and scaling by it is
post-processing); with epochs over unequal data they reveal the clients' data sizes.
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
  """FedNova's client (see the module docstring): local steps from the received model, the
  normalized model ``x − (x − y_i)/‖a_i‖₁`` sent up and ``weight · ‖a_i‖₁`` beside it.

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
  """FedNova's server: the aggregate of the normalized updates rescaled by ``τ_eff`` (see the
  module docstring for ``aggregation``); reports ``tau_eff`` (its mean over the nodes)."""
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
  cannot("blockwise", "τ_eff averages the clients' reported step counts outside it, so one client's report "
                      "would scale every step"),
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
  """FedNova on ``topology`` (default flat): see the module docstring.

  Args:
    momentum: the local optimizer's heavy-ball momentum ``ρ`` in ``[0, 1)`` (``‖a_i‖₁`` depends on
      it; give the ``ρ`` of ``local_optimizer``).
    aggregation: ``"answered"`` (paper), ``"population"`` or ``"scaled"``: the weights ``p_i`` (see the
      module docstring).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg` (``weighting``:
      ``"examples"``, the paper's ``p_i ∝ n_i``, or ``"uniform"``).

  Raises:
    ValueError: an ``aggregation`` that does not exist, ``momentum`` outside ``[0, 1)``, a robust
      aggregator, personal parameters, a model with BatchNorm statistics, or a ``server_rule``.

  Example:
    Clients with unequal data take one epoch each (unequal step counts):

    >>> import jax, optax
    >>> from fedtree.core import loop
    >>> from fedtree.core.local import LocalSchedule
    >>> from fedtree.datasets.synthetic import grouped_synthetic
    >>> from fedtree.models import build_model
    >>> data, _ = grouped_synthetic(group_sizes=(3, 2), dim=8, num_classes=3)
    >>> model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
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
