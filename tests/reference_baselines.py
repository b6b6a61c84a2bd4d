"""Plain per-client reference loops of the optimization baselines (SCAFFOLD, ...), written from
the papers: Python loops over clients and local steps, numpy aggregation, server steps by hand.

They share nothing with the vectorized engine but the minibatch order (``batch_at``, tested on
its own), the cohort draw (``cohort_sampler``, tested on its own) and the model's forward pass.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.local import ClientData, batch_at
from fedtree.core.rng import stream
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


# ------------------------------------------------------------------------ issue 36, second half:
# MOON, q-FFL / q-FedAvg, AFL, FedAsync. One-hidden-layer MLPs (``build_model("mlp", hidden=(h,))``)
# written out by hand: ``z = relu(x W0 + b0)`` is the representation, ``z W1 + b1`` the logits.
def mlp_forward(params, x):
  """``(z, logits)`` of a one-hidden-layer MLP's params, by hand."""
  x = x.reshape((x.shape[0], -1))
  z = jax.nn.relu(x @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"][None])
  return z, z @ params["Dense_1"]["kernel"] + params["Dense_1"]["bias"][None]


def _ce(logits, y, mask):
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, y[:, None], axis=1)[:, 0]
  m = mask.astype(logp.dtype)
  return jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)


def _cos(a, b):
  return jnp.sum(a * b, -1) / jnp.maximum(jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1), 1e-8)


@jax.jit
def _moon_grad(w, x, prev, b, mu, tau):
  def loss(w):
    z, logits = mlp_forward(w, b.x)
    zg, _ = mlp_forward(x, b.x)
    zp, _ = mlp_forward(prev, b.x)
    pos, neg = jnp.exp(_cos(z, zg) / tau), jnp.exp(_cos(z, zp) / tau)
    con = -jnp.log(pos / (pos + neg))
    m = b.mask.astype(con.dtype)
    return _ce(logits, b.y, b.mask) + mu * jnp.sum(con * m) / jnp.maximum(jnp.sum(m), 1.0)

  return jax.grad(loss)(w)


def moon_client(x, prev, data, client, num_steps, key, *, lr, batch_size, mu, tau):
  """MOON's local training (Li et al. 2021, Algorithm 1, lines 14-21): SGD steps on
  ``CE + μ · −log(e^{cos(z, z_glob)/τ} / (e^{cos(z, z_glob)/τ} + e^{cos(z, z_prev)/τ}))``."""
  cd = client_data(data, client)
  batch_key, _ = jax.random.split(key)
  w = x
  for t in range(int(num_steps)):
    g = _moon_grad(w, x, prev, batch_at(batch_key, cd, jnp.asarray(t), batch_size), mu, tau)
    w = jax.tree.map(lambda a, d: a - lr * d, w, g)
  return w


def full_mean_loss(model, params, data, c):
  """Client ``c``'s mean cross-entropy over all its training examples (one batch, by hand)."""
  n = int(data.n_train[c])
  logits = model.apply(params, jnp.asarray(data.x_train[c][:n]))
  return float(_ce(logits, jnp.asarray(data.y_train[c][:n]), jnp.ones((n,), bool)))


@functools.cache
def _value_and_grad(model):
  return jax.jit(jax.value_and_grad(lambda p, b: masked_cross_entropy(model.apply(p, b.x), b.y, b.mask)))


def sgd_client(model, x, data, client, num_steps, key, *, lr, batch_size):
  """Plain local SGD from ``x``; returns the model and every step's minibatch loss."""
  cd = client_data(data, client)
  batch_key, _ = jax.random.split(key)
  f = _value_and_grad(model)
  w, losses = x, []
  for t in range(int(num_steps)):
    loss, g = f(w, batch_at(batch_key, cd, jnp.asarray(t), batch_size))
    losses.append(float(loss))
    w = jax.tree.map(lambda a, d: a - lr * d, w, g)
  return w, losses


def qffedavg_round(model, x, data, cohort, keys, *, q, lr, lipschitz, batch_size, steps, loss_at,
                   weights=None):
  """One round of q-FedAvg (Li et al. 2020, Algorithm 2) over ``cohort``: every client's ``F_k``,
  ``Δ_k = F_k^q L (w − w̄_k)``, ``h_k = q F_k^{q−1} ‖L (w − w̄_k)‖² + L F_k^q``; ``w − Σ Δ_k / Σ h_k``
  (with ``weights``: ``w − Σ p_k Δ_k / Σ p_k h_k``)."""
  big_l = 1.0 / lr if lipschitz is None else lipschitz
  deltas, hs = [], []
  for c, key in zip(cohort, keys, strict=True):
    p = 1.0 if weights is None else float(weights[c])
    w, losses = sgd_client(model, x, data, c, steps[c], key, lr=lr, batch_size=batch_size)
    if loss_at == "received":
      f = full_mean_loss(model, x, data, c)
    else:
      per_epoch = max(-(-int(data.n_train[c]) // batch_size), 1)
      f = float(np.mean(losses[-per_epoch:]))
    f += 1e-10
    dw = jax.tree.map(lambda a, b: big_l * (np.asarray(a, np.float64) - np.asarray(b, np.float64)), x, w)
    sq = sum(float(np.sum(d ** 2)) for d in jax.tree.leaves(dw))
    deltas.append(jax.tree.map(lambda d, f=f, p=p: p * f ** q * d, dw))
    hs.append(p * (q * f ** (q - 1) * sq + big_l * f ** q))
  return jax.tree.map(lambda a, *d: np.asarray(a, np.float64) - sum(d) / sum(hs), x, *deltas)


def simplex_projection(v):
  """The Euclidean projection of ``v`` onto the probability simplex, by bisection on the threshold
  ``θ`` of ``Σ max(v − θ, 0) = 1`` (independent of the sort-based formula the library uses)."""
  v = np.asarray(v, np.float64)
  lo, hi = v.min() - 1.0, v.max()
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if np.maximum(v - mid, 0).sum() > 1 else (lo, mid)
  return np.maximum(v - 0.5 * (lo + hi), 0)


def afl_round(model, x, lam, domain, data, cohort, keys, *, lr, batch_size, steps, gamma, step="projected"):
  """One round of AFL (Mohri et al. 2019, Stochastic-AFL; FedJAX's agnostic_fed_avg): losses at
  ``x`` per domain, local SGD, the update weighted by ``λ_d n_k / m_d``, then the ascent on ``λ``."""
  n = np.asarray(data.n_train, np.float64)
  m = {d: n[domain == d].sum() for d in set(domain.tolist())}
  loss, count, deltas, weights = {}, {}, [], []
  for c, key in zip(cohort, keys, strict=True):
    d = int(domain[c])
    loss[d] = loss.get(d, 0.0) + full_mean_loss(model, x, data, c) * n[c]
    count[d] = count.get(d, 0.0) + n[c]
    w, _ = sgd_client(model, x, data, c, steps[c], key, lr=lr, batch_size=batch_size)
    deltas.append(jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64), x, w))
    weights.append(lam[d] * n[c] / m[d])
  total = sum(weights)
  def mix(a, *ds):
    return np.asarray(a, np.float64) - sum(p * dd for p, dd in zip(weights, ds, strict=True)) / total

  new_x = jax.tree.map(mix, x, *deltas)
  grad = np.array([loss[d] / count[d] if d in loss else 0.0 for d in range(len(lam))])
  if step == "projected":
    new_lam = simplex_projection(lam + gamma * grad)
  else:
    e = lam * np.exp(gamma * grad)
    new_lam = e / e.sum()
  return new_x, new_lam


def fedasync_event_loop(model, x0, data, speeds, steps, rounds, root, *, lr, batch_size, alpha, s):
  """FedAsync (Xie et al. 2019, Algorithm 1) with every client always in flight, as an event loop:
  the earliest to finish trains from the model of the version it started from (with the key of the
  server update that applies it), ``x ← (1 − α s(t − τ)) x + α s(t − τ) y``, and starts again from
  the new model. Returns the models and every update's staleness."""
  import heapq

  models, stale = [x0], []
  heap = [(steps[c] / speeds[c], c, 0) for c in range(len(speeds))]
  heapq.heapify(heap)
  x = x0
  for r in range(rounds):
    t, c, v = heapq.heappop(heap)
    rk = jax.random.fold_in(root, r)
    y, _ = sgd_client(model, models[v], data, c, steps[c], jax.random.fold_in(stream(rk, "train"), c), lr=lr,
                      batch_size=batch_size)
    a = alpha * s(r - v)
    def mix(p, q, a=a):
      return jnp.asarray((1 - a) * np.asarray(p, np.float64) + a * np.asarray(q, np.float64), jnp.float32)

    x = jax.tree.map(mix, x, y)
    models.append(x)
    stale.append(r - v)
    heapq.heappush(heap, (t + steps[c] / speeds[c], c, r + 1))
  return models, stale
