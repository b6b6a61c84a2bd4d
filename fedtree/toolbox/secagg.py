"""Secure aggregation (SecAgg, SecAgg+) as array programs on the update path: every client's update
clipped and encoded into a ``b``-bit field, summed modulo ``2^b`` per parent (overflow wraps, as
it does in the protocol), decoded; dropouts recovered if enough of a parent's cohort survives; the
protocol's bytes; and the clients' half of distributed differential privacy.

The masks of SecAgg cancel in the sum, so the simulation does not draw them: a parent receives
exactly ``Σ_i encode(Δ_i) mod 2^b`` over its surviving children, the one thing the protocol
reveals (``tests/reference_secagg.py`` runs the masked protocol client by client, Shamir shares
included, and gets the same sum). What the simulation models is what changes the result:

* **encoding** (:func:`fixed_point`): each coordinate of ``w Δ`` (``w`` the child's aggregation
  weight, 1 under uniform weighting; TFF's weighted secure mean) clipped to ``[-r, r]`` and rounded
  (stochastically or to the nearest) onto the grid ``γ = r / (2^(q-1) - 1)``: a signed ``q``-bit
  integer, its two's complement taken modulo ``2^b`` (Flower's SecAgg+ defaults: ``r = 8``,
  ``2^22`` levels, ``b = 32``);
* **the modular sum** (:func:`secure_sum`, an :class:`~fedtree.core.updates.Aggregator` with its own
  streamed accumulator): ``uint32`` additions masked to ``b`` bits, chunk by chunk, per parent
  (``segment_sum``); decoded by reading the sum as a signed integer in ``[-2^(b-1), 2^(b-1))``
  times ``γ``. A sum outside that range wraps to the other end: the statistic ``secagg_overflow``
  is the fraction of coordinates that wrapped (the simulator knows the true sum; a server does not);
* **dropout recovery** (:func:`recovery`, a node transform): a child that does not report (the
  systems capability's dropouts, deadlines, unavailability) is a dropout after masking; the
  parent's round succeeds only if at least ``t = ⌈threshold · n⌉`` of its cohort of ``n``
  survive and, under SecAgg+ (``neighbours = k``: every client shares its keys with its ``k``
  neighbours on a random Harary ring, Bell et al. 2020), every client of the cohort keeps at least
  ``⌈threshold · (k + 1)⌉`` of its shareholders (itself and its neighbours) alive. Otherwise its
  round fails there: its aggregate is empty (weight 0, the node does not update) and
  ``secagg_failed`` (the fraction of parents) says so. SecAgg is SecAgg+ on the complete graph;
* **bytes** (:func:`exchange_bytes`): a client sends its masked vector (``⌈b d / 8⌉`` bytes) and
  the protocol's keys and shares (two public keys, an encrypted pair of shares to each of its
  ``k`` neighbours, a share of each neighbour at unmasking) and receives its neighbours' keys
  and shares: ``O(n + d)`` per client for SecAgg (``k = n - 1``: quadratic in the cohort in
  all), ``O(log n + d)`` for SecAgg+; the client transform reports ``uplink_bytes`` (replacing a
  compressor's: what travels is the field vector) and :func:`with_exchange` adds the download to
  the downlink's ``bytes``; ``secagg_client_ops`` counts the field elements a client's masks and
  shares take to compute;
* **distributed DP** (:func:`distributed`): the discrete Gaussian or Skellam mechanism's client
  side (:mod:`fedtree.toolbox.distributed_dp`): L2 clipping, scaling by ``1/γ``, the randomized
  Hadamard rotation (random signs from the parent's key of the round, shared by its children and
  itself), conditional randomized rounding, integer noise (:mod:`fedtree.toolbox.discrete_noise`),
  modular clipping; the parent decodes and rotates back.

Composition: the encoding is the last client transform (a compressor's decoded output is encoded:
compression before encoding), and the secure sum replaces the level's aggregator: a robust
(blockwise) aggregator, or anything that reads individual updates, cannot run on what SecAgg
reveals (:func:`check_aggregator` refuses it by name).

Example:
  Two clients' values summed in an 8-bit field on the grid 1: 127 is the largest sum it holds, and
  one more wraps to -128:

  >>> import jax, jax.numpy as jnp
  >>> enc = fixed_point(bits=8, clip_range=127.0, quant_bits=8, rounding="deterministic")
  >>> sent = jnp.stack([enc.encode(jnp.asarray(v), jax.random.key(0), None, 0)[0]
  ...                   for v in ([100.0, 100.0], [27.0, 28.0])])
  >>> total = field_sum(sent, jnp.zeros(2, jnp.int32), 1, bits=8)
  >>> enc.decode(total[0], None, 0, 2).tolist()
  [127.0, -128.0]

References:
  Bonawitz et al., "Practical secure aggregation for privacy-preserving machine learning", CCS 2017.
  Bell, Bonawitz, Gascón, Lepoint, Raykova, "Secure single-server aggregation with (poly)logarithmic
  overhead", CCS 2020.
  Kairouz, Liu, Steinke, ICML 2021; Agarwal, Kairouz, Liu, NeurIPS 2021 (distributed DP).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from fedtree.core.updates import Accumulator, Aggregator, Chunk, ClientTransform, DownTransform, NodeTransform
from fedtree.toolbox.compression import hadamard
from fedtree.toolbox.discrete_noise import discrete_gaussian, skellam
from fedtree.toolbox.distributed_dp import Mechanism

PyTree = Any

MAX_BITS = 32
"""The widest field simulated: ``uint32`` arithmetic, whose wrap-around modulo ``2^32`` masked to
``b`` bits is exactly a ``b``-bit field's."""

ROUNDINGS = ("stochastic", "deterministic")

MAX_QUANT_BITS = 24
"""The most bits a client's coordinate is encoded on: a float32 update carries 24 (its mantissa)."""

KEY_BYTES = 32
"""A public key (X25519)."""
SHARE_BYTES = 16
"""A Shamir share of a 128-bit secret."""
ID_BYTES = 4
"""A client's index in a message."""
AEAD_BYTES = 28
"""An authenticated encryption's overhead (AES-GCM: 12-byte nonce, 16-byte tag)."""

MAX_ROUNDING_TRIES = 64
"""Conditional rounding's tries before a client sends zeros instead (probability ``β^64``)."""

NAME = "secure"


# ------------------------------------------------------------------------ the field
def _check_bits(bits) -> int:
  if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 1 <= int(bits) <= MAX_BITS:
    raise ValueError(f"bits={bits!r} must be an integer in [1, {MAX_BITS}] (the field is the integers "
                     f"modulo 2^bits, simulated in uint32)")
  return int(bits)


def field_mask(bits: int) -> jax.Array:
  """``2^bits - 1`` as ``uint32``: ``x & mask`` is ``x mod 2^bits``."""
  return jnp.uint32((1 << _check_bits(bits)) - 1)


def to_field(x: jax.Array, bits: int) -> jax.Array:
  """``int32`` values to the field: their two's complement modulo ``2^bits`` (``uint32``)."""
  return jax.lax.bitcast_convert_type(x.astype(jnp.int32), jnp.uint32) & field_mask(bits)


def field_add(a: jax.Array, b: jax.Array, bits: int) -> jax.Array:
  """``(a + b) mod 2^bits`` of field elements (``uint32``)."""
  return (a + b) & field_mask(bits)


def field_sum(values: jax.Array, segment: jax.Array, num_segments: int, bits: int) -> jax.Array:
  """``Σ values mod 2^bits`` per segment (``values: uint32[K, ...]``): ``segment_sum`` wraps modulo
  ``2^32``, and ``2^bits`` divides ``2^32``."""
  return jax.ops.segment_sum(values, segment, num_segments=num_segments) & field_mask(bits)


def centered(u: jax.Array, bits: int) -> jax.Array:
  """Field elements read as signed integers in ``[-2^(bits-1), 2^(bits-1))`` (``int32``)."""
  shift = jnp.uint32(32 - _check_bits(bits))   # sign-extend the b-bit value: up to the top bit and back
  top = jax.lax.bitcast_convert_type(jax.lax.shift_left(u.astype(jnp.uint32), shift), jnp.int32)
  return jax.lax.shift_right_arithmetic(top, shift.astype(jnp.int32))


# ------------------------------------------------------------------------ encodings
class Encoding(NamedTuple):
  """How a child's update becomes a vector of the field and a parent's modular sum its aggregate.

  Attributes:
    encode: ``encode(value [d], key, rotation key, parent) -> (uint32 [length(d)], stats)``.
    decode: ``decode(sum uint32 [length(d)], rotation key, parent, d) -> float32 [d]``.
    length: ``length(d) -> int``, the field vector's length for an update of ``d`` coordinates.
    bits: ``b``.
    name: names it in statistics and errors.
  """

  encode: Callable[..., tuple[jax.Array, dict]]
  decode: Callable[..., jax.Array]
  length: Callable[[int], int]
  bits: int
  name: str


def check_fixed_point(bits, clip_range, quant_bits, rounding) -> None:
  """Named errors for a fixed-point encoding's bad values (:func:`fixed_point`)."""
  b = _check_bits(bits)
  r = clip_range
  if isinstance(r, bool) or not isinstance(r, (int, float, np.floating, np.integer)) or not (
      math.isfinite(float(r)) and float(r) > 0):
    raise ValueError(f"clip_range={clip_range!r} must be a finite number > 0 (every coordinate is clipped "
                     f"to [-clip_range, clip_range])")
  top = min(b, MAX_QUANT_BITS)
  q = quant_bits
  if isinstance(q, bool) or not isinstance(q, (int, np.integer)) or not 2 <= int(q) <= top:
    raise ValueError(f"quant_bits={quant_bits!r} must be an integer in [2, {top}] (a client's coordinate is "
                     f"a signed quant_bits-bit integer of the {b}-bit field, and a float32 update carries "
                     f"{MAX_QUANT_BITS} bits)")
  if rounding not in ROUNDINGS:
    raise ValueError(f"rounding={rounding!r}; choose one of {list(ROUNDINGS)}")


def step(clip_range: float, quant_bits: int) -> float:
  """``γ = r / (2^(q-1) - 1)``: the grid of a fixed-point encoding of ``[-r, r]`` on ``q`` signed bits."""
  return float(clip_range) / float((1 << (int(quant_bits) - 1)) - 1)


def fixed_point(*, bits: int = 32, clip_range: float = 8.0, quant_bits: int = 22,
                rounding: str = "stochastic") -> Encoding:
  """SecAgg's fixed-point encoding: every coordinate clipped to ``[-r, r]``, rounded onto the grid
  :func:`step` (``stochastic``: up with the probability of the remainder, unbiased;
  ``deterministic``: to the nearest), a signed ``q``-bit integer taken modulo ``2^b``. A parent's
  sum decodes exactly to the sum of its children's rounded values while it stays in
  ``[-2^(b-1), 2^(b-1))`` (so with ``n`` children, never wraps for ``b >= q + ⌈log2 n⌉``).

  Args:
    bits: ``b``, the field (modulus ``2^b``).
    clip_range: ``r``.
    quant_bits: ``q <= b``.
    rounding: ``"stochastic"`` or ``"deterministic"``.

  Statistic: ``secagg_clipped``, the fraction of a client's coordinates clipped.

  Raises:
    ValueError: a bad value, named.
  """
  check_fixed_point(bits, clip_range, quant_bits, rounding)
  gamma = step(clip_range, quant_bits)
  r = float(clip_range)

  def encode(value, key, rotation, parent):
    x = jnp.clip(value, -r, r)
    s = x.astype(jnp.float32) / jnp.float32(gamma)
    if rounding == "stochastic":
      s = jnp.floor(s + jax.random.uniform(key, s.shape))
    else:
      s = jnp.round(s)
    return to_field(s.astype(jnp.int32), bits), {
      "secagg_clipped": jnp.mean((jnp.abs(value) > r).astype(jnp.float32))}

  def decode(total, rotation, parent, d):
    return centered(total, bits).astype(jnp.float32) * jnp.float32(gamma)

  return Encoding(encode, decode, lambda d: int(d), int(bits), "fixed_point")


def _pow2(n: int) -> int:
  return 1 << max(0, (int(n) - 1).bit_length())


def rotate(x: jax.Array, key: jax.Array) -> jax.Array:
  """The randomized Hadamard rotation ``H D x`` of ``x [d]`` zero-padded to ``m`` (a power of 2):
  ``D`` random signs from ``key``, ``H`` the orthonormal Walsh-Hadamard transform."""
  m = _pow2(x.shape[0])
  v = jnp.zeros((m,), jnp.float32).at[: x.shape[0]].set(x.astype(jnp.float32))
  return hadamard(jax.random.rademacher(key, (m,), jnp.float32) * v)


def unrotate(y: jax.Array, key: jax.Array, d: int) -> jax.Array:
  """The inverse of :func:`rotate` (``D H y``), cut to the first ``d`` coordinates."""
  return (jax.random.rademacher(key, y.shape, jnp.float32) * hadamard(y.astype(jnp.float32)))[:d]


def conditional_round(y: jax.Array, key: jax.Array, bound_sq, max_tries: int = MAX_ROUNDING_TRIES):
  """Randomized rounding of ``y`` to the integers (up with the probability of the remainder),
  drawn again until ``‖z‖₂² <= bound_sq`` (Kairouz et al. 2021, Algorithm 1). Returns ``(z int32,
  tries, ok)``: after ``max_tries`` failures ``z`` is zero and ``ok`` false (the client sends
  nothing of its update; its noise still goes in)."""
  y = jnp.clip(y, -2.0 ** 30, 2.0 ** 30)
  low = jnp.floor(y)

  def body(carry):
    z, i, ok = carry
    cand = low + (jax.random.uniform(jax.random.fold_in(key, i), y.shape) < (y - low))
    good = jnp.sum(cand * cand) <= bound_sq
    return cand, i + 1, good

  z, tries, ok = jax.lax.while_loop(lambda c: (~c[2]) & (c[1] < max_tries), body,
                                    (jnp.zeros_like(y), jnp.zeros((), jnp.int32), jnp.zeros((), bool)))
  return jnp.where(ok, z, 0.0).astype(jnp.int32), tries, ok


@dataclasses.dataclass(frozen=True)
class Distributed:
  """The per-parent numbers of a distributed mechanism (host arrays ``[P]``, one entry per parent
  of the level; :func:`distributed` builds it from :class:`~fedtree.toolbox.distributed_dp.Mechanism`).

  Attributes:
    name: ``"ddg"`` or ``"skellam"``.
    bits: ``b``.
    clip: ``[P]`` L2 clip norms.
    gamma: ``[P]`` granularities.
    noise: ``[P]`` each client's noise parameter (scaled): ``σ_i`` or ``μ_i``.
    bound_sq: ``[P]`` ``Δ₂²`` (slightly reduced: the float32 norm check never passes above it).
  """

  name: str
  bits: int
  clip: np.ndarray
  gamma: np.ndarray
  noise: np.ndarray
  bound_sq: np.ndarray


def distributed(mechanisms) -> Encoding:
  """The client side of a distributed mechanism (see the module docstring), one
  :class:`~fedtree.toolbox.distributed_dp.Mechanism` per parent of the level (``[P]``, all of the
  same name and bits). Statistics: ``secagg_clipped`` (1 where the L2 clip bit) and
  ``secagg_rounding_tries``, and ``secagg_rounding_failed`` (1 where a client sent zeros)."""
  ms: list[Mechanism] = list(mechanisms)
  names, bits = {m.name for m in ms}, {m.bits for m in ms}
  if len(names) != 1 or len(bits) != 1:
    raise ValueError(f"one mechanism and one field per level (got {sorted(names)}, bits {sorted(bits)})")
  p = Distributed(ms[0].name, ms[0].bits, np.asarray([m.clip for m in ms], np.float32),
                  np.asarray([m.gamma for m in ms], np.float32), np.asarray([m.client_noise for m in ms]),
                  np.asarray([m.l2 * m.l2 * (1 - 1e-5) for m in ms], np.float32))
  clip, gamma, bound = (jnp.asarray(a) for a in (p.clip, p.gamma, p.bound_sq))
  skellam_mu = [float(v) for v in p.noise] if p.name == "skellam" else None
  sigma = jnp.asarray(p.noise, jnp.float32)

  def noise(key, parent, shape):
    if skellam_mu is None:
      return discrete_gaussian(key, sigma[parent], shape)
    if len(set(skellam_mu)) == 1:   # (a Python number: the sampler's branch is static)
      return skellam(key, skellam_mu[0], shape)
    branches = [lambda k, mu=mu: skellam(k, mu, shape) for mu in skellam_mu]
    return jax.lax.switch(parent, branches, key)

  def encode(value, key, rotation, parent):
    c, g = clip[parent], gamma[parent]
    norm = jnp.sqrt(jnp.sum(jnp.square(value.astype(jnp.float32))))
    scale = jnp.where(norm > c, c / jnp.where(norm > 0, norm, 1.0), 1.0)
    y = rotate(value * scale, rotation) / g
    z, tries, ok = conditional_round(y, jax.random.fold_in(key, 0), bound[parent])
    noisy = z + noise(jax.random.fold_in(key, 1), parent, z.shape)   # int32: wraps modulo 2^32
    return to_field(noisy, p.bits), {"secagg_clipped": (norm > c).astype(jnp.float32),
                                     "secagg_rounding_tries": tries.astype(jnp.float32),
                                     "secagg_rounding_failed": (~ok).astype(jnp.float32)}

  def decode(total, rotation, parent, d):
    return unrotate(centered(total, p.bits).astype(jnp.float32) * gamma[parent], rotation, d)

  return Encoding(encode, decode, _pow2, p.bits, p.name)


# ------------------------------------------------------------------------ costs
def exchange_bytes(cohort, neighbours: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """``(up, down)``: bytes a client of a cohort of ``n`` sends and receives for the protocol's keys
  and shares, beside its masked vector (semi-honest SecAgg, Bonawitz et al. 2017, rounds 0, 1 and 4;
  SecAgg+, Bell et al. 2020, with ``neighbours = k``):

  * up: its two public keys, to each of its ``k`` neighbours an encrypted pair of shares (of its
    mask key and of its self-mask seed, with both ids), and at unmasking one share of each
    neighbour: ``2 K + k (2 S + 2 I + A) + k S``;
  * down: its neighbours' keys (with their ids), their encrypted shares to it, and the list of who
    survived: ``k (2 K + I) + k (2 S + 2 I + A) + k I``,

  with ``K``, ``S``, ``I``, ``A`` = :data:`KEY_BYTES`, :data:`SHARE_BYTES`, :data:`ID_BYTES`,
  :data:`AEAD_BYTES` and ``k = n - 1`` for SecAgg (``min(neighbours, n - 1)`` for SecAgg+).
  ``cohort``: a number or an array; the result has its shape."""
  n = np.asarray(cohort, np.float64)
  k = np.maximum(n - 1, 0) if neighbours is None else np.minimum(float(neighbours), np.maximum(n - 1, 0))
  share_msg = 2 * SHARE_BYTES + 2 * ID_BYTES + AEAD_BYTES
  up = 2 * KEY_BYTES + k * share_msg + k * SHARE_BYTES
  down = k * (2 * KEY_BYTES + ID_BYTES) + k * share_msg + k * ID_BYTES
  return np.where(n > 0, up, 0.0), np.where(n > 0, down, 0.0)


def masked_bytes(bits: int, length: int) -> float:
  """``⌈b · length / 8⌉``: the masked vector's bytes, packed."""
  return float(math.ceil(int(bits) * int(length) / 8))


def client_ops(cohort, length: int, neighbours: int | None = None, threshold: float = 0.5) -> np.ndarray:
  """Field elements a client computes per round: a mask of ``length`` elements for each of its
  ``k`` neighbours and its own, and ``k`` shares of each of its two secrets, each a polynomial
  of degree ``t - 1`` evaluated (``(k + 1) length + 2 k t``; the key agreements not counted)."""
  n = np.asarray(cohort, np.float64)
  k = np.maximum(n - 1, 0) if neighbours is None else np.minimum(float(neighbours), np.maximum(n - 1, 0))
  t = np.ceil(float(threshold) * (k + 1))
  return np.where(n > 0, (k + 1) * int(length) + 2 * k * t, 0.0)


# ------------------------------------------------------------------------ the stages
class Recovery(NamedTuple):
  """The per-parent state of a secure level.

  Attributes:
    rotation: ``uint32[P, 2]`` the key data of every parent's round key (its children's rotation),
      drawn afresh every round.
  """

  rotation: jax.Array


def _rotation_key(data: jax.Array) -> jax.Array:
  return jax.random.wrap_key_data(data)


def _node_row(node_state, name: str) -> Recovery:
  """The secure level's state within what a stage receives (its own, or ``{name: state}``)."""
  if isinstance(node_state, Recovery):
    return node_state
  return node_state[name]


def client(encoding: Encoding, *, exchange_up=0.0, masks=0.0, share_ops=0.0,
           name: str = NAME) -> ClientTransform:
  """Every child encodes ``w Δ`` (its weight times its update, flattened) into the field with
  ``encoding``, using its parent's rotation key (the node state of :func:`recovery` named
  ``name``).

  Args:
    encoding: :func:`fixed_point` or :func:`distributed`.
    exchange_up: bytes a child sends for the protocol's keys and shares (one number, or ``[P]``
      per parent: :func:`exchange_bytes`).
    masks: masks a child expands (its neighbours' and its own; a number or ``[P]``).
    share_ops: field elements its shares take (a number or ``[P]``).
    name: the transform's name and the recovery state's key.

  Statistics: the encoding's, ``uplink_bytes`` (the masked vector, :func:`masked_bytes`, and
  ``exchange_up``; it replaces a compressor's) and ``secagg_client_ops`` (``masks`` times the
  vector's length, and ``share_ops``: :func:`client_ops`).
  """
  def per_parent(v):
    a = np.asarray(v, np.float32)
    return jnp.asarray(a.reshape(-1) if a.ndim else a.reshape(1))

  up, mask_count, shares = per_parent(exchange_up), per_parent(masks), per_parent(share_ops)

  def row(a, parent):
    return a[parent] if a.shape[0] > 1 else a[0]

  def apply(delta, state, key, ctx):
    flat, _ = ravel_pytree(delta)
    value = flat.astype(jnp.float32) * ctx.weight.astype(jnp.float32)
    rotation = _rotation_key(_node_row(ctx.node_state, name).rotation)
    sent, stats = encoding.encode(value, key, rotation, ctx.parent)
    length = encoding.length(flat.shape[0])
    return sent, state, {**stats, "uplink_bytes": masked_bytes(encoding.bits, length) + row(up, ctx.parent),
                         "secagg_client_ops": row(mask_count, ctx.parent) * length + row(shares, ctx.parent)}

  return ClientTransform(apply, name=name, replaces=("uplink_bytes",))


def _register(cls):
  return jax.tree_util.register_dataclass(cls, data_fields=["sums", "weights", "signed"],
                                          meta_fields=["layout"])


@_register
@dataclasses.dataclass(frozen=True)
class SumState:
  """The secure sum's accumulator.

  Attributes:
    sums: ``uint32[D, P, n]`` the parents' modular sums (one row per device; summed in ``finish``).
    weights: ``[D, P]`` the sums of the children's weights.
    signed: ``float32[D, P, n]`` the sums of the children's field vectors read as signed integers:
      what the sum would be without wrapping (for ``secagg_overflow`` only).
    layout: (static) the update's tree structure, leaf shapes and dtypes, to decode into.
  """

  sums: jax.Array
  weights: jax.Array
  signed: jax.Array
  layout: tuple


def secure_sum(encoding: Encoding, *, name: str = NAME) -> Aggregator:
  """The parents' modular sums of their children's field vectors (a streamed
  :class:`~fedtree.core.updates.Aggregator`, chunk by chunk like the weighted mean, sharded rows
  summed once), decoded with the parent's rotation key: ``delta_sum [P, ...]`` as the model's
  tree, ``weight_sum`` the children's weights. Statistic ``secagg_overflow``: the fraction of the
  coordinates of a parent's sum that wrapped around the field."""
  bits = encoding.bits
  half = float(2 ** (bits - 1))

  def accumulate(devices: int = 1, constrain=None) -> Accumulator:
    keep = (lambda t: t) if constrain is None or devices == 1 else constrain

    def rows(a):
      return a.reshape((devices, a.shape[0] // devices) + a.shape[1:])

    def init(template, num_parents, dtype):
      leaves, treedef = jax.tree.flatten(template)
      shapes = tuple(tuple(x.shape[1:]) for x in leaves)
      d = int(sum(int(np.prod(s, dtype=np.int64)) for s in shapes))
      n = encoding.length(d)
      layout = (treedef, shapes, tuple(jnp.dtype(x.dtype) for x in leaves))
      return keep(SumState(jnp.zeros((devices, num_parents, n), jnp.uint32),
                           jnp.zeros((devices, num_parents), dtype),
                           jnp.zeros((devices, num_parents, n), jnp.float32), layout))

    def add(state: SumState, ch: Chunk):
      num = state.weights.shape[1]
      u = jnp.where(ch.kept[:, None], ch.deltas, jnp.uint32(0))
      w = jnp.where(ch.kept, ch.weights, 0).astype(state.weights.dtype)
      seg = jax.vmap(lambda v, i: jax.ops.segment_sum(v, i, num_segments=num))
      parent = rows(ch.parent)
      sums = (state.sums + seg(rows(u), parent)) & field_mask(bits)
      signed = state.signed + seg(rows(centered(u, bits).astype(jnp.float32)), parent)
      return keep(dataclasses.replace(state, sums=sums, weights=state.weights + seg(rows(w), parent),
                                      signed=signed))

    def finish(state: SumState, key, node_state):
      total = jnp.sum(state.sums, axis=0) & field_mask(bits)   # (uint32: wraps modulo 2^32)
      signed = jnp.sum(state.signed, axis=0)
      treedef, shapes, dtypes = state.layout
      d = int(sum(int(np.prod(s, dtype=np.int64)) for s in shapes))
      keys = jax.vmap(_rotation_key)(_node_row(node_state, name).rotation)
      num = total.shape[0]
      flat = jax.vmap(lambda t, k, p: encoding.decode(t, k, p, d))(total, keys, jnp.arange(num))
      leaves, start = [], 0
      for shape, dtype in zip(shapes, dtypes, strict=True):
        size = int(np.prod(shape, dtype=np.int64))
        leaves.append(flat[:, start:start + size].reshape((num,) + shape).astype(dtype))
        start += size
      wrapped = jnp.mean(((signed >= half) | (signed < -half)).astype(jnp.float32), axis=1)
      return jax.tree.unflatten(treedef, leaves), jnp.sum(state.weights, axis=0), {"secagg_overflow": wrapped}

    return Accumulator(init, add, finish)

  return Aggregator(name=f"{name}_sum[{encoding.name}, {bits} bits]", accumulate=accumulate)


def check_aggregator(aggregator: Aggregator, *, what: str = "secure aggregation") -> None:
  """Refuses, by name, an aggregator that cannot run on a secure sum: one that needs every update
  of a parent's cohort (a robust aggregator, an omniscient attack's rewrite of the cohort) or
  another streamed aggregator of its own."""
  if aggregator.blockwise:
    raise ValueError(f"{what} cannot compose with aggregator {aggregator.name!r}: it reads every update of a "
                     f"parent's cohort (a robust aggregator or an omniscient attack), and secure aggregation "
                     f"reveals only their sum")
  if not aggregator.is_mean:
    raise ValueError(f"{what} cannot compose with aggregator {aggregator.name!r}: a level aggregates one way")


def shareholders_alive(alive: jax.Array, cohort, neighbours: int) -> jax.Array:
  """``int32[P, W]``: for every client of a cohort sitting at place ``j`` of a ring of ``cohort[p]``
  places (``alive: bool[P, W]``, ``W >= max(cohort)``), how many of its shareholders are alive:
  itself and its ``neighbours`` (``neighbours / 2`` on each side; SecAgg+'s Harary graph)."""
  alive = alive.astype(jnp.int32)
  width = alive.shape[1]
  j = jnp.arange(width)[None, :]
  n = jnp.asarray(np.maximum(np.asarray(cohort, np.int64), 1), jnp.int32)[:, None]
  count = alive
  for o in range(1, neighbours // 2 + 1):
    for side in (o, -o):
      count = count + jnp.take_along_axis(alive, jnp.mod(j + side, n), axis=1)
  return count


def harary_failures(key: jax.Array, survivors: jax.Array, cohort: np.ndarray, neighbours: int,
                    need: np.ndarray) -> jax.Array:
  """``bool[P]``: whether some client of a parent's cohort keeps fewer than ``need [P]`` of its
  shareholders alive (:func:`shareholders_alive`) when ``survivors [P]`` of its ``cohort [P]``
  survive and the others dropped at random places of the ring (the clients are placed on it at
  random, so dropouts that do not depend on the place are exchangeable with it)."""
  cohort = np.asarray(cohort, np.int64)
  num, width = cohort.shape[0], max(int(cohort.max(initial=0)), 1)
  valid = jnp.arange(width)[None, :] < jnp.asarray(cohort)[:, None]
  u = jnp.where(valid, jax.random.uniform(key, (num, width)), jnp.inf)
  rank = jnp.argsort(jnp.argsort(u, axis=1), axis=1)
  dropped = rank < (jnp.asarray(cohort)[:, None] - survivors.astype(jnp.int32)[:, None])
  count = shareholders_alive(valid & ~dropped, cohort, neighbours)
  return jnp.any(valid & (count < jnp.asarray(need, jnp.int32)[:, None]), axis=1)


def recovery(*, cohort=None, threshold: float = 0.5, neighbours: int | None = None,
             name: str = NAME) -> NodeTransform:
  """Dropout recovery at every parent, and its rotation key (a node transform).

  Args:
    cohort: ``[P]`` the clients of every parent's cohort (who mask); ``None``: the children that
      report (no dropouts are modelled: Poisson cohorts, the server levels).
    threshold: in (0, 1]: the round at a parent succeeds when at least ``⌈threshold · n⌉`` of its
      cohort of ``n`` survive and, with ``neighbours``, every client of the cohort keeps at least
      ``⌈threshold · (k + 1)⌉`` of its shareholders alive; otherwise its aggregate is empty.
    neighbours: SecAgg+'s ``k`` (even, >= 2); ``None``: SecAgg (every client shares with all).
    name: the state's key (what :func:`client` and :func:`secure_sum` read).

  Statistic: ``secagg_failed`` ``[P]``, 1 where the round failed.

  Raises:
    ValueError: a bad ``threshold`` or ``neighbours``.
  """
  check_protocol(threshold, neighbours)
  need_total = None if cohort is None else np.ceil(float(threshold) * np.asarray(cohort, np.float64))
  graph = None
  if cohort is not None and neighbours is not None:
    sizes = np.asarray(cohort, np.int64)
    sparse = int(neighbours) < sizes - 1   # the ring is the complete graph below k + 2 clients
    if np.any(sparse):
      need = np.where(sparse, np.ceil(float(threshold) * (int(neighbours) + 1)), 0)
      graph = (sizes, int(neighbours), need)

  def init(params, num):
    base = jax.random.key(0)
    return Recovery(jax.vmap(lambda i: jax.random.key_data(jax.random.fold_in(base, i)))(jnp.arange(num)))

  def apply(delta_sum, weight_sum, client_stats, state, key):
    num = weight_sum.shape[0]
    survivors = client_stats["reported"]
    failed = jnp.zeros((num,), bool)
    if need_total is not None:
      failed = survivors < jnp.asarray(need_total, survivors.dtype)
    if graph is not None:
      failed = failed | harary_failures(jax.random.fold_in(key, 0), survivors, graph[0], graph[1], graph[2])
    keep = ~failed
    delta_sum = jax.tree.map(
      lambda a: jnp.where(keep.reshape((num,) + (1,) * (a.ndim - 1)), a, jnp.zeros_like(a)), delta_sum)
    weight_sum = jnp.where(keep, weight_sum, jnp.zeros_like(weight_sum))
    fresh = jax.vmap(lambda i: jax.random.key_data(jax.random.fold_in(jax.random.fold_in(key, 1), i)))(
      jnp.arange(num))
    return delta_sum, weight_sum, Recovery(fresh.astype(state.rotation.dtype)), {
      "secagg_failed": failed.astype(jnp.float32)}

  return NodeTransform(apply, init, name=name)


def check_protocol(threshold, neighbours) -> None:
  """Named errors for a bad ``threshold`` (in (0, 1]) or ``neighbours`` (an even integer >= 2)."""
  if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.floating)) or not (
      0 < float(threshold) <= 1):
    raise ValueError(f"threshold={threshold!r} must be in (0, 1]: the fraction of a parent's cohort (and of "
                     f"a client's shareholders under SecAgg+) that must survive for its sum to be recovered")
  if neighbours is not None and (isinstance(neighbours, bool) or not isinstance(neighbours, (int, np.integer))
                                 or int(neighbours) < 2 or int(neighbours) % 2):
    raise ValueError(f"neighbours={neighbours!r} must be an even integer >= 2 (SecAgg+'s neighbourhood on a "
                     f"Harary ring: k/2 on each side), or None (SecAgg: every client shares with all)")


def with_exchange(down: DownTransform | None, exchange_down, *, name: str = NAME) -> DownTransform:
  """``down`` (``None``: the model sent as it is) with the protocol's download at every parent
  (``exchange_down [P]`` bytes a child receives beside the model) added to the downlink's ``bytes``."""
  extra = np.asarray(exchange_down, np.float32)

  def apply(params, key):
    num = jax.tree.leaves(params)[0].shape[0]
    if down is None:
      sent = params
      size = float(sum(int(np.prod(a.shape[1:], dtype=np.int64)) * jnp.dtype(a.dtype).itemsize
                       for a in jax.tree.leaves(params)))
      stats: Mapping[str, jax.Array] = {"bytes": jnp.full((num,), size, jnp.float32)}
    else:
      sent, stats = down.apply(params, key)
    add = jnp.broadcast_to(jnp.asarray(extra), (num,))
    return sent, {**stats, "bytes": jnp.asarray(stats["bytes"], jnp.float32) + add}

  return DownTransform(apply, name=name if down is None else f"{down.name}+{name}")
