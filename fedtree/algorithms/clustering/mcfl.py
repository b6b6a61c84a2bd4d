"""MCFL: multi-distribution clustered FL (paper 004: Li & Yan 2023, "Inter-cluster
optimization for clustered federated learning", Sec. 3.2, Algorithm 2).

Training is plain K-means clustered FL (AWCFL with β = 0: clients train from their
cluster's model, the server K-means-clusters their weights and averages every cluster), but
every cluster model is sent to every client. To choose among them:

* each participating client uploads ``X̄_i``, the mean of ``n`` inputs sampled from its
  training data (``feature_examples``; fresh samples whenever it takes part);
* each cluster's feature is the mean of its members' ``X̄_i`` (over members that uploaded);
* at inference a device computes ``μ``, the mean of ``n`` of its test inputs, and uses the
  cluster model with the smallest ``t = |X̄ - μ|`` (``metric``: ``"l1"`` or ``"l2"``).

``models(state)`` gives ``cluster`` (each client's own cluster model, plain clustered FL)
and ``selected`` (the model each device picks from its test inputs; on another cluster's
data a device picks from that data, so its inter-cluster accuracy uses the pick). Choices
(marked): clusters none of whose members has uploaded are never picked; the test-input
sample ``μ`` is drawn once per client at ``init`` from the run's key.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms.clustering.awcfl import awcfl
from fedtree.algorithms.clustering.ops import ClusterState, pairwise_distances, segment_mean_rows
from fedtree.core.algorithm import FederatedAlgorithm, NodeModels
from fedtree.core.data import FederatedData
from fedtree.core.local import ClientUpdate, LocalSchedule
from fedtree.core.model import Model

METRICS = ("l1", "l2")


def select_clusters(state: ClusterState, metric: str = "l2") -> jax.Array:
  """``int32[C]``: the cluster model each client's device picks from its test-input mean."""
  f = state.features
  k = jax.tree.leaves(state.params)[0].shape[0]
  cluster_mean, total = segment_mean_rows(f.client_mean, f.seen.astype(jnp.float32), state.cluster_of, k)
  dist = pairwise_distances(f.query_mean, cluster_mean, metric)
  dist = jnp.where(total[None, :] > 0, dist, jnp.inf)
  return jnp.argmin(dist, axis=1).astype(jnp.int32)


def mcfl(
  *,
  model: Model,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule,
  num_clusters: int,
  feature_examples: int = 10,
  metric: str = "l2",
  cluster_start_round: int = 20,
  kmeans_iters: int = 20,
  server_optimizer: optax.GradientTransformation | None = None,
  cohort_size: int | None = None,
  chunk_size: int | str | None = "auto",
  weighting: str = "examples",
  compute_dtype: str | None = None,
  client_update: ClientUpdate | None = None,
  init_params: Any = None,
  name: str = "mcfl",
) -> FederatedAlgorithm:
  """MCFL (module docstring).

  Args:
    model, data, local_optimizer, schedule: as in :func:`fedtree.algorithms.fedavg`.
    num_clusters: number of clusters, in ``[1, num_clients]``.
    feature_examples: ``n``, inputs averaged into a feature mean (train upload and test query).
    metric: ``"l1"`` or ``"l2"`` distance between feature means.
    cluster_start_round, kmeans_iters, server_optimizer, cohort_size, chunk_size, weighting,
      compute_dtype, client_update, init_params: as in
      :func:`fedtree.algorithms.clustering.awcfl.awcfl` (MCFL is AWCFL with β = 0).
    name: label for reports.
  """
  if metric not in METRICS:
    raise ValueError(f"metric={metric!r}; choose one of {METRICS}")
  inner = awcfl(
    model=model, data=data, local_optimizer=local_optimizer, schedule=schedule,
    num_clusters=num_clusters, beta=0.0, cluster_start_round=cluster_start_round,
    kmeans_iters=kmeans_iters, server_optimizer=server_optimizer, cohort_size=cohort_size,
    chunk_size=chunk_size, weighting=weighting, compute_dtype=compute_dtype,
    client_update=client_update, feature_examples=int(feature_examples), init_params=init_params,
    name=name,
  )

  def models(state: ClusterState):
    cl = np.asarray(state.cluster_of)
    picked = np.asarray(select_clusters(state, metric))
    return {
      "cluster": NodeModels(state.params, cl, cluster_of_client=cl),
      "selected": NodeModels(state.params, picked, cluster_of_client=cl, chosen_by_data=True),
    }

  return inner._replace(models=models)
