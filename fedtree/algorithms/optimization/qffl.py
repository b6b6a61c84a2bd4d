"""q-FFL solved by q-FedAvg (Li, Sanjabi, Beirami and Smith 2020): fair resource allocation, on any tree.

The client (:func:`qffl_update`), the server rule (:func:`qffl_server`) and the method
(:func:`qffl`). The equations, the weights, the loss and how the paper's code, FLGo and FedLab
differ: :doc:`q-FFL on the optimization page <algorithms/optimization.md#q-ffl>`.

References:
  Li, Sanjabi, Beirami and Smith, Fair resource allocation in federated learning, ICLR 2020
  (Algorithm 2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedtree.algorithms.host import Host, cannot, hierfavg, method_over
from fedtree.algorithms.host.refusals import weighted_messages
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import check_nonnegative, check_positive, named
from fedtree.core.local import (
  ClientData,
  ClientRound,
  ClientUpdate,
  SGDCarry,
  full_loss,
  make_sgd_step,
  run_local_steps,
  steps_per_epoch,
)
from fedtree.core.model import Model, zero_state
from fedtree.core.server_rule import Inbox, ServerRule, Uplink, per_node

LOSS_AT = ("received", "last_epoch")
LOSS_EPS = 1e-10
"""Added to ``F_k`` before its powers by default (the paper's code; FLGo's is ``1e-8``)."""


def last_epoch_step(step):
  """``step`` that also sums its losses from step ``start`` on: the carry is ``(inner, t, start,
  loss_sum, count)``, for the mean minibatch loss of the last local epoch."""

  def wrapped(carry, batch, rng):
    inner, t, start, total, count = carry
    inner, loss = step(inner, batch, rng)
    last = t >= start
    total = total + jnp.where(last, loss, 0.0).astype(total.dtype)
    return (inner, t + 1, start, total, count + last.astype(count.dtype)), loss

  return wrapped


def qffl_update(
  model: Model, optimizer: optax.GradientTransformation, *, q: float, lipschitz: float | None = None,
  loss_at: str = "received", loss_epsilon: float = LOSS_EPS, batch_size: int, max_steps: int,
  compute_dtype=None,
) -> ClientUpdate:
  """q-FedAvg's client (:doc:`docs <algorithms/optimization.md#q-ffl>`): local SGD from the received ``w``,
  then ``Δ_k`` as its update and ``h_k`` (times its aggregation weight) as its message.

  Args:
    model: the model.
    optimizer: the local optimizer (SGD in the paper).
    q: ``q >= 0``.
    lipschitz: ``L > 0``; ``None``: ``1/η`` from the local learning rate the client is told
      (:attr:`~fedtree.core.local.ClientRound.learning_rate`).
    loss_at: ``"received"`` or ``"last_epoch"``, where ``F_k`` is taken.
    loss_epsilon: ``>= 0`` added to ``F_k`` before its powers.
    batch_size: minibatch size.
    max_steps: static scan length.
    compute_dtype: mixed-precision local steps (``None``: the params' dtype).
  """
  check_nonnegative(q=q, loss_epsilon=loss_epsilon)
  if lipschitz is not None:
    check_positive(lipschitz=lipschitz)
  if loss_at not in LOSS_AT:
    raise ValueError(f"loss_at={loss_at!r}; choose one of {LOSS_AT}")
  step = make_sgd_step(model, optimizer, compute_dtype=compute_dtype)

  def apply(anchor, state, data: ClientData, num_steps, key, rnd: ClientRound):
    dtype = jnp.result_type(jnp.float32, *jax.tree.leaves(anchor))
    inner = SGDCarry(params=anchor, opt_state=optimizer.init(anchor), anchor=anchor)
    if loss_at == "received":
      f = full_loss(model, anchor, data, batch_size=batch_size)
      inner, loss = run_local_steps(step, inner, data, num_steps, key, batch_size=batch_size,
                                    max_steps=max_steps)
    else:
      k = jnp.minimum(num_steps, max_steps)
      start = k - jnp.maximum(steps_per_epoch(data.n, batch_size), 1)
      carry = (inner, jnp.zeros((), jnp.int32), start, jnp.zeros((), dtype), jnp.zeros((), jnp.int32))
      (inner, _, _, total, count), loss = run_local_steps(last_epoch_step(step), carry, data, num_steps, key,
                                                          batch_size=batch_size, max_steps=max_steps)
      f = total / jnp.maximum(count, 1).astype(dtype)
    if lipschitz is None:
      if rnd.learning_rate is None:
        raise ValueError("q-FFL with lipschitz=None takes L = 1/η and needs the local learning rate η "
                         "(local_learning_rate=)")
      big_l = 1.0 / jnp.asarray(rnd.learning_rate, dtype)
    else:
      big_l = jnp.asarray(lipschitz, dtype)
    f = jnp.asarray(f, dtype) + jnp.asarray(loss_epsilon, dtype)
    qq = jnp.asarray(q, dtype)
    dw = jax.tree.map(lambda a, y: (a - y) * big_l.astype(a.dtype), anchor, inner.params)
    sq = sum(jnp.sum(jnp.square(d.astype(dtype))) for d in jax.tree.leaves(zero_state(model, dw)))
    fq = jnp.power(f, qq)
    h = qq * jnp.power(f, qq - 1.0) * sq + big_l * fq
    params = jax.tree.map(lambda a, d: a - d * fq.astype(d.dtype), anchor, dw)   # its update is Δ_k
    return params, state, loss, h * jnp.asarray(rnd.weight, dtype)

  return ClientUpdate(apply=apply, takes_round=True, model_state=True)


def qffl_server() -> ServerRule:
  """q-FedAvg's server step: the host's mean ``Σ w_k Δ_k / Σ w_k`` times ``Σ w_k / Σ w_k h_k`` is
  ``Σ w_k Δ_k / Σ w_k h_k`` (the messages are the ``w_k h_k``). It keeps no state.

  The ``h_k`` take the updates' path (:class:`~fedtree.core.server_rule.Uplink` ``robust`` and
  ``with_update``): a robust aggregator's estimate of them beside its estimate of the ``Δ_k`` (the median
  step ``med Δ / med h``), one clip over each pair ``(Δ_k, h_k)`` (which scales both, so a clipped
  client's step keeps its direction and its own ratio), noise and compression on both."""

  def receive(inbox: Inbox, state):
    h = inbox.messages
    factor = jnp.where(h > 0, inbox.weight_sum / jnp.where(h > 0, h, 1.0), 0.0)
    return per_node(factor, inbox.pseudo_gradient), state, {"qffl_h": h}

  return ServerRule(init=lambda params, num_nodes: (), receive=receive, name="qffl", moves=True,
                    up=Uplink(robust=True, with_update=True))


def sent_beside(sent: str) -> tuple:
  """The refusals of a method whose clients send ``sent`` in the clear beside a scaled update (AFL; q-FFL's
  ``h_k`` take the update's path, :func:`qffl_server`): a privacy stage, a robust (blockwise)
  aggregator, personal parameters."""
  return (
    cannot("private", f"the clients send {sent} beside their update, unclipped and unnoised, so no "
                      f"differential-privacy guarantee would hold; run it without the privacy section"),
    cannot("blockwise", f"it would still sum what the clients send beside their updates ({sent}), so one "
                        f"client could steer every step"),
    cannot("personal", "its clients send a rescaled update of the whole model"),
  )


@method_over(hierfavg, cannot=(cannot("personal", "its clients send a rescaled update of the whole model"),))
def qffl(
  host: Host,
  *,
  q: float = 1.0,
  lipschitz: float | None = None,
  loss_at: str = "received",
  loss_epsilon: float = LOSS_EPS,
  weighting: str = "uniform",
  name: str = "qffl",
) -> FederatedAlgorithm:
  """q-FFL by q-FedAvg on ``topology`` (default flat): every sampled client sends ``Δ_k = F_k^q L(w − w̄_k)``
  and ``h_k``, and its parent steps ``w ← w − Σ_k Δ_k / Σ_k h_k`` (:doc:`the method's page
  <algorithms/optimization.md#q-ffl>`).

  Args:
    q: ``q >= 0`` (0: FedAvg; the paper uses 1 to 15 by dataset; FLGo defaults to 1).
    lipschitz: ``L > 0``; ``None`` (default): ``1/η``, ``η`` the local learning rate
      (``local_learning_rate``; from a config: ``local.learning_rate``).
    loss_at: ``"received"`` (the paper, FLGo: the loss at the received model over all the client's
      examples) or ``"last_epoch"`` (FedLab: the mean minibatch loss of the last local epoch).
    loss_epsilon: ``>= 0`` added to ``F_k`` before its powers: ``1e-10`` (default, the paper's code) or
      FLGo's ``1e-8``.
    weighting: ``"uniform"`` (the paper's unweighted sums) or ``"examples"``.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`.

  Raises:
    ValueError: ``q < 0``, ``loss_epsilon < 0``, ``lipschitz <= 0``, an unknown ``loss_at``, no learning
      rate to take ``L`` from, personal parameters, or ``weighting="examples"`` with a robust aggregator
      or a client or node stage (the ``w_k h_k`` would be weighted a second time on the path they take with
      the updates, :func:`qffl_server`).

  Example:
    Two rounds of q-FedAvg (q = 2) over 5 clients:

    >>> alg = qffl(model=model, data=data, local_optimizer=optax.sgd(0.1), local_learning_rate=0.1,
    ...            schedule=LocalSchedule(batch_size=8, steps=2), q=2.0)
    >>> state, metrics = jax.jit(alg.round)(alg.init(jax.random.key(0)), data, jax.random.key(1))
    >>> bool(metrics["qffl_h"] > 0)    # Σ h_k of the round
    True
  """
  with named(name):
    check_nonnegative(q=q, loss_epsilon=loss_epsilon)
    if lipschitz is not None:
      check_positive(lipschitz=lipschitz)
  if loss_at not in LOSS_AT:
    raise ValueError(f"{name}: loss_at={loss_at!r}; choose one of {LOSS_AT}")
  weighted_messages(name, host, weighting, "h_k")
  if lipschitz is None and host.get("local_learning_rate") is None:
    raise ValueError(f"{name}: lipschitz=None takes L = 1/η from the local learning rate η: pass "
                     f"local_learning_rate= (from a config: local.learning_rate), or lipschitz=")

  def objective(s: LocalSetup):
    return qffl_update(s.model, s.optimizer, q=q, lipschitz=lipschitz, loss_at=loss_at,
                       loss_epsilon=loss_epsilon, batch_size=s.batch_size, max_steps=s.max_steps,
                       compute_dtype=s.compute_dtype)

  return host.build(client_update=objective, server_rule=qffl_server(), weighting=weighting, name=name)
