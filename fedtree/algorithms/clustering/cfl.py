"""CFL (Sattler, Müller & Samek 2020): clustered FL by recursive bipartition, a baseline of paper 004.

The split rule and the choices where the paper is vague: :doc:`CFL on the clustered-FL page
<algorithms/clustered.md#cfl>`.

References:
  Sattler, Müller and Samek, Clustered federated learning: model-agnostic distributed multitask
  optimization under privacy constraints, IEEE TNNLS 2020.
"""

from __future__ import annotations

from fedtree.algorithms.clustering.clustered import clustered, split_clusters
from fedtree.algorithms.host.method import Host, method_over
from fedtree.core.algorithm import FederatedAlgorithm

__all__ = ["cfl", "split_clusters"]


@method_over(clustered, sets={"clustering": "CFL splits clusters by the cosine similarity of their updates"},
             drops=("num_clusters", "cluster_start_round", "kmeans_iters", "init"), bound=())
def cfl(host: Host, *, max_clusters: int = 4, split_start_round: int = 0,
        name: str = "cfl") -> FederatedAlgorithm:
  """CFL (:doc:`docs <algorithms/clustered.md#cfl>`).

  Args:
    model, data, local_optimizer, schedule: as in :func:`fedtree.algorithms.fedavg`.
    max_clusters: static number of cluster slots, in ``[1, num_clients]``.
    eps1: split only when the cluster's mean update norm is below this.
    eps2: ... and its largest client update norm is above this.
    min_split_size: reporting members a cluster needs to split (>= 2).
    split_start_round: no split in rounds ``<= split_start_round``.
    server_optimizer: per-cluster server optimizer (default ``sgd(1.0)``).
    cohort_size, chunk_size, weighting, client_update, name: as in FedAvg.
    compute_dtype, init_params, skip_nonfinite, update_paths: as in
      :func:`~fedtree.algorithms.clustering.clustered.clustered`.
    similarity_check: Sattler's ``γ_max < √((1 - α_max^cross)/2)`` before a split.
    inter_cluster: ``"none"`` (CFL), ``"awcfl"`` (β-mixing) or ``"mcfl"`` (selection).
    beta, feature_examples, metric: AWCFL's β; MCFL's ``n`` and distance.

  Example:
    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=2))
    >>> alg = cfl(max_clusters=2, local_optimizer=optax.sgd(0.1), **common)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> "cluster" in alg.models(state)
    True
  """
  if int(split_start_round) < 0:
    raise ValueError(f"split_start_round={split_start_round} must be >= 0")
  return host.build(clustering="cfl", num_clusters=max_clusters, cluster_start_round=int(split_start_round),
                    name=name)
