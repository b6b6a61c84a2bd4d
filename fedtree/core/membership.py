"""Which parent every client belongs to, round by round: a tree whose leaf level moves.

In a :class:`~fedtree.core.topology.Topology` the parent of each client is a static index array; the
engine aggregates by ``segment_sum`` over it, so it can as well be data. A :class:`Membership` gives
the clients' parents (the edge servers) of every round as an ``int32[R, C]`` array and which edges
are up as ``bool[R, E]``: the number of edges and every level above them stay those of the tree,
only who belongs to which edge changes, inside the compiled round (row ``r - 1`` is read in round
``r``, the last row in every round after it; no recompile). :class:`MobileSampler` draws the cohort
of every edge among its members of the round, in the layout of
:class:`~fedtree.core.sampling.CohortSampler`, and, under a membership that never moves, the very
same cohort (bit for bit: the tests).

What a client keeps (its local state, cursor, personal parameters) is indexed by the client and
travels with it; what an edge keeps (its model, its server optimizer's state, an edge-level personal
part) is indexed by the edge and stays. A client whose edge is down takes no part in the round (the
rule ``"wait"``); :func:`fedtree.toolbox.mobility.fail_edges` may re-associate it instead, which
is a change of the membership itself. The mobility models and association policies that build one
live in :mod:`fedtree.toolbox.mobility`.

Example:
  >>> m = Membership(edges=np.array([[0, 0, 1], [0, 1, 1]]), up=np.ones((2, 2), bool))
  >>> m.num_rounds, m.num_clients, m.num_edges, m.max_load
  (2, 3, 2, 2)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.sampling import Cohort, _chunk


@dataclasses.dataclass(frozen=True, eq=False)
class Membership:
  """The clients' edges and the edges' state, round by round.

  Attributes:
    edges: ``int[R, C]``: ``edges[r - 1, c]`` is client ``c``'s edge in round ``r`` (the last row
      in every round after ``R``).
    up: ``bool[R, E]``: whether edge ``e`` is up in round ``r`` (a down edge neither trains its
      clients nor aggregates, nor receives the levels above; it keeps its model).
  """

  edges: np.ndarray
  up: np.ndarray

  def __post_init__(self):
    edges, up = np.asarray(self.edges), np.asarray(self.up)
    if edges.ndim != 2 or edges.shape[0] < 1 or edges.shape[1] < 1:
      raise ValueError(f"Membership.edges must be int[rounds, clients] with at least one of each, got "
                       f"shape {edges.shape}")
    if not np.issubdtype(edges.dtype, np.integer):
      raise ValueError(f"Membership.edges must hold integer edge indices, got dtype {edges.dtype}")
    if up.ndim != 2 or up.shape[0] != edges.shape[0] or up.dtype != bool:
      raise ValueError(f"Membership.up must be bool[{edges.shape[0]}, edges] (one row per round of "
                       f"edges), got {up.dtype}{list(up.shape)}")
    num_edges = up.shape[1]
    bad = np.argwhere((edges < 0) | (edges >= num_edges))
    if bad.size:
      r, c = (int(v) for v in bad[0])
      raise ValueError(f"Membership: round {r + 1} puts client {c} on edge {int(edges[r, c])}, outside "
                       f"[0, {num_edges}) (the {num_edges} edges of the tree)")
    object.__setattr__(self, "edges", edges.astype(np.int32))
    object.__setattr__(self, "up", up)

  @classmethod
  def static(cls, parent, num_edges: int | None = None) -> Membership:
    """The membership of a fixed tree (``parent``: every client's edge), every edge up: a run under
    it is the run without one, bit for bit."""
    parent = np.asarray(parent, np.int64)
    num_edges = int(parent.max()) + 1 if num_edges is None else int(num_edges)
    return cls(edges=parent[None, :], up=np.ones((1, num_edges), bool))

  @property
  def num_rounds(self) -> int:
    """The rounds it gives (every later round reads the last)."""
    return int(self.edges.shape[0])

  @property
  def num_clients(self) -> int:
    return int(self.edges.shape[1])

  @property
  def num_edges(self) -> int:
    return int(self.up.shape[1])

  @functools.cached_property
  def loads(self) -> np.ndarray:
    """``int[R, E]`` the clients on every edge (up or down) in every round."""
    return np.stack([np.bincount(row, minlength=self.num_edges) for row in self.edges])

  @property
  def max_load(self) -> int:
    """The most clients an edge holds in any round (the block of a blockwise aggregator)."""
    return int(self.loads.max())

  @functools.cached_property
  def handovers(self) -> np.ndarray:
    """``int[R]`` the clients whose edge in round ``r`` is not their edge in round ``r - 1`` (0 in
    the first round)."""
    moved = (self.edges[1:] != self.edges[:-1]).sum(axis=1)
    return np.concatenate([[0], moved]).astype(np.int64)

  def check(self, num_clients: int, num_edges: int) -> None:
    """Refuses a membership of another population or tree, naming both sizes."""
    if self.num_clients != int(num_clients):
      raise ValueError(f"the membership gives {self.num_clients} clients' edges; the run has {num_clients} "
                       f"clients")
    if self.num_edges != int(num_edges):
      raise ValueError(f"the membership has {self.num_edges} edges; the run's tree has {num_edges} clients' "
                       f"parents (edges)")

  def of_round(self, r) -> tuple[jax.Array, jax.Array]:
    """``(int32[C] every client's edge, bool[E] every edge up)`` in round ``r`` (traced or not): row
    ``r - 1``, the first in round 0 and the last after the rounds it gives."""
    i = jnp.clip(jnp.asarray(r, jnp.int32) - 1, 0, self.num_rounds - 1)
    return jnp.asarray(self.edges)[i], jnp.asarray(self.up)[i]

  def moved(self, r) -> jax.Array:
    """``int32``: the clients handed over to another edge in round ``r``."""
    i = jnp.clip(jnp.asarray(r, jnp.int32) - 1, 0, self.num_rounds - 1)
    return jnp.asarray(self.handovers.astype(np.int32))[i]


@dataclasses.dataclass(frozen=True)
class MobileSampler:
  """Every edge's cohort among its members of the round, uniformly without replacement, in the
  layout of :class:`~fedtree.core.sampling.CohortSampler`: ``per_edge`` slots per edge (an edge
  with fewer members fills fewer: the others are invalid), or every client (``per_edge=None``: ``C``
  slots, grouped by edge). A client of a down edge is not drawn (its slot is invalid).

  Under a membership that never moves and edges of at least ``per_edge`` members, a draw is
  :class:`~fedtree.core.sampling.CohortSampler`'s shuffled draw from the same key, slot for slot
  (its ``"draw"`` method, which parents of at least 1,024 children use, has no such twin: the
  mobile sampler always shuffles, one sort of the population a round).
  """

  num_clients: int
  num_edges: int
  per_edge: int | None
  chunk_size: int

  @property
  def total(self) -> int:
    return self.num_clients if self.per_edge is None else self.num_edges * self.per_edge

  @property
  def padded_size(self) -> int:
    return -(-self.total // self.chunk_size) * self.chunk_size

  @property
  def sizes(self) -> tuple[int, ...]:
    """The most slots an edge may fill (every client, or ``per_edge``), per edge."""
    return (self.num_clients if self.per_edge is None else self.per_edge,) * self.num_edges

  def __call__(self, key, member: jax.Array, live: jax.Array) -> Cohort:
    n, e = self.num_clients, self.num_edges
    if self.per_edge is None:
      clients = jnp.argsort(member, stable=True).astype(jnp.int32)
      parent = jnp.take(member, clients)
      valid = jnp.take(live, parent)
    else:
      k = self.per_edge
      u = jax.random.uniform(key, (n,))
      shuffled = jnp.lexsort((u, member)).astype(jnp.int32)   # grouped by edge, random inside one
      counts = jax.ops.segment_sum(jnp.ones((n,), jnp.int32), member, num_segments=e)
      start = jnp.cumsum(counts) - counts
      j = jnp.arange(k, dtype=jnp.int32)
      pos = (start[:, None] + j[None, :]).reshape(-1)
      clients = jnp.take(shuffled, jnp.minimum(pos, n - 1))
      parent = jnp.repeat(jnp.arange(e, dtype=jnp.int32), k)
      valid = ((j[None, :] < counts[:, None]) & live[:, None]).reshape(-1)
    pad = self.padded_size - self.total
    if pad:
      clients = jnp.concatenate([clients, jnp.zeros((pad,), jnp.int32)])
      parent = jnp.concatenate([parent, jnp.zeros((pad,), jnp.int32)])
      valid = jnp.concatenate([valid, jnp.zeros((pad,), bool)])
    return Cohort(clients=clients, parent=parent.astype(jnp.int32), valid=valid)


def mobile_sampler(membership: Membership, cohort_size, *, chunk_size) -> MobileSampler:
  """The sampler of ``cohort_size`` clients per edge (an int; ``None`` or ``-1``: every member) under
  ``membership``, padded to a multiple of ``chunk_size`` (as :func:`~fedtree.core.sampling.cohort_sampler`).

  Raises:
    ValueError: a per-edge cohort that is not one int for every edge, below 1 or above the clients.
  """
  n, e = membership.num_clients, membership.num_edges
  if cohort_size is None or (np.isscalar(cohort_size) and int(np.asarray(cohort_size)) == -1):
    per_edge = None
    sizes = np.asarray(membership.loads[0], np.int64)   # (the chunk of every client, as the tree's)
  else:
    if not np.isscalar(cohort_size):
      raise ValueError(f"cohort_size={cohort_size!r} under a moving membership must be one int for every "
                       f"edge (its members change: a per-edge list has no fixed owner), or None for all")
    per_edge = int(np.asarray(cohort_size))
    if not 1 <= per_edge <= n:
      raise ValueError(f"cohort_size={per_edge} must be in [1, {n}] (the clients), or None/-1 for every "
                       f"member of an edge")
    sizes = np.full(e, per_edge, np.int64)
  return MobileSampler(num_clients=n, num_edges=e, per_edge=per_edge, chunk_size=_chunk(chunk_size, sizes))


def ancestor_through(topology, level: int, member):
  """Every client's node at ``level`` (at most the clients' parents' level): the tree's
  (``topology.ancestor(level)``, numpy) where ``member`` is ``None``, else through every client's edge
  ``member`` (``int32[C]``, traced)."""
  if member is None:
    return topology.ancestor(level)
  leaf = topology.depth - 1
  if not 0 <= level <= leaf:
    raise ValueError(f"level={level}: a client's node under a membership is at a server level 0..{leaf}")
  return jnp.take(jnp.asarray(topology.ancestor(level, leaf)), member)


def clients_parent_rows(topology, level: int, membership: Membership | None, r, params, clients=None):
  """The rows of ``params`` (a level's ``[N, ...]`` node models) of every client's node at ``level`` in
  round ``r`` (:func:`clients_node`), or of the clients ``clients`` (``int[K]``) only: what a client's
  personal model combines with its own rows."""
  node = jnp.asarray(clients_node(topology, level, membership, r), jnp.int32)
  node = node if clients is None else jnp.take(node, jnp.asarray(clients))
  return jax.tree.map(lambda a: jnp.take(a, node, axis=0), params)


def clients_node(topology, level: int, membership: Membership | None, r):
  """Every client's node at ``level`` in round ``r`` (:func:`ancestor_through` its edge of the round;
  the tree's without a membership): what scores a client with its edge's model, or its region's,
  follows it."""
  return ancestor_through(topology, level, None if membership is None else membership.of_round(r)[0])
