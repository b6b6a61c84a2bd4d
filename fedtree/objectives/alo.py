"""ALO, adversarial learning against overfitted models (FedKWS-UI, paper 002: Li et al. 2022,
"Avoid overfitting user specific information in federated keyword spotting"), as a
:class:`~fedtree.core.local.ClientUpdate`, so it runs under any tree and any server optimizer.

Every client keeps a private model ``ψ_p`` (its persistent state, stacked ``[C, ...]``),
trained with plain cross-entropy on its own data each time the client is sampled, so that
over the rounds it overfits the client. The downloaded global model ``ψ`` is then trained on

  ``L = L_ls + λ · L_adv``,
  ``L_ls = E[-Σ_c ((1 - μ) 1{y = c} + μ / C) log f(x)_c]``       (label smoothing μ),
  ``L_adv = -E[-Σ_c f_p(x)_c log f(x)_c]``                          (negative distillation),

where ``f_p = softmax`` of the private model's logits (a constant: no gradient flows into
``ψ_p``) and ``f`` the global model's softmax. Paper values: μ = 0.2, λ = 0.001.

Choices (the paper leaves them open): the private model starts from the initial global model
(the same initialization as every node), is trained *before* the global model in a round
(the global model is pushed away from the freshly updated private model), for the client's
own step count (``private_steps`` overrides it), with a fresh optimizer state every round (as
Ditto's personal model); its predictions are taken in inference mode (dropout off). The
global-model training uses the round key itself, so with μ = λ = 0 the model sent up is
exactly plain local training (:func:`fedtree.core.local.sgd_client_update`) with the same key.
The reported loss is the plain cross-entropy of the global model (comparable across methods).

Compared with the authors' public code (lxcnju/FedKWS-UI, ``fedkwsui.py``; read, not copied):
the sign of the negative distillation (``L_ls - λ CE(f_p, f)``) and the target (the private
predictions, detached) agree with this module. It differs in: (a) the private "model" is a second
classifier head on the shared encoder, part of the global model and averaged by the server,
re-started from the downloaded model every round rather than a persistent per-client model
(not offered here); (b) it trains for ``int(0.2 * steps) + 1`` steps with the encoder frozen
(not offered here; ``private_steps`` sets a fixed count); (c) μ is per client, ``μ (1 - w)``,
and the global-model step count is scaled by ``ratio * w``, with ``w`` the harmonic mean of
``min(n / n_max, 1)`` and the normalized label entropy (the "user-specific information"
weighting): option ``client_utility`` (the step scaling is ALT with a fixed ``r0``,
:mod:`fedtree.algorithms.fedkws.alt`); (d) gradients are clipped by norm: option
``max_grad_norm``. The defaults are the paper's form.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from fedtree.core.checks import check_nonnegative, check_positive, is_traced
from fedtree.core.local import (
  Batch,
  ClientData,
  ClientUpdate,
  SGDCarry,
  cast_floating,
  check_compute_dtype,
  make_sgd_step,
  run_local_steps,
  stack,
)
from fedtree.core.model import Model, masked_cross_entropy
from fedtree.core.rng import stream

PyTree = Any


def check_alo(mu: float, lam: float) -> None:
  """``ValueError`` naming μ outside ``[0, 1)`` or a negative / non-finite λ (a traced,
  i.e. swept, value is skipped: its concrete values were checked before tracing)."""
  if not is_traced(mu) and not 0.0 <= float(mu) < 1.0:
    raise ValueError(f"ALO label smoothing mu={mu} must be in [0, 1)")
  check_nonnegative(lam=lam)


def alo_loss(logits: jax.Array, private_logits: jax.Array, labels: jax.Array, mask: jax.Array, *,
             mu: float, lam: float) -> jax.Array:
  """``L_ls + λ L_adv`` averaged over the unmasked examples (0 if none).

  ``logits``, ``private_logits``: ``[B, C]``; ``labels``: ``int[B]``; ``mask``: ``bool[B]``.
  Computed in the logits' dtype promoted with float32 (float64 logits under
  ``jax_enable_x64`` give a float64 loss, as :func:`~fedtree.core.model.masked_cross_entropy`).
  """
  num_classes = logits.shape[-1]
  dtype = jnp.promote_types(logits.dtype, jnp.float32)
  logp = jax.nn.log_softmax(logits.astype(dtype))
  target = (1.0 - mu) * jax.nn.one_hot(labels, num_classes, dtype=dtype) + mu / num_classes
  smoothed = -jnp.sum(target * logp, axis=-1)
  teacher = jax.lax.stop_gradient(jax.nn.softmax(private_logits.astype(dtype)))
  adversarial = jnp.sum(teacher * logp, axis=-1)        # = -CE(f_p, f)
  m = mask.astype(dtype)
  return jnp.sum((smoothed + lam * adversarial) * m) / jnp.maximum(jnp.sum(m), 1.0)


@struct.dataclass
class ALOCarry:
  """Local state of the global-model training: ``params`` (the model trained), ``opt_state``
  and the client's ``private`` model (fixed during the global training)."""

  params: PyTree
  opt_state: PyTree
  private: PyTree


def make_alo_step(model: Model, optimizer: optax.GradientTransformation, *, mu: float, lam: float,
                  compute_dtype=None):
  """A step of ``optimizer`` on :func:`alo_loss`: ``step(ALOCarry, batch, rng) -> (carry, CE)``
  (both models' forward passes in ``compute_dtype`` when given; the loss in at least float32)."""
  check_alo(mu, lam)
  dtype = check_compute_dtype(compute_dtype)

  def objective(params, private, batch: Batch, rng):
    if dtype is not None:
      params, private = cast_floating(params, dtype), cast_floating(private, dtype)
      batch = batch._replace(x=cast_floating(batch.x, dtype))
    logits = model.apply(params, batch.x, train=True, rng=rng)
    private_logits = model.apply(private, batch.x, train=False, rng=rng)   # same augmented views
    total = alo_loss(logits, private_logits, batch.y, batch.mask, mu=mu, lam=lam)
    return total, masked_cross_entropy(logits, batch.y, batch.mask)

  def step(carry: ALOCarry, batch: Batch, rng):
    grads, ce = jax.grad(objective, has_aux=True)(carry.params, carry.private, batch, rng)
    updates, opt_state = optimizer.update(grads, carry.opt_state, carry.params)
    return carry.replace(params=optax.apply_updates(carry.params, updates), opt_state=opt_state), ce

  return step


@struct.dataclass
class ALOState:
  """ALO's persistent client state.

  Attributes:
    private: ``[C, ...]`` the private models ``ψ_p`` (one per client when stacked).
    utility: ``[C]`` each client's utility ``w_k`` in ``[0, 1]`` when μ is weighted per
      client (``client_utility``; fixed), else ``None``.
  """

  private: PyTree
  utility: Any = None


def clipped(optimizer: optax.GradientTransformation,
            max_grad_norm: float | None) -> optax.GradientTransformation:
  """``optimizer`` after clipping the gradient to global norm ``max_grad_norm`` (``None``: as is)."""
  if max_grad_norm is None:
    return optimizer
  return optax.chain(optax.clip_by_global_norm(max_grad_norm), optimizer)


def alo_update(
  model: Model,
  optimizer: optax.GradientTransformation,
  *,
  mu: float,
  lam: float,
  batch_size: int,
  max_steps: int,
  private_optimizer: optax.GradientTransformation | None = None,
  private_steps: int | None = None,
  client_utility: Any = None,
  max_grad_norm: float | None = None,
  compute_dtype=None,
) -> ClientUpdate:
  """ALO's client: train the private model ``ψ_p`` with cross-entropy, then the downloaded
  model on ``L_ls + λ L_adv`` against it; send the latter up (see the module docstring).

  Args:
    model: the model (global and private models share the architecture).
    optimizer: local optimizer of the global model.
    mu: label smoothing μ in ``[0, 1)``.
    lam: weight λ >= 0 of the negative distillation.
    batch_size: minibatch size.
    max_steps: static scan length of the global-model training.
    private_optimizer: optimizer of ``ψ_p`` (default ``optimizer``).
    private_steps: steps of ``ψ_p`` per round (default: the client's own step count).
    client_utility: ``None`` (paper form: one μ for all), or every client's utility ``w_k``
      in ``[0, 1]`` (``[C]``, e.g. :func:`fedtree.algorithms.fedkws.alt.client_utility`):
      client ``k`` then smooths its labels with ``μ (1 - w_k)`` (the authors' code, difference
      (c)); kept in :class:`ALOState`.
    max_grad_norm: ``None`` (paper form), or clip the gradient of every local step, the
      private model's and the global model's, to this global norm before the optimizer
      (the authors' code, difference (d)).
    compute_dtype: mixed-precision local steps (``None``: the params' dtype).

  The private models are adversaries, not personalized models: the update declares no
  ``personal_models`` (FedKWS-UI scores the global model only, as the paper).
  """
  check_alo(mu, lam)
  if private_steps is not None and int(private_steps) < 0:
    raise ValueError(f"ALO private_steps={private_steps} must be >= 0")
  if max_grad_norm is not None:
    check_positive(max_grad_norm=max_grad_norm)
  if client_utility is not None:
    client_utility = np.asarray(client_utility, np.float64)
    if client_utility.ndim != 1 or not np.all((client_utility >= 0) & (client_utility <= 1)):
      raise ValueError(f"ALO client_utility must be a [C] vector in [0, 1], got {client_utility[:10]}")
  optimizer = clipped(optimizer, max_grad_norm)
  private_optimizer = optimizer if private_optimizer is None else clipped(private_optimizer, max_grad_norm)
  private_step = make_sgd_step(model, private_optimizer, compute_dtype=compute_dtype)
  global_step = make_alo_step(model, optimizer, mu=mu, lam=lam, compute_dtype=compute_dtype)
  private_max = max_steps if private_steps is None else int(private_steps)

  def apply(anchor, state: ALOState, data: ClientData, num_steps, key):
    p_steps = num_steps if private_steps is None else jnp.minimum(num_steps, 1) * private_max
    private = state.private
    pcarry = SGDCarry(params=private, opt_state=private_optimizer.init(private), anchor=private)
    pcarry, _ = run_local_steps(private_step, pcarry, data, p_steps, stream(key, "private"),
                                batch_size=batch_size, max_steps=private_max)
    step = global_step
    if state.utility is not None:
      step = make_alo_step(model, optimizer, mu=mu * (1.0 - state.utility), lam=lam,
                           compute_dtype=compute_dtype)
    carry = ALOCarry(params=anchor, opt_state=optimizer.init(anchor), private=pcarry.params)
    carry, loss = run_local_steps(step, carry, data, num_steps, key, batch_size=batch_size,
                                  max_steps=max_steps)
    return carry.params, state.replace(private=pcarry.params), loss

  def init_state(params, num_clients):
    utility = None
    if client_utility is not None:
      if len(client_utility) != num_clients:
        raise ValueError(f"ALO client_utility has {len(client_utility)} entries for {num_clients} clients")
      utility = jnp.asarray(client_utility, jnp.result_type(float))
    return ALOState(private=stack(params, num_clients), utility=utility)

  return ClientUpdate(apply=apply, init_state=init_state)
