"""MCFL, multi-distribution clustered FL (paper 004: Li & Yan 2023): every cluster model goes to every
client, which picks one by its inputs' feature mean.

The round and the choices where the paper is vague: :doc:`MCFL on the clustered-FL page
<algorithms/clustered.md#mcfl>`.

References:
  Li and Yan, Inter-cluster optimization for clustered federated learning, Computer Science
  50(11A), 2023 (Sec. 3.2, Algorithm 2).
"""

from __future__ import annotations

from fedtree.algorithms.clustering.clustered import METRICS, clustered, select_clusters
from fedtree.algorithms.host.method import Host, method_over
from fedtree.core.algorithm import FederatedAlgorithm

__all__ = ["METRICS", "mcfl", "select_clusters"]


@method_over(clustered, sets={"inter_cluster": "MCFL selects each device's cluster by its feature mean"},
             drops=("beta",), bound=())
def mcfl(host: Host, *, feature_examples: int = 10, metric: str = "l2",
         cluster_start_round: int | None = None, name: str = "mcfl") -> FederatedAlgorithm:
  """MCFL (:doc:`docs <algorithms/clustered.md#mcfl>`). Its clusters are never mixed (no ``beta``).

  Args:
    model, data, local_optimizer, schedule: as in :func:`fedtree.algorithms.fedavg`.
    num_clusters: number of clusters, in ``[1, num_clients]`` (CFL: the most).
    feature_examples: ``n``, inputs averaged into a feature mean (train upload and test query).
    metric: ``"l1"`` or ``"l2"`` distance between feature means.
    clustering: ``"kmeans"`` (the paper's MCFL), ``"cfl"`` or ``"ifca"``.
    cluster_start_round: rounds before clustering starts (default 20; 0 for IFCA).
    kmeans_iters: Lloyd iterations (K-means).
    eps1, eps2, min_split_size, similarity_check: CFL's split criterion (``clustering="cfl"``).
    init: IFCA's initial models (``clustering="ifca"``): ``"random"`` or ``"same"``.
    server_optimizer: per-cluster server optimizer (default ``sgd(1.0)``).
    cohort_size, chunk_size, weighting, client_update: as in FedAvg.
    compute_dtype, init_params, skip_nonfinite, update_paths: as in
      :func:`~fedtree.algorithms.clustering.clustered.clustered`.
    name: label for reports.

  Example:
    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=2))
    >>> alg = mcfl(num_clusters=2, cluster_start_round=0, local_optimizer=optax.sgd(0.1), **common)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['cluster', 'selected']
  """
  if metric not in METRICS:
    raise ValueError(f"metric={metric!r}; choose one of {METRICS}")
  if cluster_start_round is None:
    cluster_start_round = 0 if host.get("clustering") == "ifca" else 20
  return host.build(inter_cluster="mcfl", feature_examples=int(feature_examples), metric=metric,
                    cluster_start_round=cluster_start_round, name=name)
