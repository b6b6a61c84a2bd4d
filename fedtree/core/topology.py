"""Trees of servers and clients as per-level parent index arrays.

Level 0 is the root (one node); level ``depth`` holds the clients, in the same order as the
rows of the federated data. ``parent(level)[i]`` is the index, at ``level - 1``, of node ``i``
of ``level``. A :class:`Topology` is immutable and hashable, so a jitted round closes over it
and specializes on it exactly once.

Example:
  >>> topo = Topology.from_labels([0, 0, 1, 1, 1])   # root -> 2 groups -> 5 clients
  >>> topo.depth, topo.num_nodes(1), topo.num_clients
  (2, 2, 5)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np


def _as_label_array(labels, name: str) -> np.ndarray:
  arr = np.asarray(labels)
  if arr.ndim != 1:
    raise ValueError(f"{name} must be a 1-D array of integer labels, got shape {arr.shape}")
  if arr.size == 0:
    raise ValueError(f"{name} is empty: a tree needs at least one client")
  if not np.issubdtype(arr.dtype, np.integer):
    if np.issubdtype(arr.dtype, np.floating) and np.all(arr == np.round(arr)):
      arr = arr.astype(np.int64)
    else:
      raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
  return arr.astype(np.int64)


def _check_parent(parent: np.ndarray, num_parents: int, level: int) -> None:
  bad = np.flatnonzero((parent < 0) | (parent >= num_parents))
  if bad.size:
    raise ValueError(
      f"level {level}: node {int(bad[0])} has parent {int(parent[bad[0]])}, "
      f"outside [0, {num_parents}) (the {num_parents} nodes of level {level - 1})"
    )
  counts = np.bincount(parent, minlength=num_parents)
  empty = np.flatnonzero(counts == 0)
  if empty.size:
    raise ValueError(
      f"level {level - 1}: node(s) {empty[:10].tolist()} have no children "
      f"(empty group); every server node needs at least one child"
    )


@dataclasses.dataclass(frozen=True)
class Topology:
  """A rooted tree whose leaves (the deepest level) are the clients.

  Attributes:
    parents: ``parents[l - 1][i]`` is the parent (at level ``l - 1``) of node ``i`` of level
      ``l``, for ``l = 1 .. depth``. Tuples of Python ints, so the object is hashable.
  """

  parents: tuple[tuple[int, ...], ...]

  def __post_init__(self):
    if not self.parents:
      raise ValueError("a Topology needs at least one level below the root")
    num_parents = 1
    for level, p in enumerate(self.parents, start=1):
      _check_parent(np.asarray(p, dtype=np.int64), num_parents, level)
      num_parents = len(p)

  # ---------------------------------------------------------------- builders
  @classmethod
  def flat(cls, num_clients: int) -> Topology:
    """Root -> ``num_clients`` clients (one tier: FedAvg, FedOpt, ...)."""
    if int(num_clients) < 1:
      raise ValueError(f"num_clients={num_clients} must be >= 1")
    return cls(parents=((0,) * int(num_clients),))

  @classmethod
  def from_labels(cls, labels: Sequence[int] | np.ndarray) -> Topology:
    """Root -> groups -> clients, with ``labels[c]`` the group of client ``c``.

    Labels must be ``0 .. G-1`` with every group non-empty.
    """
    return cls.from_label_columns([labels])

  @classmethod
  def from_label_columns(cls, columns: Sequence[Sequence[int] | np.ndarray]) -> Topology:
    """A deeper tree from several label columns, coarsest first.

    ``columns[k][c]`` is the level-``k+1`` ancestor of client ``c``; labels of each column
    are ``0 .. G_k - 1``. Finer groups must nest inside coarser ones (a level-2 group cannot
    span two level-1 groups).

    Example: ``from_label_columns([region, edge])`` builds root -> regions -> edges -> clients.
    """
    if len(columns) == 0:
      raise ValueError("from_label_columns needs at least one label column")
    cols = [_as_label_array(c, f"columns[{k}]") for k, c in enumerate(columns)]
    n = cols[0].size
    for k, c in enumerate(cols):
      if c.size != n:
        raise ValueError(
          f"label columns disagree in length: columns[0] has {n} clients, columns[{k}] has {c.size}"
        )
      if c.min() < 0:
        raise ValueError(f"columns[{k}] has a negative label {int(c.min())}")
      num = int(c.max()) + 1
      missing = np.setdiff1d(np.arange(num), c)
      if missing.size:
        raise ValueError(
          f"columns[{k}]: label(s) {missing[:10].tolist()} have no clients (empty group); "
          f"labels must be 0..{num - 1} with every group used"
        )
    parents = []
    prev = np.zeros(n, dtype=np.int64)  # the root
    for k, c in enumerate(cols):
      num = int(c.max()) + 1
      parent_of_group = np.full(num, -1, dtype=np.int64)
      for g, p in zip(c, prev, strict=True):
        if parent_of_group[g] == -1:
          parent_of_group[g] = p
        elif parent_of_group[g] != p:
          raise ValueError(
            f"columns[{k}]: group {int(g)} spans two parents ({int(parent_of_group[g])} and "
            f"{int(p)}) of columns[{k - 1}]; finer labels must nest inside coarser ones"
          )
      parents.append(tuple(int(v) for v in parent_of_group))
      prev = c
    parents.append(tuple(int(v) for v in cols[-1]))
    return cls(parents=tuple(parents))

  @classmethod
  def from_sizes(cls, sizes) -> Topology:
    """A tree from nested sizes: a list of children, each an int (that many clients) or a list.

    ``from_sizes([5, 5, 10])`` is root -> 3 groups of 5, 5 and 10 clients;
    ``from_sizes([[5, 5], [10]])`` is root -> 2 regions -> 3 edges -> 20 clients.
    All clients must sit at the same depth.
    """

    def depth_of(node) -> int:
      if isinstance(node, (int, np.integer)):
        if node < 1:
          raise ValueError(f"from_sizes: a group of {node} clients; every group needs >= 1")
        return 1
      if not isinstance(node, (list, tuple)) or len(node) == 0:
        raise ValueError(f"from_sizes: expected an int or a non-empty list, got {node!r}")
      depths = {depth_of(child) for child in node}
      if len(depths) != 1:
        raise ValueError(f"from_sizes: clients at different depths under {node!r}")
      return depths.pop() + 1

    if isinstance(sizes, (int, np.integer)):
      return cls.flat(int(sizes))
    d = depth_of(list(sizes))
    levels: list[list[int]] = [[] for _ in range(d)]

    def walk(node, level: int, parent: int) -> None:
      if isinstance(node, (int, np.integer)):
        levels[level].extend([parent] * int(node))
        return
      for child in node:
        me = len(levels[level])
        levels[level].append(parent)
        walk(child, level + 1, me)

    for child in sizes:
      me = len(levels[0])
      levels[0].append(0)
      walk(child, 1, me)
    return cls(parents=tuple(tuple(lv) for lv in levels))

  # ---------------------------------------------------------------- queries
  @property
  def depth(self) -> int:
    """Number of edges from the root to a client (1 for FedAvg, 2 for root-groups-clients)."""
    return len(self.parents)

  @property
  def num_levels(self) -> int:
    return self.depth + 1

  @property
  def num_clients(self) -> int:
    return len(self.parents[-1])

  def num_nodes(self, level: int) -> int:
    self._check_level(level)
    return 1 if level == 0 else len(self.parents[level - 1])

  def parent(self, level: int) -> np.ndarray:
    """int32 parent index (at ``level - 1``) of every node of ``level`` (>= 1)."""
    if not 1 <= level <= self.depth:
      raise ValueError(f"level={level} has no parents; choose 1..{self.depth}")
    return self._parent_arrays[level - 1]

  def num_children(self, level: int) -> np.ndarray:
    """Number of children (at ``level + 1``) of every node of ``level``."""
    if not 0 <= level < self.depth:
      raise ValueError(f"level={level} has no children; choose 0..{self.depth - 1}")
    return np.bincount(self.parent(level + 1), minlength=self.num_nodes(level)).astype(np.int32)

  def ancestor(self, level: int, of_level: int | None = None) -> np.ndarray:
    """Index at ``level`` of the ancestor of every node of ``of_level`` (default: clients)."""
    of_level = self.depth if of_level is None else of_level
    self._check_level(level)
    self._check_level(of_level)
    if level > of_level:
      raise ValueError(f"level={level} is below of_level={of_level}: no ancestor")
    idx = np.arange(self.num_nodes(of_level), dtype=np.int32)
    for lv in range(of_level, level, -1):
      idx = self.parent(lv)[idx]
    return idx.astype(np.int32)

  def leaf_counts(self, level: int) -> np.ndarray:
    """Number of clients under every node of ``level``."""
    return np.bincount(self.ancestor(level), minlength=self.num_nodes(level)).astype(np.int32)

  def _check_level(self, level: int) -> None:
    if not 0 <= level <= self.depth:
      raise ValueError(f"level={level} out of range 0..{self.depth}")

  @functools.cached_property
  def _parent_arrays(self) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(p, dtype=np.int32) for p in self.parents)

  def __repr__(self) -> str:
    sizes = ", ".join(str(self.num_nodes(lv)) for lv in range(self.num_levels))
    return f"Topology(levels=[{sizes}])"

  def __hash__(self) -> int:
    return self._hash

  def __eq__(self, other) -> bool:
    return isinstance(other, Topology) and self.parents == other.parents

  @functools.cached_property
  def _hash(self) -> int:
    return hash(self.parents)
