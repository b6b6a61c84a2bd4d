"""FedProx (Li et al. 2020): ``f_i(θ) + (μ/2)‖θ - Θ‖²`` from the downloaded ``Θ``."""

from __future__ import annotations

import optax

from fedtree.core.checks import check_nonnegative
from fedtree.core.local import ClientUpdate, proximal, sgd_client_update
from fedtree.core.model import Model


def fedprox_update(
  model: Model, optimizer: optax.GradientTransformation, *, mu: float, batch_size: int,
  max_steps: int, compute_dtype=None, persistent: bool = False,
) -> ClientUpdate:
  """FedProx local training: ``f_i(θ) + (μ/2)‖θ - Θ‖²`` towards the downloaded ``Θ``.

  Args:
    model: the model.
    optimizer: the local optimizer.
    mu: μ >= 0.
    batch_size: minibatch size.
    max_steps: static scan length.
    compute_dtype: mixed-precision local steps (``None``: the params' dtype).
    persistent: start from the client's own persistent model instead of ``Θ`` (B-HFL's
      clients; ``Θ`` is then only what the proximal term pulls towards).
  """
  check_nonnegative(mu=mu)
  return sgd_client_update(
    model, optimizer, batch_size=batch_size, max_steps=max_steps, regularizer=proximal(mu),
    compute_dtype=compute_dtype, persistent=persistent,
  )
