"""Compressed updates: lossy encodings of what travels along an edge of the tree, with its size.

A :class:`Compressor` is a pure ``apply(tree, key) -> decoded tree`` (the encode and the decode in
one function: the simulator needs what the receiver reconstructs) and ``bits(tree) -> []``, the
exact size of the encoding in bits (computed from the shapes and the hyperparameters, so it may be
traced when a hyperparameter is swept). It becomes

* an **uplink** :class:`~fedtree.core.updates.ClientTransform` on every child's pseudo-gradient
  (:func:`uplink`; optionally with **error feedback**, a persistent per-child residual ``e``:
  the child sends ``C(Δ + e)`` and keeps ``e' = Δ + e - C(Δ + e)``, Seide et al. 2014,
  Karimireddy et al. 2019), at any server level of an :class:`~fedtree.core.updates.UpdatePath`;
* a **downlink** :class:`~fedtree.core.updates.DownTransform` on the models a parent sends to its
  children (:func:`downlink`);
* a parent's **majority vote** (:func:`majority_vote`, a node transform) for signSGD.

Compressors, one factory each in the optax style (sizes for a leaf of ``n`` coordinates of
``w``-bit floats; ``d`` the whole update); a run's ``compression`` section names them
(:data:`fedtree.experiment.capabilities.compression.COMPRESSORS`):

| factory (name) | what the receiver decodes | bits |
| --- | --- | --- |
| `identity()` (`none`) | the update as it is | `w n` |
| `fp16()` / `bf16()` | a cast to 16 bits and back | `16 n` |
| `qsgd(bits)` | stochastic rounding to `2^b` levels in [min, max] of the leaf (unbiased) | `b n + 64` |
| `rotated(bits)` | `qsgd` of the randomly Hadamard-rotated leaf (Suresh et al. 2017) | `b m + 64` |
| `drive()` | DRIVE (Vargaftik et al. 2021): the signs of the rotated leaf times `‖x‖² / ‖Rx‖₁` | `m + 32` |
| `topk(k)` | the `k` largest magnitudes of the update (values, indices) | `k (w + ⌈log₂ d⌉)` |
| `randk(k)` | `k` coordinates at random (values; indices from the shared seed) | `k w` |
| `sign()` | signSGD: `sign(Δ)` (`+1` for 0) | `d` |
| `scaled_sign()` | EF-signSGD's `(‖Δ‖₁ / d) sign(Δ)` | `d + 32` |

(``m``: ``n`` padded to a power of 2; ``qsgd``'s 64 bits are the leaf's min and max; ``topk`` and
``randk`` take ``k`` or a ``fraction`` of the update's size.)

The rotations' and random-k's randomness comes from the key of the edge (in a deployment, a seed
shared by sender and receiver), so it costs no bits.

Example:
  >>> c = qsgd(bits=2)
  >>> x = {"w": jnp.arange(6.0)}
  >>> int(c.bits(x))   # 2 bits for each of 6 coordinates, plus the leaf's min and max
  76
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from fedtree.core.checks import is_traced
from fedtree.core.updates import ClientTransform, DownTransform, NodeTransform

PyTree = Any

LOSSLESS_DOWN = ("none", "fp16", "bf16", "qsgd", "rotated", "drive")
"""The compressors that make sense on a model sent down (not sparsifiers or signs of a model)."""


class Compressor(NamedTuple):
  """A lossy encoding of a pytree, simulated.

  Attributes:
    apply: ``apply(tree, key) -> tree`` what the receiver decodes (same shapes and dtypes).
    bits: ``bits(tree) -> float32[]`` the size of the encoding in bits (from the shapes).
    name: names it in statistics and errors.
  """

  apply: Callable[[PyTree, jax.Array], PyTree]
  bits: Callable[[PyTree], jax.Array]
  name: str


def _dtype_bits(x) -> int:
  return jnp.dtype(x.dtype).itemsize * 8


def _total(tree, per_leaf) -> jax.Array:
  return sum((jnp.asarray(per_leaf(x), jnp.float32) for x in jax.tree.leaves(tree)),
             jnp.zeros((), jnp.float32))


def _leafwise(fn, tree, key):
  leaves, treedef = jax.tree.flatten(tree)
  return jax.tree.unflatten(treedef, [fn(x, jax.random.fold_in(key, i)) for i, x in enumerate(leaves)])


def _pow2(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


# ------------------------------------------------------------------------ leaf codecs
def stochastic_quantize(x: jax.Array, key: jax.Array, bits) -> jax.Array:
  """``x`` rounded at random to one of ``2^bits`` evenly spaced levels between its min and max,
  up or down with the probabilities that make it unbiased (each coordinate's variance is at most
  ``Δ²/4``, ``Δ = (max - min) / (2^bits - 1)``)."""
  lo, hi = jnp.min(x), jnp.max(x)
  levels = jnp.exp2(jnp.asarray(bits, jnp.float32)) - 1
  step = (hi - lo) / levels
  safe = jnp.where(step > 0, step, 1)
  pos = (x - lo) / safe
  low = jnp.floor(pos)
  up = jax.random.uniform(key, x.shape, jnp.float32) < (pos - low)
  q = lo + (low + up) * safe
  return jnp.where(step > 0, q, x).astype(x.dtype)


def hadamard(v: jax.Array) -> jax.Array:
  """The orthonormal Walsh-Hadamard transform of ``v [m]`` (``m`` a power of 2; its own inverse)."""
  m = v.shape[0]
  h = 1
  while h < m:
    v = v.reshape(-1, 2, h)
    v = jnp.stack([v[:, 0] + v[:, 1], v[:, 0] - v[:, 1]], axis=1).reshape(m)
    h *= 2
  return v / jnp.sqrt(jnp.asarray(m, v.dtype))


def _rotate(x, key):
  """``(R x, inverse)`` for the random rotation ``R = H D`` (``D`` random signs) of the padded leaf."""
  n = x.size
  m = _pow2(n)
  v = jnp.zeros((m,), jnp.float32).at[:n].set(x.reshape(-1).astype(jnp.float32))
  signs = jnp.where(jax.random.bernoulli(key, 0.5, (m,)), 1.0, -1.0)

  def inverse(r):
    return (signs * hadamard(r))[:n].reshape(x.shape).astype(x.dtype)

  return hadamard(signs * v), inverse


def _rotated_quantize(x, key, bits):
  r, inverse = _rotate(x, jax.random.fold_in(key, 0))
  return inverse(stochastic_quantize(r, jax.random.fold_in(key, 1), bits))


def _drive(x, key):
  r, inverse = _rotate(x, key)
  l1 = jnp.sum(jnp.abs(r))
  scale = jnp.where(l1 > 0, jnp.sum(jnp.square(r)) / jnp.where(l1 > 0, l1, 1), 0)
  return inverse(scale * jnp.where(r >= 0, 1.0, -1.0))


def _sign(x):
  return jnp.where(x >= 0, 1, -1).astype(x.dtype)


# ------------------------------------------------------------------------ compressors
MAX_BITS = 31
"""The most bits per coordinate :func:`qsgd` / :func:`rotated` take: 32 and more send no fewer
bits than the float32 values they encode."""


def _check_bits(name: str, bits) -> None:
  if bits is None:
    raise ValueError(f"compressor {name!r} needs bits (an integer >= 1)")
  if is_traced(bits):
    return
  if not (float(bits) >= 1 and float(bits) == int(bits)):
    raise ValueError(f"bits={bits!r} must be an integer >= 1")
  if int(bits) > MAX_BITS:
    raise ValueError(f"bits={bits!r}: {name!r} would send {int(bits)} bits per coordinate, no fewer than a "
                     f"float32 value's 32 (no compression); choose an integer in [1, {MAX_BITS}]")


def _check_count(name: str, k, fraction) -> None:
  if (k is None) == (fraction is None):
    raise ValueError(f"compressor {name!r} needs exactly one of k (coordinates kept) or fraction "
                     f"(got k={k!r}, fraction={fraction!r})")
  for field, v in (("k", k), ("fraction", fraction)):
    if is_traced(v):
      raise ValueError(f"{field} of {name!r} changes the shape of what is sent (k values and "
                       f"indices), so it cannot be a sweep axis: sweep it as separate runs")
  if k is not None and not (int(k) == k and k >= 1):
    raise ValueError(f"k={k!r} must be an integer >= 1")
  if fraction is not None and not 0 < float(fraction) <= 1:
    raise ValueError(f"fraction={fraction!r} must be in (0, 1]")


def identity() -> Compressor:
  """The update as it is (``none``): ``w n`` bits, the plain run's."""
  return Compressor(lambda t, key: t, lambda t: _total(t, lambda x: x.size * _dtype_bits(x)), "none")


def _cast(name: str, dt) -> Compressor:
  return Compressor(lambda t, key: jax.tree.map(lambda x: x.astype(dt).astype(x.dtype), t),
                    lambda t: _total(t, lambda x: 16 * x.size), name)


def fp16() -> Compressor:
  """A cast to float16 and back: 16 bits a coordinate."""
  return _cast("fp16", jnp.float16)


def bf16() -> Compressor:
  """A cast to bfloat16 and back: 16 bits a coordinate."""
  return _cast("bf16", jnp.bfloat16)


def qsgd(bits: int | float) -> Compressor:
  """QSGD: every leaf stochastically rounded to ``2^bits`` levels between its min and max
  (:func:`stochastic_quantize`, unbiased); ``bits n + 64`` bits a leaf.

  Args:
    bits: an integer in ``[1, MAX_BITS]`` (may be a traced sweep value).

  Raises:
    ValueError: ``bits`` not such an integer.
  """
  _check_bits("qsgd", bits)
  return Compressor(lambda t, key: _leafwise(lambda x, kk: stochastic_quantize(x, kk, bits), t, key),
                    lambda t: _total(t, lambda x: jnp.asarray(bits, jnp.float32) * x.size + 64), "qsgd")


def rotated(bits: int | float) -> Compressor:
  """:func:`qsgd` of the randomly Hadamard-rotated leaf (Suresh et al. 2017); ``bits m + 64`` bits
  a leaf (``m``: its size padded to a power of 2).

  Args:
    bits: an integer in ``[1, MAX_BITS]`` (may be a traced sweep value).

  Raises:
    ValueError: ``bits`` not such an integer.
  """
  _check_bits("rotated", bits)
  return Compressor(lambda t, key: _leafwise(lambda x, kk: _rotated_quantize(x, kk, bits), t, key),
                    lambda t: _total(t, lambda x: jnp.asarray(bits, jnp.float32) * _pow2(x.size) + 64),
                    "rotated")


def drive() -> Compressor:
  """DRIVE (Vargaftik et al. 2021): the signs of the rotated leaf times ``‖x‖² / ‖Rx‖₁``;
  ``m + 32`` bits a leaf."""
  return Compressor(lambda t, key: _leafwise(_drive, t, key),
                    lambda t: _total(t, lambda x: _pow2(x.size) + 32), "drive")


def sign() -> Compressor:
  """signSGD: ``sign(Δ)`` (``+1`` for 0), one bit a coordinate."""
  return Compressor(lambda t, key: jax.tree.map(_sign, t), lambda t: _total(t, lambda x: x.size), "sign")


def scaled_sign() -> Compressor:
  """EF-signSGD's ``(‖Δ‖₁ / d) sign(Δ)``: ``d + 32`` bits."""
  def scaled(t, key):
    flat, unravel = ravel_pytree(t)
    return unravel(jnp.mean(jnp.abs(flat)) * _sign(flat))
  return Compressor(scaled, lambda t: _total(t, lambda x: x.size) + 32, "scaled_sign")


def _counter(k: int | None, fraction: float | None) -> Callable[[PyTree], int]:
  """``count(tree)``: the coordinates kept of ``tree`` (checked against its size)."""

  def count(t) -> int:
    d = sum(x.size for x in jax.tree.leaves(t))
    if k is not None:
      kk = int(k)
    else:
      assert fraction is not None
      kk = max(1, int(math.floor(float(fraction) * d)))
    if kk > d:
      raise ValueError(f"k={kk} exceeds the update's size ({d} coordinates)")
    return kk

  return count


def _value_bits(t) -> int:
  return _dtype_bits(jax.tree.leaves(t)[0])


def topk(*, k: int | None = None, fraction: float | None = None) -> Compressor:
  """The ``k`` largest magnitudes of the whole update (values and indices):
  ``k (w + ⌈log₂ d⌉)`` bits.

  Args:
    k: coordinates kept (``1 <= k <=`` the update's size, checked when the update is first
      seen), or
    fraction: ``k`` as a fraction of the update's size (``0 < fraction <= 1``, at least 1 kept).

  Raises:
    ValueError: neither or both of ``k`` and ``fraction``, a bad value, or a traced one (``k``
      is a shape: no sweep axis).
  """
  _check_count("topk", k, fraction)
  count = _counter(k, fraction)

  def apply(t, key):
    flat, unravel = ravel_pytree(t)
    _, idx = jax.lax.top_k(jnp.abs(flat), count(t))
    return unravel(jnp.zeros_like(flat).at[idx].set(flat[idx]))

  def bits(t):
    index_bits = max(1, math.ceil(math.log2(max(2, sum(x.size for x in jax.tree.leaves(t))))))
    return jnp.asarray(count(t) * (_value_bits(t) + index_bits), jnp.float32)

  return Compressor(apply, bits, "topk")


def randk(*, k: int | None = None, fraction: float | None = None) -> Compressor:
  """``k`` coordinates at random (values; the indices follow from the edge's key, shared by
  sender and receiver): ``k w`` bits. ``k`` / ``fraction`` as :func:`topk`'s.

  Raises:
    ValueError: as :func:`topk`.
  """
  _check_count("randk", k, fraction)
  count = _counter(k, fraction)

  def apply(t, key):
    flat, unravel = ravel_pytree(t)
    _, idx = jax.lax.top_k(jax.random.uniform(key, flat.shape), count(t))   # k distinct, uniformly
    return unravel(jnp.zeros_like(flat).at[idx].set(flat[idx]))

  return Compressor(apply, lambda t: jnp.asarray(count(t) * _value_bits(t), jnp.float32), "randk")


# ------------------------------------------------------------------------ edges
class ErrorFeedback(NamedTuple):
  """Error feedback's per-child state.

  Attributes:
    residual: ``[C, ...]`` (the params' tree) what each child has not sent yet.
  """

  residual: PyTree


def uplink(c: Compressor, *, error_feedback: bool = False, name: str = "compression") -> ClientTransform:
  """Every child sends ``c``'s encoding of its update (a client transform); the statistic
  ``uplink_bytes`` is its size in bytes (the round's metric: its mean over the children that
  reported). With ``error_feedback`` each child keeps what it has not sent (:class:`ErrorFeedback`)
  and adds it to its next update."""

  def stats(delta):
    return {"uplink_bytes": c.bits(delta) / 8}

  if not error_feedback:
    def apply(delta, state, key, ctx):
      return c.apply(delta, key), state, stats(delta)
    return ClientTransform(apply, None, name=name)

  def init(params, num):
    return ErrorFeedback(jax.tree.map(lambda p: jnp.zeros((num,) + p.shape, p.dtype), params))

  def apply_ef(delta, state, key, ctx):
    v = jax.tree.map(jnp.add, delta, state.residual)
    sent = c.apply(v, key)
    return sent, ErrorFeedback(jax.tree.map(jnp.subtract, v, sent)), stats(delta)

  return ClientTransform(apply_ef, init, name=name)


def downlink(c: Compressor, *, name: str = "compression") -> DownTransform:
  """Every parent sends ``c``'s encoding of its model to its children (a downlink transform,
  parents' keys ``fold_in(key, parent)``); the statistic ``bytes`` (``downlink_bytes`` in the
  metrics) is the size of one parent's message in bytes."""
  if c.name not in LOSSLESS_DOWN:
    raise ValueError(f"compressor {c.name!r} cannot compress a model sent down (it sparsifies or "
                     f"takes signs of an update); choose one of {list(LOSSLESS_DOWN)}")

  def apply(params, key):
    num = jax.tree.leaves(params)[0].shape[0]
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(num))
    sent = jax.vmap(c.apply)(params, keys)
    one = jax.tree.map(lambda p: p[0], params)
    return sent, {"bytes": jnp.broadcast_to(c.bits(one) / 8, (num,))}

  return DownTransform(apply, name=name)


def majority_vote(*, step: float, name: str = "majority_vote") -> NodeTransform:
  """signSGD's majority vote at a parent (Bernstein et al. 2018): the parent's pseudo-gradient is
  ``step * sign(Σ_i w_i sign(Δ_i))``, the weighted vote of its children's signs.

  It is a node transform, not a blockwise aggregator: the vote is the sign of the (streamed)
  weighted sum of the signs the children sent, so it needs no parent's whole cohort in memory
  and runs wherever node transforms do.

  Raises:
    ValueError: ``step`` not a finite number > 0 (a traced one is the sweep's to check).
  """
  if not is_traced(step):
    ok = isinstance(step, (int, float, np.integer, np.floating)) and not isinstance(step, bool)
    if not (ok and math.isfinite(float(step)) and float(step) > 0):
      raise ValueError(f"vote={step!r}: the majority vote's step must be a number > 0 (the parent moves "
                       f"step * sign of the vote in every coordinate)")

  def apply(delta_sum, weight_sum, client_stats, state, key):
    shape = lambda d: weight_sum.reshape(weight_sum.shape + (1,) * (d.ndim - 1))  # noqa: E731
    voted = jax.tree.map(lambda d: (step * jnp.sign(d) * shape(d)).astype(d.dtype), delta_sum)
    return voted, weight_sum, state, {}

  return NodeTransform(apply, None, name=name)
