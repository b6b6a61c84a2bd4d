"""IFCA: the iterative federated clustering algorithm (Ghosh et al. 2020, "An efficient
framework for clustered federated learning", NeurIPS), model-averaging variant; a baseline
of paper 004.

``k`` cluster models, initialized independently (``init="random"``: model ``j`` from
``fold_in(key, j)``, as IFCA's random initialization) or all equal (``init="same"``). One
round: every sampled client computes the loss of all ``k`` models on its whole training data
(masked mean cross-entropy), picks ``ĵ = argmin_j loss_j`` (lowest index on ties), trains
that model locally, and the server averages the trained models per cluster: the cohort's
parent index *is* ``ĵ``, so this is :func:`fedtree.core.tier.train_cohort` followed by a
per-cluster server step (``sgd(1.0)``: FedAvg inside each cluster). A cluster nobody picked
keeps its model. The last pick of every client is kept (``int32[C]``, 0 before its first
round) and is the model it is evaluated with. With ``inter_cluster`` the same clusters take
AWCFL's mixing or MCFL's selection (paper 004's AWCFL_IFCA / MCFL_IFCA, Figs. 7-8;
:mod:`fedtree.algorithms.clustering.clustered`).
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
  """IFCA (module docstring).

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
