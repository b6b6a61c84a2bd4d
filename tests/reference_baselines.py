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
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
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


def _f32(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float32), tree)


def feddyn_client(model, x, grad_l, data, client, num_steps, key, *, lr, batch_size, alpha):
  """FedDyn's client (Acar et al. 2021, Algorithm 1), plain SGD step by step on
  ``L_i(θ) − ⟨∇L_i, θ⟩ + (α/2)‖θ − x‖²``: ``θ ← θ − η (g(θ) − ∇L_i + α (θ − x))`` for ``K`` steps,
  then ``∇L_i ← ∇L_i − α (θ − x)``. Returns ``(θ, ∇L_i⁺)``."""
  cd = client_data(data, client)
  batch_key, _ = jax.random.split(key)
  g = grad_fn(model)
  y = _f32(x)
  for t in range(int(num_steps)):
    gy = g(y, batch_at(batch_key, cd, jnp.asarray(t), batch_size))

    def step(w, gw, gl, xx):
      return w - np.float32(lr) * (np.asarray(gw) - np.float32(gl) + np.float32(alpha) * (w - xx))

    y = jax.tree.map(step, y, gy, grad_l, _f32(x))
  new = jax.tree.map(lambda gl, w, xx: gl - alpha * (np.asarray(w, np.float64) - np.asarray(xx, np.float64)),
                     np64(grad_l), y, x)
  return y, new


def fednova_client(model, x, data, client, num_steps, key, *, lr, batch_size, momentum):
  """FedNova's client (Wang et al. 2020): ``τ`` steps of SGD with heavy-ball momentum ``ρ``
  (``v ← ρ v + g``, ``y ← y − η v``) and ``‖a‖₁`` by the paper's recursion (``c ← ρ c + 1``,
  ``‖a‖₁ += c`` per step). Returns ``(y, ‖a‖₁)``."""
  cd = client_data(data, client)
  batch_key, _ = jax.random.split(key)
  g = grad_fn(model)
  y = _f32(x)
  v = jax.tree.map(np.zeros_like, y)
  counter = norm = 0.0
  for t in range(int(num_steps)):
    gy = g(y, batch_at(batch_key, cd, jnp.asarray(t), batch_size))
    v = jax.tree.map(lambda vv, gw: np.float32(momentum) * vv + np.asarray(gw), v, gy)
    y = jax.tree.map(lambda w, vv: w - np.float32(lr) * vv, y, v)
    counter = momentum * counter + 1.0
    norm += counter
  return y, norm


def mime_client(model, x, momentum_state, c, data, client, num_steps, key, *, lr, batch_size, momentum,
                corrected):
  """Mime's (``corrected``) or MimeLite's client (Karimireddy et al. 2021, Algorithm 1) with SGD and
  heavy-ball momentum ``ρ`` as the base optimizer, written out: the server's momentum ``m`` fixed,
  ``y ← y − η (g + ρ m)`` with ``g = ∇f(y; ζ)`` (MimeLite) or ``∇f(y; ζ) − ∇f(x; ζ) + c`` (Mime)."""
  cd = client_data(data, client)
  batch_key, _ = jax.random.split(key)
  grad = grad_fn(model)
  y = _f32(x)
  for t in range(int(num_steps)):
    b = batch_at(batch_key, cd, jnp.asarray(t), batch_size)
    gy = jax.tree.map(np.asarray, grad(y, b))
    if corrected:
      gy = jax.tree.map(lambda a, bb, cc: a - np.asarray(bb) + np.float32(cc), gy, grad(_f32(x), b), c)
    y = jax.tree.map(lambda w, gw, m: w - np.float32(lr) * (gw + np.float32(momentum) * np.float32(m)),
                     y, gy, momentum_state)
  return y


def run_rounds(data, x0, parent, rounds, key, *, cohort_size, client, server, root_period=None,
               root_weights=None, before=None):
  """A per-parent loop of ``rounds`` rounds: every parent of clients ``p`` holds its model ``x[p]``
  (float64); each round draws the cohort as the engine does (the only thing shared with it) and
  calls ``client(round_key, k, p, x[p])`` for every sampled client ``k`` (its answer, any object),
  then ``x[p] = server(p, x[p], [(k, answer), ...])`` for every parent with answers (``before(p, x[p],
  [k, ...])``, if given, first, with every parent's sampled clients: Mime's pass); the root (if
  ``root_period``) averages the parents' models by ``root_weights`` every ``root_period`` rounds
  and sends its model down. Returns the parents' models."""
  parent = np.asarray(parent)
  num_parents = int(parent.max()) + 1
  x = [np64(x0) for _ in range(num_parents)]
  sampler = cohort_sampler(parent, cohort_size)
  for r in range(rounds):
    rk = jax.random.fold_in(key, r)
    cohort = sampler(stream(rk, "cohort"))
    sampled = [[] for _ in range(num_parents)]
    for k, p, v in zip(np.asarray(cohort.clients), np.asarray(cohort.parent), np.asarray(cohort.valid),
                       strict=True):
      if v:
        sampled[int(p)].append(int(k))
    if before is not None:
      for p in range(num_parents):
        if sampled[p]:
          before(p, x[p], sampled[p])
    answers = [[(k, client(rk, k, p, x[p])) for k in sampled[p]] for p in range(num_parents)]
    for p in range(num_parents):
      if answers[p]:
        x[p] = server(p, x[p], answers[p])
    if root_period and (r + 1) % root_period == 0:
      root = jax.tree.map(lambda *m: sum(w * a for w, a in zip(root_weights, m, strict=True)), *x)
      root = jax.tree.map(lambda a: a / sum(root_weights), root)
      x = [root for _ in range(num_parents)]
  return x


def train_key(round_key, client):
  """Client ``client``'s key of the round (the engine's ``fold_in(stream(key, "train"), client)``)."""
  return jax.random.fold_in(stream(round_key, "train"), client)
