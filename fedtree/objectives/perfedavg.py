"""Per-FedAvg (Fallah et al. 2020): MAML steps ``w ← w - β ∇f(w - α∇f(w; D); D')``,
first-order (``"fo"``) or Hessian-free (``"hf"``: ``- β (I - α∇²f(w; D''))∇f(w̃; D')`` with an
exact Hessian-vector product). The extra batches ``D', D''`` are drawn with
:func:`~fedtree.core.local.batch_at` under their own keys, shuffled whatever the schedule's
``batch_order`` (which orders ``D``): fresh random minibatches, as the paper says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from fedtree.core.checks import check_positive
from fedtree.core.local import Batch, ClientData, ClientUpdate, batch_at, data_loss, run_local_steps
from fedtree.core.model import Model
from fedtree.core.rng import stream

PyTree = Any


def tree_sub_scaled(a: PyTree, b: PyTree, scale) -> PyTree:
  """``a - scale · b`` leaf by leaf."""
  return jax.tree.map(lambda x, y: x - scale * y, a, b)


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

  data = data._replace(cursor=0, shuffle=True)  # D', D'': fresh random minibatches

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
