"""FedProx (Li et al. 2020, "Federated optimization in heterogeneous networks") on any tree.

Clients minimize ``f_i(θ) + (μ/2)‖θ - Θ‖²`` from the downloaded ``Θ``
(:func:`fedtree.objectives.fedprox_update`); everything above the clients is
:func:`~fedtree.algorithms.hierfavg.hierfavg`, so FedProx runs under any tree and any server
optimizers (a flat tree and FedAvg servers give the original method). ``μ = 0`` is FedAvg.
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
from fedtree.objectives import fedprox_update


def fedprox(
  *,
  model: Model,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule,
  mu: float,
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
  name: str = "fedprox",
) -> FederatedAlgorithm:
  """FedProx with proximal weight ``mu`` on ``topology`` (default flat).

  Args:
    model, data, local_optimizer, schedule: as for :func:`~fedtree.algorithms.hierfavg.hierfavg`.
    mu: μ >= 0.
    topology: the tree (``None``: one server over all clients).
    server_optimizers, periods, cohort_size, chunk_size, weighting: as for
      :func:`~fedtree.algorithms.hierfavg.hierfavg`.
    init_params, skip_nonfinite, update_paths: as for :func:`~fedtree.algorithms.hierfavg.hierfavg`.
    compute_dtype: mixed-precision local steps (``None``: the params' dtype).
    name: label for reports.

  Example:
    One round of FedProx (μ = 0.01) over 5 clients:

    >>> import jax, optax
    >>> from fedtree.core import loop
    >>> from fedtree.core.local import LocalSchedule
    >>> from fedtree.datasets.synthetic import grouped_synthetic
    >>> from fedtree.models import build_model
    >>> data, groups = grouped_synthetic(group_sizes=(3, 2), dim=8, num_classes=3)
    >>> model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=1))
    >>> alg = fedprox(mu=0.01, local_optimizer=optax.sgd(0.1), **common)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['global']
  """
  return with_objective(
    functools.partial(fedprox_update, model, local_optimizer, mu=mu, compute_dtype=compute_dtype),
    model=model, data=data, local_optimizer=local_optimizer, schedule=schedule, topology=topology,
    server_optimizers=server_optimizers, periods=periods, cohort_size=cohort_size,
    chunk_size=chunk_size, weighting=weighting, init_params=init_params,
    skip_nonfinite=skip_nonfinite, update_paths=update_paths, name=name,
  )
