"""Ditto (Li et al. 2021): a persistent personal model ``v_i`` trained on
``f_i(v) + (λ/2)‖v - Θ‖²`` whenever the client is sampled, next to plain local training of the
model sent up. ``v_i`` is the client state, stacked ``[C, ...]``. (Choice: the personal model
takes as many steps as the local schedule gives the global model.)
"""

from __future__ import annotations

from typing import Any

import optax
from flax import struct

from fedtree.core.checks import check_nonnegative
from fedtree.core.local import (
  ClientData,
  ClientUpdate,
  SGDCarry,
  make_sgd_step,
  proximal,
  run_local_steps,
  stack,
)
from fedtree.core.model import Model
from fedtree.core.rng import stream

PyTree = Any


@struct.dataclass
class DittoState:
  """Ditto's persistent client state.

  Attributes:
    personal: ``[C, ...]`` personal models ``v_i`` (one per client when stacked).
  """

  personal: PyTree


def ditto_update(
  model: Model,
  optimizer: optax.GradientTransformation,
  *,
  lam: float,
  batch_size: int,
  max_steps: int,
  personal_optimizer: optax.GradientTransformation | None = None,
  compute_dtype=None,
) -> ClientUpdate:
  """Ditto: plain local training of the model sent up, and the personal model ``v_i`` trained
  on ``f_i(v) + (λ/2)‖v - Θ‖²`` towards the downloaded ``Θ`` (same number of steps).

  Args:
    model: the model.
    optimizer: local optimizer of the global-model training.
    lam: Ditto's λ >= 0 (0: purely local personal models).
    batch_size: minibatch size.
    max_steps: static scan length.
    personal_optimizer: optimizer of ``v_i`` (default ``optimizer``).
    compute_dtype: mixed-precision local steps of both models (``None``: the params' dtype).

  The personal models ``v_i`` are the update's ``personal_models``.
  """
  check_nonnegative(lam=lam)
  personal_optimizer = optimizer if personal_optimizer is None else personal_optimizer
  global_step = make_sgd_step(model, optimizer, compute_dtype=compute_dtype)
  personal_step = make_sgd_step(model, personal_optimizer, proximal(lam), compute_dtype=compute_dtype)

  def apply(anchor, state: DittoState, data: ClientData, num_steps, key):
    carry = SGDCarry(params=anchor, opt_state=optimizer.init(anchor), anchor=anchor)
    carry, loss = run_local_steps(
      global_step, carry, data, num_steps, stream(key, "global"), batch_size=batch_size,
      max_steps=max_steps,
    )
    v = state.personal
    pcarry = SGDCarry(params=v, opt_state=personal_optimizer.init(v), anchor=anchor)
    pcarry, _ = run_local_steps(
      personal_step, pcarry, data, num_steps, stream(key, "personal"), batch_size=batch_size,
      max_steps=max_steps,
    )
    return carry.params, DittoState(personal=pcarry.params), loss

  def init_state(params, num_clients):
    return DittoState(personal=stack(params, num_clients))

  return ClientUpdate(apply=apply, init_state=init_state, personal_models=lambda state: state.personal,
                      model_state=True)
