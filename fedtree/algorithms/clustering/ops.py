"""Clustering clients inside jit: K-means on flattened models, stable cluster labels, cosine
bipartition, feature means, and the family's state and model sets.

K-means (:func:`kmeans`, :func:`stable_kmeans`), labels kept across rounds (:func:`match_labels`),
CFL's split (:func:`cosine_bipartition`), MCFL's feature mean (:func:`sample_mean`), and
:class:`ClusterState`, :class:`ClusterModels`. How each works: :doc:`the clustered-FL page
<algorithms/clustered.md#in-jit-operations>`.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedtree.core.algorithm import CLIENT_ROWS, UNNAMED, RowName, path_rows

PyTree = Any


# ------------------------------------------------------------------------ vectors
def flatten_rows(tree: PyTree) -> jax.Array:
  """Stacked pytree ``[N, ...]`` -> ``float32[N, D]`` (leaves raveled and concatenated)."""
  leaves = jax.tree.leaves(tree)
  n = leaves[0].shape[0]
  return jnp.concatenate([jnp.reshape(a, (n, -1)).astype(jnp.float32) for a in leaves], axis=1)


def squared_distances(x: jax.Array, c: jax.Array) -> jax.Array:
  """``[N, K]`` squared Euclidean distances between rows of ``x [N, D]`` and ``c [K, D]``."""
  xx = jnp.sum(x * x, axis=1)[:, None]
  cc = jnp.sum(c * c, axis=1)[None, :]
  return jnp.maximum(xx - 2.0 * x @ c.T + cc, 0.0)


def pairwise_distances(x: jax.Array, c: jax.Array, metric: str = "l2") -> jax.Array:
  """``[N, K]`` distances: ``"l2"`` (Euclidean) or ``"l1"`` (sum of absolute differences)."""
  if metric == "l2":
    return jnp.sqrt(squared_distances(x, c))
  if metric == "l1":
    return jax.vmap(lambda xi: jnp.sum(jnp.abs(xi[None, :] - c), axis=1))(x)
  raise ValueError(f"metric={metric!r}; choose 'l1' or 'l2'")


# ------------------------------------------------------------------------ K-means
class KMeansResult(NamedTuple):
  """``centroids: float32[K, D]``; ``assignment: int32[N]`` (0 for masked points);
  ``inertia: float32[]`` sum of squared distances of the unmasked points to their centroid."""

  centroids: jax.Array
  assignment: jax.Array
  inertia: jax.Array


def kmeans_plusplus(key: jax.Array, x: jax.Array, k: int, mask: jax.Array | None = None) -> jax.Array:
  """k-means++ seeding (Arthur & Vassilvitskii 2007): ``k`` rows of ``x [N, D]``, the first
  uniform among unmasked points, each next one with probability ``∝ D²`` (uniform among the
  unmasked points when every ``D²`` is 0). Deterministic for a key."""
  n = x.shape[0]
  mask = jnp.ones((n,), bool) if mask is None else mask.astype(bool)
  keys = jax.random.split(key, k)
  first = jax.random.categorical(keys[0], jnp.where(mask, 0.0, -jnp.inf))
  cents = jnp.zeros((k, x.shape[1]), x.dtype).at[0].set(x[first])
  d2 = jnp.where(mask, jnp.sum((x - x[first][None, :]) ** 2, axis=1), 0.0)

  def body(i, carry):
    cents, d2 = carry
    total = jnp.sum(d2)
    logits = jnp.where(total > 0, jnp.log(jnp.where(d2 > 0, d2, 1.0)), 0.0)
    logits = jnp.where(mask & ((d2 > 0) | (total <= 0)), logits, -jnp.inf)
    pick = jax.random.categorical(keys[i], logits)
    cents = cents.at[i].set(x[pick])
    d2 = jnp.minimum(d2, jnp.where(mask, jnp.sum((x - x[pick][None, :]) ** 2, axis=1), 0.0))
    return cents, d2

  cents, _ = jax.lax.fori_loop(1, k, body, (cents, d2))
  return cents


def kmeans(
  key: jax.Array, x: jax.Array, k: int, *, iters: int = 20, mask: jax.Array | None = None,
  init: jax.Array | None = None,
) -> KMeansResult:
  """K-means of the rows of ``x [N, D]`` (those where ``mask[N]`` holds) into ``k`` clusters.

  Args:
    key: seeds the k-means++ initialization (unused when ``init`` is given).
    x: points.
    k: number of clusters (static).
    iters: Lloyd iterations (static; no early stop, so the cost is fixed).
    mask: ``bool[N]`` points to cluster (default all).
    init: ``[k, D]`` initial centroids instead of k-means++.
  """
  if k < 1:
    raise ValueError(f"kmeans: k={k} must be >= 1")
  x = x.astype(jnp.float32)
  n = x.shape[0]
  mask = jnp.ones((n,), bool) if mask is None else mask.astype(bool)
  cents = kmeans_plusplus(key, x, k, mask) if init is None else init.astype(jnp.float32)
  w = mask.astype(jnp.float32)

  def assign(c):
    return jnp.argmin(squared_distances(x, c), axis=1).astype(jnp.int32)

  def step(c, _):
    a = assign(c)
    sums = jax.ops.segment_sum(x * w[:, None], a, num_segments=k)
    counts = jax.ops.segment_sum(w, a, num_segments=k)
    c = jnp.where(counts[:, None] > 0, sums / jnp.maximum(counts, 1.0)[:, None], c)
    return c, None

  cents, _ = jax.lax.scan(step, cents, None, length=iters)
  a = assign(cents)
  d2 = jnp.take_along_axis(squared_distances(x, cents), a[:, None], axis=1)[:, 0]
  return KMeansResult(cents, jnp.where(mask, a, 0), jnp.sum(jnp.where(mask, d2, 0.0)))


EXACT_MATCH_MAX = 7  # up to 7! = 5,040 permutations are scored inside jit


def _permutations(k: int) -> np.ndarray:
  """``int32[k!, k]``: every permutation of ``range(k)``, in lexicographic order."""
  return np.asarray(list(itertools.permutations(range(k))), np.int32).reshape(-1, k)


def _host_assignment(cost: np.ndarray) -> np.ndarray:
  from scipy.optimize import linear_sum_assignment

  rows, cols = linear_sum_assignment(np.asarray(cost, np.float64))
  labels = np.zeros(cost.shape[0], np.int32)
  labels[rows] = cols
  return labels


def optimal_assignment(cost: jax.Array) -> jax.Array:
  """``int32[K]``: the permutation ``p`` minimizing ``Σ_i cost[i, p[i]]`` (the linear
  assignment problem, solved exactly).

  For ``K <= EXACT_MATCH_MAX`` every permutation is scored inside jit (ties: the
  lexicographically first); larger ``K`` calls scipy's ``linear_sum_assignment`` (the
  Hungarian method, Kuhn 1955 / Jonker-Volgenant) on the host through ``jax.pure_callback``.
  """
  k = cost.shape[0]
  if k <= EXACT_MATCH_MAX:
    perms = jnp.asarray(_permutations(k))
    totals = jnp.sum(cost[jnp.arange(k)[None, :], perms], axis=1)
    return perms[jnp.argmin(totals)]
  out = jax.ShapeDtypeStruct((k,), jnp.int32)
  return jax.pure_callback(_host_assignment, out, cost, vmap_method="sequential")


def match_labels(new: jax.Array, previous: jax.Array) -> jax.Array:
  """``int32[K]``: the label each new centroid takes so that ids stay put between rounds.

  The optimal (Hungarian) matching of new to previous centroids on their ``[K, K]`` squared
  distances (:func:`optimal_assignment`): ``labels[i]`` is the previous id of new centroid
  ``i``; relabel an assignment with ``labels[assignment]`` and centroids with
  ``centroids[argsort(labels)]``. Invariant to relabelling: permuting ``previous`` permutes
  the labels the same way, so a permutation of centroids is undone exactly.
  """
  cost = squared_distances(new.astype(jnp.float32), previous.astype(jnp.float32))
  return optimal_assignment(cost)


def greedy_match_labels(new: jax.Array, previous: jax.Array) -> jax.Array:
  """The earlier greedy matching (K times, the closest unmatched pair; ties: lowest index),
  kept for comparison: it is not optimal when centroids are close (:func:`match_labels`)."""
  k = new.shape[0]
  cost = squared_distances(new.astype(jnp.float32), previous.astype(jnp.float32))

  def body(_, carry):
    cost, labels = carry
    flat = jnp.argmin(cost)
    i, j = flat // k, flat % k
    labels = labels.at[i].set(j.astype(jnp.int32))
    cost = cost.at[i, :].set(jnp.inf).at[:, j].set(jnp.inf)
    return cost, labels

  _, labels = jax.lax.fori_loop(0, k, body, (cost, jnp.zeros((k,), jnp.int32)))
  return labels


def stable_kmeans(
  key: jax.Array, x: jax.Array, previous: jax.Array, *, iters: int = 20, mask: jax.Array | None = None,
) -> KMeansResult:
  """:func:`kmeans` into ``K = len(previous)`` clusters whose ids are matched to the previous
  centroids ``previous [K, D]`` (:func:`match_labels`)."""
  res = kmeans(key, x, previous.shape[0], iters=iters, mask=mask)
  labels = match_labels(res.centroids, previous)
  assignment = labels[res.assignment]
  if mask is not None:
    assignment = jnp.where(mask, assignment, 0)
  return KMeansResult(res.centroids[jnp.argsort(labels)], assignment, res.inertia)


# ------------------------------------------------------------------------ CFL bipartition
def cosine_similarity_matrix(x: jax.Array) -> jax.Array:
  """``[N, N]`` cosine similarities of the rows of ``x`` (0 for a zero row)."""
  norm = jnp.linalg.norm(x, axis=1, keepdims=True)
  u = x / jnp.where(norm > 0, norm, 1.0)
  return u @ u.T


def cosine_bipartition(similarity: jax.Array, mask: jax.Array) -> jax.Array:
  """Splits the points where ``mask[N]`` holds into two groups: ``bool[N]``, true for the
  second group (false outside ``mask``).

  Complete-linkage agglomerative clustering on the distance ``-similarity`` (Sattler et
  al.'s choice), stopped at two groups: every step merges the two groups whose farthest
  members are closest. The first group is the one holding the lowest-index point. With
  fewer than two points nothing is split (all false).
  """
  n = similarity.shape[0]
  mask = mask.astype(bool)
  big = jnp.float32(1e9)
  dist = -similarity.astype(jnp.float32)
  both = mask[:, None] & mask[None, :]
  eye = jnp.eye(n, dtype=bool)
  # group-to-group complete-linkage distances; rows of merged-away groups are inactive
  d = jnp.where(both & ~eye, dist, big)
  label = jnp.arange(n, dtype=jnp.int32)
  alive = mask

  def body(_, carry):
    d, label, alive = carry
    do = jnp.sum(alive.astype(jnp.int32)) > 2
    dm = jnp.where(alive[:, None] & alive[None, :] & ~eye, d, big)
    flat = jnp.argmin(dm).astype(jnp.int32)  # int64 under jax_enable_x64
    i, j = jnp.minimum(flat // n, flat % n), jnp.maximum(flat // n, flat % n)
    merged = jnp.maximum(d[i], d[j])  # complete linkage: the farther of the two
    new_d = d.at[i, :].set(merged).at[:, i].set(merged).at[i, i].set(big)
    new_label = jnp.where(label == j, i, label)
    new_alive = alive.at[j].set(False)
    return (jnp.where(do, new_d, d), jnp.where(do, new_label, label), jnp.where(do, new_alive, alive))

  _, label, alive = jax.lax.fori_loop(0, max(n - 2, 0), body, (d, label, alive))
  first = jnp.min(jnp.where(mask, label, n))
  return mask & (label != first) & (jnp.sum(alive.astype(jnp.int32)) >= 2)


# ------------------------------------------------------------------------ initial models
# ------------------------------------------------------------------------ feature means
def sample_mean(key: jax.Array, x: jax.Array, count: jax.Array, n: int) -> jax.Array:
  """Mean of ``min(n, count)`` inputs drawn without replacement from the real rows
  ``x[:count]`` of one client's padded ``x [M, ...]``; returned flattened ``float32[F]``
  (``float64[F]`` for float64 inputs)."""
  m = x.shape[0]
  dtype = x.dtype if x.dtype == jnp.float64 else jnp.float32
  u = jax.random.uniform(key, (m,))
  u = jnp.where(jnp.arange(m) < count, u, 2.0)  # padding sorts last
  rank = jnp.argsort(jnp.argsort(u))
  take = (rank < jnp.minimum(n, count)).astype(dtype)
  flat = jnp.reshape(x, (m, -1)).astype(dtype)
  return jnp.sum(flat * take[:, None], axis=0) / jnp.maximum(jnp.sum(take), 1.0)


def segment_mean_rows(
  values: jax.Array, weights: jax.Array, ids: jax.Array, k: int
) -> tuple[jax.Array, jax.Array]:
  """Weighted mean of the rows ``values [N, F]`` per id (``k`` ids), and the total weight."""
  total = jax.ops.segment_sum(weights, ids, num_segments=k)
  sums = jax.ops.segment_sum(values * weights[:, None], ids, num_segments=k)
  return sums / jnp.maximum(total, 1e-30)[:, None], total


# ------------------------------------------------------------------------ state
class ClusterModels(NamedTuple):
  """The cluster models of a clustered method: :class:`~fedtree.core.algorithm.NodeModels`'
  ``params [K, ...]`` and ``model_of_client int32[C]``, plus ``cluster_of_client int32[C]``
  (row ``k`` is cluster ``k``'s model): the evaluation then scores every row on every client
  and adds intra- and inter-cluster accuracy (:func:`fedtree.core.metrics.cluster_accuracy`).
  ``chosen_by_data``: a device picks its model from the data it is given (MCFL), so on another
  cluster's data it uses ``model_of_client`` of that data rather than its own cluster's model.
  """

  params: PyTree
  model_of_client: np.ndarray | jax.Array
  cluster_of_client: np.ndarray | jax.Array
  chosen_by_data: bool = False


@struct.dataclass
class ClusterFeatures:
  """MCFL's feature means (paper 004, Sec. 3.2).

  Attributes:
    client_mean: ``float32[C, F]`` mean of ``n`` training inputs each client last uploaded.
    seen: ``bool[C]`` the client has uploaded at least once.
    query_mean: ``float32[C, F]`` mean of ``n`` test inputs of every client (computed on the
      device at inference; drawn once at ``init``).
  """

  client_mean: jax.Array
  seen: jax.Array
  query_mean: jax.Array


@struct.dataclass
class ClusterState:
  """State of a clustered-FL algorithm: one model per cluster and every client's cluster.

  Attributes:
    round: ``int32[]`` rounds completed.
    params: ``[K, ...]`` the cluster models (K: the static number of cluster slots).
    opt_state: ``[K, ...]`` per-cluster server optimizer states.
    cluster_of: ``int32[C]`` cluster of every client (the dynamic parent index).
    num_clusters: ``int32[]`` cluster slots in use (CFL grows it; K for the others).
    features: :class:`ClusterFeatures` (MCFL) or ``()``.
    cursor: ``int32[C]`` the clients' batch cursors under ``batch_order="cyclic"`` (else ``()``).
    update_state: the :class:`~fedtree.core.updates.UpdateState` of the clients' update path.
  """

  round: jax.Array
  params: PyTree
  opt_state: PyTree
  cluster_of: jax.Array
  num_clusters: jax.Array
  features: Any = ()
  cursor: Any = ()
  update_state: Any = ()

  def row_names(self) -> ClusterState:
    """Rows: the cluster slots (models, optimizer states), the clients (the rest)."""
    clusters = RowName("cluster")
    return self.replace(round=UNNAMED, params=clusters, opt_state=clusters, cluster_of=CLIENT_ROWS,
                        num_clusters=UNNAMED, features=CLIENT_ROWS, cursor=CLIENT_ROWS,
                        update_state=path_rows(self.update_state, CLIENT_ROWS, clusters))


def check_num_clusters(num_clusters, num_clients: int, name: str = "num_clusters") -> int:
  """``num_clusters`` as an int in ``[1, num_clients]``, else a ``ValueError`` naming it."""
  if isinstance(num_clusters, bool) or not isinstance(num_clusters, (int, np.integer)):
    raise ValueError(f"{name}={num_clusters!r} must be an int in [1, {num_clients}] (the number of clients)")
  if not 1 <= int(num_clusters) <= num_clients:
    raise ValueError(f"{name}={num_clusters} must be in [1, {num_clients}] (the number of clients)")
  return int(num_clusters)
