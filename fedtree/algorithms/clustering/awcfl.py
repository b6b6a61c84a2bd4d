"""AWCFL, adaptive weighted clustered FL (paper 004: Li & Yan 2023): every cluster model mixes in the
other clusters' means.

The round and the choices where the paper is vague: :doc:`AWCFL on the clustered-FL page
<algorithms/clustered.md#awcfl>`.

References:
  Li and Yan, Inter-cluster optimization for clustered federated learning, Computer Science
  50(11A), 2023 (Algorithm 1).
"""

from __future__ import annotations

from fedtree.algorithms.clustering.clustered import check_beta, clustered, mix_clusters
from fedtree.algorithms.host.method import Host, method_over
from fedtree.core.algorithm import FederatedAlgorithm

__all__ = ["awcfl", "check_beta", "mix_clusters"]


@method_over(clustered, sets={"inter_cluster": "AWCFL mixes its clusters' models by beta"},
             drops=("metric",), bound=())
def awcfl(host: Host, *, beta: float = 0.5, cluster_start_round: int | None = None,
          name: str = "awcfl") -> FederatedAlgorithm:
  """AWCFL (:doc:`docs <algorithms/clustered.md#awcfl>`); β = 0 is plain clustered FL.

  Args:
    model: the model every cluster holds.
    data: the federated data (static shapes; MCFL's test-feature means).
    local_optimizer: the clients' optax optimizer.
    schedule: local epochs or steps, and batch size.
    num_clusters: ``n``, the number of clusters (static), in ``[1, num_clients]`` (with
      ``clustering="cfl"``: the most clusters CFL may form).
    beta: β in ``[0, 1]``, the weight of the other clusters.
    cluster_start_round: rounds of plain FedAvg before clustering starts (default 20; 0 and
      nothing else with ``clustering="ifca"``).
    kmeans_iters: Lloyd iterations of the K-means.
    server_optimizer: applied per cluster to ``c_k - target_k`` (default ``sgd(1.0)``).
    cohort_size: clients sampled per round (``None``: all).
    chunk_size: clients trained at once (an int, ``None``: the whole cohort, ``"auto"``: the
      per-backend default).
    weighting: ``"examples"`` or ``"uniform"`` (the paper's plain mean).
    client_update: override the local training (stateless).
    compute_dtype, init_params, skip_nonfinite, update_paths: as in
      :func:`~fedtree.algorithms.clustering.clustered.clustered`.
    feature_examples: when set, clients also upload the mean of this many training inputs
      and the state keeps MCFL's :class:`~fedtree.algorithms.clustering.ops.ClusterFeatures`.
    clustering: ``"kmeans"`` (the paper's AWCFL), ``"cfl"`` (AWCFL_CFL) or ``"ifca"``
      (AWCFL_IFCA).
    eps1, eps2, min_split_size, similarity_check: CFL's split criterion (``clustering="cfl"``).
    init: IFCA's initial models (``clustering="ifca"``): ``"random"`` or ``"same"``.
    name: label for reports.

  Raises:
    ValueError: ``num_clusters`` outside ``[1, C]``, β outside ``[0, 1]``, negative
      ``cluster_start_round``, ``kmeans_iters < 1``, an unknown ``clustering``.

  Example:
    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=2))
    >>> alg = awcfl(num_clusters=2, beta=0.5, cluster_start_round=0, local_optimizer=optax.sgd(0.1), **common)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> "cluster" in alg.models(state)
    True
  """
  if cluster_start_round is None:
    cluster_start_round = 0 if host.get("clustering") == "ifca" else 20
  return host.build(inter_cluster="awcfl", beta=beta, cluster_start_round=cluster_start_round, name=name)
