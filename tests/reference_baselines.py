"""Plain per-client reference loops of the optimization baselines (SCAFFOLD, ...), written from
the papers: Python loops over clients and local steps, numpy aggregation, server steps by hand.

They share nothing with the vectorized engine but the minibatch order (``batch_at``, tested on
its own), the cohort draw (``cohort_sampler``, tested on its own) and the model's forward pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.local import ClientData, batch_at
from fedtree.models import masked_cross_entropy


def np64(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def client_data(data, c, shuffle=True):
  return ClientData(
    x=jnp.asarray(data.x_train[c]),
    y=jnp.asarray(data.y_train[c]),
    n=jnp.asarray(data.n_train[c]),
    shuffle=shuffle,
  )


def grad_fn(model):
  return jax.jit(jax.grad(lambda p, b: masked_cross_entropy(model.apply(p, b.x), b.y, b.mask)))


def full_gradient(model, params, data, c, batch_size):
  """``∇f_c(params)`` over all of client ``c``'s examples: minibatch gradients of the mean loss,
  weighted by their sizes, over one pass in stored order."""
  cd = client_data(data, c, shuffle=False)
  g = grad_fn(model)
  n = int(data.n_train[c])
  total = jax.tree.map(lambda p: np.zeros(np.shape(p)), np64(params))
  for j in range(-(-n // batch_size)):
    b = batch_at(jax.random.key(0), cd, jnp.asarray(j), batch_size)
    count = float(np.sum(np.asarray(b.mask)))
    total = jax.tree.map(lambda t, x, w=count: t + w * np.asarray(x, np.float64), total, g(params, b))
  return jax.tree.map(lambda t: t / max(n, 1), total)


def scaffold_client(model, x, c_server, c_own, data, client, num_steps, key, *, lr, batch_size, option):
  """SCAFFOLD's client (Karimireddy et al. 2020, Algorithm 1, lines 8-12), step by step:
  ``y ← y − η (g(y) − c_i + c)`` for ``K`` steps, then ``c_i⁺`` by option I or II."""
  cd = client_data(data, client)
  batch_key, _ = jax.random.split(key)
  g = grad_fn(model)
  y = x
  for t in range(int(num_steps)):
    b = batch_at(batch_key, cd, jnp.asarray(t), batch_size)
    gy = g(y, b)
    y = jax.tree.map(
      lambda w, gw, ci, cs: np.asarray(w, np.float32) - lr * (np.asarray(gw) - ci + cs).astype(np.float32),
      y,
      gy,
      c_own,
      c_server,
    )
  k = int(num_steps)
  if option == "I":
    c_new = full_gradient(model, x, data, client, batch_size)
  elif k == 0:
    c_new = c_own
  else:
    c_new = jax.tree.map(
      lambda ci, cs, xx, yy: ci - cs + (np.asarray(xx, np.float64) - np.asarray(yy, np.float64)) / (k * lr),
      c_own,
      c_server,
      x,
      y,
    )
  return y, np64(c_new)
