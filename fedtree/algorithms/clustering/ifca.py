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

import optax

from fedtree.algorithms.clustering.clustered import INITS, cluster_losses, clustered
from fedtree.core.algorithm import FederatedAlgorithm, PyTree
from fedtree.core.data import FederatedData
from fedtree.core.local import ClientUpdate, LocalSchedule
from fedtree.core.model import Model
from fedtree.core.updates import UpdatePath

__all__ = ["INITS", "cluster_losses", "ifca"]


def ifca(
  *,
  model: Model,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule,
  num_clusters: int,
  init: str = "random",
  server_optimizer: optax.GradientTransformation | None = None,
  cohort_size: int | None = None,
  chunk_size: int | str | None = "auto",
  weighting: str = "examples",
  client_update: ClientUpdate | None = None,
  compute_dtype: str | None = None,
  init_params: PyTree | None = None,
  inter_cluster: str = "none",
  beta: float = 0.5,
  feature_examples: int | None = None,
  metric: str = "l2",
  skip_nonfinite: bool = False,
  update_paths: UpdatePath | None = None,
  name: str = "ifca",
) -> FederatedAlgorithm:
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

    >>> import jax, optax
    >>> from fedtree.core import loop
    >>> from fedtree.core.local import LocalSchedule
    >>> from fedtree.datasets.synthetic import grouped_synthetic
    >>> from fedtree.models import build_model
    >>> data, groups = grouped_synthetic(group_sizes=(3, 2), dim=8, num_classes=3)
    >>> model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=1))
    >>> alg = ifca(num_clusters=2, local_optimizer=optax.sgd(0.1), **common)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    [...]
  """
  return clustered(
    model=model, data=data, local_optimizer=local_optimizer, schedule=schedule, num_clusters=num_clusters,
    clustering="ifca", inter_cluster=inter_cluster, beta=beta, init=init, feature_examples=feature_examples,
    metric=metric, server_optimizer=server_optimizer, cohort_size=cohort_size, chunk_size=chunk_size,
    weighting=weighting, client_update=client_update, compute_dtype=compute_dtype, init_params=init_params,
    skip_nonfinite=skip_nonfinite, update_paths=update_paths, name=name,
  )
