"""Weighted aggregation of stacked children into their parents with ``segment_sum``.

Children are rows of stacked pytrees ``[K, ...]`` with a parent index each; every parent's
weighted mean (and so its pseudo-gradient) comes out of one ``jax.ops.segment_sum``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedtree.core.checks import is_traced

PyTree = Any


def _bcast(w: jax.Array, x: jax.Array) -> jax.Array:
  return w.reshape(w.shape + (1,) * (x.ndim - w.ndim))


def weighted_segment_sum(
  values: PyTree, weights: jax.Array, segment_ids: jax.Array, num_segments: int
) -> PyTree:
  """``out[s] = Σ_{i: segment_ids[i] = s} weights[i] · values[i]`` for every leaf."""
  return jax.tree.map(
    lambda v: jax.ops.segment_sum(
      _bcast(weights, v).astype(v.dtype) * v, segment_ids, num_segments=num_segments
    ),
    values,
  )


def weighted_mean(
  values: PyTree, weights: jax.Array, segment_ids: jax.Array, num_segments: int
) -> tuple[PyTree, jax.Array]:
  """Weighted mean of the rows of every segment, and the total weight per segment.

  A segment with zero total weight (no child reported) gets a zero mean; callers use the
  returned weight to leave such a parent unchanged.
  """
  total = jax.ops.segment_sum(weights, segment_ids, num_segments=num_segments)
  sums = weighted_segment_sum(values, weights, segment_ids, num_segments)
  return divide_by_weight(sums, total), total


def divide_by_weight(sums: PyTree, total: jax.Array) -> PyTree:
  """``sums[s] / total[s]`` per leaf, 0 where ``total[s] == 0``."""
  safe = jnp.where(total > 0, total, 1.0)
  return jax.tree.map(lambda s: s / _bcast(safe, s).astype(s.dtype), sums)


def pseudo_gradient_from_children(
  parent_params: PyTree, child_params: PyTree, weights: jax.Array, parent_of_child: jax.Array
) -> tuple[PyTree, jax.Array]:
  """``Δ_n = Θ_n - Σ_i p_i θ_i`` for every parent ``n`` (``p_i ∝ weights`` among its children).

  Returns ``(Δ [N, ...], total weight [N])``.
  """
  num = jax.tree.leaves(parent_params)[0].shape[0]
  anchor = jax.tree.map(lambda p: p[parent_of_child], parent_params)
  diffs = jax.tree.map(jnp.subtract, anchor, child_params)
  return weighted_mean(diffs, weights, parent_of_child, num)


def staleness_weight(staleness: jax.Array, exponent: float) -> jax.Array:
  """``(1 + s)^-a`` (FedBuff's polynomial staleness discount); 1 for ``a = 0``."""
  if not is_traced(exponent) and exponent == 0:
    return jnp.ones(staleness.shape, jnp.float32)
  return jnp.power(1.0 + jnp.maximum(staleness, 0).astype(jnp.float32),
                   -jnp.asarray(exponent, jnp.float32))
