"""Plain per-client reference loops of the methods whose clients learn from each other's models
(FedAMP, FedFomo, pFedHN, FedProto), written from the papers: Python loops over a round's cohort,
its clients and their local steps, numpy for the pairwise weights, prototypes and server steps.

They share with the vectorized engine only the minibatch order (``batch_at``), the cohort draw
(``cohort_sampler``), FedFomo's random draws (``jax.random`` on the same keys: the exploration
coin, the tie-breaking order and the fixed validation permutation ``shuffled_positions``, each
tested on its own) and the model's forward pass; the MLP's representation (FedProto) is computed
by hand.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.local import ClientData, batch_at, shuffled_positions
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.models import masked_cross_entropy


def np64(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def f32(tree):
  return jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), tree)


def flat(tree) -> np.ndarray:
  return np.concatenate([np.asarray(a, np.float64).ravel() for a in jax.tree.leaves(tree)])


def client_data(data, c, shuffle=True):
  return ClientData(x=jnp.asarray(data.x_train[c]), y=jnp.asarray(data.y_train[c]),
                    n=jnp.asarray(data.n_train[c]), shuffle=shuffle)


def cohorts(parent, cohort_size, rk):
  """``{parent: [client, ...]}`` of round key ``rk``'s draw, in slot order."""
  cohort = cohort_sampler(parent, cohort_size)(stream(rk, "cohort"))
  out: dict[int, list[int]] = {}
  for k, p, v in zip(np.asarray(cohort.clients), np.asarray(cohort.parent), np.asarray(cohort.valid),
                     strict=True):
    if v:
      out.setdefault(int(p), []).append(int(k))
  return out


@functools.cache
def ce_grad(model):
  """The jitted gradient of the masked cross-entropy (one compile per model)."""
  return jax.jit(jax.grad(lambda p, b: masked_cross_entropy(model.apply(p, b.x), b.y, b.mask)))


def sgd_steps(model, start, cd, num_steps, key, *, lr, batch_size, extra_grad=None, dtype=np.float32):
  """Plain SGD on the masked cross-entropy from ``start`` (``extra_grad(w)``: a regularizer's
  gradient added to every step's), the model held in ``dtype`` (float64 under x64 for the float64
  comparisons)."""
  grad = ce_grad(model)
  batch_key, _ = jax.random.split(key)
  w = jax.tree.map(lambda a: jnp.asarray(a, dtype), start)
  for t in range(int(num_steps)):
    g = np64(grad(w, batch_at(batch_key, cd, jnp.asarray(t), batch_size)))
    if extra_grad is not None:
      g = jax.tree.map(np.add, g, extra_grad(np64(w)))
    w = jax.tree.map(lambda a, d: (np.asarray(a, np.float64) - lr * d).astype(dtype), w, g)
  return np64(w)


# ------------------------------------------------------------------------ FedAMP
def fedamp_weights(models, *, attention, alpha, sigma, self_attention):
  """``ξ [n, n]`` of one parent's cohort (Huang et al. 2021: eq. (4) for ``"distance"``, HeurFedAMP
  for ``"cosine"``; ``"uniform"``: ``1/n``)."""
  vecs = [flat(m) for m in models]
  n = len(vecs)
  xi = np.zeros((n, n))
  for i in range(n):
    if attention == "uniform":
      xi[i] = 1.0 / n
      continue
    others = [j for j in range(n) if j != i]
    if attention == "distance":
      for j in others:
        d2 = float(np.sum((vecs[i] - vecs[j]) ** 2))
        xi[i, j] = alpha * math.exp(-d2 / sigma) / sigma
      xi[i, i] = 1.0 - sum(xi[i, j] for j in others)
    else:
      if not others:
        xi[i, i] = 1.0
        continue
      cos = [float(vecs[i] @ vecs[j] / (np.linalg.norm(vecs[i]) * np.linalg.norm(vecs[j]))) for j in others]
      e = np.exp(sigma * np.asarray(cos) - np.max(sigma * np.asarray(cos)))
      for j, v in zip(others, e / e.sum(), strict=True):
        xi[i, j] = (1.0 - self_attention) * v
      xi[i, i] = self_attention
  return xi


def fedamp_reference(model, data, w0, parent, rounds, key, *, cohort_size, attention, alpha, lam, sigma,
                     self_attention, start, lr, batch_size, steps, dtype=np.float32, transform=None):
  """Algorithm 1 of FedAMP per parent of clients: every round its cohort's cloud models ``u_i = Σ_j
  ξ_ij w_j`` from their current models, then every client's SGD on ``F_i(w) + λ/(2α) ‖w − u_i‖²``
  from its own model (or ``u_i``). ``transform(Δ leaves) -> leaves`` (a client stage): the server
  keeps ``u_i − transform(u_i − w_i)`` of every client, not ``w_i``, and pairs those. Returns every
  client's personal model (and, with ``transform``, the server's copies too)."""
  w = [np64(w0) for _ in range(data.num_clients)]
  held = [np64(w0) for _ in range(data.num_clients)]   # what the server holds of each client
  mu = lam / alpha
  for r in range(rounds):
    rk = jax.random.fold_in(key, r)
    for _, members in cohorts(parent, cohort_size, rk).items():
      seen = held if transform is not None else w
      xi = fedamp_weights([seen[k] for k in members], attention=attention, alpha=alpha, sigma=sigma,
                          self_attention=self_attention)
      cloud = [jax.tree.map(lambda *ms, row=xi[i]: sum(c * m for c, m in zip(row, ms, strict=True)),
                            *[seen[k] for k in members]) for i in range(len(members))]
      new = {}
      for i, k in enumerate(members):
        u = cloud[i]
        begin = w[k] if start == "own" else u
        new[k] = sgd_steps(model, begin, client_data(data, k), steps[k],
                           jax.random.fold_in(stream(rk, "train"), k), lr=lr, batch_size=batch_size,
                           extra_grad=lambda ww, u=u: jax.tree.map(lambda x, z: mu * (x - z), ww, u),
                           dtype=dtype)
        if transform is not None:
          leaves, treedef = jax.tree.flatten(u)
          delta = transform([np.asarray(a, np.float64) - np.asarray(b, np.float64)
                             for a, b in zip(leaves, jax.tree.leaves(new[k]), strict=True)])
          held[k] = jax.tree.unflatten(treedef, [a - d for a, d in zip(leaves, delta, strict=True)])
      for k, v in new.items():
        w[k] = v
  return w if transform is None else (w, held)


# ------------------------------------------------------------------------ FedFomo
@functools.cache
def _eval_loss(model):
  def loss(p, x, y):
    return masked_cross_entropy(model.apply(p, x, train=False), y, jnp.ones(y.shape, bool))

  return jax.jit(loss)


def mean_loss(model, params, x, y, dtype=np.float32):
  """Mean cross-entropy of ``params`` (in ``dtype``) over ``x, y`` (all at once, evaluation mode); 0 for
  none."""
  if len(y) == 0:
    return 0.0
  return float(_eval_loss(model)(jax.tree.map(lambda a: jnp.asarray(a, dtype), params), jnp.asarray(x),
                                 jnp.asarray(y)))


def fomo_split(data, k, *, fraction, how, seed):
  """``(train rows, val rows)`` of client ``k``'s examples (indices into its stored rows)."""
  n = int(data.n_train[k])
  n_val = int(math.floor(np.float32(fraction) * np.float32(n)))
  if how == "last":
    return np.arange(n - n_val), np.arange(n - n_val, n)
  perm = np.asarray(shuffled_positions(jax.random.fold_in(jax.random.key(seed), k), jnp.arange(n), max(n, 1)))
  return perm[n_val:], perm[:n_val]


def fedfomo_reference(model, data, w0, parent, rounds, key, *, cohort_size, num_candidates, epsilon,
                      epsilon_decay, fraction, how, pool, lr, batch_size, steps, seed, dtype=np.float32,
                      transform=None):
  """FedFomo per parent of clients (Zhang et al. 2021, Algorithm 1 with the authors' ε-greedy
  choice): every sampled client receives the ``M`` other clients' models of highest affinity (or
  ``M`` at random), weighs them on its validation rows by ``(L(θ_i) − L(θ_n)) / ‖θ_n − θ_i‖``,
  moves by the normalized positive weights, adds the weights to its affinities and trains on its
  other rows. ``transform(Δ leaves) -> leaves`` (a client stage): the server keeps ``h_i −
  transform(h_i − θ_i)`` of every client (``h_i`` its previous copy) and sends those as candidates.
  Returns ``(models, affinities [C, C], last round)`` (and the server's copies, with ``transform``)."""
  c = data.num_clients
  theta = [np64(w0) for _ in range(c)]
  held = [np64(w0) for _ in range(c)]
  seen = held if transform is not None else theta
  affinity = np.zeros((c, c))
  last = np.zeros(c, int)
  siblings = {p: [i for i in range(c) if parent[i] == p] for p in set(parent.tolist())}
  for r in range(rounds):
    t = r + 1
    rk = jax.random.fold_in(key, r)
    eps = max(epsilon - (t - 1) * epsilon_decay, 0.0)
    picked = {}
    for p, members in cohorts(parent, cohort_size, rk).items():
      mates = siblings[p]
      for i in members:
        ke, kt = jax.random.split(jax.random.fold_in(stream(rk, "parcels"), i))
        explore = float(jax.random.uniform(ke)) < np.float32(eps)
        tie = np.asarray(jax.random.uniform(kt, (max(len(m) for m in siblings.values()),)))
        pool_ids = [j for j in mates if j != i and (pool == "all" or last[j] == t - 1)]
        rank = {j: mates.index(j) for j in mates}
        score = {j: tie[rank[j]] if explore else affinity[i, j] for j in pool_ids}
        order = sorted(pool_ids, key=lambda j: (-score[j], tie[rank[j]]))
        picked[i] = order[:num_candidates]
    new = {}
    for i, cands in picked.items():
      tr, va = fomo_split(data, i, fraction=fraction, how=how, seed=seed)
      x, y = np.asarray(data.x_train[i]), np.asarray(data.y_train[i])
      own = theta[i]
      base = mean_loss(model, own, x[va], y[va], dtype)
      w = []
      for j in cands:
        dist = float(np.linalg.norm(flat(seen[j]) - flat(own)))
        better = base - mean_loss(model, seen[j], x[va], y[va], dtype)
        w.append(0.0 if dist == 0 or len(va) == 0 else better / dist)
      pos = np.maximum(np.asarray(w), 0.0)
      begin = own
      if pos.sum() > 0:
        share = pos / pos.sum()
        begin = jax.tree.map(
          lambda o, *ms, share=share: o + sum(s * (m - o) for s, m in zip(share, ms, strict=True)), own,
          *[seen[j] for j in cands])
      for j, v in zip(cands, w, strict=True):
        affinity[i, j] += v
      rows = np.concatenate([tr, np.zeros(x.shape[0] - len(tr), int)])
      cd = ClientData(x=jnp.asarray(x[rows]), y=jnp.asarray(y[rows]), n=jnp.asarray(len(tr)), shuffle=True)
      new[i] = sgd_steps(model, begin, cd, steps[i], jax.random.fold_in(stream(rk, "train"), i), lr=lr,
                         batch_size=batch_size, dtype=dtype)
      last[i] = t
    for i, v in new.items():
      theta[i] = v
      if transform is not None:
        leaves, treedef = jax.tree.flatten(held[i])
        delta = transform([np.asarray(a, np.float64) - np.asarray(b, np.float64)
                           for a, b in zip(leaves, jax.tree.leaves(v), strict=True)])
        held[i] = jax.tree.unflatten(treedef, [a - d for a, d in zip(leaves, delta, strict=True)])
  return (theta, affinity, last) if transform is None else (theta, affinity, last, held)


# ------------------------------------------------------------------------ pFedHN
def hn_generate(hnet, v, shapes):
  """``h(v; φ)``: the MLP on the embedding, then one linear head per target leaf (numpy-free jax,
  written out)."""
  z = v @ hnet["mlp"][0]["kernel"] + hnet["mlp"][0]["bias"]
  for layer in hnet["mlp"][1:]:
    z = jnp.maximum(z, 0.0) @ layer["kernel"] + layer["bias"]
  return [(z @ h["kernel"] + h["bias"]).reshape(s) for h, s in zip(hnet["heads"], shapes, strict=True)]


@functools.cache
def _hn_forward(shapes):
  return jax.jit(lambda h, v: hn_generate(h, v, shapes))


@functools.cache
def _hn_pullback(shapes):
  return jax.jit(lambda h, v, ct: jax.vjp(lambda hh, vv: hn_generate(hh, vv, shapes), h, v)[1](ct))


def pfedhn_reference(model, data, hnet, emb, treedef, shapes, rounds, key, *, cohort_size, lr, batch_size,
                     steps, hn_lr, momentum, weight_decay, clip_norm, embedding_step="own", dtype=np.float32,
                     transform=None):
  """Algorithm 1 of pFedHN on one server, its cohort's steps averaged (one client per round is the
  paper's): for every sampled client ``θ_i = h(v_i; φ)``, SGD to ``θ̃_i``, ``Δθ_i = θ_i − θ̃_i``;
  ``∇φ = mean_i J_φᵀ Δθ_i``, ``∇v_i = J_vᵀ Δθ_i``; the global norm of ``(∇φ, ∇v)`` clipped, then
  PyTorch's SGD with weight decay and momentum on ``(φ, v)`` (``embedding_step="mean"``: ``∇v_i``
  over the cohort too, FLGo's). ``transform(list of Δθ_i leaves) -> leaves``: what the client's update
  path makes of its update before it leaves (``None``: nothing). Returns ``(φ, v)``."""
  parent = np.zeros(data.num_clients, int)
  hnet, emb = np64(hnet), np.asarray(emb, np.float64)
  buf = None
  for r in range(rounds):
    rk = jax.random.fold_in(key, r)
    members = cohorts(parent, cohort_size, rk)[0]
    g_h = jax.tree.map(np.zeros_like, hnet)
    g_e = np.zeros_like(emb)
    for k in members:
      h32, v32 = jax.tree.map(lambda a: jnp.asarray(a, dtype), hnet), jnp.asarray(emb[k], dtype)
      theta = _hn_forward(tuple(shapes))(h32, v32)
      start = jax.tree.unflatten(treedef, theta)
      trained = sgd_steps(model, start, client_data(data, k), steps[k],
                          jax.random.fold_in(stream(rk, "train"), k), lr=lr, batch_size=batch_size,
                          dtype=dtype)
      delta = [np.asarray(a, np.float64) - b for a, b in zip(theta, jax.tree.leaves(trained), strict=True)]
      if transform is not None:
        delta = transform(delta)
      gh, gv = _hn_pullback(tuple(shapes))(h32, v32, [jnp.asarray(d, dtype) for d in delta])
      share = 1.0 / len(members)
      g_h = jax.tree.map(lambda a, b, s=share: a + np.asarray(b, np.float64) * s, g_h, gh)
      g_e[k] += np.asarray(gv, np.float64) * (share if embedding_step == "mean" else 1.0)
    grads = (g_h, g_e)
    norm = math.sqrt(sum(float(np.sum(np.square(g))) for g in jax.tree.leaves(grads)))
    scale = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    params = (hnet, emb)
    d = jax.tree.map(lambda g, p, s=scale: g * s + weight_decay * p, grads, params)
    buf = d if buf is None else jax.tree.map(lambda b, x: momentum * b + x, buf, d)
    hnet, emb = jax.tree.map(lambda p, b: p - hn_lr * b, params, buf)
  return hnet, emb


# ------------------------------------------------------------------------ FedProto
def mlp_forward(params, x):
  """``(f(x), logits)`` of a one-hidden-layer MLP, by hand: ``f = relu(x W0 + b0)``."""
  x = x.reshape((x.shape[0], -1))
  f = jax.nn.relu(x @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"][None])
  return f, f @ params["Dense_1"]["kernel"] + params["Dense_1"]["bias"][None]


def fedproto_reference(data, w0, parent, rounds, key, *, cohort_size, lam, weighting, lr, batch_size, steps,
                       num_classes, dtype=np.float32):
  """FedProto per parent of clients (Tan et al. 2022): every sampled client takes SGD steps on
  ``CE + λ · mean (f(x) − C̄^(y))²`` (rows of a class without a global prototype adding 0), then
  sends its class prototypes of its trained model over all its examples; the parent averages them
  (by class counts, or over the clients with the class). Returns ``(models, {parent: (protos,
  present)})``."""
  w = [np64(w0) for _ in range(data.num_clients)]
  global_protos: dict[int, tuple[np.ndarray, np.ndarray]] = {}

  def loss(p, b, protos, present):
    f, logits = mlp_forward(p, b.x)
    ce = masked_cross_entropy(logits, b.y, b.mask)
    has = b.mask & present[b.y]
    sq = jnp.where(has[:, None], (f - protos[b.y]) ** 2, 0.0)
    return ce + lam * jnp.sum(sq) / (jnp.maximum(jnp.sum(b.mask), 1) * f.shape[1])

  grad = jax.jit(jax.grad(loss))
  for r in range(rounds):
    rk = jax.random.fold_in(key, r)
    for p, members in cohorts(parent, cohort_size, rk).items():
      width = w0["Dense_0"]["bias"].shape[0]
      protos, present = global_protos.get(p, (np.zeros((num_classes, width)), np.zeros(num_classes, bool)))
      sums, counts = np.zeros((num_classes, width)), np.zeros(num_classes)
      for k in members:
        cd = client_data(data, k)
        batch_key, _ = jax.random.split(jax.random.fold_in(stream(rk, "train"), k))
        p32 = jax.tree.map(lambda a: jnp.asarray(a, dtype), w[k])
        for t in range(int(steps[k])):
          g = grad(p32, batch_at(batch_key, cd, jnp.asarray(t), batch_size), jnp.asarray(protos, dtype),
                   jnp.asarray(present))
          p32 = jax.tree.map(lambda a, d: a - lr * d, p32, g)
        w[k] = np64(p32)
        n = int(data.n_train[k])
        f, _ = mlp_forward(p32, jnp.asarray(data.x_train[k][:n]))
        f = np.asarray(f, np.float64)
        labels = np.asarray(data.y_train[k][:n])
        for j in range(num_classes):
          rows = f[labels == j]
          if len(rows) == 0:
            continue
          if weighting == "examples":
            sums[j] += rows.sum(axis=0)
            counts[j] += len(rows)
          else:
            sums[j] += rows.mean(axis=0)
            counts[j] += 1
      has = counts > 0
      global_protos[p] = (np.where(has[:, None], sums / np.maximum(counts, 1)[:, None], 0.0), has)
  return w, global_protos
