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

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.algorithms.clustering.awcfl import awcfl
from fedtree.algorithms.clustering.ops import ClusterState, pairwise_distances, segment_mean_rows
from fedtree.core.algorithm import FederatedAlgorithm, NodeModels

METRICS = ("l1", "l2")


def select_clusters(state: ClusterState, metric: str = "l2") -> jax.Array:
  """``int32[C]``: the cluster model each client's device picks from its test-input mean."""
  f = state.features
  k = jax.tree.leaves(state.params)[0].shape[0]
  cluster_mean, total = segment_mean_rows(f.client_mean, f.seen.astype(jnp.float32), state.cluster_of, k)
  dist = pairwise_distances(f.query_mean, cluster_mean, metric)
  dist = jnp.where(total[None, :] > 0, dist, jnp.inf)
  return jnp.argmin(dist, axis=1).astype(jnp.int32)


def mcfl(*, num_clusters: int, feature_examples: int = 10, metric: str = "l2", name: str = "mcfl",
         **kwargs) -> FederatedAlgorithm:
  """MCFL (module docstring).

  Args:
    num_clusters: number of clusters, in ``[1, num_clients]``.
    feature_examples: ``n``, inputs averaged into a feature mean (train upload and test query).
    metric: ``"l1"`` or ``"l2"`` distance between feature means.
    name: label for reports.
    **kwargs: the rest of :func:`fedtree.algorithms.clustering.awcfl.awcfl`'s arguments (``model``,
      ``data``, ``local_optimizer``, ``schedule``, ``cluster_start_round``, ...; not ``beta``).
  """
  if metric not in METRICS:
    raise ValueError(f"metric={metric!r}; choose one of {METRICS}")
  if "beta" in kwargs:
    raise ValueError(f"mcfl takes no beta (got beta={kwargs['beta']}): its clusters are not mixed")
  inner = awcfl(num_clusters=num_clusters, beta=0.0, feature_examples=int(feature_examples), name=name,
                **kwargs)

  def models(state: ClusterState):
    cl = np.asarray(state.cluster_of)
    picked = np.asarray(select_clusters(state, metric))
    return {
      "cluster": NodeModels(state.params, cl, cluster_of_client=cl),
      "selected": NodeModels(state.params, picked, cluster_of_client=cl, chosen_by_data=True),
    }

  return inner._replace(models=models)
