"""FedMMD (Yao et al. 2018, "Two-stream federated learning: reduce the communication costs";
a baseline of FedKWS-UI, paper 002) on any tree.

Clients minimize ``f_i(θ) + λ MMD²(φ_θ(x), φ_Θ(x))``, an MMD penalty between the features of
the model trained and of the downloaded ``Θ`` (:func:`fedtree.objectives.fedmmd_update`);
everything above the clients is :func:`~fedtree.algorithms.hierfavg.hierfavg`, so FedMMD runs
under any tree and any server optimizers (a flat tree and FedAvg servers give the original
method). ``λ = 0`` is FedAvg.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import optax

from fedtree.algorithms.hierfavg import with_objective
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.data import FederatedData
from fedtree.core.local import LocalSchedule
from fedtree.core.model import Model
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath
from fedtree.objectives.fedmmd import check_features, fedmmd_update


def fedmmd(
  *,
  model: Model,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule,
  lam: float,
  kernel: str = "gaussian",
  num_kernels: int = 5,
  kernel_mul: float = 2.0,
  bandwidth: float | None = None,
  topology: Topology | None = None,
  server_optimizers: optax.GradientTransformation | Sequence[optax.GradientTransformation] | None = None,
  periods: int | Sequence[int] | None = None,
  cohort_size: int | Sequence[int] | None = None,
  chunk_size: int | str | None = "auto",
  weighting: str = "examples",
  compute_dtype: str | None = None,
  init_params: Any = None,
  skip_nonfinite: bool = False,
  update_paths: UpdatePath | dict[int, UpdatePath] | None = None,
  name: str = "fedmmd",
) -> FederatedAlgorithm:
  """FedMMD with penalty weight ``lam`` on ``topology`` (default flat).

  Args:
    model, data, local_optimizer, schedule: as for :func:`~fedtree.algorithms.hierfavg.hierfavg`;
      the model must have features (:func:`fedtree.objectives.fedmmd.check_features`).
    lam: λ >= 0.
    kernel, num_kernels, kernel_mul, bandwidth: the MMD kernel
      (:func:`fedtree.objectives.fedmmd.mmd2`).
    topology: the tree (``None``: one server over all clients).
    server_optimizers, periods, cohort_size, chunk_size, weighting: as for
      :func:`~fedtree.algorithms.hierfavg.hierfavg`.
    init_params, skip_nonfinite, update_paths: as for :func:`~fedtree.algorithms.hierfavg.hierfavg`.
    compute_dtype: mixed-precision local steps (``None``: the params' dtype).
    name: label for reports.

  Raises:
    ValueError: a bad hyperparameter, or a model without features.

  Example:
    One round of FedMMD (λ = 0.01) over 5 clients with an MLP (features: its hidden layer):

    >>> import jax, optax
    >>> from fedtree.core import loop
    >>> from fedtree.core.local import LocalSchedule
    >>> from fedtree.datasets.synthetic import grouped_synthetic
    >>> from fedtree.models import build_model
    >>> data, groups = grouped_synthetic(group_sizes=(3, 2), dim=8, num_classes=3)
    >>> model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(8,))
    >>> alg = fedmmd(model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...              schedule=LocalSchedule(batch_size=8, steps=1), lam=0.01)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['global']
  """
  check_features(model, data.example_shape)
  return with_objective(
    functools.partial(fedmmd_update, model, local_optimizer, lam=lam, kernel=kernel, num_kernels=num_kernels,
                      kernel_mul=kernel_mul, bandwidth=bandwidth, compute_dtype=compute_dtype),
    model=model, data=data, local_optimizer=local_optimizer, schedule=schedule, topology=topology,
    server_optimizers=server_optimizers, periods=periods, cohort_size=cohort_size,
    chunk_size=chunk_size, weighting=weighting, init_params=init_params,
    skip_nonfinite=skip_nonfinite, update_paths=update_paths, name=name,
  )
