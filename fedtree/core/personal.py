"""Personal parameters: the parts of a model that stay with each client, or that are shared only
within a subtree of the tree.

A run names them by path patterns, as LoRA's targets (regular expressions searched in every
leaf's ``"a/b/kernel"`` path, :func:`fedtree.core.model.param_paths`), and says how far up they
are shared (:class:`Personal`):

* ``level=None`` (the default): **personal to each client** (FedPer's and FedRep's heads,
  LG-FedAvg's body, FedBN's BatchNorm layers). Every client keeps its own copy ``[C, ...]``,
  starts every round from it (the rest of the model from its parent's), and sends nothing of it
  up: it is never broadcast, never aggregated, never counted in bytes, and each client is scored
  with its own combination.
* ``level=l`` (``1 <= l < depth``): **shared within each level-``l`` node's subtree** (e.g. a head
  per edge server): aggregated by the servers of levels ``l .. depth-1`` as usual, never by the
  levels above ``l``, and a level above ``l`` that sends its model down leaves those parameters of
  its children as they are.

:func:`share_levels` resolves a spec against a model once into a static pytree of levels (``0``:
shared everywhere; ``l``; ``depth``: personal to the client). The helpers below view a model
through a boolean mask of the same structure: :func:`shared_part` and :func:`personal_part` replace
the other leaves with ``None`` (an empty subtree to JAX, so ``jax.tree.map`` and every update-path
transform skip them), :func:`merge` joins the two parts again and :func:`fill` puts zeros back
where a part has none.

Example:
  The head of a 2-layer MLP personal to each client:

  >>> model = build_model("mlp", example_shape=(8,), num_classes=3, hidden=(16,))
  >>> params = model.init(jax.random.key(0))
  >>> levels = share_levels(Personal(patterns=("Dense_1",)), params, depth=1)
  >>> jax.tree.leaves(levels)
  [0, 0, 1, 1]
  >>> parameter_counts(params, personal_mask(levels, 0))
  (51, 144)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.model import param_paths

PyTree = Any


class Personal(NamedTuple):
  """Which parameters are personal, and how far up they are shared.

  Attributes:
    patterns: regular expressions, each searched in every parameter's ``"a/b/kernel"`` path; a
      parameter matched by any is personal. Each pattern must match at least one parameter.
    level: ``None``: personal to each client; ``l``: shared within each level-``l`` node's
      subtree (``1 <= l < depth``), see the module docstring.
  """

  patterns: tuple[str, ...]
  level: int | None = None


def personal(patterns: str | Sequence[str], *, level: int | None = None) -> Personal:
  """A :class:`Personal` spec; ``patterns`` one regular expression or several.

  Raises:
    ValueError: no pattern, a pattern that is not a regular expression, or ``level < 1``.
  """
  pats = (patterns,) if isinstance(patterns, str) else tuple(patterns)
  if not pats:
    raise ValueError("personal parameters need at least one path pattern (e.g. 'Dense_1' or 'head/.*')")
  for p in pats:
    if not isinstance(p, str):
      raise ValueError(f"personal pattern {p!r} must be a string (a regular expression)")
    try:
      re.compile(p)
    except re.error as e:
      raise ValueError(f"personal pattern {p!r} is not a regular expression: {e}") from e
  if level is not None and int(level) < 1:
    raise ValueError(f"personal level={level}: parameters shared up to the root are not personal; use a "
                     f"level >= 1 (shared within that level's subtrees) or None (personal to each client)")
  return Personal(patterns=pats, level=None if level is None else int(level))


def share_levels(spec: Personal | None, params: PyTree, depth: int) -> PyTree:
  """Per leaf of ``params``: the highest server level that aggregates it (``0``: shared everywhere,
  ``l``: shared within level-``l`` subtrees, ``depth``: personal to each client), as a pytree of
  Python ints of ``params``' structure (static). ``spec=None``: every leaf ``0``.

  Raises:
    ValueError: a pattern that matches no parameter (the message lists the parameters' paths), or
      a level that is not a server level below the root (``1 .. depth-1``).
  """
  leaves, treedef = jax.tree.flatten(params)
  if spec is None:
    return jax.tree.unflatten(treedef, [0] * len(leaves))
  level = depth if spec.level is None else int(spec.level)
  if spec.level is not None and not 1 <= level <= depth - 1:
    raise ValueError(f"personal level={spec.level}: a tree of depth {depth} shares within the subtrees of "
                     f"levels 1..{depth - 1}" + (" (it has none: use level=None, personal to each client)"
                                                  if depth == 1 else ""))
  paths = param_paths(params)
  hit = [False] * len(paths)
  for pattern in spec.patterns:
    matched = [i for i, p in enumerate(paths) if re.search(pattern, p)]
    if not matched:
      listing = [f"{p} {tuple(np.shape(v))}" for p, v in zip(paths, leaves, strict=True)]
      raise ValueError(f"personal pattern {pattern!r} matches no parameter of the model; its parameters are "
                       f"{listing}")
    for i in matched:
      hit[i] = True
  return jax.tree.unflatten(treedef, [level if h else 0 for h in hit])


def personal_mask(levels: PyTree, level: int) -> PyTree:
  """The leaves that server level ``level`` does not aggregate (their share level is deeper than
  ``level``), as a pytree of bools. At the clients' parents (``level = depth - 1``) these are the
  leaves personal to each client."""
  return jax.tree.map(lambda s: s > level, levels)


def any_personal(mask: PyTree | None) -> bool:
  """Whether ``mask`` marks any leaf."""
  return mask is not None and any(jax.tree.leaves(mask))


def shared_part(tree: PyTree, mask: PyTree) -> PyTree:
  """``tree`` with the leaves of ``mask`` replaced by ``None`` (what is sent and aggregated)."""
  return jax.tree.map(lambda x, m: None if m else x, tree, mask)


def personal_part(tree: PyTree, mask: PyTree) -> PyTree:
  """``tree`` with the leaves outside ``mask`` replaced by ``None`` (what stays)."""
  return jax.tree.map(lambda x, m: x if m else None, tree, mask)


def merge(shared: PyTree, personal: PyTree, mask: PyTree) -> PyTree:
  """The full tree: ``personal``'s leaves where ``mask`` holds, ``shared``'s elsewhere (each part
  holds ``None`` where the other has its leaves)."""
  flat_mask, treedef = jax.tree.flatten(mask)
  shared_leaves = iter(jax.tree.leaves(shared))
  personal_leaves = iter(jax.tree.leaves(personal))
  return jax.tree.unflatten(treedef, [next(personal_leaves) if m else next(shared_leaves) for m in flat_mask])


def fill(part: PyTree, mask: PyTree, like: PyTree) -> PyTree:
  """``part`` (``None`` at the leaves of ``mask``) with zeros shaped as ``like``'s leaves there."""
  return merge(part, personal_part(jax.tree.map(jnp.zeros_like, like), mask), mask)


def keep_where(mask: PyTree, own: PyTree, received: PyTree) -> PyTree:
  """``own``'s leaves where ``mask`` holds, ``received``'s elsewhere (full trees)."""
  return jax.tree.map(lambda m, o, r: o if m else r, mask, own, received)


def parameter_counts(params: PyTree, mask: PyTree) -> tuple[int, int]:
  """``(personal, shared)`` numbers of parameters of one model (unstacked)."""
  sizes = [(int(np.prod(np.shape(x))), bool(m))
           for x, m in zip(jax.tree.leaves(params), jax.tree.leaves(mask), strict=True)]
  return sum(n for n, m in sizes if m), sum(n for n, m in sizes if not m)


@dataclasses.dataclass(frozen=True)
class Shares:
  """A host's view of its personal parameters on a tree of ``depth`` server levels (resolved once,
  static): which leaves each level aggregates, what a node sends, and the clients' personal
  leaves kept as a flat tuple (what checkpoints hold).

  Attributes:
    levels: per leaf, its share level (:func:`share_levels`), or ``None`` without personal
      parameters.
    depth: the tree's number of server levels.
  """

  levels: PyTree | None
  depth: int

  @classmethod
  def of(cls, spec: Personal | None, template: PyTree, depth: int, algorithm: str) -> Shares:
    """``spec`` resolved against ``template`` (one model, possibly abstract); refusals name
    ``algorithm``."""
    if spec is None:
      return cls(None, depth)
    try:
      return cls(share_levels(spec, template, depth), depth)
    except ValueError as e:
      raise ValueError(f"{algorithm}: {e}") from e

  def mask(self, level: int) -> PyTree | None:
    """The leaves level ``level`` does not aggregate (``None`` when it aggregates every leaf)."""
    if self.levels is None:
      return None
    m = personal_mask(self.levels, level)
    return m if any(jax.tree.leaves(m)) else None

  @property
  def level_masks(self) -> tuple[PyTree | None, ...]:
    """:meth:`mask` of every server level ``0 .. depth-1``."""
    return tuple(self.mask(lv) for lv in range(self.depth))

  @property
  def client_mask(self) -> PyTree | None:
    """The leaves personal to each client (``None``: none)."""
    return self.mask(self.depth - 1)

  @property
  def has_client_personal(self) -> bool:
    return self.client_mask is not None

  def reported(self, level: int) -> bool:
    """Whether level ``level``'s models are whole models (every leaf aggregated at or below it)."""
    return self.mask(level) is None

  def sent(self, params: PyTree, level: int, stacked: bool = False) -> PyTree:
    """What a child of level ``level`` sends up (the leaves the level aggregates)."""
    del stacked   # the same view of one model or of stacked ones
    m = self.mask(level)
    return params if m is None else shared_part(params, m)

  def init_clients(self, params: PyTree, num_clients: int) -> tuple:
    """The clients' personal leaves at the start: ``params``' (one model) for every client."""
    m = self.client_mask
    if m is None:
      return ()
    return tuple(jnp.array(jnp.broadcast_to(x, (num_clients,) + jnp.shape(x)), copy=True)
                 for x in jax.tree.leaves(personal_part(params, m)))

  def unpack(self, packed: tuple) -> PyTree:
    """The clients' personal leaves as a tree (``None`` at the shared leaves), or ``None``."""
    m = self.client_mask
    if m is None:
      return None
    flat, treedef = jax.tree.flatten(m)
    it = iter(packed)
    return jax.tree.unflatten(treedef, [next(it) if x else None for x in flat])

  def pack(self, tree: PyTree) -> tuple:
    """Inverse of :meth:`unpack`: the personal leaves in leaf order."""
    return () if tree is None else tuple(jax.tree.leaves(tree))
