"""FedMMD (Yao et al. 2018, "Two-stream federated learning: reduce the communication costs";
a baseline of FedKWS-UI, paper 002): the local loss adds an MMD penalty between the features
of the model being trained and those of the downloaded global model on the same batch,

  ``f_i(θ) + λ · MMD²(φ_θ(x), φ_Θ(x))``,

as a :class:`~fedtree.core.local.ClientUpdate`, so it runs under any tree and any server
optimizer (as FedProx).

* Features ``φ`` (:func:`penultimate`): the input of the model's last dense layer (the
  penultimate representation), flattened to ``[B, D]``; obtained from any flax-backed
  :class:`~fedtree.core.model.Model` by intercepting the ``nn.Dense`` calls of one forward
  pass (``flax.linen.intercept_methods``, scoped to that call), with no change to the
  model. A model whose logits are not the output of an ``nn.Dense`` (or whose labels are
  token sequences, as a language model's) is refused with a ``ValueError``
  (:func:`check_features`). The global model's features are taken in inference mode and
  are constants (no gradient flows into ``Θ``).
* MMD² (:func:`mmd2`): the biased (V-statistic) estimate ``sᵀ K s`` over the pooled
  ``2B`` features, ``s = (w, -w)`` with ``w`` the batch mask normalized to sum 1 (padding
  takes no part). ``kernel="gaussian"`` (default): ``k(a, b) = Σ_j exp(-‖a - b‖² / h_j)``
  with ``num_kernels`` bandwidths ``h_j = h₀ · kernel_mul^(j - num_kernels // 2)`` around
  ``h₀`` = the mean squared distance over distinct pairs of real pooled features (a
  constant: no gradient through it; at least 1e-12), or ``h₀ = bandwidth`` when given
  (``num_kernels=1`` and ``bandwidth = 2σ²`` is one Gaussian of width σ).
  ``kernel="linear"``: ``k(a, b) = a·b``, i.e. ``‖mean φ_θ - mean φ_Θ‖²``.

Choices (the paper leaves them open here): the default kernel (5 bandwidths, ratio 2,
around the mean pairwise distance) is the one of the FedKWS-UI authors' FedMMD baseline
(lxcnju/FedKWS-UI, read not copied); the reported loss is the cross-entropy alone
(comparable across methods). ``λ = 0`` is FedAvg's local training.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fedtree.core.checks import check_nonnegative, check_positive
from fedtree.core.local import (
  Batch,
  ClientData,
  ClientUpdate,
  SGDCarry,
  cast_floating,
  check_compute_dtype,
  run_local_steps,
  stack,
)
from fedtree.core.model import Model, forward_train, label_kind, masked_cross_entropy

KERNELS = ("gaussian", "linear")
MIN_BANDWIDTH = 1e-12


def _capture_last_dense(forward: Callable[[], Any]) -> tuple[dict, Any]:
  """Runs ``forward()`` with the ``nn.Dense`` calls intercepted (``flax.linen.intercept_methods``,
  scoped to this call): its output and ``{"layer", "in", "out"}`` of the last ``nn.Dense`` called."""
  last: dict = {}

  def capture(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, nn.Dense) and context.method_name == "__call__":
      last["layer"], last["in"], last["out"] = context.module, args[0], out
    return out

  with nn.intercept_methods(capture):
    result = forward()
  return last, result


def last_dense(model: Model, params, x: jax.Array, *, train: bool = False,
               rng: jax.Array | None = None) -> tuple[nn.Dense | None, jax.Array, jax.Array]:
  """``(layer, inputs, logits)`` of one forward pass: ``layer`` the ``nn.Dense`` whose output is
  the logits (an unbound copy that ``layer.apply({"params": ...}, inputs)`` re-applies with other
  weights; ``None`` when the logits are not an ``nn.Dense``'s output), ``inputs`` its input as
  the layer saw it. The ``nn.Dense`` calls are intercepted (``flax.linen.intercept_methods``,
  scoped to this call); the model is not changed."""
  last, logits = _capture_last_dense(lambda: model.apply(params, x, train=train, rng=rng))
  if last.get("out") is not logits:
    return None, x, logits
  return last["layer"].clone(parent=None), last["in"], logits


def _no_features(method: str) -> ValueError:
  return ValueError(
    f"{method} needs features: the model's logits must be the output of a flax nn.Dense layer "
    "(its input is the penultimate representation); this model's are not"
  )


def penultimate(model: Model, params, x: jax.Array, *, train: bool = False,
                rng: jax.Array | None = None, method: str = "FedMMD") -> tuple[jax.Array, jax.Array]:
  """``(features [B, D], logits)`` of one forward pass: the features are the input of the
  ``nn.Dense`` layer whose output is the logits (see the module docstring; :func:`last_dense`).

  Raises:
    ValueError: the logits are not the output of an ``nn.Dense`` layer (naming ``method``).
  """
  layer, feats, logits = last_dense(model, params, x, train=train, rng=rng)
  if layer is None:
    raise _no_features(method)
  return feats.reshape((feats.shape[0], -1)), logits


def penultimate_train(model: Model, params, x: jax.Array, *, rng: jax.Array | None, mask: jax.Array,
                      method: str = "FedMMD") -> tuple[jax.Array, jax.Array, Any]:
  """``(features [B, D], logits, params')`` of one forward pass in training mode: as
  :func:`penultimate`, through :func:`fedtree.core.model.forward_train`, so that a model with state
  (BatchNorm) also returns its statistics updated from the rows of ``mask`` (``params'``; a model
  without state: ``params``), what a local step that keeps them needs (MOON's).

  Raises:
    ValueError: the logits are not the output of an ``nn.Dense`` layer (naming ``method``).
  """
  last, (logits, updated) = _capture_last_dense(lambda: forward_train(model, params, x, rng=rng, mask=mask))
  if last.get("out") is not logits:
    raise _no_features(method)
  feats = last["in"]
  return feats.reshape((feats.shape[0], -1)), logits, updated


def check_features(model: Model, example_shape: Sequence[int], method: str = "FedMMD") -> int:
  """The feature width ``D`` of ``model`` on ``[B, *example_shape]`` inputs (traced
  abstractly), or a ``ValueError`` saying why ``method`` cannot run on it."""
  if tuple(model.label_shape) != ():
    raise ValueError(f"{method} compares per-example features; this model's labels have shape "
                     f"{tuple(model.label_shape)} ({label_kind(model)}), choose a classifier")
  params = jax.eval_shape(model.init, jax.random.key(0))
  x = jax.ShapeDtypeStruct((2,) + tuple(example_shape), jnp.dtype(model.input_dtype))
  feats, _ = jax.eval_shape(lambda p, v: penultimate(model, p, v, method=method), params, x)
  return int(feats.shape[-1])


def check_kernel(kernel: str, num_kernels: int, kernel_mul: float, bandwidth: float | None) -> None:
  """``ValueError`` naming a kernel outside :data:`KERNELS` or a bad kernel setting."""
  if kernel not in KERNELS:
    raise ValueError(f"FedMMD kernel={kernel!r}; choose one of {KERNELS}")
  if int(num_kernels) < 1:
    raise ValueError(f"FedMMD num_kernels={num_kernels} must be >= 1")
  check_positive(kernel_mul=kernel_mul)
  if bandwidth is not None:
    check_positive(bandwidth=bandwidth)


def mmd2(a: jax.Array, b: jax.Array, mask: jax.Array, *, kernel: str = "gaussian", num_kernels: int = 5,
         kernel_mul: float = 2.0, bandwidth: float | None = None) -> jax.Array:
  """The biased estimate of MMD² between the rows of ``a`` and ``b`` (``[B, D]``) where
  ``mask`` (``bool[B]``) is true, for the kernels of the module docstring (0 if no row)."""
  dtype = jnp.promote_types(jnp.result_type(a, b), jnp.float32)
  a, b = a.astype(dtype), b.astype(dtype)
  m = mask.astype(dtype)
  w = m / jnp.maximum(jnp.sum(m), 1.0)
  s = jnp.concatenate([w, -w])
  z = jnp.concatenate([a, b])
  if kernel == "linear":
    return jnp.sum(jnp.square(s @ z))
  if kernel != "gaussian":
    raise ValueError(f"FedMMD kernel={kernel!r}; choose one of {KERNELS}")
  d2 = jnp.sum(jnp.square(z[:, None, :] - z[None, :, :]), axis=-1)            # [2B, 2B]
  if bandwidth is None:
    mm = jnp.concatenate([m, m])
    pairs = mm[:, None] * mm[None, :] * (1.0 - jnp.eye(z.shape[0], dtype=dtype))
    h0 = jax.lax.stop_gradient(jnp.sum(d2 * pairs) / jnp.maximum(jnp.sum(pairs), 1.0))
  else:
    h0 = jnp.asarray(bandwidth, dtype)
  h0 = jnp.maximum(h0, MIN_BANDWIDTH)
  k = sum(jnp.exp(-d2 / (h0 * kernel_mul ** (j - num_kernels // 2))) for j in range(int(num_kernels)))
  return s @ k @ s


def fedmmd_update(
  model: Model, optimizer: optax.GradientTransformation, *, lam: float, batch_size: int, max_steps: int,
  kernel: str = "gaussian", num_kernels: int = 5, kernel_mul: float = 2.0, bandwidth: float | None = None,
  compute_dtype=None, persistent: bool = False,
) -> ClientUpdate:
  """FedMMD local training: ``f_i(θ) + λ MMD²(φ_θ, φ_Θ)`` towards the downloaded ``Θ``.

  Args:
    model: a flax-backed classifier whose logits come from an ``nn.Dense`` (:func:`penultimate`).
    optimizer: the local optimizer.
    lam: λ >= 0 (paper 002 tries 1e-4, 1e-3, 1e-2).
    batch_size: minibatch size.
    max_steps: static scan length.
    kernel, num_kernels, kernel_mul, bandwidth: the MMD kernel (:func:`mmd2`).
    compute_dtype: mixed-precision local steps (``None``: the params' dtype); the MMD is
      computed in at least float32.
    persistent: start from the client's own persistent model instead of ``Θ`` (B-HFL's
      clients; ``Θ`` is then only the model whose features the penalty matches).
  """
  check_nonnegative(lam=lam)
  check_kernel(kernel, num_kernels, kernel_mul, bandwidth)
  dtype = check_compute_dtype(compute_dtype)

  def objective(params, anchor, batch: Batch, rng):
    if dtype is not None:
      params, anchor = cast_floating(params, dtype), cast_floating(anchor, dtype)
      batch = batch._replace(x=cast_floating(batch.x, dtype))
    feats, logits = penultimate(model, params, batch.x, train=True, rng=rng)
    global_feats, _ = penultimate(model, anchor, batch.x, train=False, rng=rng)  # same augmented views
    loss = masked_cross_entropy(logits, batch.y, batch.mask)
    penalty = mmd2(feats, jax.lax.stop_gradient(global_feats), batch.mask, kernel=kernel,
                   num_kernels=num_kernels, kernel_mul=kernel_mul, bandwidth=bandwidth)
    return loss + lam * penalty.astype(loss.dtype), loss

  def step(carry: SGDCarry, batch: Batch, rng):
    grads, loss = jax.grad(objective, has_aux=True)(carry.params, carry.anchor, batch, rng)
    updates, opt_state = optimizer.update(grads, carry.opt_state, carry.params)
    return carry.replace(params=optax.apply_updates(carry.params, updates), opt_state=opt_state), loss

  def apply(anchor, state, data: ClientData, num_steps, key):
    start = state if persistent else anchor
    carry = SGDCarry(params=start, opt_state=optimizer.init(start), anchor=anchor)
    carry, loss = run_local_steps(step, carry, data, num_steps, key, batch_size=batch_size,
                                  max_steps=max_steps)
    return carry.params, (carry.params if persistent else state), loss

  if not persistent:
    return ClientUpdate(apply=apply)
  return ClientUpdate(apply=apply, init_state=stack, starts_from_own_model=True,
                      personal_models=lambda state: state)
