"""AWCFL: adaptive weighted clustered FL (paper 004: Li & Yan 2023, "Inter-cluster
optimization for clustered federated learning", Computer Science 50(11A), Algorithm 1).

One round (the paper's Algorithm 1, with a sampled cohort):

1. every sampled client ``j`` trains locally from its cluster's model ``c_{m_j}``
   (``m_j``: its cluster, persistent ``int32[C]``) and sends its weights ``w_j`` up;
2. the server clusters the received weights by K-means into ``n = num_clusters`` clusters
   (:func:`fedtree.algorithms.clustering.ops.stable_kmeans`: k-means++ from the round's key, fixed Lloyd
   iterations, ids matched to the current cluster models so they do not permute);
3. every cluster model becomes (Eq. (2) / line 3.3.1)

   ``c_k ← β/(n-1) · Σ_{i≠k} m_i + (1-β) · m_k``,   ``m_k = mean(w_j : j in cluster k)``

   i.e. its own members' mean mixed with the other clusters' means (β = 0: plain K-means
   clustered FL; β = 1: the mean of the *other* clusters only);
4. each client receives its cluster's model (step 3.4): its membership is updated.

Before round ``cluster_start_round + 1`` there is no clustering: all clients form one
cluster and every cluster model is set to their (FedAvg) mean, so clustering starts from a
trained global model, as in the paper's experiments ("clustering starts after 20 rounds").

Choices where the paper is silent or vague (marked):
* the ``c_i`` of the other clusters in line 3.3.1 are read as this round's cluster means
  ``m_i`` (the K-means centroids of step 3.2), updated simultaneously for all k;
* a cluster none of whose members reported keeps its model as ``m_k``;
* ``mean`` is weighted by ``weighting`` (``"uniform"`` is the paper's plain mean,
  ``"examples"`` the FedAvg weighting);
* the new cluster model is applied as a server-optimizer step on the pseudo-gradient
  ``c_k - target_k`` (default ``sgd(1.0)``: exactly ``c_k ← target_k``), so FedAvgM/FedAdam
  per cluster are one argument away;
* with one cluster, β is irrelevant (there are no other clusters).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms.clustering.ops import (
  ClusterFeatures,
  ClusterState,
  KMeansResult,
  check_num_clusters,
  flatten_rows,
  sample_mean,
  stable_kmeans,
)
from fedtree.core.aggregation import weighted_mean
from fedtree.core.algorithm import (
  FederatedAlgorithm,
  NodeModels,
  client_weights,
  initial_params,
  local_training,
)
from fedtree.core.data import FederatedData
from fedtree.core.local import ClientUpdate, LocalSchedule
from fedtree.core.model import Model
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.core.server import select_nodes, update_nodes
from fedtree.core.tier import train_cohort


def check_beta(beta) -> float:
  """β in ``[0, 1]``."""
  if not 0.0 <= float(beta) <= 1.0:
    raise ValueError(f"beta={beta} must be in [0, 1] (0: plain clustered FL, 1: other clusters only)")
  return float(beta)


def mix_clusters(means, beta: float, num_clusters: int):
  """``β/(n-1) · Σ_{i≠k} m_i + (1-β) · m_k`` for every row ``k`` of ``means [n, ...]``."""
  if num_clusters == 1 or beta == 0.0:
    return means

  def mix(m):
    others = (jnp.sum(m, axis=0, keepdims=True) - m) / (num_clusters - 1)
    return beta * others + (1.0 - beta) * m

  return jax.tree.map(mix, means)


def awcfl(
  *,
  model: Model,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule,
  num_clusters: int,
  beta: float = 0.5,
  cluster_start_round: int = 20,
  kmeans_iters: int = 20,
  server_optimizer: optax.GradientTransformation | None = None,
  cohort_size: int | None = None,
  chunk_size: int | str | None = "auto",
  weighting: str = "examples",
  compute_dtype: str | None = None,
  client_update: ClientUpdate | None = None,
  init_params: Any = None,
  feature_examples: int | None = None,
  name: str = "awcfl",
) -> FederatedAlgorithm:
  """AWCFL (module docstring); β = 0 is K-means clustered FL.

  Args:
    model: the model every cluster holds.
    data: the federated data (static shapes; MCFL's test-feature means).
    local_optimizer: the clients' optax optimizer.
    schedule: local epochs or steps, and batch size.
    num_clusters: ``n``, the number of clusters (static), in ``[1, num_clients]``.
    beta: β in ``[0, 1]``, the weight of the other clusters.
    cluster_start_round: rounds of plain FedAvg before clustering starts.
    kmeans_iters: Lloyd iterations of the K-means.
    server_optimizer: applied per cluster to ``c_k - target_k`` (default ``sgd(1.0)``).
    cohort_size: clients sampled per round (``None``: all).
    chunk_size: clients trained at once (an int, ``None``: all, ``"auto"``: the per-backend default).
    weighting: ``"examples"`` or ``"uniform"`` (the paper's plain mean).
    compute_dtype: mixed-precision default local training (``None``: the params' dtype).
    client_update: override the local training (a stateless objective that starts from the
      cluster's model; others are refused).
    init_params: the model every cluster starts from (default ``model.init(key)``).
    feature_examples: when set, clients also upload the mean of this many training inputs
      and the state keeps MCFL's :class:`~fedtree.algorithms.clustering.ops.ClusterFeatures`.
    name: label for reports.

  Raises:
    ValueError: ``num_clusters`` outside ``[1, C]``, β outside ``[0, 1]``, negative
      ``cluster_start_round``, ``kmeans_iters < 1``.
  """
  num_clients = data.num_clients
  k = check_num_clusters(num_clusters, num_clients)
  beta = check_beta(beta)
  if int(cluster_start_round) < 0:
    raise ValueError(f"cluster_start_round={cluster_start_round} must be >= 0")
  if int(kmeans_iters) < 1:
    raise ValueError(f"kmeans_iters={kmeans_iters} must be >= 1")
  if feature_examples is not None and int(feature_examples) < 1:
    raise ValueError(f"feature_examples={feature_examples} must be >= 1")
  client_weights(jnp.zeros(1), weighting)
  start_round, iters = int(cluster_start_round), int(kmeans_iters)
  opt = optax.sgd(1.0) if server_optimizer is None else server_optimizer
  sampler = cohort_sampler(np.zeros(num_clients, np.int32), cohort_size, chunk_size=chunk_size)
  client_update = local_training(client_update, model, local_optimizer, schedule, data,
                                 compute_dtype=compute_dtype, stateless_for="awcfl")
  test_data = (jnp.asarray(data.x_test), jnp.asarray(data.n_test))

  def init(key):
    p0 = initial_params(model, key, init_params)
    params = jax.tree.map(lambda p: jnp.broadcast_to(p, (k,) + p.shape), p0)
    features = ()
    if feature_examples is not None:
      keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(stream(key, "query"), jnp.arange(num_clients))
      query = jax.vmap(sample_mean, in_axes=(0, 0, 0, None))(keys, *test_data, int(feature_examples))
      features = ClusterFeatures(client_mean=jnp.zeros_like(query), seen=jnp.zeros((num_clients,), bool),
                                 query_mean=query)
    return ClusterState(
      round=jnp.zeros((), jnp.int32), params=params, opt_state=jax.vmap(opt.init)(params),
      cluster_of=jnp.zeros((num_clients,), jnp.int32), num_clusters=jnp.asarray(k, jnp.int32),
      features=features,
    )

  def round_fn(state: ClusterState, data: FederatedData, key):
    r = state.round + 1
    clustering = r > start_round
    w_client = client_weights(data.n_train, weighting)
    cohort = sampler(stream(key, "cohort"))
    cohort = cohort._replace(parent=jnp.take(state.cluster_of, cohort.clients))
    res = train_cohort(
      client_update, state.params, cohort, data, num_steps=schedule.num_steps(data.n_train),
      weights=w_client, key=stream(key, "train"), chunk_size=sampler.chunk_size, keep_client_params=True,
    )
    w = jnp.where(cohort.valid, jnp.take(w_client, cohort.clients), 0.0)
    points, previous = flatten_rows(res.client_params), flatten_rows(state.params)
    km = jax.lax.cond(  # no K-means before clustering starts
      clustering,
      lambda: stable_kmeans(stream(key, "kmeans"), points, previous, iters=iters, mask=cohort.valid),
      lambda: KMeansResult(previous, jnp.zeros(cohort.valid.shape, jnp.int32), jnp.zeros((), jnp.float32)),
    )
    assign = jnp.where(clustering, km.assignment, 0)
    means, total = weighted_mean(res.client_params, w, assign, k)
    means = select_nodes(total > 0, means, state.params)  # no report: keep the model
    mixed = mix_clusters(means, beta, k)
    global_mean = jax.tree.map(lambda m: jnp.broadcast_to(m[:1], m.shape), means)
    target = select_nodes(jnp.broadcast_to(clustering, (k,)), mixed, global_mean)
    pseudo_grad = jax.tree.map(jnp.subtract, state.params, target)
    if beta > 0.0 and k > 1:
      active = jnp.broadcast_to(total.sum() > 0, (k,))
    else:
      active = jnp.where(clustering, total > 0, total.sum() > 0)
    params, opt_state = update_nodes(opt, state.params, state.opt_state, pseudo_grad, active)
    slot_client = jnp.where(cohort.valid, cohort.clients, num_clients)  # padding writes nowhere
    cluster_of = state.cluster_of.at[slot_client].set(assign, mode="drop")
    features = state.features
    if feature_examples is not None:
      fkey = stream(key, "features")
      keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(fkey, cohort.clients)
      xs = jnp.take(data.x_train, cohort.clients, axis=0)
      ns = jnp.take(data.n_train, cohort.clients)
      up = jax.vmap(sample_mean, in_axes=(0, 0, 0, None))(keys, xs, ns, int(feature_examples))
      features = features.replace(
        client_mean=features.client_mean.at[slot_client].set(up, mode="drop"),
        seen=features.seen.at[slot_client].set(True, mode="drop"),
      )
    metrics = {
      "train_loss": res.loss_sum / jnp.maximum(res.num_trained, 1).astype(jnp.float32),
      "clients_trained": res.num_trained,
      "kmeans_inertia": jnp.where(clustering, km.inertia, 0.0),
      "clusters_nonempty": jnp.sum((jax.ops.segment_sum(jnp.ones_like(cluster_of), cluster_of,
                                                        num_segments=k) > 0).astype(jnp.int32)),
    }
    return state.replace(round=r, params=params, opt_state=opt_state, cluster_of=cluster_of,
                         features=features), metrics

  def models(state: ClusterState):
    cl = np.asarray(state.cluster_of)
    return {"cluster": NodeModels(state.params, cl, cluster_of_client=cl)}

  return FederatedAlgorithm(init=init, round=round_fn, models=models, name=name)
