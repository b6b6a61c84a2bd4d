"""Ditto (Li et al. 2021, "Ditto: fair and robust federated learning through
personalization") on any tree.

Each sampled client trains the downloaded model as usual (sent up, aggregated by
:func:`~fedtree.algorithms.hierfavg.hierfavg` under any tree and server optimizers) and its
persistent personal model ``v_i`` on ``f_i(v) + (λ/2)‖v - Θ‖²``
(:func:`fedtree.objectives.ditto_update`). ``v_i`` lives in ``TreeState.client_state`` as
``DittoState.personal [C, ...]``; clients that are not sampled keep theirs untouched.
Models evaluated: the tree's models and ``personal`` (client ``c`` scored with ``v_c``; the
objective declares them, :attr:`fedtree.core.local.ClientUpdate.personal_models`).
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
from fedtree.objectives import ditto_update


def ditto(
  *,
  model: Model,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule,
  lam: float,
  personal_optimizer: optax.GradientTransformation | None = None,
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
  name: str = "ditto",
) -> FederatedAlgorithm:
  """Ditto with regularization ``lam`` (λ >= 0) on ``topology`` (default flat).

  Args:
    model, data, local_optimizer, schedule: as for :func:`~fedtree.algorithms.hierfavg.hierfavg`.
    lam: Ditto's λ.
    personal_optimizer: optimizer of the personal models (default the local optimizer).
    topology: the tree (``None``: one server over all clients).
    server_optimizers, periods, cohort_size, chunk_size, weighting: as for
      :func:`~fedtree.algorithms.hierfavg.hierfavg`.
    init_params, skip_nonfinite, update_paths: as for :func:`~fedtree.algorithms.hierfavg.hierfavg`.
    compute_dtype: mixed-precision local steps (``None``: the params' dtype).
    name: label for reports.

  Example:
    One round of Ditto (λ = 0.1): a global model and a personal model per client:

    >>> import jax, optax
    >>> from fedtree.core import loop
    >>> from fedtree.core.local import LocalSchedule
    >>> from fedtree.datasets.synthetic import grouped_synthetic
    >>> from fedtree.models import build_model
    >>> data, groups = grouped_synthetic(group_sizes=(3, 2), dim=8, num_classes=3)
    >>> model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=1))
    >>> alg = ditto(lam=0.1, local_optimizer=optax.sgd(0.1), **common)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    [...]
  """
  return with_objective(
    functools.partial(ditto_update, model, local_optimizer, lam=lam, personal_optimizer=personal_optimizer,
                      compute_dtype=compute_dtype),
    model=model, data=data, local_optimizer=local_optimizer, schedule=schedule, topology=topology,
    server_optimizers=server_optimizers, periods=periods, cohort_size=cohort_size,
    chunk_size=chunk_size, weighting=weighting, init_params=init_params,
    skip_nonfinite=skip_nonfinite, update_paths=update_paths, name=name,
  )
