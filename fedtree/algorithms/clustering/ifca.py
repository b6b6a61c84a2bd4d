"""IFCA (Ghosh et al. 2020): every client trains the cluster model of lowest loss on its data
(model-averaging variant), a baseline of paper 004.

The round: :doc:`IFCA on the clustered-FL page <algorithms/clustered.md#ifca>`.

References:
  Ghosh, Chung, Yin and Ramchandran, An efficient framework for clustered federated learning,
  NeurIPS 2020.
"""

from __future__ import annotations

from fedtree.algorithms.clustering.clustered import INITS, cluster_losses, clustered
from fedtree.algorithms.host.method import Host, method_over
from fedtree.core.algorithm import FederatedAlgorithm

__all__ = ["INITS", "cluster_losses", "ifca"]


@method_over(clustered, sets={"clustering": "IFCA picks each client's cluster by its loss"},
             drops=("cluster_start_round", "kmeans_iters", "eps1", "eps2", "min_split_size",
                    "similarity_check"), bound=())
def ifca(host: Host, *, init: str = "random", name: str = "ifca") -> FederatedAlgorithm:
  """IFCA (:doc:`docs <algorithms/clustered.md#ifca>`).

  Args:
    model, data, local_optimizer, schedule: as in :func:`fedtree.algorithms.fedavg`.
    num_clusters: ``k``, in ``[1, num_clients]``.
    init: ``"random"`` (independent initial models) or ``"same"``.
    server_optimizer: per-cluster server optimizer (default ``sgd(1.0)``).
    cohort_size, chunk_size, weighting, client_update, name: as in FedAvg.
    compute_dtype, init_params, skip_nonfinite, update_paths: as in
      :func:`~fedtree.algorithms.clustering.clustered.clustered`.
    inter_cluster: ``"none"`` (IFCA), ``"awcfl"`` (β-mixing) or ``"mcfl"`` (selection).
    beta, feature_examples, metric: AWCFL's β; MCFL's ``n`` and distance.

  Example:
    One round of IFCA with 2 cluster models:

    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=1))
    >>> alg = ifca(num_clusters=2, local_optimizer=optax.sgd(0.1), **common)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    [...]
  """
  return host.build(clustering="ifca", init=init, name=name)
