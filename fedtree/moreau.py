"""The Moreau-envelope personalization step of pFedMe (Dinh et al. 2020) and pFedMT (paper 003).

Both methods train a device model ``θ`` on ``f(θ) + (λ/2)‖θ - w‖²``, the objective inside the
Moreau envelope ``F(w) = min_θ f(θ) + (λ/2)‖θ - w‖²`` of the device loss ``f`` around a
reference model ``w`` (the team model in pFedMT, the local copy of the global model in
pFedMe). pFedMT's Algorithm 1, line 6, is one plain gradient step on it:

  ``θ ← θ - α ∇f(θ) - α λ (θ - w)``

:func:`moreau_step` is that step on a minibatch (``∇f`` is the masked cross-entropy gradient
of the batch), written as a :data:`fedtree.local.StepFn` so that
:func:`fedtree.local.run_local_steps` runs it for ``L`` steps with in-jit batching, and
:func:`moreau_client_update` wraps it into a :class:`fedtree.local.ClientUpdate` for
:func:`fedtree.tier.train_cohort`.

The step is one inner step of pFedMe's Moreau solver
(:func:`fedtree.objectives.moreau_solver` with ``inner_steps=1`` and ``personal_lr = α``):
both methods share one implementation of the equation.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import struct

from fedtree.local import Batch, ClientData, ClientUpdate, data_loss, proximal, run_local_steps
from fedtree.models import Model
from fedtree.objectives import moreau_solver

PyTree = Any


@struct.dataclass
class MoreauCarry:
  """State of the Moreau step.

  Attributes:
    params: the device model ``θ`` (model pytree).
    anchor: the reference model ``w`` the proximal term pulls towards (model pytree).
  """

  params: PyTree
  anchor: PyTree


def moreau_step(model: Model, *, learning_rate: float, lam: float):
  """``θ ← θ - α ∇f(θ; batch) - α λ (θ - w)`` as a :data:`fedtree.local.StepFn`.

  Args:
    model: the model whose masked cross-entropy is ``f``.
    learning_rate: ``α`` (> 0).
    lam: ``λ`` (>= 0), the Moreau-envelope regularization.

  Returns:
    ``step(carry: MoreauCarry, batch, rng) -> (carry, data loss)``.

  Raises:
    ValueError: ``learning_rate <= 0`` or ``lam < 0``.
  """
  solve = moreau_solver(model, lam=lam, inner_steps=1, personal_lr=learning_rate)

  def step(carry: MoreauCarry, batch: Batch, rng: jax.Array):
    params, loss = solve(carry.params, carry.anchor, batch, rng)
    return carry.replace(params=params), loss

  return step


def moreau_client_update(
  model: Model, *, learning_rate: float, lam: float, batch_size: int, max_steps: int
) -> ClientUpdate:
  """A device that starts from the received model ``w`` and takes :func:`moreau_step` steps.

  The client state is the device's personalized model (PM): it is overwritten by the model
  after the last local step (pass ``client_state=`` stacked params to ``train_cohort``).
  """
  step = moreau_step(model, learning_rate=learning_rate, lam=lam)

  def apply(anchor, state, data: ClientData, num_steps, key):
    del state
    carry, loss = run_local_steps(
      step, MoreauCarry(params=anchor, anchor=anchor), data, num_steps, key,
      batch_size=batch_size, max_steps=max_steps,
    )
    return carry.params, carry.params, loss

  return ClientUpdate(apply=apply)


def moreau_objective(model: Model, params: PyTree, anchor: PyTree, batch: Batch, *, lam: float,
                     rng: jax.Array | None = None) -> jax.Array:
  """``f(θ; batch) + (λ/2)‖θ - w‖²`` (for tests and diagnostics)."""
  return data_loss(model, params, batch, rng) + proximal(lam)(params, anchor)
