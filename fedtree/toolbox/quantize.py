"""A frozen base model stored in fewer bytes: bfloat16, or int8 weight-only quantization.

:func:`store_base` casts a base's parameters for a LoRA run (:mod:`fedtree.toolbox.lora`), whose
base is never trained: ``"bfloat16"`` halves it; ``"int8"`` quarters its matrices.

**The int8 scheme** (:class:`Int8Weight`): symmetric, per output channel, round to nearest, weight
only (activations stay in the compute dtype). Every floating parameter with at least 2 axes (a
kernel ``[in..., out]`` or an embedding table ``[V, d]``) is stored as ``q = round(W / s)``,
``int8`` in ``[-127, 127]``, with one float32 scale ``s = max |W| / 127`` per output channel: per
column ``out`` of a kernel (the maximum over its input axes), per row of an embedding table (a
path ending in ``embedding``: each token's vector, as it is gathered). Dequantized ``s q`` differs
from ``W`` by at most ``s / 2`` per entry (the bound :func:`error_bound` gives and the tests check),
``max |W| / 254`` of its channel. The other parameters (norm scales, biases) are stored in
bfloat16, the compute dtype, and the model runs on ``dequantize(base)``: inside a jitted round each
matrix is expanded where it is used (one transient bfloat16 copy, never one per client) and the
stored base stays int8. This is the weight-only absmax int8 of LLM.int8()'s baseline (Dettmers et
al. 2022) without its outlier decomposition, and the scheme of ``bitsandbytes``' ``Linear8bitLt``
weights in inference (row-wise absmax).

References:
  Dettmers et al. 2022, "LLM.int8(): 8-bit matrix multiplication for Transformers at scale".
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

PyTree = Any

BASE_DTYPES = ("float32", "bfloat16", "int8")
"""How a frozen base may be stored (:func:`store_base`)."""


@struct.dataclass
class Int8Weight:
  """One int8 weight-only quantized matrix (see the module docstring).

  Attributes:
    q: ``int8[*shape]``, ``round(W / scale)`` in ``[-127, 127]``.
    scale: ``float32``, broadcastable to ``shape``: ``[1, ..., 1, out]`` for a kernel (per output
      column), ``[V, 1]`` for an embedding table (per row).
    dtype: the dtype :func:`dequantize` returns (static).
  """

  q: jax.Array
  scale: jax.Array
  dtype: str = struct.field(pytree_node=False, default="bfloat16")

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(self.q.shape)

  def dequantize(self) -> jax.Array:
    """``scale * q`` in :attr:`dtype`."""
    return (self.q.astype(jnp.float32) * self.scale).astype(self.dtype)


def _is_matrix(leaf) -> bool:
  return len(np.shape(leaf)) >= 2 and jnp.issubdtype(jnp.result_type(leaf), jnp.floating)


def quantize_int8(w: jax.Array, *, per_row: bool = False, dtype: str = "bfloat16") -> Int8Weight:
  """``w`` as an :class:`Int8Weight`: one scale per output column (``per_row=False``: the maximum
  over every axis but the last) or per row (``per_row=True``, an embedding table ``[V, d]``)."""
  w32 = jnp.asarray(w, jnp.float32)
  axes = tuple(range(1, w32.ndim)) if per_row else tuple(range(w32.ndim - 1))
  amax = jnp.max(jnp.abs(w32), axis=axes, keepdims=True)
  scale = jnp.where(amax > 0, amax / 127.0, 1.0)
  q = jnp.clip(jnp.round(w32 / scale), -127, 127).astype(jnp.int8)
  return Int8Weight(q=q, scale=scale.astype(jnp.float32), dtype=dtype)


def error_bound(w: Int8Weight) -> jax.Array:
  """``float32`` broadcastable to the matrix: the largest ``|W - dequantize(q)|`` the scheme allows
  per entry, ``scale / 2`` (round to nearest), before the cast to the compute dtype."""
  return w.scale / 2.0


def _path(p) -> str:
  return jax.tree_util.keystr(p, simple=True, separator="/")


def store_base(params: PyTree, dtype: str | None) -> PyTree:
  """``params`` stored as ``dtype`` (one of :data:`BASE_DTYPES`; ``None``: unchanged): floating leaves
  cast to float32 or bfloat16, or (``"int8"``) every matrix an :class:`Int8Weight` and the other
  floating leaves bfloat16.

  Raises:
    ValueError: an unknown ``dtype``.
  """
  if dtype is None:
    return params
  if dtype not in BASE_DTYPES:
    raise ValueError(f"base dtype={dtype!r}; choose one of {BASE_DTYPES}")
  return _store(params, dtype)


@functools.partial(jax.jit, static_argnames=("dtype",))
def _store(params: PyTree, dtype: str) -> PyTree:
  """:func:`store_base` as one compiled program (not one per leaf)."""

  def one(path, leaf):
    if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
      return leaf
    if dtype == "int8" and _is_matrix(leaf):
      return quantize_int8(leaf, per_row=_path(path).endswith("embedding"))
    return jnp.asarray(leaf, "bfloat16" if dtype == "int8" else dtype)

  return jax.tree_util.tree_map_with_path(one, params)


def is_quantized(leaf) -> bool:
  return isinstance(leaf, Int8Weight)


def dequantize(params: PyTree) -> PyTree:
  """``params`` with every :class:`Int8Weight` expanded to its dtype (others unchanged); on abstract
  values (``jax.ShapeDtypeStruct`` leaves) the expanded shapes and dtypes."""

  def one(leaf):
    if not is_quantized(leaf):
      return leaf
    if isinstance(leaf.q, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(leaf.q.shape, jnp.dtype(leaf.dtype))
    return leaf.dequantize()

  return jax.tree.map(one, params, is_leaf=is_quantized)


def dequantized_shapes(params: PyTree) -> PyTree:
  """``jax.ShapeDtypeStruct`` of every leaf of ``dequantize(params)``, computed without expanding
  anything."""

  def one(leaf):
    if is_quantized(leaf):
      return jax.ShapeDtypeStruct(tuple(np.shape(leaf.q)), jnp.dtype(leaf.dtype))
    return jax.ShapeDtypeStruct(np.shape(leaf), jnp.result_type(leaf))

  return jax.tree.map(one, params, is_leaf=is_quantized)


def stored_bytes(params: PyTree) -> int:
  """Bytes the stored parameters hold (int8 matrices and their scales included)."""
  return int(sum(np.prod(np.shape(a)) * jnp.dtype(jnp.result_type(a)).itemsize
                 for a in jax.tree.leaves(params)))
