"""A per-client reference loop of the width methods (HeteroFL, FedRolex, FjORD), written from the papers:
every local step cuts the client's channels out of its MLP (two hidden layers), trains that smaller MLP
built with its own widths, and writes them back; the server averages each coordinate over its holders in
numpy. It shares nothing with the vectorized engine but the minibatch order (``batch_at``), the cohort
draw, the capacity placement (``client_levels``) and FjORD's width draw (``ordered_width``), each tested
on its own. Used by tests/test_heterogeneous.py (float32) and tests/x64_references.py (float64)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from reference_baselines import client_data

from fedtree.algorithms.heterogeneous.heterofl import drawn_level, ordered_width
from fedtree.algorithms.heterogeneous.width import client_levels
from fedtree.core.local import batch_at
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.models import build_model, masked_cross_entropy


@functools.cache
def sub_model_gradient(example_shape, widths, scale, classes=None):
  """The gradient of the small MLP of ``widths`` whose hidden layers' outputs are multiplied by ``scale``
  and, with ``classes`` (a tuple of bools), whose other classes' logits are 0 (HeteroFL's masked_fill)."""
  small = build_model("mlp", example_shape=example_shape, num_classes=3, hidden=widths)

  def loss(p, b):
    scaled = {n: jax.tree.map(lambda v, n=n: v * (1.0 if n == "Dense_2" else scale), layer)
              for n, layer in p.items()}
    logits = small.apply(scaled, b.x)
    if classes is not None:
      logits = jnp.where(jnp.asarray(classes), logits, 0.0)
    return masked_cross_entropy(logits, b.y, b.mask)

  return jax.jit(jax.grad(loss))


@functools.cache
def distilled_gradients(example_shape, wide, narrow, weight, temperature):
  """FjORD's self-distillation by hand: the gradients of the teacher (the small MLP of widths ``wide``)
  on its cross-entropy and of the student (``narrow``) on ``(1 − α) CE + α T² KL(softmax(teacher / T) ‖
  softmax(student / T))``, the teacher's logits a constant, each mean over the batch's real rows."""
  teacher, student = (build_model("mlp", example_shape=example_shape, num_classes=3, hidden=w)
                      for w in (wide, narrow))

  def student_loss(p, b, z):
    zs, t = student.apply(p, b.x), temperature
    q = jax.nn.softmax(z / t)
    kl = jnp.sum(q * (jnp.log(q) - jax.nn.log_softmax(zs / t)), axis=-1)
    m = b.mask.astype(kl.dtype)
    mean_kl = jnp.sum(kl * m) / jnp.maximum(jnp.sum(m), 1.0)
    return (1 - weight) * masked_cross_entropy(zs, b.y, b.mask) + weight * t * t * mean_kl

  @jax.jit
  def grads(pt, ps, b):
    g_t = jax.grad(lambda p: masked_cross_entropy(teacher.apply(p, b.x), b.y, b.mask))(pt)
    return g_t, jax.grad(student_loss)(ps, b, teacher.apply(pt, b.x))

  return grads


def channels(x, rate, offset, classes=None):
  """The MLP's held rows and columns at ``rate`` (a window from ``offset``; of the output layer the
  ``classes``, default all), and its hidden widths."""
  names = ["Dense_0", "Dense_1", "Dense_2"]
  widths = [int(np.ceil(rate * x[n]["bias"].size)) for n in names[:2]]
  outs = [(offset + np.arange(k)) % x[n]["bias"].size for n, k in zip(names[:2], widths, strict=True)]
  outs.append(np.arange(x["Dense_2"]["bias"].size) if classes is None else np.flatnonzero(classes))
  ins = [np.arange(x["Dense_0"]["kernel"].shape[0]), outs[0], outs[1]]
  return list(zip(names, ins, outs, strict=True)), tuple(widths)


def reference(data, x0, rounds, key, *, cohort_size, mode, scaler, rates, shares, seed, lr, steps,
              batch_size, label_split=False, distill=None, clip=None, expected_weight=None, dynamic=False):
  """HeteroFL / FedRolex / FjORD as a peer runs them: every local step of a sampled client cuts its
  channels out of its model (its own width; FjORD's, a width drawn up to its own), trains that smaller
  MLP (its hidden outputs divided by the rate with the scaler) and writes them back; the server averages
  each coordinate over the clients that hold it, weighted by their examples. With ``distill`` (``(α, T)``,
  FjORD) every step also cuts the client's own width as the teacher (:func:`distilled_gradients`), and
  both sub-models' gradients, taken at the same point, step the coordinates each holds. With ``clip``
  (central differential privacy without noise, uniform weights): every client's update ``x − y`` (zero
  where it holds nothing) scaled to norm at most ``clip``, summed, and each coordinate's sum divided by
  its expected reporting holders, ``expected_weight`` times the population's share holding it. With
  ``dynamic`` every sampled client's level is drawn anew every round from ``shares``
  (:func:`~fedtree.algorithms.heterogeneous.heterofl.drawn_level` on its key of the round)."""
  levels = client_levels(np.asarray(shares), data.num_clients, seed)
  dtype = np.asarray(jax.tree.leaves(x0)[0]).dtype   # the clients train in the model's dtype
  x = {k: {f: np.asarray(v, np.float64) for f, v in layer.items()} for k, layer in x0.items()}
  sampler = cohort_sampler(np.zeros(data.num_clients, np.int32), cohort_size)
  for r in range(rounds):
    rk = jax.random.fold_in(key, r)
    cohort = sampler(stream(rk, "cohort"))
    total = {k: {f: np.zeros_like(v) for f, v in layer.items()} for k, layer in x.items()}
    held = {k: {f: np.zeros_like(v) for f, v in layer.items()} for k, layer in x.items()}
    for c, valid in zip(np.asarray(cohort.clients), np.asarray(cohort.valid), strict=True):
      if not valid:
        continue
      client_key = jax.random.fold_in(stream(rk, "train"), int(c))
      level = int(drawn_level(client_key, np.asarray(shares))) if dynamic else levels[c]
      own, offset = rates[level], (r if mode == "rolling" else 0)
      classes = None
      if label_split:   # the classes in the client's training rows
        classes = tuple(bool(k in set(np.asarray(data.y_train[c, : int(data.n_train[c])]).tolist()))
                        for k in range(3))
      batch_key, step_key = jax.random.split(client_key)
      cd = client_data(data, int(c))
      y = {n: {f: v.astype(dtype) for f, v in layer.items()} for n, layer in x.items()}
      for t in range(steps):
        rate = own
        if mode == "ordered":
          choices = sorted(q for q in rates if q <= own)
          rate = choices[int(ordered_width(jax.random.fold_in(step_key, t), len(choices)))]
        layers, widths = channels(x, rate, offset)
        sub = {n: {"kernel": y[n]["kernel"][np.ix_(i, o)], "bias": y[n]["bias"][o]} for n, i, o in layers}
        batch = batch_at(batch_key, cd, jnp.asarray(t), batch_size)
        if distill is not None:
          wide, wide_widths = channels(x, own, offset)
          top = {n: {"kernel": y[n]["kernel"][np.ix_(i, o)], "bias": y[n]["bias"][o]} for n, i, o in wide}
          g_t, g = distilled_gradients(data.example_shape, wide_widths, widths, *distill)(top, sub, batch)
          for n, i, o in wide:
            y[n]["kernel"][np.ix_(i, o)] = top[n]["kernel"] - lr * np.asarray(g_t[n]["kernel"])
            y[n]["bias"][o] = top[n]["bias"] - lr * np.asarray(g_t[n]["bias"])
          for n, i, o in layers:   # the student's coordinates, from the same point
            y[n]["kernel"][np.ix_(i, o)] -= lr * np.asarray(g[n]["kernel"])
            y[n]["bias"][o] -= lr * np.asarray(g[n]["bias"])
          continue
        grad = sub_model_gradient(data.example_shape, widths, 1.0 / rate if scaler else 1.0, classes)
        g = grad(sub, batch)
        for n, i, o in layers:
          y[n]["kernel"][np.ix_(i, o)] = sub[n]["kernel"] - lr * np.asarray(g[n]["kernel"])
          y[n]["bias"][o] = sub[n]["bias"] - lr * np.asarray(g[n]["bias"])
      if clip is not None:
        delta = {n: {f: np.zeros_like(v) for f, v in layer.items()} for n, layer in x.items()}
        for n, i, o in channels(x, own, offset)[0]:
          delta[n]["kernel"][np.ix_(i, o)] = x[n]["kernel"][np.ix_(i, o)] - y[n]["kernel"][np.ix_(i, o)]
          delta[n]["bias"][o] = x[n]["bias"][o] - y[n]["bias"][o]
        norm = np.sqrt(sum(np.sum(v ** 2) for layer in delta.values() for v in layer.values()))
        scale = min(1.0, clip / norm) if norm > 0 else 1.0
        for n in x:
          for f in x[n]:
            total[n][f] += scale * delta[n][f]
        continue
      w = float(data.n_train[c])
      for n, i, o in channels(x, own, offset, classes)[0]:   # the coordinates the client holds
        total[n]["kernel"][np.ix_(i, o)] += w * y[n]["kernel"][np.ix_(i, o)].astype(np.float64)
        held[n]["kernel"][np.ix_(i, o)] += w
        total[n]["bias"][o] += w * y[n]["bias"][o].astype(np.float64)
        held[n]["bias"][o] += w
    if clip is not None:   # the population's holders of every coordinate at this round's offset
      for c in range(data.num_clients):   # (levels drawn every round: each level's share of a client)
        for level, part in (enumerate(shares) if dynamic else [(levels[c], 1.0)]):
          for n, i, o in channels(x, rates[level], r if mode == "rolling" else 0)[0]:
            held[n]["kernel"][np.ix_(i, o)] += part
            held[n]["bias"][o] += part
      expected = {n: {f: expected_weight * h / data.num_clients for f, h in layer.items()}
                  for n, layer in held.items()}
      x = {n: {f: np.where(held[n][f] > 0, x[n][f] - total[n][f] / np.maximum(expected[n][f], 1e-30), x[n][f])
               for f in x[n]} for n in x}
      continue
    x = {n: {f: np.where(held[n][f] > 0, total[n][f] / np.maximum(held[n][f], 1e-30), x[n][f]) for f in x[n]}
         for n in x}
  return x


def _weighted_mean(arrays, weights):
  return sum(w * np.asarray(a, np.float64) for w, a in zip(weights, arrays, strict=True)) / weights.sum()


def feddf_reference(model, data, x0, rounds, key, *, cohort_size, lr, steps, batch_size, public,
                    distill_steps, distill_batch_size, distill_lr, temperature):
  """FedDF (Lin et al. 2020, Algorithm 1) on one server: every sampled client's SGD by hand, the mean by
  examples, then Adam steps of the student on ``T² KL(softmax(mean teacher logits / T) ‖ softmax(student
  / T))``, the teacher a Python loop over the clients' models; the public batches are FedDF's
  (``public_batch``)."""
  import optax
  import reference_personalization as pref

  from fedtree.algorithms.heterogeneous.feddf import public_batch

  theta, t = x0, temperature
  dtype = np.asarray(jax.tree.leaves(x0)[0]).dtype
  sampler = cohort_sampler(np.zeros(data.num_clients, np.int32), cohort_size)
  for r in range(rounds):
    rk = jax.random.fold_in(key, r)
    drawn = sampler(stream(rk, "cohort"))
    clients = [int(c) for c, v in zip(np.asarray(drawn.clients), np.asarray(drawn.valid), strict=True) if v]
    keys = [jax.random.fold_in(stream(rk, "train"), c) for c in clients]
    sent = [pref.sgd(model, theta, pref.client_cdata(data, c), steps, k, lr=lr, batch_size=batch_size)
            for c, k in zip(clients, keys, strict=True)]
    n = np.asarray([float(data.n_train[c]) for c in clients])
    student = jax.tree.map(lambda *m, n=n: jnp.asarray(_weighted_mean(m, n), dtype), *sent)
    adam = optax.adam(distill_lr)
    opt = adam.init(student)
    for j in range(distill_steps):
      x = public[np.asarray(public_batch(0, r, j, len(public), distill_batch_size))]
      teacher = sum(model.apply(m, x) for m in sent) / len(sent)

      def kl(p, x=x, teacher=teacher):
        q = jax.nn.softmax(teacher / t)
        log_s = jax.nn.log_softmax(model.apply(p, x) / t)
        return t * t * jnp.mean(jnp.sum(q * (jnp.log(q) - log_s), axis=-1))

      updates, opt = adam.update(jax.grad(kl)(student), opt, student)
      student = optax.apply_updates(student, updates)
    theta = student
  return theta


def fedmd_reference(model, data, x0, rounds, key, *, cohort_size, lr, steps, batch_size, public, subset,
                    digest_steps, digest_lr):
  """FedMD (Li and Wang 2019, Algorithm 1) on one server, every client its own model: each sampled
  client digests the consensus (full-batch Adam on the mean absolute error of its logits, from the
  second round), revisits its data (SGD by hand) and scores the next round's public inputs; the server
  averages the scores of the round's clients. Returns every client's model."""
  import optax
  import reference_personalization as pref

  from fedtree.algorithms.heterogeneous.feddf import public_batch

  own = [x0 for _ in range(data.num_clients)]
  consensus = None
  sampler = cohort_sampler(np.zeros(data.num_clients, np.int32), cohort_size)
  for r in range(rounds):
    rk = jax.random.fold_in(key, r)
    drawn = sampler(stream(rk, "cohort"))
    clients = [int(c) for c, v in zip(np.asarray(drawn.clients), np.asarray(drawn.valid), strict=True) if v]
    x_now = public[np.asarray(public_batch(0, r, 0, len(public), subset))]
    x_next = public[np.asarray(public_batch(0, r + 1, 0, len(public), subset))]
    scores = []
    for c in clients:
      p = own[c]
      if consensus is not None:
        adam = optax.adam(digest_lr)
        opt = adam.init(p)
        for _ in range(digest_steps):
          g = jax.grad(lambda q, x=x_now, t=consensus: jnp.mean(jnp.abs(model.apply(q, x) - t)))(p)
          updates, opt = adam.update(g, opt, p)
          p = optax.apply_updates(p, updates)
      p = pref.sgd(model, p, pref.client_cdata(data, c), steps, jax.random.fold_in(stream(rk, "train"), c),
                   lr=lr, batch_size=batch_size)
      own[c] = p
      scores.append(np.asarray(model.apply(p, x_next), np.float64))
    consensus = sum(scores) / len(scores)
  return own


def truncated_loss(sub, depth, x, y, mask):
  """The loss of a client of ``depth``: its network stops after block ``depth`` (written out, no exit
  model): ``Σ_i CE_i + (1 / (d - 1)) Σ_i Σ_{j ≠ i} KL(p_j ‖ p_i)``, ``p_j`` held fixed."""
  h, logits = x.reshape((x.shape[0], -1)), []
  for i in range(depth):
    h = h @ sub[f"Dense_{i}"]["kernel"] + sub[f"Dense_{i}"]["bias"][None, :]
    if i == 2:   # the MLP's output layer is the last exit
      logits.append(h)
    else:
      h = jax.nn.relu(h)
      logits.append(h @ sub[f"Exit_{i}"]["kernel"] + sub[f"Exit_{i}"]["bias"][None, :])
  real = mask.astype(x.dtype)
  n = jnp.maximum(real.sum(), 1.0)
  total = 0.0
  for z in logits:
    total += -jnp.sum(real * jnp.take_along_axis(jax.nn.log_softmax(z), y[:, None], axis=1)[:, 0]) / n
  for i, zi in enumerate(logits):
    for j, zj in enumerate(logits):
      if i != j:
        p = jax.lax.stop_gradient(jax.nn.softmax(zj))
        kl = jnp.sum(p * (jnp.log(p) - jax.nn.log_softmax(zi)), axis=1)
        total += jnp.sum(real * kl) / n / (depth - 1)
  return total


def depthfl_reference(data, x0, rounds, key, *, cohort_size, shares, lr, steps, batch_size, clip=None,
                      expected_weight=None):
  """DepthFL (Kim et al. 2023) on one server with an MLP of two hidden layers: each sampled client of depth
  ``d`` trains its truncated network (:func:`truncated_loss`), the server averages every block and exit
  over its holders by examples; with ``clip``, as :func:`reference`'s: clipped updates summed, each block
  divided by its expected reporting holders."""
  levels = client_levels(np.asarray(shares), data.num_clients, 0)
  dtype = np.asarray(jax.tree.leaves(x0)[0]).dtype
  names = lambda d: [f"Dense_{i}" for i in range(d)] + [f"Exit_{i}" for i in range(min(d, 2))]   # noqa: E731
  flat = {**x0["body"], **x0["exits"]}
  x = {n: {f: np.asarray(v, np.float64) for f, v in layer.items()} for n, layer in flat.items()}
  sampler = cohort_sampler(np.zeros(data.num_clients, np.int32), cohort_size)
  grad = jax.jit(jax.grad(truncated_loss), static_argnums=1)
  for r in range(rounds):
    rk = jax.random.fold_in(key, r)
    drawn = sampler(stream(rk, "cohort"))
    total = {n: {f: np.zeros_like(v) for f, v in layer.items()} for n, layer in x.items()}
    held = {n: {f: np.zeros_like(v) for f, v in layer.items()} for n, layer in x.items()}
    for c in np.asarray(drawn.clients)[np.asarray(drawn.valid)]:
      depth = int(levels[c]) + 1
      sub = {n: {f: jnp.asarray(v, dtype) for f, v in x[n].items()} for n in names(depth)}
      batch_key, _ = jax.random.split(jax.random.fold_in(stream(rk, "train"), int(c)))
      cd = client_data(data, int(c))
      for t in range(steps):
        b = batch_at(batch_key, cd, jnp.asarray(t), batch_size)
        g = grad(sub, depth, b.x, b.y, b.mask)
        sub = jax.tree.map(lambda p, gp: p - lr * gp, sub, g)
      if clip is not None:
        delta = {n: {f: x[n][f] - np.asarray(sub[n][f], np.float64) for f in sub[n]} for n in names(depth)}
        norm = np.sqrt(sum(np.sum(v ** 2) for layer in delta.values() for v in layer.values()))
        for n in delta:
          for f in delta[n]:
            total[n][f] += min(1.0, clip / norm) * delta[n][f]
        continue
      w = float(data.n_train[c])
      for n in names(depth):
        for f in sub[n]:
          total[n][f] += w * np.asarray(sub[n][f], np.float64)
          held[n][f] += w
    if clip is not None:   # the population's holders of every block
      for c in range(data.num_clients):
        for n in names(int(levels[c]) + 1):
          for f in held[n]:
            held[n][f] += 1.0
      x = {n: {f: np.where(held[n][f] > 0, x[n][f] - total[n][f] * data.num_clients / np.maximum(
        expected_weight * held[n][f], 1e-30), x[n][f]) for f in x[n]} for n in x}
      continue
    x = {n: {f: np.where(held[n][f] > 0, total[n][f] / np.maximum(held[n][f], 1e-30), x[n][f]) for f in x[n]}
         for n in x}
  return x
