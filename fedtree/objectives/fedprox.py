"""FedProx (Li et al. 2020): ``f_i(θ) + (μ/2)‖θ - Θ‖²`` from the downloaded ``Θ``."""

from __future__ import annotations

import optax

from fedtree.core.checks import check_nonnegative
from fedtree.core.local import ClientUpdate, proximal, sgd_client_update
from fedtree.core.model import Model


def fedprox_update(
  model: Model, optimizer: optax.GradientTransformation, *, mu: float, batch_size: int,
  max_steps: int,
) -> ClientUpdate:
  """FedProx local training: ``f_i(θ) + (μ/2)‖θ - Θ‖²`` from the downloaded ``Θ``."""
  check_nonnegative(mu=mu)
  return sgd_client_update(
    model, optimizer, batch_size=batch_size, max_steps=max_steps, regularizer=proximal(mu)
  )
