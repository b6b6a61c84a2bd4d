"""The :class:`Model` pair every algorithm trains, and the masked loss.

A :class:`Model` is ``init(key) -> params`` plus ``apply(params, x, *, train, rng) -> logits``:
pure functions, so a whole tier of clients is ``vmap(apply)`` over stacked params. Any flax
module becomes one with :func:`from_flax`; the architectures live in :mod:`fedtree.models`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

Params = Any


class Model(NamedTuple):
  """A pure model: ``init(key) -> params`` and ``apply(params, x, train=, rng=) -> logits``.

  ``input_dtype`` is the dtype of ``x`` (``"int32"`` for token ids) and ``label_shape`` the
  shape of one example's label: ``()`` for a classifier, ``(T,)`` for a language model whose
  label is the next token at every position (see :func:`token_mask`).
  """

  init: Callable[[jax.Array], Params]
  apply: Callable[..., jax.Array]
  num_classes: int
  input_dtype: str = "float32"
  label_shape: tuple[int, ...] = ()


def from_flax(module: nn.Module, example_shape: Sequence[int], num_classes: int) -> Model:
  """Wraps a flax module taking ``[B, *example_shape]`` into a :class:`Model`."""
  example_shape = tuple(int(s) for s in example_shape)

  def init(key):
    return module.init(key, jnp.zeros((1,) + example_shape, jnp.float32), train=False)["params"]

  def apply(params, x, *, train: bool = False, rng: jax.Array | None = None):
    rngs = {"dropout": rng} if (train and rng is not None) else None
    return module.apply({"params": params}, x, train=train, rngs=rngs)

  return Model(init=init, apply=apply, num_classes=int(num_classes))


PAD_ID = 0  # the padding token of sequence labels (fedtree.datasets.text reserves it)


def token_mask(labels: jax.Array, mask: jax.Array) -> jax.Array:
  """``mask`` broadcast to the shape of ``labels``.

  ``mask`` marks real examples (``[B]``). Labels with more axes than the mask are token
  sequences (``[B, T]``, a language model's next tokens): there a position counts only if its
  label is not :data:`PAD_ID`, so padded tokens of a short sentence are never trained on nor
  evaluated. Class labels (same shape as the mask) are returned unchanged: class 0 is a class.
  """
  if labels.ndim == mask.ndim:
    return mask
  mask = mask.reshape(mask.shape + (1,) * (labels.ndim - mask.ndim))
  return mask & (labels != PAD_ID)


def masked_cross_entropy(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy over the entries where ``mask`` is true (0 if none); for
  sequence labels the mean is over real tokens (:func:`token_mask`)."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
  nll = -jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
  m = token_mask(labels, mask).astype(jnp.float32)
  return jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)
