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

Compared with the authors' public code (lxcnju/FedKWS-UI, ``fedkwsui.py`` and ``cif_networks.py``;
read, not copied): the sign of the negative distillation (``L_ls - λ CE(f_p, f)``) and the target
(the private predictions, detached) agree with this module. It differs in four ways, each an
option here (the defaults are the paper's form):

(a) The private "model" is a second classifier head on the shared encoder, part of the global
    model (the server averages it with every other parameter) and re-started from the
    downloaded model every round, not a persistent per-client model: option
    ``private="head"`` (default ``"persistent"``, the paper's). Here the second head is a copy
    of the model's last ``nn.Dense`` layer (the one whose output is the logits, found by
    :func:`fedtree.objectives.fedmmd.last_dense`, FedMMD's interception) applied to that
    layer's input; the shared encoder is everything below it. The model's params become
    ``{"model": params, "private_head": head}`` (:func:`with_private_head`; the head
    initialized independently, from ``stream(key, "private_head")``), and every evaluation
    uses the main head. The authors' network instead gives both heads a bias-free projection,
    a ReLU and a linear classifier (widths 1.2 and 0.8 times the encoder's), which a model
    here does not have. A client then (1) trains the private head alone on cross-entropy, the
    encoder frozen (the authors zero its gradients; here the head is the only argument
    differentiated, so no optimizer, weight decay included, touches anything else), with a
    fresh state of the private optimizer (default: the local one, clipped as it), on the
    features of a training-mode forward pass; (2) trains the encoder and the main head on
    ``L_ls + λ L_adv`` from the downloaded encoder and main head, the private logits being the
    trained private head applied to the *current* encoder's features of the same
    training-mode pass (detached), the private head fixed; and (3) sends up both heads and the
    encoder. Such a model runs under :func:`fedtree.algorithms.optimization.fedkws.fedkws` (``private="head"``
    wraps the model) or any host given :func:`with_private_head`'s model.
(b) The private model trains for ``int(0.2 · E) + 1`` steps (``E`` the local step count before
    ALT's scaling): option ``private_steps_ratio`` (``int(ratio · n) + 1`` steps for a client
    with step count ``n > 0``, evaluated in Python's float64 arithmetic, none for ``n = 0``;
    default ``None``: ``n`` steps, or ``private_steps``).
(c) μ is per client, ``μ (1 - w)``, and the global-model step count is scaled by ``ratio * w``,
    with ``w`` the harmonic mean of ``min(n / n_max, 1)`` and the normalized label entropy (the
    "user-specific information" weighting): option ``client_utility`` (the step scaling is ALT
    with a fixed ``r0``, :mod:`fedtree.algorithms.optimization.fedkws.alt`).
(d) Gradients are clipped by norm: option ``max_grad_norm``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
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
from fedtree.core.model import Model, label_kind, masked_cross_entropy
from fedtree.core.rng import stream
from fedtree.objectives.fedmmd import last_dense

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


PRIVATE = ("persistent", "head")
"""The forms of the private model: ``"persistent"`` (the paper's: one per client, kept across
rounds) and ``"head"`` (the authors' code: a second head of the global model)."""
MODEL, HEAD = "model", "private_head"   # the keys of a model's params under private="head"


def check_private(private: str, private_steps: int | None = None,
                  private_steps_ratio: float | None = None) -> None:
  """``ValueError`` naming a ``private`` form outside :data:`PRIVATE`, a negative
  ``private_steps`` or ``private_steps_ratio``, or both step settings at once."""
  if private not in PRIVATE:
    raise ValueError(f"ALO private={private!r}; choose one of {PRIVATE}")
  if private_steps is not None and int(private_steps) < 0:
    raise ValueError(f"ALO private_steps={private_steps} must be >= 0")
  if private_steps_ratio is not None:
    if is_traced(private_steps_ratio):
      raise ValueError("ALO private_steps_ratio sets a static step count; it cannot be swept")
    if not (np.isfinite(float(private_steps_ratio)) and float(private_steps_ratio) >= 0):
      raise ValueError(f"ALO private_steps_ratio={private_steps_ratio} must be a finite number >= 0")
    if private_steps is not None:
      raise ValueError(f"ALO private_steps={private_steps} and private_steps_ratio={private_steps_ratio}: "
                       f"set at most one")


def ratio_steps(ratio: float, max_steps: int) -> np.ndarray:
  """``int32[max_steps + 1]``: entry ``n`` the private step count of a client with ``n`` steps,
  ``int(ratio · n) + 1`` for ``n > 0`` (Python's float arithmetic, as the authors' code) and
  0 for ``n = 0`` (a client that does not train)."""
  return np.asarray([0] + [int(ratio * n) + 1 for n in range(1, int(max_steps) + 1)], np.int32)


def head_layer(model: Model, example_shape: Sequence[int]) -> tuple[nn.Dense, jax.ShapeDtypeStruct]:
  """The model's classifier layer (an unbound ``nn.Dense``, :func:`~fedtree.objectives.fedmmd.last_dense`)
  and the shape of its input on ``[1, *example_shape]`` inputs, traced abstractly.

  Raises:
    ValueError: the model cannot carry a second head: its labels are sequences (a language
      model) or its logits are not the output of an ``nn.Dense``.
  """
  if tuple(model.label_shape) != ():
    raise ValueError(f"ALO private='head' adds a second classifier head; this model's labels have shape "
                     f"{tuple(model.label_shape)} ({label_kind(model)}), choose a classifier or "
                     f"private='persistent'")
  found = {}

  def probe(params, x):
    found["layer"], feats, _ = last_dense(model, params, x)
    return feats

  params = jax.eval_shape(model.init, jax.random.key(0))
  x = jax.ShapeDtypeStruct((1,) + tuple(example_shape), jnp.dtype(model.input_dtype))
  feats = jax.eval_shape(probe, params, x)
  if found["layer"] is None:
    raise ValueError("ALO private='head' copies the model's classifier layer: its logits must be the "
                     "output of a flax nn.Dense layer; this model's are not (use private='persistent')")
  return found["layer"], feats


def with_private_head(model: Model, example_shape: Sequence[int], init_params: PyTree | None = None) -> Model:
  """``model`` whose params carry a second classifier head (``private="head"``, difference (a)).

  ``init(key) -> {"model": params, "private_head": head}``: ``params`` is ``model.init(key)``
  (or ``init_params`` when given), ``head`` an independent initialization of the model's last
  ``nn.Dense`` (:func:`head_layer`) from ``stream(key, "private_head")``. ``apply`` is the
  model's on ``params["model"]``: the main head, so anything that evaluates this model scores
  the main head. Raises the ``ValueError`` of :func:`head_layer`.
  """
  layer, feats = head_layer(model, example_shape)

  def init(key):
    params = model.init(key) if init_params is None else init_params
    head = layer.init(stream(key, HEAD), jnp.zeros(feats.shape, feats.dtype))["params"]
    return {MODEL: params, HEAD: head}

  def apply(params, x, *, train: bool = False, rng: jax.Array | None = None):
    return model.apply(params[MODEL], x, train=train, rng=rng)

  return model._replace(init=init, apply=apply)


def main_params(params: PyTree) -> PyTree:
  """The params of the main model of ``with_private_head``'s params (what evaluation scores)."""
  return params[MODEL]


def check_headed(params: PyTree) -> None:
  """``ValueError`` unless ``params`` are :func:`with_private_head`'s (``private="head"``)."""
  if not (isinstance(params, dict) and set(params) == {MODEL, HEAD}):
    keys = sorted(params) if isinstance(params, dict) else type(params).__name__
    raise ValueError(f"ALO private='head' trains params {{{MODEL!r}, {HEAD!r}}} (the host's model must be "
                     f"fedtree.objectives.alo.with_private_head(model), as fedkws(private='head') builds); "
                     f"got {keys}")


@struct.dataclass
class ALOCarry:
  """Local state of the global-model training: ``params`` (the model trained), ``opt_state``
  and the client's ``private`` model, or under ``private="head"`` the private head (fixed
  during the global training)."""

  params: PyTree
  opt_state: PyTree
  private: PyTree


def make_alo_step(model: Model, optimizer: optax.GradientTransformation, *, mu: float, lam: float,
                  compute_dtype=None, private: str = "persistent"):
  """A step of ``optimizer`` on :func:`alo_loss`: ``step(ALOCarry, batch, rng) -> (carry, CE)``
  (both models' forward passes in ``compute_dtype`` when given; the loss in at least float32).

  ``private="persistent"``: the private logits are the private model's, in inference mode;
  ``"head"``: they are the private head (``carry.private``) applied to the input of the
  model's classifier layer in the same training-mode forward pass (the current encoder).
  """
  check_alo(mu, lam)
  check_private(private)
  dtype = check_compute_dtype(compute_dtype)

  def objective(params, private_params, batch: Batch, rng):
    if dtype is not None:
      params, private_params = cast_floating(params, dtype), cast_floating(private_params, dtype)
      batch = batch._replace(x=cast_floating(batch.x, dtype))
    if private == "head":
      layer, feats, logits = last_dense(model, params, batch.x, train=True, rng=rng)
      private_logits = layer.apply({"params": private_params}, feats)
    else:
      logits = model.apply(params, batch.x, train=True, rng=rng)
      private_logits = model.apply(private_params, batch.x, train=False, rng=rng)   # same augmented views
    total = alo_loss(logits, private_logits, batch.y, batch.mask, mu=mu, lam=lam)
    return total, masked_cross_entropy(logits, batch.y, batch.mask)

  def step(carry: ALOCarry, batch: Batch, rng):
    grads, ce = jax.grad(objective, has_aux=True)(carry.params, carry.private, batch, rng)
    updates, opt_state = optimizer.update(grads, carry.opt_state, carry.params)
    return carry.replace(params=optax.apply_updates(carry.params, updates), opt_state=opt_state), ce

  return step


def make_head_step(model: Model, optimizer: optax.GradientTransformation, *, compute_dtype=None):
  """A step of ``optimizer`` on the private head alone (``private="head"``):
  ``step(SGDCarry, batch, rng) -> (carry, CE)`` with ``carry.params`` the head and
  ``carry.anchor`` the frozen model (encoder and main head), whose training-mode features the
  head classifies; only the head is differentiated and updated."""
  dtype = check_compute_dtype(compute_dtype)

  def objective(head, frozen, batch: Batch, rng):
    if dtype is not None:
      head, frozen = cast_floating(head, dtype), cast_floating(frozen, dtype)
      batch = batch._replace(x=cast_floating(batch.x, dtype))
    layer, feats, _ = last_dense(model, frozen, batch.x, train=True, rng=rng)
    logits = layer.apply({"params": head}, jax.lax.stop_gradient(feats))
    return masked_cross_entropy(logits, batch.y, batch.mask)

  def step(carry: SGDCarry, batch: Batch, rng):
    ce, grads = jax.value_and_grad(objective)(carry.params, carry.anchor, batch, rng)
    updates, opt_state = optimizer.update(grads, carry.opt_state, carry.params)
    return carry.replace(params=optax.apply_updates(carry.params, updates), opt_state=opt_state), ce

  return step


@struct.dataclass
class ALOState:
  """ALO's persistent client state.

  Attributes:
    private: ``[C, ...]`` the private models ``ψ_p`` (one per client when stacked);
      ``()`` under ``private="head"`` (the head is part of the global model).
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
  private: str = "persistent",
  private_optimizer: optax.GradientTransformation | None = None,
  private_steps: int | None = None,
  private_steps_ratio: float | None = None,
  client_utility: Any = None,
  max_grad_norm: float | None = None,
  compute_dtype=None,
) -> ClientUpdate:
  """ALO's client: train the private model ``ψ_p`` with cross-entropy, then the downloaded
  model on ``L_ls + λ L_adv`` against it; send the latter up (see the module docstring).

  Args:
    model: the model (global and private models share the architecture); under
      ``private="head"`` the plain model, while the host runs ``with_private_head(model)``.
    optimizer: local optimizer of the global model.
    mu: label smoothing μ in ``[0, 1)``.
    lam: weight λ >= 0 of the negative distillation.
    batch_size: minibatch size.
    max_steps: static scan length of the global-model training.
    private: ``"persistent"`` (paper form: a private model per client, kept across rounds
      in :class:`ALOState`) or ``"head"`` (the authors' code, difference (a): a second head
      of the global model, trained with the encoder frozen; the anchor and the model sent
      up are :func:`with_private_head`'s ``{"model", "private_head"}`` params, and the
      update keeps no private state).
    private_optimizer: optimizer of ``ψ_p`` or of the private head (default ``optimizer``).
    private_steps: steps of ``ψ_p`` per round (default: the client's own step count).
    private_steps_ratio: ``None`` (paper form), or the private steps of a client with ``n``
      steps this round are ``int(ratio · n) + 1`` (0 if ``n = 0``); the authors' code: 0.2
      of the step count before ALT's scaling (difference (b);
      :func:`fedtree.algorithms.optimization.fedkws.fedkws` applies it so). At most one of
      ``private_steps`` and ``private_steps_ratio``.
    client_utility: ``None`` (paper form: one μ for all), or every client's utility ``w_k``
      in ``[0, 1]`` (``[C]``, e.g. :func:`fedtree.algorithms.optimization.fedkws.alt.client_utility`):
      client ``k`` then smooths its labels with ``μ (1 - w_k)`` (the authors' code, difference
      (c)); kept in :class:`ALOState`.
    max_grad_norm: ``None`` (paper form), or clip the gradient of every local step, the
      private model's and the global model's, to this global norm before the optimizer
      (the authors' code, difference (d)).
    compute_dtype: mixed-precision local steps (``None``: the params' dtype).

  The private models are adversaries, not personalized models: the update declares no
  ``personal_models`` (FedKWS-UI scores the global model only, as the paper).

  Raises:
    ValueError: a bad hyperparameter (named, with the allowed values); under
      ``private="head"``, when traced, params that are not :func:`with_private_head`'s.
  """
  check_alo(mu, lam)
  check_private(private, private_steps, private_steps_ratio)
  if model.multi_label:
    raise ValueError("ALO smooths and distills one class posterior (softmax) per example; this model's "
                     f"labels are {label_kind(model)}, choose a classifier of one class per example")
  if max_grad_norm is not None:
    check_positive(max_grad_norm=max_grad_norm)
  if client_utility is not None:
    client_utility = np.asarray(client_utility, np.float64)
    if client_utility.ndim != 1 or not np.all((client_utility >= 0) & (client_utility <= 1)):
      raise ValueError(f"ALO client_utility must be a [C] vector in [0, 1], got {client_utility[:10]}")
  head = private == "head"
  optimizer = clipped(optimizer, max_grad_norm)
  private_optimizer = optimizer if private_optimizer is None else clipped(private_optimizer, max_grad_norm)
  if head:
    private_step = make_head_step(model, private_optimizer, compute_dtype=compute_dtype)
  else:
    private_step = make_sgd_step(model, private_optimizer, compute_dtype=compute_dtype)
  global_step = make_alo_step(model, optimizer, mu=mu, lam=lam, compute_dtype=compute_dtype, private=private)
  if private_steps_ratio is not None:
    ratio_table = ratio_steps(private_steps_ratio, max_steps)
    private_max = int(ratio_table[-1])
  else:
    private_max = max_steps if private_steps is None else int(private_steps)

  def private_count(num_steps):
    if private_steps_ratio is not None:
      return jnp.asarray(ratio_table)[jnp.clip(num_steps, 0, max_steps)]
    if private_steps is not None:
      return jnp.minimum(num_steps, 1) * private_max
    return num_steps

  def apply(anchor, state, data: ClientData, num_steps, key):
    utility = getattr(state, "utility", None)
    if head:
      check_headed(anchor)
      params, start = anchor[MODEL], anchor[HEAD]
      pcarry = SGDCarry(params=start, opt_state=private_optimizer.init(start), anchor=params)
    else:
      params = anchor
      pcarry = SGDCarry(params=state.private, opt_state=private_optimizer.init(state.private),
                        anchor=state.private)
    pcarry, _ = run_local_steps(private_step, pcarry, data, private_count(num_steps), stream(key, "private"),
                                batch_size=batch_size, max_steps=private_max)
    step = global_step
    if utility is not None:
      step = make_alo_step(model, optimizer, mu=mu * (1.0 - utility), lam=lam,
                           compute_dtype=compute_dtype, private=private)
    carry = ALOCarry(params=params, opt_state=optimizer.init(params), private=pcarry.params)
    carry, loss = run_local_steps(step, carry, data, num_steps, key, batch_size=batch_size,
                                  max_steps=max_steps)
    if head:
      return {MODEL: carry.params, HEAD: pcarry.params}, state, loss
    return carry.params, state.replace(private=pcarry.params), loss

  def init_state(params, num_clients):
    utility = None
    if client_utility is not None:
      if len(client_utility) != num_clients:
        raise ValueError(f"ALO client_utility has {len(client_utility)} entries for {num_clients} clients")
      utility = jnp.asarray(client_utility, jnp.result_type(float))
    return ALOState(private=() if head else stack(params, num_clients), utility=utility)

  if head and client_utility is None:
    return ClientUpdate(apply=apply)     # stateless: the head is part of the global model
  return ClientUpdate(apply=apply, init_state=init_state)
