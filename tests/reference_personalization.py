"""Plain per-client loops of the personalization objectives: the obviously-correct versions
the vectorized code in :mod:`fedtree.objectives` and :mod:`fedtree.core.finetune` is tested against.

Each function trains ONE client with explicit Python loops over steps and inner steps and
explicit update formulas. They draw the same minibatches as the engine (same keys through
``batch_at``), so results agree to float tolerance.
"""

import functools

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fedtree.core.local import batch_at as _batch_at
from fedtree.core.rng import stream

# The loops stay in Python; only the primitives (one batch, one gradient) are jitted, so the
# reference runs in reasonable time.
batch_at = jax.jit(_batch_at, static_argnums=3)


def loss_fn(model, params, batch):
  logits = model.apply(params, batch.x, train=False)
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, batch.y[:, None], axis=-1)[:, 0]
  m = batch.mask.astype(jnp.float32)
  return jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)


@functools.cache
def _grad_fn(model):
  return jax.jit(jax.grad(lambda p, b: loss_fn(model, p, b)))


@functools.cache
def _hessian_fn(model, unravel):
  return jax.jit(jax.hessian(lambda f, b: loss_fn(model, unravel(f), b)))


def grad(model, params, batch):
  return _grad_fn(model)(params, batch)


def axpy(a, x, y):
  """``y + a x`` leaf by leaf."""
  return jax.tree.map(lambda u, v: v + a * u, x, y)


def step_batches(key, cdata, num_steps, batch_size):
  """The ``(batch, step rng)`` pairs ``run_local_steps`` uses for ``key``."""
  bkey, skey = jax.random.split(key)
  return [(batch_at(bkey, cdata, jnp.asarray(t), batch_size), jax.random.fold_in(skey, t))
          for t in range(num_steps)]


def sgd(model, start, cdata, num_steps, key, *, lr, batch_size, mu=0.0, anchor=None):
  """SGD on ``f + (μ/2)‖θ - anchor‖²``."""
  anchor = start if anchor is None else anchor
  p = start
  for batch, _ in step_batches(key, cdata, num_steps, batch_size):
    g = grad(model, p, batch)
    g = jax.tree.map(lambda gg, pp, aa: gg + mu * (pp - aa), g, p, anchor)
    p = axpy(-lr, g, p)
  return p


def ditto(model, anchor, personal, cdata, num_steps, key, *, lr, lam, batch_size):
  sent = sgd(model, anchor, cdata, num_steps, stream(key, "global"), lr=lr, batch_size=batch_size)
  v = sgd(model, personal, cdata, num_steps, stream(key, "personal"), lr=lr, batch_size=batch_size,
          mu=lam, anchor=anchor)
  return sent, v


def pfedme(model, anchor, cdata, num_steps, key, *, lam, inner_steps, personal_lr, lr, batch_size):
  theta, w = anchor, anchor
  for batch, _ in step_batches(key, cdata, num_steps, batch_size):
    for _ in range(inner_steps):
      g = grad(model, theta, batch)
      theta = jax.tree.map(lambda t, gg, ww: t - personal_lr * (gg + lam * (t - ww)), theta, g, w)
    w = jax.tree.map(lambda ww, t: ww - lr * lam * (ww - t), w, theta)
  return w, theta


def perfedavg(model, anchor, cdata, num_steps, key, *, alpha, beta, variant, batch_size):
  w = anchor
  for batch, rng in step_batches(key, cdata, num_steps, batch_size):
    w_tilde = axpy(-alpha, grad(model, w, batch), w)
    b2 = batch_at(stream(rng, "outer_batch"), cdata, jnp.asarray(0), batch_size)
    g = grad(model, w_tilde, b2)
    if variant == "hf":
      b3 = batch_at(stream(rng, "hessian_batch"), cdata, jnp.asarray(0), batch_size)
      flat, unravel = ravel_pytree(w)
      hess = _hessian_fn(model, unravel)(flat, b3)  # the full matrix
      g_flat, _ = ravel_pytree(g)
      g = unravel(g_flat - alpha * hess @ g_flat)
    w = axpy(-beta, g, w)
  return w
