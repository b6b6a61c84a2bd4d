"""Pluggable local objectives: what a client does with the model it downloads.

Each factory returns a :class:`~fedtree.local.ClientUpdate` (vmapped over a cohort by
:func:`fedtree.tier.train_cohort`), built on the one masked scan
:func:`fedtree.local.run_local_steps`, so every objective composes with any tree and any
server optimizer (e.g. ``hierfavg(..., client_update=ditto_update(...))``).

* FedProx (Li et al. 2020): ``f_i(θ) + (μ/2)‖θ - Θ‖²`` (:func:`fedprox_update`).
* Ditto (Li et al. 2021): a persistent personal model ``v_i`` trained on
  ``f_i(v) + (λ/2)‖v - Θ‖²`` whenever the client is sampled, next to plain local training of
  the model sent up (:func:`ditto_update`). ``v_i`` is the client state, stacked ``[C, ...]``.
* pFedMe (Dinh et al. 2020): per local round, ``K`` inner steps approximately solve the
  Moreau-envelope problem ``θ̂ = argmin_θ f_i(θ; batch) + (λ/2)‖θ - w‖²``
  (:func:`moreau_solver`, reusable by pFedMT), then ``w ← w - η λ (w - θ̂)``
  (:func:`pfedme_update`). The personal model ``θ̂_i`` is the client state.
* Per-FedAvg (Fallah et al. 2020): a MAML step ``w ← w - β ∇f(w - α∇f(w; D); D')``,
  first-order (``"fo"``) or Hessian-free (``"hf"``: ``- β (I - α∇²f(w; D''))∇f(w̃; D')``
  with an exact Hessian-vector product) (:func:`perfedavg_update`). The extra batches
  ``D', D''`` are drawn with :func:`~fedtree.local.batch_at` under their own keys.

Choices (documented here since the papers leave them open): the pFedMe personal model starts
every round from the downloaded model and is warm-started across the ``R`` local rounds, with
the ``K`` inner steps on the same minibatch (as the authors' code); the Ditto personal model
takes as many steps as the local schedule gives the global model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from fedtree.local import (
  Batch,
  ClientData,
  ClientUpdate,
  SGDCarry,
  batch_at,
  data_loss,
  make_sgd_step,
  proximal,
  run_local_steps,
  sgd_client_update,
)
from fedtree.models import Model
from fedtree.rng import stream

PyTree = Any


def check_nonnegative(**values) -> None:
  """``ValueError`` naming the first negative (or non-finite) hyperparameter."""
  for name, v in values.items():
    if not (float(v) >= 0 and float(v) < float("inf")):
      raise ValueError(f"{name}={v} must be a finite number >= 0")


def check_positive(**values) -> None:
  """``ValueError`` naming the first hyperparameter that is not > 0."""
  for name, v in values.items():
    if not (float(v) > 0 and float(v) < float("inf")):
      raise ValueError(f"{name}={v} must be a finite number > 0")


def stack_clients(params: PyTree, num_clients: int) -> PyTree:
  """``params`` repeated for every client: ``[C, ...]``."""
  return jax.tree.map(lambda p: jnp.broadcast_to(p, (num_clients,) + p.shape), params)


def tree_sub_scaled(a: PyTree, b: PyTree, scale) -> PyTree:
  """``a - scale · b`` leaf by leaf."""
  return jax.tree.map(lambda x, y: x - scale * y, a, b)


# ------------------------------------------------------------------------ FedProx
def fedprox_update(
  model: Model, optimizer: optax.GradientTransformation, *, mu: float, batch_size: int,
  max_steps: int,
) -> ClientUpdate:
  """FedProx local training: ``f_i(θ) + (μ/2)‖θ - Θ‖²`` from the downloaded ``Θ``."""
  check_nonnegative(mu=mu)
  return sgd_client_update(
    model, optimizer, batch_size=batch_size, max_steps=max_steps, regularizer=proximal(mu)
  )


# ------------------------------------------------------------------------ Ditto
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
  """
  check_nonnegative(lam=lam)
  personal_optimizer = optimizer if personal_optimizer is None else personal_optimizer
  global_step = make_sgd_step(model, optimizer)
  personal_step = make_sgd_step(model, personal_optimizer, proximal(lam))

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
    return DittoState(personal=stack_clients(params, num_clients))

  return ClientUpdate(apply=apply, init_state=init_state)


# ------------------------------------------------------------------------ Moreau envelope
MoreauSolver = Callable[[PyTree, PyTree, Batch, jax.Array], tuple[PyTree, jax.Array]]


def moreau_solver(
  model: Model, *, lam: float, inner_steps: int, personal_lr: float
) -> MoreauSolver:
  """Approximate prox of the minibatch loss: ``θ̂ ≈ argmin_θ f(θ; batch) + (λ/2)‖θ - w‖²``.

  Returns ``solve(theta, w, batch, rng) -> (θ̂, mean data loss over the inner steps)``, which
  runs ``inner_steps`` gradient steps ``θ ← θ - personal_lr (∇f(θ; batch) + λ (θ - w))``
  from ``theta`` on one minibatch. pFedMe calls it with ``K`` inner steps; pFedMT's device
  step ``θ ← θ - α∇f(θ) - αλ(θ - w)`` is exactly one inner step with ``personal_lr = α``.
  """
  check_nonnegative(lam=lam)
  check_positive(personal_lr=personal_lr)
  if int(inner_steps) < 1:
    raise ValueError(f"inner_steps={inner_steps} must be >= 1")
  inner_steps = int(inner_steps)

  def solve(theta, w, batch: Batch, rng):
    def body(th, k):
      loss, g = jax.value_and_grad(data_loss, argnums=1)(
        model, th, batch, jax.random.fold_in(rng, k)
      )
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
  """
  check_positive(lam=lam, learning_rate=learning_rate)
  solve = moreau_solver(model, lam=lam, inner_steps=inner_steps, personal_lr=personal_lr)

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
    return PFedMeState(personal=stack_clients(params, num_clients))

  return ClientUpdate(apply=apply, init_state=init_state)


# ------------------------------------------------------------------------ Per-FedAvg
PERFEDAVG_VARIANTS = ("fo", "hf")


def perfedavg_step(
  model: Model, data: ClientData, *, alpha: float, beta: float, variant: str, batch_size: int
) -> Callable:
  """One Per-FedAvg step on client ``data``: ``step(w, batch, rng) -> (w, loss)``.

  ``w̃ = w - α ∇f(w; batch)``; FO: ``w ← w - β ∇f(w̃; D')``; HF: ``w ← w - β (∇f(w̃; D') -
  α ∇²f(w; D'') ∇f(w̃; D'))``. ``D'`` and ``D''`` are fresh random minibatches of ``data``.
  """
  if variant not in PERFEDAVG_VARIANTS:
    raise ValueError(f"Per-FedAvg variant={variant!r}; choose one of {PERFEDAVG_VARIANTS}")
  check_positive(alpha=alpha, beta=beta)

  def step(w, batch: Batch, rng):
    loss, g1 = jax.value_and_grad(data_loss, argnums=1)(model, w, batch, stream(rng, "inner"))
    w_tilde = tree_sub_scaled(w, g1, alpha)
    b2 = batch_at(stream(rng, "outer_batch"), data, jnp.zeros((), jnp.int32), batch_size)
    g2 = jax.grad(data_loss, argnums=1)(model, w_tilde, b2, stream(rng, "outer"))
    if variant == "hf":
      b3 = batch_at(stream(rng, "hessian_batch"), data, jnp.zeros((), jnp.int32), batch_size)
      h_rng = stream(rng, "hessian")

      def grad_at(p):
        return jax.grad(data_loss, argnums=1)(model, p, b3, h_rng)

      _, hvp = jax.jvp(grad_at, (w,), (g2,))
      g2 = tree_sub_scaled(g2, hvp, alpha)
    return tree_sub_scaled(w, g2, beta), loss

  return step


def perfedavg_update(
  model: Model, *, alpha: float, beta: float, variant: str = "fo", batch_size: int, max_steps: int
) -> ClientUpdate:
  """Per-FedAvg's client: ``num_steps`` MAML steps (:func:`perfedavg_step`) from the
  downloaded model; the result is sent up."""
  perfedavg_step(model, ClientData(None, None, None), alpha=alpha, beta=beta, variant=variant,
                 batch_size=batch_size)  # validates now, not at trace time

  def apply(anchor, state, data: ClientData, num_steps, key):
    step = perfedavg_step(model, data, alpha=alpha, beta=beta, variant=variant,
                          batch_size=batch_size)
    w, loss = run_local_steps(step, anchor, data, num_steps, key, batch_size=batch_size,
                              max_steps=max_steps)
    return w, state, loss

  return ClientUpdate(apply=apply)
