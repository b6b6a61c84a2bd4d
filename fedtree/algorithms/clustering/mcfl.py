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

``clustering="cfl"`` or ``"ifca"`` (paper 004's MCFL_CFL, MCFL_IFCA) trains CFL's or IFCA's
clusters instead of K-means' and selects among them the same way
(:mod:`fedtree.algorithms.clustering.clustered`).
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
  """MCFL (module docstring). Its clusters are never mixed (no ``beta``).

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
