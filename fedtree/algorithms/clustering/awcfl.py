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

``clustering="cfl"`` or ``"ifca"`` applies the same β-mixing to CFL's or IFCA's clusters
(paper 004's AWCFL_CFL and AWCFL_IFCA, Figs. 5, 7, 8): see
:mod:`fedtree.algorithms.clustering.clustered`, where the round lives.
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
  """AWCFL (module docstring); β = 0 is plain clustered FL.

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
