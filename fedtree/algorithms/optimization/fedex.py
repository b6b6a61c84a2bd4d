"""FedEx (Khodak et al. 2021): the clients' local learning rate tuned while the model trains, by
weight sharing, on any tree.

Every server keeps a categorical distribution ``θ`` over ``K`` local learning rates (multiples of
the local optimizer's, ``lr_scales``) and sends it down beside the model; every sampled client draws
its scale ``j ~ θ``, trains on its training rows with the scaled optimizer (FedAvg's local SGD, or
FedProx's with ``mu > 0``), and reports the loss of the model it trained on its held-out validation
rows (the last ``val_fraction`` of its examples). The server averages the models as FedAvg does and
takes an exponentiated-gradient step on ``θ``::

  g_j = Σ_i v_i (L_i − λ) 1[j_i = j] / θ_j / Σ_i v_i        (v_i: client i's validation rows)
  log θ ← log θ − η g, normalized;    η = η₀ / ‖g‖_∞,   η₀ = sqrt(2 log K)

with the baseline ``λ`` a discounted mean of the previous rounds' validation losses (``Σ_s γ^{t−1−s}
L̄_s / Σ_s γ^{t−1−s}``, ``γ = baseline_discount``; 0 before the first round reported). The
``aggressive`` step size, ``η₀`` and the baseline follow the authors' code (mkhodak/FedEx,
``hyper.py``: ``FedEx.step``); their code also offers the difference of the losses before and after
local training (``diff``), the other step sizes and a cutoff that freezes ``θ`` below an entropy, not
offered here; it samples the baseline's discount at random per run (``baseline_discount=-1``), where
this module takes it as a hyperparameter (default 0: the previous round's mean, their class's default).
Their experiments score the clients' validation *error*; this module the validation loss, the
issue's and the paper's objective.

Notes: a client's step count is the one its schedule gives for all its examples (``steps``, or its
epochs over them), its minibatches drawn from its training rows only; a client with fewer than 2
examples trains on all of them and reports no validation loss (its weight in ``g`` is 0). The round
reports ``fedex_entropy``, ``fedex_val_loss`` (after local training), ``fedex_val_loss_before`` (of
the received model) and ``fedex_mode_scale`` (the scale ``θ`` weighs most), each the mean over the
nodes.

References:
  Khodak, Tu, Li, Li, Balcan, Smith, Talwalkar, Federated hyperparameter tuning: challenges,
  baselines, and connections to weight-sharing, NeurIPS 2021.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms.host import Host, cannot, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import is_traced
from fedtree.core.local import ClientData, ClientRound, ClientUpdate, sgd_client_update
from fedtree.core.model import Model, masked_loss
from fedtree.core.server_rule import Downlink, Inbox, ServerRule
from fedtree.objectives import fedprox_update


def validation_rows(n: jax.Array, val_fraction: float) -> jax.Array:
  """How many of a client's ``n`` examples (its last rows) it holds out for validation:
  ``floor(n · val_fraction)`` within ``[1, n − 1]``, 0 for a client with fewer than 2."""
  v = jnp.floor(n.astype(jnp.result_type(float)) * val_fraction).astype(n.dtype)
  return jnp.where(n >= 2, jnp.clip(v, 1, n - 1), 0)


def validation_loss(model: Model, params, data: ClientData, first: jax.Array) -> jax.Array:
  """The mean loss of ``params`` (evaluation mode) on the client's rows ``[first, n)``."""
  rows = jnp.arange(data.x.shape[0])
  mask = (rows >= first) & (rows < data.n)
  return masked_loss(model, model.apply(params, data.x, train=False, rng=None), data.y, mask)


def fedex_update(model: Model, local, optimizer: optax.GradientTransformation, *, lr_scales: Sequence[float],
                 val_fraction: float) -> ClientUpdate:
  """FedEx's client: draw a scale from the parent's ``θ`` (its broadcast), train ``local(optimizer
  scaled)`` (a stateless :class:`~fedtree.core.local.ClientUpdate` builder: plain SGD, FedProx) on
  the training rows, and send up the validation loss's share of ``g`` beside the model.

  Args:
    model: the model.
    local: ``optimizer -> ClientUpdate``, the local training the scale is tried on.
    optimizer: the local optimizer; a client's is ``optax.chain(optimizer, optax.scale(s_j))``, the
      same as the optimizer with its learning rate times ``s_j`` wherever the learning rate scales
      the final update (every optax optimizer built from a learning rate).
    lr_scales: the ``K`` candidate multiples of the local learning rate.
    val_fraction: the share of a client's examples held out for its validation loss.
  """
  scales = jnp.asarray(np.asarray(lr_scales, np.float64), jnp.result_type(float))
  k = len(lr_scales)
  probe = local(optimizer)
  if probe.takes_round or probe.init_state is not None:
    raise ValueError("fedex: the local training it tunes must be stateless and take no round (plain SGD or "
                     "FedProx)")

  def apply(anchor, state, data: ClientData, num_steps, key, rnd: ClientRound):
    if data.offset is not None:
      raise ValueError("fedex: a client's validation rows are its last padded rows; the ragged layout "
                       "(config.data.layout='ragged') has none: use layout='padded'")
    theta = rnd.broadcast
    pick, train = jax.random.split(key)
    j = jax.random.categorical(pick, jnp.log(theta))
    first = data.n - validation_rows(data.n, val_fraction)
    inner = local(optax.chain(optimizer, optax.scale(scales[j])))
    params, state, loss = inner.apply(anchor, state, data._replace(n=first), num_steps, train)
    dtype = theta.dtype
    v = (data.n - first).astype(dtype)
    after = validation_loss(model, params, data, first).astype(dtype)
    before = validation_loss(model, anchor, data, first).astype(dtype)
    share = jax.nn.one_hot(j, k, dtype=dtype) * (v / theta[j])
    message = {"loss_share": share * after, "share": share, "loss": v * after, "loss_before": v * before,
               "rows": v}
    return params, state, loss, message

  return ClientUpdate(apply=apply, takes_round=True, model_state=probe.model_state)


def fedex_server(lr_scales: Sequence[float], *, baseline_discount: float = 0.0) -> ServerRule:
  """FedEx's server rule: the model averaged as FedAvg's, and ``θ`` (``log θ`` kept, with the
  baseline's discounted sums) updated by the exponentiated-gradient step of the module docstring."""
  k = len(lr_scales)
  eta0 = float(np.sqrt(2.0 * np.log(k))) if k > 1 else 0.0
  scales = np.asarray(lr_scales, np.float64)

  def init(params, num_nodes):
    dtype = jnp.result_type(float)
    return {"log_theta": jnp.full((num_nodes, k), -np.log(k), dtype), "trace": jnp.zeros((num_nodes,), dtype),
            "count": jnp.zeros((num_nodes,), dtype)}

  def receive(inbox: Inbox, state):
    m = inbox.messages
    rows = jnp.maximum(m["rows"], 1e-30)
    baseline = jnp.where(state["count"] > 0, state["trace"] / jnp.maximum(state["count"], 1e-30), 0.0)
    grad = (m["loss_share"] - baseline[:, None] * m["share"]) / rows[:, None]
    norm = jnp.max(jnp.abs(grad), axis=1)
    eta = eta0 / jnp.where(norm > 0, norm, 1.0)
    log_theta = state["log_theta"] - eta[:, None] * grad
    log_theta = log_theta - jax.scipy.special.logsumexp(log_theta, axis=1, keepdims=True)
    val_loss, before = m["loss"] / rows, m["loss_before"] / rows
    has_rows = m["rows"] > 0   # a node whose reporting clients held out nothing keeps θ
    new = {"log_theta": jnp.where(has_rows[:, None], log_theta, state["log_theta"]),
           "trace": jnp.where(has_rows, baseline_discount * state["trace"] + val_loss, state["trace"]),
           "count": jnp.where(has_rows, baseline_discount * state["count"] + 1.0, state["count"])}
    theta = jnp.exp(new["log_theta"])
    stats = {"fedex_entropy": -jnp.sum(theta * new["log_theta"], axis=1), "fedex_val_loss": val_loss,
             "fedex_val_loss_before": before,
             "fedex_mode_scale": jnp.asarray(scales, theta.dtype)[jnp.argmax(theta, axis=1)]}
    return inbox.pseudo_gradient, new, stats

  return ServerRule(init=init, receive=receive, name="fedex",
                    down=Downlink(broadcast=lambda state: jnp.exp(state["log_theta"])), moves=True)


def check_fedex(lr_scales, val_fraction, baseline_discount, name: str = "fedex") -> None:
  """Raises ``ValueError`` naming the value for scales that are not positive and finite (or none),
  a validation fraction outside (0, 1) and a discount outside [0, 1]."""
  scales = list(lr_scales)
  if not scales or not all(np.isfinite(s) and s > 0 for s in scales):
    raise ValueError(f"{name}: lr_scales={tuple(lr_scales)}; give one or more positive multiples of the "
                     f"local learning rate, e.g. (0.25, 0.5, 1.0, 2.0, 4.0)")
  if not 0.0 < float(val_fraction) < 1.0:
    raise ValueError(f"{name}: val_fraction={val_fraction}; the share of a client's examples held out for "
                     f"its validation loss must be in (0, 1)")
  if not 0.0 <= float(baseline_discount) <= 1.0:
    raise ValueError(f"{name}: baseline_discount={baseline_discount}; the baseline's discount must be in "
                     f"[0, 1] (0: the previous round's loss, 1: the mean of every round's)")


@method_over(hierfavg, cannot=(
  cannot("personal", "every client tries a learning rate on the whole model and reports its validation loss"),
))
def fedex(
  host: Host,
  *,
  lr_scales: Sequence[float] = (0.25, 0.5, 1.0, 2.0, 4.0),
  val_fraction: float = 0.2,
  baseline_discount: float = 0.0,
  mu: float = 0.0,
  name: str = "fedex",
) -> FederatedAlgorithm:
  """FedEx on ``topology`` (default flat): every server tunes its clients' local learning rate
  (``lr_scales`` times the local optimizer's) by exponentiated gradient on their validation losses
  while the model trains as FedAvg's (FedProx's with ``mu > 0``).

  Args:
    lr_scales: the candidate multiples of the local learning rate.
    val_fraction: the share of each client's examples held out for its validation loss.
    baseline_discount: the discount ``γ`` of the baseline (0: the previous round's mean loss; 1:
      the mean of every round's).
    mu: FedProx's proximal weight in the local training tuned (0: FedAvg's plain SGD).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`.

  Raises:
    ValueError: scales that are not positive, a validation fraction outside (0, 1), a discount
      outside [0, 1], a negative ``mu``, or personal parameters.

  Example:
    Five local learning rates tried over 5 clients; ``θ`` starts uniform (entropy ``log 5``) and
    moves after the first round:

    >>> alg = fedex(model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...             schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state, metrics = jax.jit(alg.round)(alg.init(jax.random.key(0)), data, jax.random.key(1))
    >>> bool(metrics["fedex_entropy"] < np.log(5))
    True
  """
  check_fedex(lr_scales, val_fraction, baseline_discount, name)
  if not is_traced(mu) and float(mu) < 0:
    raise ValueError(f"{name}: mu={mu} must be >= 0 (FedProx's proximal weight)")

  def objective(s: LocalSetup):
    def local(opt):
      if is_traced(mu) or float(mu) > 0:   # (a swept mu: FedProx's step, which at mu = 0 is SGD's)
        return fedprox_update(s.model, opt, mu=mu, batch_size=s.batch_size, max_steps=s.max_steps,
                              compute_dtype=s.compute_dtype)
      return sgd_client_update(s.model, opt, batch_size=s.batch_size, max_steps=s.max_steps,
                               compute_dtype=s.compute_dtype)

    return fedex_update(s.model, local, s.optimizer, lr_scales=lr_scales, val_fraction=val_fraction)

  rule = fedex_server(lr_scales, baseline_discount=baseline_discount)
  return host.build(client_update=objective, server_rule=rule, name=name)
