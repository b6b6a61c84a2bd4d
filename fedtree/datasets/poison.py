"""Data poisoning: the malicious clients' training data rewritten once, before the run, and the
backdoor's attack success rate.

The attackers are a fixed set (:func:`fedtree.toolbox.attacks.attackers` without ``redraw``, as a
``bool [C]`` mask): poisoning their stored examples makes every round of any algorithm train on
the poisoned data with no change to local training.

* :func:`flip_labels`: label flipping, by a permutation of the classes or to one target class
  (Fang et al. 2020; Tolpegin et al. 2020);
* :func:`add_backdoor`: a trigger stamped on a fraction of each attacker's examples, relabelled
  to the target class (Gu et al. 2017; Bagdasaryan et al. 2020). A :class:`Trigger` sets some
  features of an example (flat indices) to values: a pixel pattern of an image, or a token at a
  position of a token sequence;
* :func:`attack_success_rate`: the fraction of the benign test examples of another class than
  the target that the model puts in the target class once triggered (:func:`triggered`).

Classifiers only (labels ``[C, M]``); both the padded and the ragged training layouts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.data import FederatedData


class Trigger(NamedTuple):
  """A backdoor trigger: ``features`` (flat indices into one example) set to ``value``.

  Attributes:
    features: ``int`` flat feature indices (e.g. a 3x3 corner of a 28x28 image: rows * 28 + cols;
      or the last token position of a sequence).
    value: one value for all, or one per feature (a pixel intensity, a token id).
  """

  features: Sequence[int]
  value: float | Sequence[float]


def corner_trigger(example_shape: Sequence[int], *, size: int = 3, value: float = 1.0) -> Trigger:
  """A ``size x size`` square in the bottom-right corner of an image ``(H, W[, channels])``
  (every channel), at ``value``."""
  if len(example_shape) < 2:
    raise ValueError(f"corner_trigger: example_shape={tuple(example_shape)!r} is not an image (H, W[, C])")
  grid = np.zeros(tuple(example_shape), bool)
  grid[-size:, -size:] = True
  return Trigger(features=tuple(int(i) for i in np.flatnonzero(grid)), value=value)


def _check(data: FederatedData, mask, what: str) -> np.ndarray:
  mask = np.asarray(mask, bool)
  if mask.shape != (int(np.shape(data.n_train)[0]),):
    raise ValueError(f"{what}: the attackers' mask has shape {mask.shape}; need one entry per client "
                     f"({int(np.shape(data.n_train)[0])})")
  if np.ndim(data.y_train) != (1 if data.train_offset is not None else 2):
    raise ValueError(f"{what}: labels of shape {np.shape(data.y_train)} are not class labels; data "
                     f"poisoning needs a classifier's data")
  return mask


def _rows(data: FederatedData, mask: np.ndarray, fraction: float, seed: int) -> np.ndarray:
  """``bool`` over the stored training rows (``[C, M]`` padded, ``[N]`` ragged): the first
  ``ceil(fraction * n_c)`` of a random order of each attacker's real examples."""
  rng = np.random.default_rng(seed)
  n = np.asarray(data.n_train)
  shape = np.shape(data.y_train)
  out = np.zeros(shape, bool)
  off = None if data.train_offset is None else np.asarray(data.train_offset)
  for c in np.flatnonzero(mask):
    pick = rng.permutation(int(n[c]))[:int(np.ceil(fraction * n[c]))]
    if off is None:
      out[c, pick] = True
    else:
      out[off[c] + pick] = True
  return out


def flip_labels(data: FederatedData, mask, *, permutation: Sequence[int] | None = None,
                target: int | None = None) -> FederatedData:
  """The attackers' training labels ``y`` replaced by ``permutation[y]`` or by ``target``.

  Raises:
    ValueError: both or neither of ``permutation`` and ``target``; a permutation that is not one
      of ``range(num_classes)``; a target outside it.
  """
  mask = _check(data, mask, "flip_labels")
  k = int(data.num_classes)
  if (permutation is None) == (target is None):
    raise ValueError("flip_labels: give one of permutation= and target=")
  if permutation is not None:
    perm = np.asarray(permutation, np.int64)
    if sorted(perm.tolist()) != list(range(k)):
      raise ValueError(f"flip_labels: permutation={list(permutation)!r} is not a permutation of range({k})")
  else:
    assert target is not None
    if not 0 <= int(target) < k:
      raise ValueError(f"flip_labels: target={target!r} must be a class in [0, {k})")
    perm = np.full(k, int(target))
  rows = _rows(data, mask, 1.0, 0)
  y = np.asarray(data.y_train)
  y = np.where(rows, perm[np.clip(y, 0, k - 1)], y).astype(y.dtype)
  return dataclasses.replace(data, y_train=jnp.asarray(y) if isinstance(data.y_train, jax.Array) else y)


def stamp(x, trigger: Trigger, batch_dims: int):
  """Examples ``x`` (numpy or jax; the first ``batch_dims`` axes index examples) with the
  trigger's features set."""
  xp = jnp if isinstance(x, jax.Array) else np
  lead = x.shape[:batch_dims]
  flat = x.reshape(lead + (-1,))
  idx = np.asarray(trigger.features, np.int64)
  val = np.broadcast_to(np.asarray(trigger.value, np.float64), idx.shape).astype(flat.dtype)
  if xp is jnp:
    flat = flat.at[..., idx].set(jnp.asarray(val))
  else:
    flat = flat.copy()
    flat[..., idx] = val
  return flat.reshape(x.shape)


def add_backdoor(data: FederatedData, mask, *, trigger: Trigger, target: int, fraction: float = 0.5,
                 seed: int = 0) -> FederatedData:
  """``ceil(fraction * n_c)`` of every attacker's training examples (drawn by ``seed``) with the
  trigger stamped and the label ``target``.

  Raises:
    ValueError: ``fraction`` outside ``(0, 1]``, a target outside the classes, trigger indices
      outside an example.
  """
  mask = _check(data, mask, "add_backdoor")
  if not 0.0 < float(fraction) <= 1.0:
    raise ValueError(f"add_backdoor: fraction={fraction!r} must be in (0, 1]")
  if not 0 <= int(target) < int(data.num_classes):
    raise ValueError(f"add_backdoor: target={target!r} must be a class in [0, {int(data.num_classes)})")
  batch_dims = np.ndim(data.y_train)
  size = int(np.prod(np.shape(data.x_train)[batch_dims:]))
  idx = np.asarray(trigger.features, np.int64)
  if idx.size == 0 or idx.min() < 0 or idx.max() >= size:
    raise ValueError(f"add_backdoor: trigger indices must lie in [0, {size}) (an example's features)")
  rows = _rows(data, mask, float(fraction), seed)
  x, y = np.asarray(data.x_train), np.asarray(data.y_train)
  xs = stamp(x, trigger, batch_dims)
  x = np.where(rows.reshape(rows.shape + (1,) * (x.ndim - batch_dims)), xs, x)
  y = np.where(rows, int(target), y).astype(y.dtype)
  on_device = isinstance(data.x_train, jax.Array)
  return dataclasses.replace(data, x_train=jnp.asarray(x) if on_device else x,
                             y_train=jnp.asarray(y) if on_device else y)


def triggered(x, y, n, *, trigger: Trigger, target: int):
  """A triggered copy of test data ``x [C, M, ...]``, ``y [C, M]``, ``n [C]``: every example
  stamped, and ``keep [C, M]`` the real ones whose label is not ``target`` (what the attack
  success rate counts)."""
  keep = (np.arange(np.shape(y)[1])[None, :] < np.asarray(n)[:, None]) & (np.asarray(y) != int(target))
  return stamp(x, trigger, 2), keep


def attack_success_rate(apply: Callable, params, data: FederatedData, *, trigger: Trigger,
                        target: int) -> jax.Array:
  """The fraction of every client's real test examples of another class than ``target`` that
  ``apply(params, x) -> logits`` (one model) classifies as ``target`` once triggered."""
  xt, keep = triggered(data.x_test, data.y_test, data.n_test, trigger=trigger, target=target)
  logits = jax.vmap(lambda xc: apply(params, xc))(jnp.asarray(xt))
  hit = (jnp.argmax(logits, axis=-1) == int(target)) & jnp.asarray(keep)
  return jnp.sum(hit) / jnp.maximum(jnp.sum(jnp.asarray(keep)), 1)


def backdoor_test_split(data: FederatedData, *, trigger: Trigger, target: int):
  """``(x, y, n)`` a test split per client (the shapes of ``data``'s) holding, first, the
  triggered copies of its real test examples whose label is not ``target``, all labelled
  ``target``: a model's accuracy on it is its attack success rate."""
  xt, keep = triggered(data.x_test, data.y_test, data.n_test, trigger=trigger, target=target)
  xt = np.asarray(xt)
  order = np.argsort(~keep, axis=1, kind="stable")          # kept rows first, in their order
  x = np.take_along_axis(xt, order.reshape(order.shape + (1,) * (xt.ndim - 2)), axis=1)
  y = np.full(np.shape(data.y_test), int(target), np.asarray(data.y_test).dtype)
  n = keep.sum(axis=1).astype(np.asarray(data.n_test).dtype)
  return jnp.asarray(x), jnp.asarray(y), jnp.asarray(n)
