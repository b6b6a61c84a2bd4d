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


# ------------------------------------------------------------------------ partial personalization
# FedPer, FedRep, LG-FedAvg, FedBN, FedRoD, FedBABU and local training, written from the papers:
# a model is a list of leaves (jax.tree.leaves order) and a list of flags saying which leaves stay
# with the client; the server averages the others of the clients that trained, in numpy. Only the
# minibatch order (batch_at), the cohort draw (cohort_sampler) and the forward pass are shared with
# the engine.
import numpy as np  # noqa: E402

from fedtree.core.local import ClientData  # noqa: E402
from fedtree.core.sampling import cohort_sampler  # noqa: E402


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


def _ce(logits, y, mask):
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
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
  log_prior = jnp.asarray(np.where(counts > 0, np.log(np.maximum(counts, 1.0)), -1e9), jnp.float32)
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
                   own=None):
  """One server, ``rounds`` rounds: every sampled client starts from the server's leaves where
  ``keep`` is False and its own where True, runs ``client(params, c, round_key) -> params``, keeps
  the ``keep`` leaves and sends the others; the server takes the weighted mean of what it received
  (data sizes, or uniform). Returns the server's model and every client's own leaves."""
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
      p = client(jax.tree.unflatten(treedef, [jnp.asarray(a, jnp.float32) for a in start_c]), c, rk)
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
