"""pFedMe (Dinh et al. 2020, "Personalized federated learning with Moreau envelopes") on any
tree.

Client (:func:`fedtree.objectives.pfedme_update`): ``R`` local rounds (the local schedule's
steps), each solving ``θ̂ ≈ argmin_θ f_i(θ; batch) + (λ/2)‖θ - w‖²`` by ``K`` inner steps
of rate ``personal_lr`` and then ``w ← w - η λ (w - θ̂)``; ``w`` is sent up. Server:
``Θ ← (1-β)Θ + β·mean(w_i)``, which is ``Θ - β·Δ`` with the pseudo-gradient
``Δ = Θ - mean(w_i)``: exactly ``optax.sgd(β)`` as the leaf-parent server optimizer (upper
levels of a deeper tree default to FedAvg). The personal models ``θ̂_i`` live in
``TreeState.client_state`` (``PFedMeState.personal [C, ...]``). Models evaluated: the tree's
models and ``personal``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import optax

from fedtree.algorithms.hierfavg import with_objective
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.checks import check_positive
from fedtree.core.data import FederatedData
from fedtree.core.local import LocalSchedule
from fedtree.core.model import Model
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath
from fedtree.objectives.moreau import pfedme_update


def pfedme(
  *,
  model: Model,
  data: FederatedData,
  schedule: LocalSchedule,
  lam: float,
  inner_steps: int,
  personal_lr: float,
  learning_rate: float,
  beta: float = 1.0,
  local_optimizer: optax.GradientTransformation | None = None,
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
  name: str = "pfedme",
) -> FederatedAlgorithm:
  """pFedMe on ``topology`` (default flat).

  Args:
    model, data, schedule: as for :func:`~fedtree.algorithms.hierfavg.hierfavg`.
    lam: λ > 0 of the Moreau envelope.
    inner_steps: K inner steps per local round.
    personal_lr: rate of the inner steps.
    learning_rate: η, the clients' rate of ``w``.
    beta: β > 0, the server's mixing (``β = 1``: FedAvg of the ``w_i``).
    local_optimizer: unused (pFedMe's steps are its own); accepted so that every
      HierFAVG-based factory takes the same arguments.
    topology: the tree (``None``: flat).
    server_optimizers: override (default FedAvg above, ``sgd(β)`` at the leaf parents).
    periods, cohort_size, chunk_size, weighting, init_params, skip_nonfinite, update_paths: as for
      :func:`~fedtree.algorithms.hierfavg.hierfavg`.
    compute_dtype: mixed-precision inner steps (``None``: the params' dtype).
    name: label for reports.

  Example:
    One round of pFedMe (λ = 15, K = 2 inner steps):

    >>> import jax, optax
    >>> from fedtree.core import loop
    >>> from fedtree.core.local import LocalSchedule
    >>> from fedtree.datasets.synthetic import grouped_synthetic
    >>> from fedtree.models import build_model
    >>> data, groups = grouped_synthetic(group_sizes=(3, 2), dim=8, num_classes=3)
    >>> model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=1))
    >>> alg = pfedme(lam=15.0, inner_steps=2, personal_lr=0.05, learning_rate=0.05, **common)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    [...]
  """
  check_positive(beta=beta)
  if server_optimizers is None:
    depth = 1 if topology is None else topology.depth
    server_optimizers = (optax.sgd(1.0),) * (depth - 1) + (optax.sgd(beta),)
  return with_objective(
    functools.partial(pfedme_update, model, lam=lam, inner_steps=inner_steps, personal_lr=personal_lr,
                      learning_rate=learning_rate, compute_dtype=compute_dtype),
    model=model, data=data, local_optimizer=local_optimizer, schedule=schedule, topology=topology,
    server_optimizers=server_optimizers, periods=periods, cohort_size=cohort_size,
    chunk_size=chunk_size, weighting=weighting, init_params=init_params,
    skip_nonfinite=skip_nonfinite, update_paths=update_paths, name=name,
  )
