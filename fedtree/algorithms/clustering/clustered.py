"""Clustered FL as two independent choices, how clients are clustered and what crosses between clusters
(paper 004: Li & Yan 2023).

The round (:func:`clustered`) and its steps (``mix_clusters``, ``cluster_losses``,
``split_clusters``, ``select_clusters``). Every choice in detail: :doc:`the clustered-FL page
<algorithms/clustered.md#two-choices>`.

References:
  Li and Yan, Inter-cluster optimization for clustered federated learning, Computer Science
  50(11A), 2023 (Figs. 5, 7, 8).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms.clustering.ops import (
  ClusterFeatures,
  ClusterModels,
  ClusterState,
  KMeansResult,
  check_num_clusters,
  cosine_bipartition,
  cosine_similarity_matrix,
  flatten_rows,
  pairwise_distances,
  sample_mean,
  segment_mean_rows,
  stable_kmeans,
)
from fedtree.core.aggregation import divide_by_weight, weighted_mean
from fedtree.core.algorithm import (
  FederatedAlgorithm,
  PyTree,
  check_weighting,
  client_weights,
  initial_params,
  local_training,
)
from fedtree.core.checks import check_positive
from fedtree.core.data import FederatedData
from fedtree.core.local import ClientUpdate, LocalSchedule, stack
from fedtree.core.metrics import client_sums
from fedtree.core.model import Model, independent_models
from fedtree.core.rng import stream
from fedtree.core.sampling import Cohort, CohortSampler, cohort_sampler
from fedtree.core.server import init_nodes, select_nodes, update_nodes
from fedtree.core.tier import Clients, Down, Tier, edge_metrics, train_cohort
from fedtree.core.updates import (
  UpdatePath,
  aggregate_slots,
  init_update_state,
  path_stats,
  per_level_paths,
  send_down,
)
from fedtree.toolbox.privacy import private_stages
from fedtree.toolbox.traffic import model_bytes

CLUSTERINGS = ("kmeans", "cfl", "ifca")
INTER_CLUSTER = ("none", "awcfl", "mcfl")
INITS = ("random", "same")
METRICS = ("l1", "l2")


def check_beta(beta) -> float:
  """β in ``[0, 1]`` (a ``jax.Array``, a sweep's traced β, passes unchecked)."""
  if isinstance(beta, jax.Array):
    return beta
  if not 0.0 <= float(beta) <= 1.0:
    raise ValueError(f"beta={beta} must be in [0, 1] (0: plain clustered FL, 1: other clusters only)")
  return float(beta)


def mix_clusters(means, beta: float, num_clusters, in_use: jax.Array | None = None):
  """``β/(n-1) · Σ_{i≠k} m_i + (1-β) · m_k`` for every row ``k`` of ``means [K, ...]``.

  Args:
    means: stacked cluster means.
    beta: β.
    num_clusters: ``n``, the clusters in use (an int, or ``int32[]`` when it changes: CFL).
    in_use: ``bool[K]`` rows in use (default: all); the others are returned unchanged.
  """
  if (not isinstance(beta, jax.Array) and beta == 0.0) or (
      isinstance(num_clusters, int) and num_clusters == 1):
    return means
  k = jax.tree.leaves(means)[0].shape[0]
  in_use = jnp.ones((k,), bool) if in_use is None else in_use
  n = jnp.asarray(num_clusters, jnp.result_type(float))

  def mix(m):
    u = in_use.reshape((-1,) + (1,) * (m.ndim - 1))
    others = (jnp.sum(jnp.where(u, m, 0), axis=0, keepdims=True) - m) / jnp.maximum(n - 1.0, 1.0)
    return jnp.where(u & (n > 1), beta * others + (1.0 - beta) * m, m)

  return jax.tree.map(mix, means)


def cluster_losses(model: Model, params, x, y, n, *, batch_size: int | None = None) -> jax.Array:
  """``float32[S, K]``: mean training loss of each of the ``K`` models on each of ``S``
  clients' padded data ``x [S, M, ...]``, ``y [S, M]``, ``n [S]`` (IFCA's choice)."""

  def one(args):
    xc, yc, nc = args
    loss, _, count = jax.vmap(lambda p: client_sums(model, p, xc, yc, nc))(params)[:3]
    return loss / jnp.maximum(count, 1.0)

  return jax.lax.map(one, (x, y, n), batch_size=batch_size)


def split_clusters(
  updates: jax.Array, weights: jax.Array, parent: jax.Array, valid: jax.Array, num_clusters: jax.Array, *,
  max_clusters: int, eps1: float, eps2: float, min_split_size: int, allow: jax.Array,
  similarity_check: bool = True,
):
  """CFL's split decision for one round, as masked array operations (:doc:`docs
  <algorithms/clustered.md#two-choices>`).

  Args:
    updates: ``float32[S, D]`` flattened updates of the cohort slots.
    weights: ``[S]`` aggregation weights (0 for padding).
    parent: ``int32[S]`` cluster each slot trained in.
    valid: ``bool[S]`` real slots.
    num_clusters: ``int32[]`` slots in use.
    max_clusters: static number of slots.
    eps1, eps2, min_split_size: the split criterion.
    allow: ``bool[]``, false to forbid splitting this round.
    similarity_check: also require Sattler's ``γ_max < √((1 - α_max^cross)/2)``.

  Returns:
    ``(new_parent int32[S], origin int32[K], split bool[K], mean_norm [K], max_norm [K],
    cross [K])``: the cluster of every slot after the splits, the cluster every slot's model
    comes from (itself, or the cluster it was split from), which clusters split, the norms,
    and ``α_max^cross`` of every cluster's bipartition (-1 where there is none).
  """
  k = max_clusters
  s = parent.shape[0]
  norms = jnp.linalg.norm(updates, axis=1)
  mean_upd, total = weighted_mean(updates, weights, parent, k)
  mean_norm = jnp.linalg.norm(mean_upd, axis=1)
  max_norm = jax.ops.segment_max(jnp.where(valid, norms, 0.0), parent, num_segments=k)
  size = jax.ops.segment_sum(valid.astype(jnp.int32), parent, num_segments=k)
  ids = jnp.arange(k)
  sim = cosine_similarity_matrix(updates)
  member = valid[None, :] & (parent[None, :] == ids[:, None])                       # [K, S]
  second = jax.vmap(lambda c: cosine_bipartition(sim, valid & (parent == c)))(ids)   # [K, S]
  first = member & ~second
  pair = first[:, :, None] & second[:, None, :]
  cross = jnp.max(jnp.where(pair, sim[None], -1.0), axis=(1, 2))
  eligible = (
    allow & (ids < num_clusters) & (size >= min_split_size) & (total > 0)
    & (mean_norm < eps1) & (max_norm > eps2) & jnp.any(second, axis=1)
  )
  if similarity_check:
    half = 2 * parent + second[parent, jnp.arange(s)].astype(parent.dtype)
    half_mean, _ = weighted_mean(updates, weights, half, 2 * k)
    m = jnp.take(half_mean, half, axis=0)
    m_norm = jnp.linalg.norm(m, axis=1)
    dev = jnp.where(m_norm > 0, jnp.linalg.norm(updates - m, axis=1) / jnp.where(m_norm > 0, m_norm, 1.0),
                    jnp.inf)
    gamma_max = jax.ops.segment_max(jnp.where(valid, dev, 0.0), parent, num_segments=k)
    eligible = eligible & (gamma_max < jnp.sqrt((1.0 - cross) / 2.0))
  new_id = num_clusters + jnp.cumsum(eligible.astype(jnp.int32)) - 1
  split = eligible & (new_id < k)
  moves = jnp.take(split, parent) & second[parent, jnp.arange(s)]
  new_parent = jnp.where(moves, jnp.take(new_id, parent), parent).astype(jnp.int32)
  origin = ids.at[jnp.where(split, new_id, k)].set(ids, mode="drop").astype(jnp.int32)
  return new_parent, origin, split, mean_norm, max_norm, cross


class Assignment(NamedTuple):
  """What a round's clustering step decides (after training, before aggregation).

  Attributes:
    assign: ``int32[S]`` the cluster of every cohort slot after this round.
    origin: ``int32[K]`` the cluster every slot's model and optimizer state come from (itself,
      or the cluster CFL split it from).
    num_in_use: ``int32[]`` cluster slots in use after this round.
    metrics: the step's own metrics (K-means inertia, CFL's norms).
  """

  assign: jax.Array
  origin: jax.Array
  num_in_use: jax.Array
  metrics: dict


def select_clusters(state: ClusterState, metric: str = "l2") -> jax.Array:
  """``int32[C]``: the cluster model each client's device picks from its test-input mean
  (MCFL: the nearest cluster feature mean among clusters whose members have uploaded)."""
  f = state.features
  k = jax.tree.leaves(state.params)[0].shape[0]
  seen = f.seen.astype(f.client_mean.dtype)
  cluster_mean, total = segment_mean_rows(f.client_mean, seen, state.cluster_of, k)
  dist = pairwise_distances(f.query_mean, cluster_mean, metric)
  dist = jnp.where(total[None, :] > 0, dist, jnp.inf)
  return jnp.argmin(dist, axis=1).astype(jnp.int32)


def clustered(
  *,
  model: Model,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule,
  num_clusters: int,
  clustering: str = "kmeans",
  inter_cluster: str = "none",
  beta: float = 0.5,
  cluster_start_round: int = 0,
  kmeans_iters: int = 20,
  eps1: float = 0.4,
  eps2: float = 1.6,
  min_split_size: int = 2,
  similarity_check: bool = True,
  init: str = "random",
  feature_examples: int | None = None,
  metric: str = "l2",
  server_optimizer: optax.GradientTransformation | None = None,
  cohort_size: int | None = None,
  chunk_size: int | str | None = "auto",
  weighting: str = "examples",
  client_update: ClientUpdate | None = None,
  compute_dtype: str | None = None,
  init_params: PyTree | None = None,
  skip_nonfinite: bool = False,
  update_paths: UpdatePath | None = None,
  name: str = "clustered",
) -> FederatedAlgorithm:
  """A clustered-FL algorithm (:doc:`docs <algorithms/clustered.md#two-choices>`): ``clustering`` ×
  ``inter_cluster``.

  Args:
    model, data, local_optimizer, schedule: as in :func:`fedtree.algorithms.fedavg`.
    num_clusters: cluster slots (static), in ``[1, num_clients]`` (CFL: the most clusters).
    clustering: ``"kmeans"``, ``"cfl"`` or ``"ifca"``.
    inter_cluster: ``"none"``, ``"awcfl"`` or ``"mcfl"``.
    beta: AWCFL's β in ``[0, 1]`` (``inter_cluster="awcfl"`` only).
    cluster_start_round: rounds before clustering starts (K-means: one cluster; CFL: no
      split); must be 0 for IFCA.
    kmeans_iters: Lloyd iterations (K-means).
    eps1, eps2, min_split_size, similarity_check: CFL's split criterion.
    init: IFCA's initial models, ``"random"`` or ``"same"`` (the others start all equal).
    feature_examples: MCFL's ``n`` (default 10 with ``inter_cluster="mcfl"``); with another
      strategy, set it to keep the feature means in the state anyway.
    metric: MCFL's distance between feature means, ``"l1"`` or ``"l2"``.
    server_optimizer: per-cluster server optimizer (default ``sgd(1.0)``).
    cohort_size, chunk_size, weighting, client_update, name: as in FedAvg.
    compute_dtype: mixed-precision local steps of the default local training.
    init_params: the model every cluster starts from (default ``model.init``; IFCA's
      ``init="random"`` then still draws independent models).
    skip_nonfinite: a client whose update is not finite is left out of the round as if not
      sampled: no weight in its cluster's mean, no part in K-means or CFL's split, its
      cluster assignment (and MCFL feature mean) unchanged; counted in the
      ``clients_skipped`` metric (see :func:`fedtree.core.tier.train_cohort`).
    update_paths: the clients' update path (:mod:`fedtree.core.updates`), run within each cluster:
      the client transform on every client's update (the clusters aggregate, K-means and CFL's split
      read, the models the clients sent); the aggregator (a robust one, an omniscient attack in front
      of it) over each cluster's members after the round's assignment, on their updates against the
      cluster's model (a mean of models, unchanged); the node transform on every cluster's aggregate
      (central DP at the cluster servers); the downlink transform on the models sent (IFCA's losses
      read what was received). Differential privacy is refused where the clustering reads what it
      does not cover (:func:`check_private`), and a node transform with a state per cluster
      (adaptive clipping) by name.

  Raises:
    ValueError: naming the bad value, for each argument above.

  Example:
    K-means clustering with AWCFL's inter-cluster mixing, from the first round:

    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=2))
    >>> alg = clustered(num_clusters=2, inter_cluster="awcfl", beta=0.5,
    ...                 local_optimizer=optax.sgd(0.1), **common)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> "cluster" in alg.models(state)
    True
  """
  plan = _plan(
    model=model, data=data, local_optimizer=local_optimizer, schedule=schedule, num_clusters=num_clusters,
    clustering=clustering, inter_cluster=inter_cluster, beta=beta, cluster_start_round=cluster_start_round,
    kmeans_iters=kmeans_iters, eps1=eps1, eps2=eps2, min_split_size=min_split_size,
    similarity_check=similarity_check, init=init, feature_examples=feature_examples, metric=metric,
    server_optimizer=server_optimizer, cohort_size=cohort_size, chunk_size=chunk_size, weighting=weighting,
    client_update=client_update, compute_dtype=compute_dtype, init_params=init_params,
    skip_nonfinite=skip_nonfinite, update_paths=update_paths, name=name)
  return FederatedAlgorithm(init=functools.partial(_init, plan), round=functools.partial(_round, plan),
                            models=functools.partial(_models, plan), name=name)


@dataclasses.dataclass(frozen=True)
class _Plan:
  """The family's fixed pieces, checked once (``k`` cluster slots)."""

  model: Model
  schedule: LocalSchedule
  k: int
  clustering: str
  inter_cluster: str
  beta: Any
  start: int                      # rounds before clustering starts
  kmeans_iters: int
  eps1: Any
  eps2: Any
  min_split_size: int
  similarity_check: bool
  init: str
  feature_examples: int | None
  metric: str
  weighting: str
  server_optimizer: optax.GradientTransformation
  sampler: CohortSampler
  tier: Tier
  path: UpdatePath | None         # the clients' whole update path (the tier runs its client stage)
  init_params: PyTree | None
  test_data: tuple                # (x_test, n_test) for MCFL's query means
  num_clients: int

  @property
  def mixing(self) -> bool:
    return (self.inter_cluster == "awcfl" and (isinstance(self.beta, jax.Array) or self.beta > 0.0)
            and self.k > 1)

  @property
  def per_cluster(self) -> bool:
    """Whether the clusters aggregate through the path's aggregator and node stage (else: the
    weighted mean of their members' models, as without a path)."""
    return self.path is not None and not self.path.sums_by_mean


def _check_clustering(clustering, inter_cluster, num_clusters, num_clients, beta, cluster_start_round,
                      kmeans_iters, eps1, eps2, min_split_size, init, metric, feature_examples):
  """``(k, beta, start, feature_examples)`` checked, every refusal naming its value."""
  if clustering not in CLUSTERINGS:
    raise ValueError(f"clustering={clustering!r}; choose one of {CLUSTERINGS}")
  if inter_cluster not in INTER_CLUSTER:
    raise ValueError(f"inter_cluster={inter_cluster!r}; choose one of {INTER_CLUSTER}")
  k = check_num_clusters(num_clusters, num_clients, "max_clusters" if clustering == "cfl" else "num_clusters")
  beta = check_beta(beta) if inter_cluster == "awcfl" else 0.0
  start = int(cluster_start_round)
  if start < 0:
    raise ValueError(f"cluster_start_round={cluster_start_round} must be >= 0")
  if clustering == "ifca" and start != 0:
    raise ValueError(f"cluster_start_round={cluster_start_round}: IFCA picks clusters from round 1; set 0")
  if clustering == "kmeans" and int(kmeans_iters) < 1:
    raise ValueError(f"kmeans_iters={kmeans_iters} must be >= 1")
  if clustering == "cfl":
    check_positive(eps1=eps1, eps2=eps2)
    if int(min_split_size) < 2:
      raise ValueError(f"min_split_size={min_split_size} must be >= 2 (a split needs two halves)")
  if init not in INITS:
    raise ValueError(f"init={init!r}; choose one of {INITS}")
  if metric not in METRICS:
    raise ValueError(f"metric={metric!r}; choose one of {METRICS}")
  if inter_cluster == "mcfl" and feature_examples is None:
    feature_examples = 10
  if feature_examples is not None and int(feature_examples) < 1:
    raise ValueError(f"feature_examples={feature_examples} must be >= 1")
  return k, beta, start, None if feature_examples is None else int(feature_examples)


def check_private(path: UpdatePath | None, clustering: str, feature_examples: int | None, name: str) -> None:
  """Refuses differential privacy where the clustering reads what no privacy stage covers, by name:

  * central noise at the clusters (a ``dp`` node transform) needs each client to move one cluster's
    sum only, and by at most its clipped update: true of IFCA, whose clients each pick a cluster
    from their own data and the (private) cluster models, not of K-means or CFL, which assign every
    client from the raw updates of all (one client's update can move the others between clusters);
  * local noise (the clients' privacy stage alone) covers what the server reads with K-means or
    CFL (post-processing of noised updates), not IFCA's pick, which each client makes from its raw
    data and reveals by the cluster its update joins;
  * MCFL's feature means (of every client's own inputs) travel beside the update, unnoised.
  """
  stages = private_stages(path)
  if not stages:
    return
  assert path is not None
  central = path.node is not None and bool(private_stages(UpdatePath(node=path.node)))
  if feature_examples is not None:
    raise ValueError(f"{name}: differential privacy ({stages}) with MCFL's feature means "
                     f"(feature_examples={feature_examples}): each client's mean of its own inputs travels "
                     f"beside its update, unnoised; run it without the privacy section")
  if central and clustering != "ifca":
    raise ValueError(f"{name}: central differential privacy ({stages}) with clustering={clustering!r}: the "
                     f"clusters are formed from every client's raw update, so one client can move others "
                     f"between clusters and no cluster's sum has a bounded sensitivity; use "
                     f"clustering='ifca' (each client picks its cluster itself) or mechanism='local'")
  if not central and clustering == "ifca":
    raise ValueError(f"{name}: local differential privacy ({stages}) with clustering='ifca': each client "
                     f"picks its cluster by its raw loss and the cluster its update joins reveals the pick, "
                     f"which no local noise covers; use central noise (the server is trusted with the picks)")


def _check_node_state(path: UpdatePath | None, model: Model, k: int, name: str) -> None:
  """Refuses a node transform that keeps a state per cluster (adaptive clipping's clip norm): it
  would adapt to the clipped counts of the cluster each client trained in, summed before the
  round's assignment."""
  if path is None or path.node is None or path.node.init is None:
    return
  node = path.node
  shapes = jax.eval_shape(lambda key: node.init(model.init(key), k), jax.random.key(0))
  if jax.tree.leaves(shapes):
    raise ValueError(f"{name}: the node transform {node.name!r} keeps a state per cluster (adaptive "
                     f"clipping's clip norm), which would follow the clients' statistics of the cluster "
                     f"they trained in, not the one the round assigns them to; use a fixed clip "
                     f"(privacy.clip_norm=C without adaptive)")


def _plan(*, model, data, local_optimizer, schedule, num_clusters, clustering, inter_cluster, beta,
          cluster_start_round, kmeans_iters, eps1, eps2, min_split_size, similarity_check, init,
          feature_examples, metric, server_optimizer, cohort_size, chunk_size, weighting, client_update,
          compute_dtype, init_params, skip_nonfinite, update_paths, name) -> _Plan:
  """:func:`clustered`'s arguments checked (every refusal raised here) into its :class:`_Plan`."""
  num_clients = data.num_clients
  k, beta, start, feature_examples = _check_clustering(
    clustering, inter_cluster, num_clusters, num_clients, beta, cluster_start_round, kmeans_iters, eps1, eps2,
    min_split_size, init, metric, feature_examples)
  check_weighting(weighting)
  sampler = cohort_sampler(np.zeros(num_clients, np.int32), cohort_size, chunk_size=chunk_size)
  path = per_level_paths(update_paths, 1, algorithm=name)[0]
  check_private(path, clustering, feature_examples, name)
  _check_node_state(path, model, k, name)
  client_update = local_training(client_update, model, local_optimizer, schedule, data,
                                 compute_dtype=compute_dtype, stateless_for=name)
  # The tier runs the path's client stage; the clusters, known after training, aggregate (_aggregate).
  tier = Tier(client_update, path=None if path is None else UpdatePath(client=path.client),
              chunk_size=sampler.chunk_size, batch_order=schedule.batch_order, batch_size=schedule.batch_size,
              skip_nonfinite=skip_nonfinite, keep_client_params=True)
  return _Plan(
    model=model, schedule=schedule, k=k, clustering=clustering, inter_cluster=inter_cluster, beta=beta,
    start=start, kmeans_iters=int(kmeans_iters), eps1=eps1, eps2=eps2, min_split_size=int(min_split_size),
    similarity_check=bool(similarity_check), init=init, feature_examples=feature_examples, metric=metric,
    weighting=weighting, server_optimizer=optax.sgd(1.0) if server_optimizer is None else server_optimizer,
    sampler=sampler, tier=tier, path=path, init_params=init_params,
    test_data=(jnp.asarray(data.x_test), jnp.asarray(data.n_test)), num_clients=num_clients)


def _init(plan: _Plan, key) -> ClusterState:
  k, num_clients = plan.k, plan.num_clients
  if plan.clustering == "ifca" and plan.init == "random" and plan.init_params is None:
    params = independent_models(plan.model, key, k)
  else:
    params = stack(initial_params(plan.model, key, plan.init_params), k)
  features = ()
  if plan.feature_examples is not None:
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(stream(key, "query"), jnp.arange(num_clients))
    query = jax.vmap(sample_mean, in_axes=(0, 0, 0, None))(keys, *plan.test_data, plan.feature_examples)
    features = ClusterFeatures(client_mean=jnp.zeros_like(query), seen=jnp.zeros((num_clients,), bool),
                               query_mean=query)
  return ClusterState(
    round=jnp.zeros((), jnp.int32), params=params, opt_state=init_nodes(plan.server_optimizer, params),
    cluster_of=jnp.zeros((num_clients,), jnp.int32),
    num_clusters=jnp.asarray(1 if plan.clustering == "cfl" else k, jnp.int32), features=features,
    cursor=plan.schedule.init_cursor(num_clients),
    update_state=init_update_state(plan.path, jax.tree.map(lambda p: p[0], params), num_clients, k),
  )


# ------------------------------------------------------------------------ the round's phases
def _pick(plan: _Plan, state: ClusterState, sent, cohort: Cohort, data: FederatedData) -> Cohort:
  """The cluster each slot trains in: its client's current one, or (IFCA) the one whose model (as
  received, ``sent``) has the lowest loss on its data."""
  if plan.clustering != "ifca":
    return cohort._replace(parent=jnp.take(state.cluster_of, cohort.clients))
  losses = cluster_losses(
    plan.model, sent, jnp.take(data.x_train, cohort.clients, axis=0),
    jnp.take(data.y_train, cohort.clients, axis=0), jnp.take(data.n_train, cohort.clients),
    batch_size=plan.sampler.chunk_size,
  )
  return cohort._replace(parent=jnp.argmin(losses, axis=1).astype(jnp.int32))


def _assign_kmeans(plan: _Plan, state, cohort, res, w, key, active_clustering) -> Assignment:
  """K-means of the trained models, labels matched to the previous clusters."""
  points, previous = flatten_rows(res.client_params), flatten_rows(state.params)
  km = jax.lax.cond(  # no K-means before clustering starts
    active_clustering,
    lambda: stable_kmeans(stream(key, "kmeans"), points, previous, iters=plan.kmeans_iters,
                          mask=cohort.valid),
    lambda: KMeansResult(previous, jnp.zeros(cohort.valid.shape, jnp.int32), jnp.zeros((), previous.dtype)),
  )
  return Assignment(jnp.where(active_clustering, km.assignment, 0), jnp.arange(plan.k, dtype=jnp.int32),
                    state.num_clusters, {"kmeans_inertia": jnp.where(active_clustering, km.inertia, 0.0)})


def _assign_cfl(plan: _Plan, state, sent, cohort, res, w, key, active_clustering) -> Assignment:
  """CFL: clusters whose updates are stationary but diverse split in two (every update against the
  model its client received, ``sent``)."""
  start_params = jax.tree.map(lambda p: jnp.take(p, cohort.parent, axis=0), sent)
  delta = jax.tree.map(jnp.subtract, start_params, res.client_params)   # θ_c - θ_i = -Δθ_i
  assign, origin, split, mean_norm, max_norm, cross = split_clusters(
    flatten_rows(delta), w, cohort.parent, cohort.valid, state.num_clusters, max_clusters=plan.k,
    eps1=plan.eps1, eps2=plan.eps2, min_split_size=plan.min_split_size, allow=active_clustering,
    similarity_check=plan.similarity_check,
  )
  in_use_before = jnp.arange(plan.k) < state.num_clusters
  return Assignment(assign, origin, state.num_clusters + jnp.sum(split, dtype=jnp.int32), dict(
    max_mean_update_norm=jnp.max(jnp.where(in_use_before, mean_norm, 0.0)),
    max_update_norm=jnp.max(jnp.where(in_use_before, max_norm, 0.0)),
    max_cross_similarity=jnp.max(jnp.where(in_use_before, cross, -1.0)),
  ))


def _assign(plan: _Plan, state, sent, cohort, res, w, key, active_clustering) -> Assignment:
  """Every slot's cluster after training (IFCA: the one it trained in)."""
  if plan.clustering == "kmeans":
    return _assign_kmeans(plan, state, cohort, res, w, key, active_clustering)
  if plan.clustering == "cfl":
    return _assign_cfl(plan, state, sent, cohort, res, w, key, active_clustering)
  return Assignment(cohort.parent, jnp.arange(plan.k, dtype=jnp.int32), state.num_clusters, {})


def _aggregate(plan: _Plan, state: ClusterState, res, w, cohort: Cohort, a: Assignment, key):
  """Every cluster's aggregate of its members (a cluster without reports keeps its model), from the
  models, optimizer and path states the clusters come from: the weighted mean of their models, or
  (:attr:`_Plan.per_cluster`) the path's aggregator over their updates against the cluster's model
  and its node stage on each cluster's sum. Returns ``(means, total, base, base_opt, update_state,
  metrics)``."""
  take = lambda t: jax.tree.map(lambda x: jnp.take(x, a.origin, axis=0), t)   # noqa: E731
  base, base_opt = take(state.params), take(state.opt_state)
  update_state = res.update_state
  if not plan.per_cluster:
    means, total = weighted_mean(res.client_params, w, a.assign, plan.k)
    return select_nodes(total > 0, means, base), total, base, base_opt, update_state, {}
  path = plan.path
  assert path is not None
  update_state = update_state._replace(node=take(update_state.node))   # a split cluster's from its origin
  anchor = jax.tree.map(lambda b: jnp.take(b, a.assign, axis=0), base)
  deltas = jax.tree.map(jnp.subtract, anchor, res.client_params)
  delta_sum, total, update_state, stats = aggregate_slots(   # (one cluster may get the whole cohort)
    path, update_state, base, deltas, w, a.assign, cohort.valid, cohort.clients, sum(plan.sampler.sizes),
    stream(key, "aggregate"))
  means = jax.tree.map(jnp.subtract, base, divide_by_weight(delta_sum, total))
  metrics = path_stats(stats)
  return select_nodes(total > 0, means, base), total, base, base_opt, update_state, metrics


def _targets(plan: _Plan, means, total, a: Assignment, active_clustering):
  """``(target, active)``: what every cluster steps to (AWCFL: leaning towards the others by β; K-means
  before clustering starts: the one cluster's mean everywhere), and which clusters step."""
  k = plan.k
  in_use = jnp.arange(k) < a.num_in_use
  target = mix_clusters(means, plan.beta, a.num_in_use, in_use) if plan.mixing else means
  if plan.clustering == "kmeans":
    global_mean = jax.tree.map(lambda m: jnp.broadcast_to(m[:1], m.shape), means)
    target = select_nodes(jnp.broadcast_to(active_clustering, (k,)), target, global_mean)
    active = jnp.where(active_clustering, total > 0, total.sum() > 0)
  else:
    active = total > 0
  if plan.mixing:
    active = in_use & (total.sum() > 0)
  return target, active


def _update_features(plan: _Plan, features, cohort: Cohort, data: FederatedData, key):
  """MCFL's feature means of the clients that trained."""
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(stream(key, "features"), cohort.clients)
  xs = jnp.take(data.x_train, cohort.clients, axis=0)
  ns = jnp.take(data.n_train, cohort.clients)
  up = jax.vmap(sample_mean, in_axes=(0, 0, 0, None))(keys, xs, ns, plan.feature_examples)
  return features.replace(client_mean=cohort.scatter(features.client_mean, up),
                          seen=cohort.scatter(features.seen, True))


def _metrics(plan: _Plan, state: ClusterState, res, a: Assignment, total, cluster_of, down_stats) -> dict:
  k = plan.k
  metrics = {
    **res.metrics(plan.tier.skip_nonfinite),
    "num_clusters": a.num_in_use,
    "clusters_nonempty": jnp.sum((jax.ops.segment_sum(jnp.ones_like(cluster_of), cluster_of,
                                                      num_segments=k) > 0).astype(jnp.int32)),
    "clusters_picked": jnp.sum((total > 0).astype(jnp.int32)),
    **a.metrics,
  }
  metrics.update(path_stats(down_stats, "downlink_"))
  if plan.clustering == "ifca":   # every sampled client receives all k models (one message: toolbox.traffic)
    metrics["clients_received_models"] = jnp.asarray(k, jnp.int32)
    each = down_stats.get("bytes")
    metrics.update(edge_metrics("clients", res.messages(), downlink_bytes=(
      model_bytes(state.params, stacked=True) * k if each is None else jnp.sum(each))))
  return metrics


def _round(plan: _Plan, state: ClusterState, data: FederatedData, key):
  """Train, assign, aggregate, mix."""
  r = state.round + 1
  active_clustering = r > plan.start
  if plan.clustering == "ifca" or plan.feature_examples is not None:
    data.require_padded("IFCA's cluster losses and MCFL's feature means (clustered FL)")
  w_client = client_weights(data.n_train, plan.weighting)
  sent, down_stats = send_down(plan.path, state.params, stream(key, "down"))   # the clusters' models received
  cohort = _pick(plan, state, sent, plan.sampler(stream(key, "cohort")), data)
  res = train_cohort(plan.tier, Down(sent), cohort, data,
                     Clients(plan.schedule.num_steps(data.n_train), w_client, cursor=state.cursor,
                             update_state=state.update_state), stream(key, "train"))
  # The slots whose update counts: the cohort, less the clients skipped for a non-finite one.
  cohort = cohort._replace(valid=cohort.valid & jnp.take(res.reported, cohort.clients))
  w = jnp.where(cohort.valid, jnp.take(w_client, cohort.clients), 0.0)
  a = _assign(plan, state, sent, cohort, res, w, key, active_clustering)
  means, total, base, base_opt, update_state, path_metrics = _aggregate(plan, state, res, w, cohort, a, key)
  target, active = _targets(plan, means, total, a, active_clustering)
  pseudo_grad = jax.tree.map(jnp.subtract, base, target)
  params, opt_state = update_nodes(plan.server_optimizer, base, base_opt, pseudo_grad, active)
  cluster_of = cohort.scatter(state.cluster_of, a.assign)
  features = state.features
  if plan.feature_examples is not None:
    features = _update_features(plan, features, cohort, data, key)
  metrics = {**_metrics(plan, state, res, a, total, cluster_of, down_stats), **path_metrics}
  return state.replace(round=r, params=params, opt_state=opt_state, cluster_of=cluster_of,
                       update_state=update_state, num_clusters=a.num_in_use, features=features,
                       cursor=res.cursor), metrics


def _models(plan: _Plan, state: ClusterState):
  cl = np.asarray(state.cluster_of)
  out = {"cluster": ClusterModels(state.params, cl, cluster_of_client=cl)}
  if plan.inter_cluster == "mcfl":
    picked = np.asarray(select_clusters(state, plan.metric))
    out["selected"] = ClusterModels(state.params, picked, cluster_of_client=cl, chosen_by_data=True)
  return out
