"""Plain per-client reference implementations: Python loops over clients, numpy aggregation.

They share nothing with the vectorized engine but the minibatch order (``batch_at``, tested
on its own) and the model's forward pass: local SGD is written out by hand, and aggregation
and server updates are numpy loops over nodes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.local import ClientData, batch_at
from fedtree.core.rng import stream
from fedtree.models import masked_cross_entropy


def to_np(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def local_sgd(model, params, data, client, num_steps, key, *, lr, batch_size):
  """Client ``client`` trains ``num_steps`` plain SGD steps from ``params`` (hand-written)."""
  cd = ClientData(x=jnp.asarray(data.x_train[client]), y=jnp.asarray(data.y_train[client]),
                  n=jnp.asarray(data.n_train[client]))
  batch_key, _ = jax.random.split(key)
  grad_fn = jax.jit(jax.grad(lambda p, b: masked_cross_entropy(model.apply(p, b.x), b.y, b.mask)))
  p = params
  for t in range(int(num_steps)):
    b = batch_at(batch_key, cd, jnp.asarray(t), batch_size)
    g = grad_fn(p, b)
    p = jax.tree.map(lambda w, gw: w - lr * gw, p, g)
  return p


def client_models(model, start_params, data, cohort, round_key, *, lr, batch_size, num_steps):
  """Every cohort client's trained model, one Python iteration per client."""
  train_key = stream(round_key, "train")
  out = {}
  for c, par in cohort:
    out[c] = local_sgd(model, start_params[par], data, c, num_steps[c],
                       jax.random.fold_in(train_key, c), lr=lr, batch_size=batch_size)
  return out


def weighted_average(models, weights):
  total = sum(weights)
  def avg(*ms):
    return sum(w * np.asarray(m, np.float64) for w, m in zip(weights, ms, strict=True)) / total

  return jax.tree.map(avg, *models)


class PaperFedAdam:
  """Reddi et al.'s FedAdam server step, line by line, in numpy (Δ = Θ - mean θ)."""

  def __init__(self, params, *, lr, b1, b2, tau):
    self.lr, self.b1, self.b2, self.tau = lr, b1, b2, tau
    self.m = jax.tree.map(lambda p: np.zeros_like(np.asarray(p, np.float64)), params)
    self.v = jax.tree.map(lambda p: np.full_like(np.asarray(p, np.float64), tau**2), params)

  def step(self, theta, delta):
    self.m = jax.tree.map(lambda m, d: self.b1 * m + (1 - self.b1) * d, self.m, delta)
    self.v = jax.tree.map(lambda v, d: self.b2 * v + (1 - self.b2) * d * d, self.v, delta)
    return jax.tree.map(lambda t, m, v: t - self.lr * m / (np.sqrt(v) + self.tau), theta, self.m, self.v)
