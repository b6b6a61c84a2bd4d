"""CFL: clustered federated learning by recursive bipartition (Sattler, Müller & Samek 2020,
"Clustered federated learning: model-agnostic distributed multitask optimization under
privacy constraints", IEEE TNNLS); a baseline of paper 004.

All clients start in one cluster. One round: every sampled client trains from its cluster's
model ``θ_c`` and reports its update ``Δθ_i = θ_i - θ_c`` (flattened). For every cluster
with at least ``min_split_size`` reporting members,

* ``mean_norm = ‖Σ_i p_i Δθ_i‖`` (weighted by ``weighting``), ``max_norm = max_i ‖Δθ_i‖``;
* if ``mean_norm < eps1`` and ``max_norm > eps2`` (the federation is near a stationary
  point of the joint objective but some clients are not: their distributions disagree),
  the cluster's reporting members are split in two by complete-linkage agglomerative
  clustering of the cosine similarities of their updates
  (:func:`fedtree.algorithms.clustering.ops.cosine_bipartition`); the second half moves to a fresh cluster
  slot.

Every cluster (old and new) then aggregates its members' updates onto the model they
started from: ``θ_k ← θ_origin(k) - opt(Σ_i p_i (θ_origin - θ_i))`` (``sgd(1.0)``: FedAvg per
cluster; a new cluster inherits its origin's model and server-optimizer state).

Fixed shapes: there are ``max_clusters`` static slots and ``num_clusters`` (``int32[]``) are
in use; a split is a masked array operation inside the jitted round, every eligible cluster
splits in the same round (lowest ids first) while free slots remain. Choices (marked):
members of a splitting cluster that did not report this round stay in the original cluster
(Sattler et al. assume full participation); Sattler's check that the split separates,
``γ_max < √((1 - α_max^cross)/2)`` (``similarity_check``, on by default; ``γ_max``
estimated from the round's updates, see :mod:`fedtree.algorithms.clustering.clustered`);
splitting only starts after ``split_start_round`` rounds. With ``inter_cluster`` the same
clusters take AWCFL's mixing or MCFL's selection (paper 004's AWCFL_CFL / MCFL_CFL; or use
``awcfl(clustering="cfl")`` / ``mcfl(clustering="cfl")``).
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
  """CFL (module docstring).

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
