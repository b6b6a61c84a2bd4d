"""Plain per-client loops of the personalization objectives: the obviously-correct versions
the vectorized code in :mod:`fedtree.objectives` and :mod:`fedtree.core.finetune` is tested against.

Each function trains ONE client with explicit Python loops over steps and inner steps and
explicit update formulas. They draw the same minibatches as the engine (same keys through
``batch_at``), so results agree to float tolerance.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from fedtree.core.local import Batch, ClientData, shuffled_positions
from fedtree.core.local import batch_at as _batch_at
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler

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


# ------------------------------------------------------------------------ partial personalization
# FedPer, FedRep, LG-FedAvg, FedBN, FedRoD, FedBABU and local training, written from the papers:
# a model is a list of leaves (jax.tree.leaves order) and a list of flags saying which leaves stay
# with the client; the server averages the others of the clients that trained, in numpy. Only the
# minibatch order (batch_at), the cohort draw (cohort_sampler) and the forward pass are shared with
# the engine.
def paths_of(params):
  """``"a/b/kernel"`` of every leaf, in leaf order."""
  return ["/".join(str(getattr(k, "key", k)) for k in path)
          for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


def flags(params, predicate):
  """``[predicate(path)]`` per leaf."""
  return [bool(predicate(p)) for p in paths_of(params)]


def client_cdata(data, c):
  return ClientData(x=jnp.asarray(data.x_train[c]), y=jnp.asarray(data.y_train[c]),
                    n=jnp.asarray(data.n_train[c]))


def _at_least_f32(a):
  """``a`` in float32, or wider if it is (float64 under x64)."""
  return a.astype(jnp.promote_types(a.dtype, jnp.float32))


def _ce(logits, y, mask):
  logp = jax.nn.log_softmax(_at_least_f32(logits))
  nll = -jnp.take_along_axis(logp, y[:, None], axis=-1)[:, 0]
  return jnp.sum(jnp.where(mask, nll, 0.0)) / jnp.maximum(jnp.sum(mask), 1)


@functools.cache
def _train_grad(model):
  """``(params, batch) -> (grad, params with the forward's statistics)``: training mode; a
  BatchNorm model's statistics from the batch's real rows."""
  def loss(p, b):
    if model.state:
      logits, upd = model.apply_train(p, b.x, rng=None, mask=b.mask)
      return _ce(logits, b.y, b.mask), {**p, **upd}
    return _ce(model.apply(p, b.x, train=True), b.y, b.mask), p

  return jax.jit(jax.grad(loss, has_aux=True))


def sgd_steps(model, params, cdata, num_steps, key, *, lr, batch_size, trainable=None):
  """``num_steps`` steps of plain SGD by hand, moving only the leaves ``trainable`` flags (``None``:
  all); a statistic is never stepped, it is the forward pass's."""
  batch_key, _ = jax.random.split(key)
  treedef = jax.tree.structure(params)
  stat = flags(params, lambda p: p.startswith("batch_stats/"))
  move = [True] * len(stat) if trainable is None else list(trainable)
  p = params
  for t in range(int(num_steps)):
    b = batch_at(batch_key, cdata, jnp.asarray(t), batch_size)
    g, fwd = _train_grad(model)(p, b)
    leaves, gl, fl = jax.tree.leaves(p), jax.tree.leaves(g), jax.tree.leaves(fwd)
    p = jax.tree.unflatten(treedef, [f if s else (w - lr * gw if m else w)
                                     for w, gw, f, s, m in zip(leaves, gl, fl, stat, move, strict=True)])
  return p


def fedrep_client(model, params, head, cdata, head_steps, body_steps, key, *, lr, batch_size):
  """FedRep's client (Collins et al. 2021, Algorithm 1): the head alone for ``head_steps``, then the
  body alone for ``body_steps``; each phase its own key."""
  head_key, body_key = jax.random.split(key)
  p = sgd_steps(model, params, cdata, head_steps, head_key, lr=lr, batch_size=batch_size, trainable=head)
  return sgd_steps(model, p, cdata, body_steps, body_key, lr=lr, batch_size=batch_size,
                   trainable=[not h for h in head])


@functools.cache
def _rod_grads(model):
  def generic(p, b, log_prior):
    z = model.apply(p, b.x, train=True) + log_prior[None, :]
    return _ce(z, b.y, b.mask)

  def personal(ph, p_rest, b):   # p_rest: the model with the generic head; ph: the head's summed params
    return _ce(model.apply(p_rest(ph), b.x, train=True), b.y, b.mask)

  return jax.jit(jax.grad(generic)), personal


def fedrod_client(model, params, own_head, head, cdata, num_steps, key, *, lr, batch_size, num_classes):
  """FedRoD's client (Chen & Chao 2022, BSM): per minibatch, the generic model steps on the balanced
  softmax loss (logits + log of the client's class counts) and the personal head on the
  cross-entropy of (generic head + personal head) applied to the detached representation, both from
  the same parameters. ``own_head``: the personal head's leaves (those ``head`` flags)."""
  n = int(cdata.n)
  counts = np.bincount(np.asarray(cdata.y[:n]), minlength=num_classes).astype(np.float64)
  log_prior = jnp.asarray(np.where(counts > 0, np.log(np.maximum(counts, 1.0)), -1e9))   # float32 but in x64
  generic_grad, personal_loss = _rod_grads(model)
  treedef = jax.tree.structure(params)
  batch_key, _ = jax.random.split(key)
  p, ph = params, list(own_head)
  for t in range(int(num_steps)):
    b = batch_at(batch_key, cdata, jnp.asarray(t), batch_size)
    leaves = jax.tree.leaves(p)

    def with_head(hs, leaves=leaves):
      it = iter(hs)
      return jax.tree.unflatten(treedef, [w + next(it) if h else w
                                          for w, h in zip(leaves, head, strict=True)])

    gp = jax.grad(lambda hs, b=b, f=with_head: personal_loss(hs, f, b))(ph)
    g = generic_grad(p, b, log_prior)
    p = jax.tree.map(lambda w, gw: w - lr * gw, p, g)
    ph = [w - lr * gw for w, gw in zip(ph, gp, strict=True)]
  return p, ph


def partial_rounds(model, data, start, rounds, key, *, keep, client, cohort_size, weighting="examples",
                   own=None, dtype=jnp.float32):
  """One server, ``rounds`` rounds: every sampled client starts from the server's leaves where
  ``keep`` is False and its own where True, runs ``client(params, c, round_key) -> params``, keeps
  the ``keep`` leaves and sends the others; the server takes the weighted mean of what it received
  (data sizes, or uniform); the clients train in ``dtype``. Returns the server's model and every
  client's own leaves."""
  treedef = jax.tree.structure(start)
  server = [np.asarray(a, np.float64) for a in jax.tree.leaves(start)]
  mine = own if own is not None else [[np.asarray(a, np.float64) for a in jax.tree.leaves(start)]
                                      for _ in range(data.num_clients)]
  sampler = cohort_sampler(np.zeros(data.num_clients, np.int32), cohort_size)
  for r in range(rounds):
    rk = jax.random.fold_in(key, r)
    drawn = sampler(stream(rk, "cohort"))
    cohort = [int(c) for c, v in zip(np.asarray(drawn.clients), np.asarray(drawn.valid), strict=True) if v]
    sent, weights = [], []
    for c in cohort:
      start_c = [mine[c][i] if keep[i] else server[i] for i in range(len(server))]
      p = client(jax.tree.unflatten(treedef, [jnp.asarray(a, dtype) for a in start_c]), c, rk)
      leaves = [np.asarray(a, np.float64) for a in jax.tree.leaves(p)]
      mine[c] = [leaves[i] if keep[i] else mine[c][i] for i in range(len(leaves))]
      sent.append(leaves)
      weights.append(float(data.n_train[c]) if weighting == "examples" else 1.0)
    if sent:
      total = sum(weights)
      server = [server[i] if keep[i] else sum(w * s[i] for w, s in zip(weights, sent, strict=True)) / total
                for i in range(len(server))]
  return jax.tree.unflatten(treedef, server), [jax.tree.unflatten(treedef, m) for m in mine]


def own_model(server, own, keep):
  """A client's model: its own leaves where ``keep``, the server's elsewhere."""
  return jax.tree.unflatten(jax.tree.structure(server), [o if k else s for s, o, k in zip(
    jax.tree.leaves(server), jax.tree.leaves(own), keep, strict=True)])


# ------------------------------------------------------------------------ issue 38: mixtures and memories
def apfl(model, w, v, alpha, cdata, num_steps, key, *, lr, alpha_lr, adaptive, alpha_decay=0.0,
         schedule="every_step", batch_size):
  """APFL's client (Deng et al. 2020, Algorithm 1), one step at a time on the same minibatch and the
  same iterate: ``w -= η ∇f(w)``, ``v -= η α ∇f(v̄)``, ``α -= η_α (⟨v − w, ∇f(v̄)⟩ + c α)`` projected
  on ``[0, 1]``, with ``v̄ = α v + (1 − α) w``. Returns ``(w, v, α)``."""
  for t, (batch, _) in enumerate(step_batches(key, cdata, num_steps, batch_size)):
    vbar = jax.tree.map(lambda a, b, al=alpha: al * a + (1 - al) * b, v, w)
    gw, gbar = grad(model, w, batch), grad(model, vbar, batch)
    new_w = axpy(-lr, gw, w)
    new_v = axpy(-lr * alpha, gbar, v)
    if adaptive and (schedule == "every_step" or t == 0):
      ga = sum(float(jnp.vdot(a - b, g)) for a, b, g in zip(jax.tree.leaves(v), jax.tree.leaves(w),
                                                             jax.tree.leaves(gbar), strict=True))
      alpha = float(min(max(alpha - alpha_lr * (ga + alpha_decay * alpha), 0.0), 1.0))
    w, v = new_w, new_v
  return w, v, alpha


def subset_rows(key, n, fraction, batch_size, j):
  """The rows and mask of batch ``j`` of FedALA's random subset: the first ``max(1, floor(s n))`` of the
  client's examples in the permutation ``key`` draws (the engine's permutation primitive)."""
  size = max(1, int(np.floor(np.float32(n) * np.float32(fraction)))) if n > 0 else 0
  pos = j * batch_size + np.arange(batch_size)
  rows = np.asarray(shuffled_positions(key, jnp.asarray(np.minimum(pos, max(size, 1) - 1)), jnp.asarray(n)))
  return rows, pos < size, size


def fedala(model, glob, local, weights, started, cdata, num_steps, key, *, higher, eta, fraction, threshold,
           num_pre_loss, max_epochs, lr, batch_size):
  """FedALA's client (Zhang et al. 2023, Algorithm 1): ALA of ``glob`` into ``local`` over the higher
  leaves (``higher``, leaf order; the lower ones take ``glob``), the weights learned on a random
  subset until the last ``num_pre_loss`` epoch losses' std is below ``threshold`` the first time,
  one epoch afterwards; then local SGD. Returns ``(trained, weights, started)``."""
  g_leaves, treedef = jax.tree.flatten(glob)
  l_leaves = jax.tree.leaves(local)
  hi = [i for i, h in enumerate(higher) if h]
  diff = [np.asarray(g_leaves[i]) - np.asarray(l_leaves[i]) for i in hi]
  w = [np.asarray(x) for x in weights]

  def assemble(w):
    leaves = [np.asarray(g) for g in g_leaves]
    for k, i in enumerate(hi):
      leaves[i] = np.asarray(l_leaves[i]) + diff[k] * w[k]
    return jax.tree.unflatten(treedef, [jnp.asarray(a) for a in leaves])

  sub_key, _ = jax.random.split(stream(key, "ala"))
  n = int(cdata.n)
  differs = any(np.any(d != 0) for d in diff)
  epochs, losses = 0, []
  if differs and n > 0:
    while True:
      _, _, size = subset_rows(sub_key, n, fraction, batch_size, 0)
      total, nb = 0.0, -(-size // batch_size)
      for j in range(nb):
        rows, mask, _ = subset_rows(sub_key, n, fraction, batch_size, j)
        x = np.where(mask.reshape((-1,) + (1,) * (np.ndim(cdata.x) - 1)), np.asarray(cdata.x)[rows], 0)
        y = np.where(mask, np.asarray(cdata.y)[rows], 0)
        b = Batch(x=jnp.asarray(x), y=jnp.asarray(y), mask=jnp.asarray(mask))
        params = assemble(w)
        total += float(loss_fn(model, params, b))
        gl = [np.asarray(g) for g in jax.tree.leaves(grad(model, params, b))]
        w = [np.clip(wk - eta * gl[i] * diff[k], 0.0, 1.0)
             for k, (i, wk) in enumerate(zip(hi, w, strict=True))]
      losses.append(total / max(nb, 1))
      epochs += 1
      if started:
        break
      if epochs > num_pre_loss and np.std(losses[-num_pre_loss:]) < threshold:
        break
      if epochs >= max_epochs:
        break
  start = assemble(w)
  trained = sgd(model, start, cdata, num_steps, key, lr=lr, batch_size=batch_size)
  return trained, w, started or epochs > 0


def example_nll(model, params, x, y):
  """``[B]`` per-example cross-entropy of one model (evaluation mode)."""
  logp = jax.nn.log_softmax(_at_least_f32(model.apply(params, jnp.asarray(x), train=False)))
  return np.asarray(-jnp.take_along_axis(logp, jnp.asarray(y)[:, None], axis=-1)[:, 0], np.float64)


def fedem(model, components, pi, cdata, num_steps, key, *, lr, batch_size):
  """FedEM's client (Marfoq et al. 2021, Algorithm 1): the E-step's posteriors of every example
  ``q_kj ∝ π_k exp(−ℓ_k(j))``, ``π_k = mean_j q_kj``, then ``num_steps`` SGD steps of every component
  on ``(1/|B|) Σ_{j∈B} q_kj ℓ_k(j)`` over the same minibatches. Returns ``(components, π)``."""
  k = len(components)
  n = int(cdata.n)
  x, y = np.asarray(cdata.x)[:n], np.asarray(cdata.y)[:n]
  pi = np.asarray(pi, np.float64)
  if n > 0:
    nll = np.stack([example_nll(model, c, x, y) for c in components])        # [K, n]
    logq = np.log(pi)[:, None] - nll
    q = np.exp(logq - logq.max(0, keepdims=True))
    q /= q.sum(0, keepdims=True)
    pi = q.mean(1)
  else:
    q = np.zeros((k, 0))
  rows = ClientData(x=cdata.x, y=jnp.arange(np.shape(cdata.x)[0], dtype=jnp.int32), n=cdata.n)
  out = list(components)
  for (b, _), (lab, _) in zip(step_batches(key, cdata, num_steps, batch_size),
                              step_batches(key, rows, num_steps, batch_size), strict=True):
    idx = np.asarray(lab.y)
    mask = np.asarray(b.mask)
    count = max(float(mask.sum()), 1.0)
    for c in range(k):
      qb = np.where(mask, q[c][np.minimum(idx, max(n - 1, 0))] if n else 0.0, 0.0)

      def weighted(p, b=b, qb=qb, count=count):
        logp = jax.nn.log_softmax(_at_least_f32(model.apply(p, b.x, train=True)))
        nll = -jnp.take_along_axis(logp, b.y[:, None], axis=-1)[:, 0]
        return jnp.sum(jnp.asarray(qb, nll.dtype) * nll) / count

      out[c] = axpy(-lr, jax.grad(weighted)(out[c]), out[c])
  return out, pi


def knn_scores(query, logits, feats, labels, count, *, k, lam, temperature):
  """kNN-Per's interpolated probabilities ``[B, K]`` for one client in float64: the ``min(k, count)``
  memory entries nearest to each query by squared distance, weights ``exp(−d²/T)``."""
  q, f = np.asarray(query, np.float64), np.asarray(feats, np.float64)[:count]
  z = np.asarray(logits, np.float64)
  p_model = np.exp(z - z.max(1, keepdims=True))
  p_model /= p_model.sum(1, keepdims=True)
  if count == 0:
    return p_model
  d2 = ((q[:, None, :] - f[None, :, :]) ** 2).sum(-1)
  out = np.zeros_like(p_model)
  for i in range(len(q)):
    near = np.argsort(d2[i], kind="stable")[:min(k, count)]
    w = np.exp(-(d2[i, near] - d2[i, near].min()) / temperature)
    w /= w.sum()
    for wj, j in zip(w, near, strict=True):
      out[i, int(labels[j])] += wj
  return lam * out + (1 - lam) * p_model
