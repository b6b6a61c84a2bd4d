"""Moreau-envelope objectives: pFedMe (Dinh et al. 2020) and pFedMT's device step (paper 003).

Both train a personal model ``θ`` on ``f(θ) + (λ/2)‖θ - w‖²``, the objective inside the
Moreau envelope ``F(w) = min_θ f(θ) + (λ/2)‖θ - w‖²`` of the client loss ``f`` around a
reference model ``w``; one implementation of that step serves both:

* :func:`moreau_solver`: ``K`` inner steps ``θ ← θ - ν (∇f(θ; batch) + λ (θ - w))`` on one
  minibatch, the approximate prox.
* :func:`pfedme_update`: per local round, :func:`moreau_solver`, then
  ``w ← w - η λ (w - θ̂)``; ``w`` is sent up and ``θ̂_i`` (the personal model) is the client
  state. (Choice, as the authors' code: ``θ`` starts every round from the downloaded model,
  is warm-started across the ``R`` local rounds, and the ``K`` inner steps share a minibatch.)
* :func:`moreau_step` / :func:`moreau_client_update`: pFedMT's Algorithm 1, line 6,
  ``θ ← θ - α ∇f(θ) - α λ (θ - w)``, which is exactly one inner step of
  :func:`moreau_solver` with ``ν = α``; the device keeps its personalized model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from fedtree.core.checks import check_nonnegative, check_positive
from fedtree.core.local import (
  Batch,
  ClientData,
  ClientUpdate,
  data_loss,
  make_data_loss,
  proximal,
  run_local_steps,
  stack,
)
from fedtree.core.model import Model

PyTree = Any


MoreauSolver = Callable[[PyTree, PyTree, Batch, jax.Array], tuple[PyTree, jax.Array]]


def moreau_solver(
  model: Model, *, lam: float, inner_steps: int, personal_lr: float, compute_dtype=None
) -> MoreauSolver:
  """Approximate prox of the minibatch loss: ``θ̂ ≈ argmin_θ f(θ; batch) + (λ/2)‖θ - w‖²``.

  Returns ``solve(theta, w, batch, rng) -> (θ̂, mean data loss over the inner steps)``, which
  runs ``inner_steps`` gradient steps ``θ ← θ - personal_lr (∇f(θ; batch) + λ (θ - w))``
  from ``theta`` on one minibatch. pFedMe calls it with ``K`` inner steps; pFedMT's device
  step ``θ ← θ - α∇f(θ) - αλ(θ - w)`` is exactly one inner step with ``personal_lr = α``.
  ``compute_dtype``: the loss's forward/backward in that dtype (mixed precision).
  """
  loss_fn = make_data_loss(model, compute_dtype)
  check_nonnegative(lam=lam)
  check_positive(personal_lr=personal_lr)
  if int(inner_steps) < 1:
    raise ValueError(f"inner_steps={inner_steps} must be >= 1")
  inner_steps = int(inner_steps)

  def solve(theta, w, batch: Batch, rng):
    def body(th, k):
      loss, g = jax.value_and_grad(loss_fn)(th, batch, jax.random.fold_in(rng, k))
      th = jax.tree.map(lambda t, gg, ww: t - personal_lr * (gg + lam * (t - ww)), th, g, w)
      return th, loss

    theta, losses = jax.lax.scan(body, theta, jnp.arange(inner_steps))
    return theta, jnp.mean(losses)

  return solve


@struct.dataclass
class PFedMeState:
  """pFedMe's persistent client state.

  Attributes:
    personal: ``[C, ...]`` the personal models ``θ̂_i`` after each client's last local round.
  """

  personal: PyTree


class PFedMeCarry(NamedTuple):
  """Local state of pFedMe: personal ``theta`` and local ``w`` (both shaped like params)."""

  theta: PyTree
  w: PyTree


def pfedme_update(
  model: Model,
  *,
  lam: float,
  inner_steps: int,
  personal_lr: float,
  learning_rate: float,
  batch_size: int,
  max_steps: int,
  compute_dtype=None,
) -> ClientUpdate:
  """pFedMe's client: every local round (a step of the schedule) solves the Moreau problem
  on a minibatch with :func:`moreau_solver`, then ``w ← w - η λ (w - θ̂)``; sends ``w`` up.

  Args:
    model: the model.
    lam: λ of the Moreau envelope (> 0; with λ = 0 ``w`` would never move).
    inner_steps: K inner steps per local round.
    personal_lr: the inner steps' learning rate.
    learning_rate: η, the local learning rate of ``w``.
    batch_size: minibatch size.
    max_steps: static scan length (the schedule gives R local rounds).
    compute_dtype: mixed-precision inner steps (``None``: the params' dtype).

  The personal models ``θ̂_i`` are the update's ``personal_models``.
  """
  check_positive(lam=lam, learning_rate=learning_rate)
  solve = moreau_solver(model, lam=lam, inner_steps=inner_steps, personal_lr=personal_lr,
                        compute_dtype=compute_dtype)

  def step(carry: PFedMeCarry, batch: Batch, rng):
    theta, loss = solve(carry.theta, carry.w, batch, rng)
    w = jax.tree.map(lambda ww, t: ww - learning_rate * lam * (ww - t), carry.w, theta)
    return PFedMeCarry(theta=theta, w=w), loss

  def apply(anchor, state: PFedMeState, data: ClientData, num_steps, key):
    carry = PFedMeCarry(theta=anchor, w=anchor)
    carry, loss = run_local_steps(
      step, carry, data, num_steps, key, batch_size=batch_size, max_steps=max_steps
    )
    # A client with no active step keeps its previous personal model.
    theta = jax.tree.map(
      lambda new, old: jnp.where(num_steps > 0, new, old), carry.theta, state.personal
    )
    return carry.w, PFedMeState(personal=theta), loss

  def init_state(params, num_clients):
    return PFedMeState(personal=stack(params, num_clients))

  return ClientUpdate(apply=apply, init_state=init_state, personal_models=lambda state: state.personal)


@struct.dataclass
class MoreauCarry:
  """State of the Moreau step.

  Attributes:
    params: the device model ``θ`` (model pytree).
    anchor: the reference model ``w`` the proximal term pulls towards (model pytree).
  """

  params: PyTree
  anchor: PyTree


def moreau_step(model: Model, *, learning_rate: float, lam: float, compute_dtype=None):
  """``θ ← θ - α ∇f(θ; batch) - α λ (θ - w)`` as a :data:`fedtree.core.local.StepFn`.

  Args:
    model: the model whose masked cross-entropy is ``f``.
    learning_rate: ``α`` (> 0).
    lam: ``λ`` (>= 0), the Moreau-envelope regularization.
    compute_dtype: mixed-precision steps (``None``: the params' dtype).

  Returns:
    ``step(carry: MoreauCarry, batch, rng) -> (carry, data loss)``.

  Raises:
    ValueError: ``learning_rate <= 0`` or ``lam < 0``.
  """
  solve = moreau_solver(model, lam=lam, inner_steps=1, personal_lr=learning_rate,
                        compute_dtype=compute_dtype)

  def step(carry: MoreauCarry, batch: Batch, rng: jax.Array):
    params, loss = solve(carry.params, carry.anchor, batch, rng)
    return carry.replace(params=params), loss

  return step


def moreau_client_update(
  model: Model, *, learning_rate: float, lam: float, batch_size: int, max_steps: int,
  compute_dtype=None,
) -> ClientUpdate:
  """A device that starts from the received model ``w`` and takes :func:`moreau_step` steps.

  The client state is the device's personalized model (PM, stacked ``[C, ...]`` by
  ``init_state``, and the update's ``personal_models``): it is overwritten by the model after
  the last local step.
  """
  step = moreau_step(model, learning_rate=learning_rate, lam=lam, compute_dtype=compute_dtype)

  def apply(anchor, state, data: ClientData, num_steps, key):
    del state
    carry, loss = run_local_steps(
      step, MoreauCarry(params=anchor, anchor=anchor), data, num_steps, key,
      batch_size=batch_size, max_steps=max_steps,
    )
    return carry.params, carry.params, loss

  return ClientUpdate(apply=apply, init_state=stack, personal_models=lambda state: state)


def moreau_objective(model: Model, params: PyTree, anchor: PyTree, batch: Batch, *, lam: float,
                     rng: jax.Array | None = None) -> jax.Array:
  """``f(θ; batch) + (λ/2)‖θ - w‖²`` (for tests and diagnostics)."""
  return data_loss(model, params, batch, rng) + proximal(lam)(params, anchor)
