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
from fedtree.core.sampling import cohort_sampler
from fedtree.models import masked_cross_entropy


def np64(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def small_problem():
  """The baselines' tests' problem: 9 clients in groups of 3, 2, 4 (ragged, 3 to 14 examples), an
  MLP with one hidden layer of 5; ``(device data, groups, model)``."""
  from fedtree.core.data import as_device
  from fedtree.datasets.synthetic import grouped_synthetic
  from fedtree.models import build_model

  data, groups = grouped_synthetic(group_sizes=(3, 2, 4), dim=6, num_classes=3, mean_examples=9,
                                   min_examples=3, max_examples=14, test_examples=5, seed=3)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,))
  return as_device(data), groups, model


def close(a, b, atol=3e-5):
  """``a`` and ``b`` equal as float64 trees within the tolerance of a float32 run."""
  import chex

  chex.assert_trees_all_close(np64(a), np64(b), atol=atol, rtol=2e-4)


def row(tree, i):
  """Row ``i`` of every leaf of a stacked tree, as float64."""
  return jax.tree.map(lambda a: np.asarray(a[i], np.float64), tree)


def start(alg):
  """The model every client starts from in :func:`run_jit` (``alg.init(key(7))``'s first node)."""
  return jax.tree.map(lambda p: p[0], alg.init(jax.random.key(7)).params[0])


def run_jit(alg, data, rounds, key):
  """``rounds`` jitted rounds of ``alg`` from ``init(key(7))``, round ``r``'s key ``fold_in(key, r)``:
  the final state and the last round's metrics."""
  state = alg.init(jax.random.key(7))
  step = jax.jit(alg.round)
  metrics = None
  for r in range(rounds):
    state, metrics = step(state, data, jax.random.fold_in(key, r))
  return state, metrics


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


def scaffold_client(model, x, c_server, c_own, data, client, num_steps, key, *, lr, batch_size, option,
                    dtype=np.float32):
  """SCAFFOLD's client (Karimireddy et al. 2020, Algorithm 1, lines 8-12), step by step:
  ``y ← y − η (g(y) − c_i + c)`` for ``K`` steps, then ``c_i⁺`` by option I or II (the model in
  ``dtype``: float64 under x64 for the float64 references)."""
  cd = client_data(data, client)
  batch_key, _ = jax.random.split(key)
  g = grad_fn(model)
  y = x
  for t in range(int(num_steps)):
    b = batch_at(batch_key, cd, jnp.asarray(t), batch_size)
    gy = g(y, b)
    y = jax.tree.map(
      lambda w, gw, ci, cs: np.asarray(w, dtype) - lr * (np.asarray(gw) - ci + cs).astype(dtype),
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


def scaffold_rounds(
  model,
  data,
  x0,
  parent,
  rounds,
  key,
  *,
  cohort_size,
  option,
  average,
  eta_g,
  steps,
  root_period=None,
  weights=None,
  lr,
  batch_size,
  dtype=np.float32,
  combine=None,
  transform=None,
):
  """SCAFFOLD's Algorithm 1 per parent of clients (its own x and c, kept in float64), the root (if any)
  averaging the parents' models by ``weights`` every ``root_period`` rounds; the clients train in
  ``dtype``. ``combine(list of trees)``: a parent's estimate of its clients' ``Δy`` and ``Δc`` alike
  (default their mean; a robust rule, the variates' sum then the estimate times their count).
  ``transform((Δy, Δc)) -> (Δy, Δc)``: what a client's update path makes of the pair it sends (a joint
  clip), the client keeping its own ``c_i``. Returns ``(x, c, c_i)``."""
  num_parents = int(parent.max()) + 1
  x = [np64(x0) for _ in range(num_parents)]
  c = [jax.tree.map(np.zeros_like, x[0]) for _ in range(num_parents)]
  c_i = [jax.tree.map(np.zeros_like, x[0]) for _ in range(data.num_clients)]
  sampler = cohort_sampler(parent, cohort_size)
  population = np.bincount(parent, minlength=num_parents)
  for r in range(rounds):
    rk = jax.random.fold_in(key, r)
    cohort = sampler(stream(rk, "cohort"))
    slots = [
      (int(k), int(p))
      for k, p, v in zip(
        np.asarray(cohort.clients), np.asarray(cohort.parent), np.asarray(cohort.valid), strict=True
      )
      if v
    ]
    dy = [[] for _ in range(num_parents)]
    dc = [[] for _ in range(num_parents)]
    for k, p in slots:
      start = jax.tree.map(lambda a: jnp.asarray(a, dtype), x[p])
      y, new_c = scaffold_client(
        model,
        start,
        c[p],
        c_i[k],
        data,
        k,
        steps[k],
        jax.random.fold_in(stream(rk, "train"), k),
        lr=lr,
        batch_size=batch_size,
        option=option,
        dtype=dtype,
      )
      pair = (jax.tree.map(lambda yy, xx: np.asarray(yy, np.float64) - xx, y, x[p]),
              jax.tree.map(np.subtract, new_c, c_i[k]))
      if transform is not None:
        pair = transform(pair)
      dy[p].append(pair[0])
      dc[p].append(pair[1])
      c_i[k] = new_c
    for p in range(num_parents):
      if not dy[p]:
        continue
      count = population[p] if average == "all" else len(dc[p])
      if combine is None:
        mean_dy = jax.tree.map(lambda *d: sum(d) / len(d), *dy[p])
        c[p] = jax.tree.map(lambda cc, *d, n=count: cc + sum(d) / n, c[p], *dc[p])
      else:
        mean_dy = combine(dy[p])
        m = len(dc[p])
        c[p] = jax.tree.map(lambda cc, e, n=count, m=m: cc + e * m / n, c[p], combine(dc[p]))
      x[p] = jax.tree.map(lambda xx, d: xx + eta_g * d, x[p], mean_dy)
    if root_period and (r + 1) % root_period == 0:
      root = jax.tree.map(lambda *m: sum(w * a for w, a in zip(weights, m, strict=True)) / sum(weights), *x)
      x = [root for _ in range(num_parents)]
  return x, c, c_i



def _cast(tree, dtype):
  return jax.tree.map(lambda a: np.asarray(a, dtype), tree)


def feddyn_client(model, x, grad_l, data, client, num_steps, key, *, lr, batch_size, alpha, dtype=np.float32):
  """FedDyn's client (Acar et al. 2021, Algorithm 1), plain SGD step by step on
  ``L_i(θ) − ⟨∇L_i, θ⟩ + (α/2)‖θ − x‖²``: ``θ ← θ − η (g(θ) − ∇L_i + α (θ − x))`` for ``K`` steps,
  then ``∇L_i ← ∇L_i − α (θ − x)``. Returns ``(θ, ∇L_i⁺)``; the model in ``dtype``."""
  cd = client_data(data, client)
  batch_key, _ = jax.random.split(key)
  g = grad_fn(model)
  y = _cast(x, dtype)
  for t in range(int(num_steps)):
    gy = g(y, batch_at(batch_key, cd, jnp.asarray(t), batch_size))

    def step(w, gw, gl, xx):
      return w - dtype(lr) * (np.asarray(gw) - dtype(gl) + dtype(alpha) * (w - xx))

    y = jax.tree.map(step, y, gy, grad_l, _cast(x, dtype))
  new = jax.tree.map(lambda gl, w, xx: gl - alpha * (np.asarray(w, np.float64) - np.asarray(xx, np.float64)),
                     np64(grad_l), y, x)
  return y, new


def fednova_client(model, x, data, client, num_steps, key, *, lr, batch_size, momentum, dtype=np.float32):
  """FedNova's client (Wang et al. 2020): ``τ`` steps of SGD with heavy-ball momentum ``ρ``
  (``v ← ρ v + g``, ``y ← y − η v``) and ``‖a‖₁`` by the paper's recursion (``c ← ρ c + 1``,
  ``‖a‖₁ += c`` per step, in Python floats). Returns ``(y, ‖a‖₁)``; the model in ``dtype``."""
  cd = client_data(data, client)
  batch_key, _ = jax.random.split(key)
  g = grad_fn(model)
  y = jax.tree.map(lambda a: np.asarray(a, dtype), x)
  v = jax.tree.map(np.zeros_like, y)
  counter = norm = 0.0
  for t in range(int(num_steps)):
    gy = g(y, batch_at(batch_key, cd, jnp.asarray(t), batch_size))
    v = jax.tree.map(lambda vv, gw: dtype(momentum) * vv + np.asarray(gw), v, gy)
    y = jax.tree.map(lambda w, vv: w - dtype(lr) * vv, y, v)
    counter = momentum * counter + 1.0
    norm += counter
  return y, norm


def mime_client(model, x, momentum_state, c, data, client, num_steps, key, *, lr, batch_size, momentum,
                corrected, dtype=np.float32):
  """Mime's (``corrected``) or MimeLite's client (Karimireddy et al. 2021, Algorithm 1) with SGD and
  heavy-ball momentum ``ρ`` as the base optimizer, written out: the server's momentum ``m`` fixed,
  ``y ← y − η (g + ρ m)`` with ``g = ∇f(y; ζ)`` (MimeLite) or ``∇f(y; ζ) − ∇f(x; ζ) + c`` (Mime); the
  model in ``dtype``."""
  cd = client_data(data, client)
  batch_key, _ = jax.random.split(key)
  grad = grad_fn(model)
  y = _cast(x, dtype)
  for t in range(int(num_steps)):
    b = batch_at(batch_key, cd, jnp.asarray(t), batch_size)
    gy = jax.tree.map(np.asarray, grad(y, b))
    if corrected:
      gy = jax.tree.map(lambda a, bb, cc: a - np.asarray(bb) + dtype(cc), gy, grad(_cast(x, dtype), b), c)
    y = jax.tree.map(lambda w, gw, m: w - dtype(lr) * (gw + dtype(momentum) * dtype(m)),
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


def fednova_rounds(
  model,
  data,
  x0,
  parent,
  rounds,
  key,
  *,
  cohort_size,
  aggregation,
  weights,
  steps,
  momentum,
  root_period=None,
  lr,
  batch_size,
  dtype=np.float32,
  combine=None,
):
  """FedNova per parent of clients: ``x ← x − τ_eff Σ_i p_i (x − y_i)/‖a_i‖₁`` with ``p_i`` and
  ``τ_eff = Σ_i p_i ‖a_i‖₁`` as ``aggregation`` says; the root (if any) averages the parents' models
  by their clients' weights every ``root_period`` rounds (in float64; the clients train in ``dtype``).
  ``combine(list of trees)``: a robust estimate of the ``d_i`` in place of their ``p``-weighted mean
  (``Σ_i p_i`` times it)."""
  parent = np.asarray(parent)
  total = np.bincount(parent, weights=weights)
  population = np.bincount(parent)

  def client(rk, k, p, x):
    return fednova_client(
      model, x, data, k, steps[k], train_key(rk, k), lr=lr, batch_size=batch_size, momentum=momentum,
      dtype=dtype)

  def server(p, x, answers):
    w = np.asarray([weights[k] for k, _ in answers])
    a = np.asarray([norm for _, (_, norm) in answers])
    d = [
      jax.tree.map(lambda xx, yy, n=n: (xx - np.asarray(yy, np.float64)) / n if n > 0 else 0 * xx, x, y)
      for (_, (y, _)), n in zip(answers, a, strict=True)
    ]
    pk = w / (w.sum() if aggregation == "answered" else total[p])
    tau_eff = float(np.sum(pk * a))
    scale = population[p] / len(answers) if aggregation == "scaled" else 1.0
    if combine is not None:
      est = combine(d)
      step = jax.tree.map(lambda e: tau_eff * scale * float(np.sum(pk)) * e, est)
      return jax.tree.map(np.subtract, x, step)
    step = jax.tree.map(lambda *di: tau_eff * scale * sum(q * dd for q, dd in zip(pk, di, strict=True)), *d)
    return jax.tree.map(np.subtract, x, step)

  return run_rounds(
    data,
    x0,
    parent,
    rounds,
    key,
    cohort_size=cohort_size,
    client=client,
    server=server,
    root_period=root_period,
    root_weights=list(total) if root_period else None,
  )



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
                   weights=None, loss_epsilon=1e-10, transform=None, combine=None):
  """One round of q-FedAvg (Li et al. 2020, Algorithm 2) over ``cohort``: every client's ``F_k``,
  ``Δ_k = F_k^q L (w − w̄_k)``, ``h_k = q F_k^{q−1} ‖L (w − w̄_k)‖² + L F_k^q``; ``w − Σ Δ_k / Σ h_k``
  (with ``weights``: ``w − Σ p_k Δ_k / Σ p_k h_k``); ``F_k`` gets ``+ loss_epsilon``. ``transform((Δ_k,
  h_k))``: each client's pair as its path leaves it (a joint clip); ``combine(list)``: a robust rule in
  place of both sums (the step ``combine(Δ) / combine(h)``)."""
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
    f += loss_epsilon
    dw = jax.tree.map(lambda a, b: big_l * (np.asarray(a, np.float64) - np.asarray(b, np.float64)), x, w)
    sq = sum(float(np.sum(d ** 2)) for d in jax.tree.leaves(dw))
    delta = jax.tree.map(lambda d, f=f, p=p: p * f ** q * d, dw)
    h = p * (q * f ** (q - 1) * sq + big_l * f ** q)
    if transform is not None:
      delta, h = transform((delta, np.asarray(h)))
    deltas.append(delta)
    hs.append(float(h))
  if combine is not None:
    step, h_all = combine(deltas), float(combine([np.asarray(h) for h in hs]))
    return jax.tree.map(lambda a, d: np.asarray(a, np.float64) - np.asarray(d) / h_all, x, step)
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


def fedasync_event_loop(model, x0, data, speeds, steps, rounds, root, *, lr, batch_size, alpha, s,
                        dtype=np.float32, receive=None):
  """FedAsync (Xie et al. 2019, Algorithm 1) with every client always in flight, as an event loop:
  the earliest to finish trains from the model of the version it started from (with the key of the
  server update that applies it; ``receive(model)``: as a downlink transform delivers it), ``x ← (1 −
  α s(t − τ)) x + α s(t − τ) y`` (in float64, the model kept in ``dtype``), and starts again from the
  new model. Returns the models and every update's staleness."""
  import heapq

  models, stale = [x0], []
  heap = [(steps[c] / speeds[c], c, 0) for c in range(len(speeds))]
  heapq.heapify(heap)
  x = x0
  for r in range(rounds):
    t, c, v = heapq.heappop(heap)
    rk = jax.random.fold_in(root, r)
    start = models[v] if receive is None else receive(models[v])
    y, _ = sgd_client(model, start, data, c, steps[c], jax.random.fold_in(stream(rk, "train"), c), lr=lr,
                      batch_size=batch_size)
    a = alpha * s(r - v)
    def mix(p, q, a=a):
      return jnp.asarray((1 - a) * np.asarray(p, np.float64) + a * np.asarray(q, np.float64), dtype)

    x = jax.tree.map(mix, x, y)
    models.append(x)
    stale.append(r - v)
    heapq.heappush(heap, (t + steps[c] / speeds[c], c, r + 1))
  return models, stale


def fedbuff_event_loop(model, x0, data, speeds, steps, weights, rounds, root, *, buffer, lr, batch_size,
                       exponent):
  """FedBuff (Nguyen et al. 2022, Algorithm 1) with every client always in flight, as an event loop in
  float64: the ``buffer`` earliest to finish each train from the model of the version they started
  from (with the key of the server update that applies them), the server steps
  ``x ← x − Σ_i w_i (1 + τ_i)^-a (x_{τ_i} − y_i) / Σ_i w_i`` and they start again from the new model.
  Returns the models and every update's stalenesses."""
  import heapq

  models, stale = [x0], []
  heap = [(steps[c] / speeds[c], c, 0) for c in range(len(speeds))]
  heapq.heapify(heap)
  x = x0
  for r in range(rounds):
    done = [heapq.heappop(heap) for _ in range(buffer)]
    rk = jax.random.fold_in(root, r)
    delta, total = None, 0.0
    for _, c, v in done:
      y, _ = sgd_client(model, models[v], data, c, steps[c], jax.random.fold_in(stream(rk, "train"), c),
                        lr=lr, batch_size=batch_size)
      scale = float(weights[c]) * (1.0 + (r - v)) ** -exponent
      d = jax.tree.map(lambda a, b, f=scale: f * (np.asarray(a, np.float64) - np.asarray(b, np.float64)),
                       models[v], y)
      delta = d if delta is None else jax.tree.map(np.add, delta, d)
      total += float(weights[c])
    x = jax.tree.map(lambda p, d, t=total: jnp.asarray(np.asarray(p, np.float64) - d / t), x, delta)
    models.append(x)
    stale.append([r - v for _, _, v in done])
    clock = max(t for t, _, _ in done)
    for _, c, _ in done:
      heapq.heappush(heap, (clock + steps[c] / speeds[c], c, r + 1))
  return models, stale


# ------------------------------------------------------------------------ issue 53: FedEx
def fedex_rounds(model, data, x0, parent, rounds, key, *, cohort_size, weights, steps, lr, batch_size, scales,
                 val_fraction, discount, dtype=np.float32):
  """FedEx (Khodak et al. 2021) per parent of clients, written from the authors' ``FedEx.step``: every
  sampled client draws ``j ~ θ_p`` (the engine's draw: ``categorical`` on the first half of its train
  key), runs ``steps[k]`` SGD steps at ``lr · scales[j]`` on its first ``n − v`` rows and scores the
  mean loss of the model it trained and of the one it received on its last ``v`` rows; the parent
  averages the models by ``weights`` (FedAvg) and steps ``log θ_p`` by the exponentiated gradient with
  the ``aggressive`` size and the discounted baseline (in float64; the clients in ``dtype``). Returns
  ``(models, log θ)`` per parent."""
  scales = np.asarray(scales, np.float64)
  k_all = len(scales)
  eta0 = np.sqrt(2.0 * np.log(k_all))
  num_parents = int(np.max(parent)) + 1
  log_theta = [np.full(k_all, -np.log(k_all)) for _ in range(num_parents)]
  trace, count = [0.0] * num_parents, [0.0] * num_parents
  f = _value_and_grad(model)

  def mean_loss(params, k, first):
    n = int(data.n_train[k])
    logits = np.asarray(model.apply(params, jnp.asarray(data.x_train[k][first:n]), train=False, rng=None),
                        np.float64)
    y = np.asarray(data.y_train[k][first:n])
    logp = logits - np.log(np.sum(np.exp(logits - logits.max(1, keepdims=True)), 1, keepdims=True)) \
      - logits.max(1, keepdims=True)
    return float(-np.mean(logp[np.arange(len(y)), y]))

  def client(rk, k, p, x):
    pick, train = jax.random.split(train_key(rk, k))
    theta = np.exp(log_theta[p])
    j = int(jax.random.categorical(pick, jnp.log(jnp.asarray(theta, jnp.result_type(float)))))
    n = int(data.n_train[k])
    v = 0 if n < 2 else min(max(int(np.floor(n * val_fraction)), 1), n - 1)
    first = n - v
    cd = client_data(data, k)._replace(n=jnp.asarray(first))
    batch_key, _ = jax.random.split(train)
    w = jax.tree.map(lambda a: np.asarray(a, dtype), x)
    for t in range(int(steps[k])):
      _, g = f(w, batch_at(batch_key, cd, jnp.asarray(t), batch_size))
      w = jax.tree.map(lambda a, d: a - dtype(lr * scales[j]) * np.asarray(d, dtype), w, g)
    after = mean_loss(w, k, first) if v else 0.0
    before = mean_loss(jax.tree.map(lambda a: np.asarray(a, dtype), x), k, first) if v else 0.0
    return w, j, v, after, before, theta

  def server(p, x, answers):
    wk = np.asarray([weights[k] for k, _ in answers], np.float64)
    new = jax.tree.map(lambda *ys: sum(q * np.asarray(y, np.float64) for q, y in zip(wk, ys, strict=True))
                       / wk.sum(), *[a[0] for _, a in answers])
    rows = sum(a[2] for _, a in answers)
    if rows > 0:
      baseline = trace[p] / count[p] if count[p] > 0 else 0.0
      grad = np.zeros(k_all)
      for _, (_, j, v, after, _, theta) in answers:
        grad[j] += v * (after - baseline) / theta[j] / rows
      norm = np.max(np.abs(grad))
      z = log_theta[p] - eta0 / (norm if norm > 0 else 1.0) * grad
      m = z.max()
      log_theta[p] = z - (m + np.log(np.sum(np.exp(z - m))))
      trace[p] = discount * trace[p] + sum(a[2] * a[3] for _, a in answers) / rows
      count[p] = discount * count[p] + 1.0
    return new

  models = run_rounds(data, x0, parent, rounds, key, cohort_size=cohort_size, client=client, server=server)
  return models, log_theta
