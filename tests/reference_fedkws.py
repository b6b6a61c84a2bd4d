"""Plain per-client references for FedKWS-UI (paper 002): ALO local training written out by
hand, ALT step counts with Python loops, false accept/reject by counting, and MFCC by the
direct DFT / mel / DCT sums. They share with the engine only the minibatch order
(``batch_at``, tested on its own) and the model's forward pass."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.local import ClientData, batch_at
from fedtree.core.rng import stream


def _batches(data: ClientData, key, num_steps, batch_size):
  batch_key, _ = jax.random.split(key)
  return [batch_at(batch_key, data, jnp.asarray(t), batch_size) for t in range(int(num_steps))]


def _alo_mean(logp, q, b, mu, lam, c):
  """ALO's loss by a loop over examples: label-smoothed CE plus λ·(−CE(q, softmax)), masked mean."""
  total, count = 0.0, 0.0
  for i in range(b.x.shape[0]):
    m = b.mask[i].astype(jnp.float32)
    smooth = -sum(((1 - mu) * (b.y[i] == k) + mu / c) * logp[i, k] for k in range(c))
    adv = sum(q[i, k] * logp[i, k] for k in range(c))          # = -CE(q, softmax)
    total, count = total + m * (smooth + lam * adv), count + m
  return total / jnp.maximum(count, 1.0)


def alo_client(model, anchor, private, data: ClientData, num_steps, key, *, lr, mu, lam, batch_size):
  """One client's ALO round by hand: private SGD on cross-entropy, then SGD of the anchor on
  label-smoothed CE + λ · (−CE(softmax(private), softmax(global))). Returns (sent, private)."""
  c = model.num_classes

  def ce(p, b):
    logp = jax.nn.log_softmax(model.apply(p, b.x))
    per = jnp.array([-logp[i, b.y[i]] for i in range(b.x.shape[0])])
    m = b.mask.astype(jnp.float32)
    return jnp.sum(per * m) / jnp.maximum(jnp.sum(m), 1.0)

  ce_grad = jax.jit(jax.grad(ce))
  p = private
  for b in _batches(data, stream(key, "private"), num_steps, batch_size):
    g = ce_grad(p, b)
    p = jax.tree.map(lambda w, gw: w - lr * gw, p, g)

  def alo(w, p, b):
    return _alo_mean(jax.nn.log_softmax(model.apply(w, b.x)), jax.nn.softmax(model.apply(p, b.x)), b,
                     mu, lam, c)

  alo_grad = jax.jit(jax.grad(alo))
  w = anchor
  for b in _batches(data, key, num_steps, batch_size):
    g = alo_grad(w, p, b)
    w = jax.tree.map(lambda a, ga: a - lr * ga, w, g)
  return w, p


def alt_steps(n_train, y_train, num_classes, base_steps, r0=None, min_steps=1):
  """ALT by loops: n̄, ē (entropy / log C), harmonic mean, r_0 = K / Σ r̄ (or given)."""
  k = len(n_train)
  n_max = max(int(n) for n in n_train)
  r = []
  for i in range(k):
    n = int(n_train[i])
    counts = [0] * num_classes
    for j in range(n):
      counts[int(y_train[i][j])] += 1
    h = -sum(cnt / n * math.log(cnt / n) for cnt in counts if cnt)
    e = h / math.log(num_classes)
    nb = n / n_max
    r.append(0.0 if nb + e == 0 else 2 * nb * e / (nb + e))
  r0 = k / sum(r) if r0 is None else r0
  return [max(int(round(r0 * ri * base_steps)), min_steps) for ri in r], [r0 * ri * base_steps for ri in r]


def fa_fr(y_true, y_pred, positive):
  """Per-keyword-averaged false accept / reject rates by counting example by example."""
  negatives = [i for i, y in enumerate(y_true) if y not in positive]
  fa = []
  fr = []
  for k in positive:
    fa.append(sum(1 for i in negatives if y_pred[i] == k) / len(negatives))
    mine = [i for i, y in enumerate(y_true) if y == k]
    if mine:
      fr.append(sum(1 for i in mine if y_pred[i] not in positive) / len(mine))
  return sum(fa) / len(fa), sum(fr) / len(fr)


def mfcc_direct(signal, *, sample_rate=16000, window=480, stride=160, n_fft=512, num_mel=40,
                num_coef=40, low_hz=20.0, high_hz=7600.0, log_offset=1e-6):
  """MFCC of one signal frame by frame with the direct DFT sum, triangle formula and DCT sum."""
  signal = np.asarray(signal, np.float64)
  frames = 1 + (len(signal) - window) // stride
  n = np.arange(window)
  hann = 0.5 - 0.5 * np.cos(2 * np.pi * n / window)
  bins = np.arange(n_fft // 2 + 1)
  dft = np.exp(-2j * np.pi * np.outer(bins, n) / n_fft)     # [bins, window] (zero padding implied)

  def mel(f):
    return 2595.0 * math.log10(1.0 + f / 700.0)

  def hz(m):
    return 700.0 * (10 ** (m / 2595.0) - 1.0)

  lo_m, hi_m = mel(low_hz), mel(high_hz)
  edges = [hz(lo_m + (hi_m - lo_m) * i / (num_mel + 1)) for i in range(num_mel + 2)]
  out = np.zeros((frames, num_coef))
  for t in range(frames):
    seg = signal[t * stride: t * stride + window] * hann
    power = np.abs(dft @ seg) ** 2
    energies = []
    for m in range(num_mel):
      lo, ce, hi = edges[m], edges[m + 1], edges[m + 2]
      e = 0.0
      for b in bins:
        f = b * sample_rate / n_fft
        if lo < f < hi:
          e += power[b] * ((f - lo) / (ce - lo) if f <= ce else (hi - f) / (hi - ce))
      energies.append(math.log(e + log_offset))
    for k in range(num_coef):
      s = math.sqrt((1.0 if k == 0 else 2.0) / num_mel)
      out[t, k] = s * sum(energies[m] * math.cos(math.pi * k * (2 * m + 1) / (2 * num_mel))
                          for m in range(num_mel))
  return out


def mlp_features(params, x):
  """The hidden layer of a one-hidden-layer MLP, ``relu(x W + b)``, written out."""
  x = x.reshape((x.shape[0], -1))
  return jnp.maximum(x @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"][None, :], 0.0)


def gaussian_mmd2_blocks(a, b, rows, *, num_kernels=5, kernel_mul=2.0):
  """The biased MMD² of the real rows ``rows`` as the four kernel blocks: ``mean K_aa +
  mean K_bb - mean K_ab - mean K_ba``, ``K = Σ_j exp(-d² / h_j)``, ``h_j = h₀ mul^(j -
  num//2)``, ``h₀`` the mean squared distance over distinct pairs of the pooled rows (a
  constant)."""
  if not rows:
    return 0.0
  idx = jnp.asarray(rows)
  z = jnp.concatenate([a[idx], b[idx]])
  n = z.shape[0]
  d2 = jnp.sum((z[:, None, :] - z[None, :, :]) ** 2, axis=-1)
  h0 = jnp.maximum(jax.lax.stop_gradient(jnp.sum(d2) / (n * n - n)), 1e-12)
  k = sum(jnp.exp(-d2 / (h0 * kernel_mul ** (q - num_kernels // 2))) for q in range(num_kernels))
  m = len(rows)
  return jnp.mean(k[:m, :m]) + jnp.mean(k[m:, m:]) - jnp.mean(k[:m, m:]) - jnp.mean(k[m:, :m])


def fedmmd_clients(model, anchor, clients, num_steps, keys, *, lr, lam, batch_size):
  """FedMMD clients by hand, one after the other (one-hidden-layer MLP): SGD on masked CE +
  λ · MMD² between the hidden features of the trained and of the downloaded model. Returns
  the trained models."""

  def loss(w, b, rows):
    logp = jax.nn.log_softmax(model.apply(w, b.x))
    ce = -sum(logp[i, b.y[i]] for i in rows) / max(len(rows), 1)
    g = jax.lax.stop_gradient(mlp_features(anchor, b.x))
    return ce + lam * gaussian_mmd2_blocks(mlp_features(w, b.x), g, rows)

  grad = jax.jit(jax.grad(loss), static_argnums=2)
  out = []
  for data, steps, key in zip(clients, num_steps, keys, strict=True):
    w = anchor
    for b in _batches(data, key, steps, batch_size):
      g = grad(w, b, tuple(int(i) for i in np.nonzero(np.asarray(b.mask))[0]))
      w = jax.tree.map(lambda a, ga: a - lr * ga, w, g)
    out.append(w)
  return out



def _private_head_ce(head, model_params, b):
  z = mlp_features(model_params, b.x) @ head["kernel"] + head["bias"][None, :]
  logp = jax.nn.log_softmax(z)
  total, count = 0.0, 0.0
  for i in range(b.x.shape[0]):
    m = b.mask[i].astype(jnp.float32)
    total, count = total - m * logp[i, b.y[i]], count + m
  return total / jnp.maximum(count, 1.0)


def _alo_head_loss(w, head, b, mu, lam, c):
  h = mlp_features(w, b.x)
  logp = jax.nn.log_softmax(h @ w["Dense_1"]["kernel"] + w["Dense_1"]["bias"][None, :])
  q = jax.lax.stop_gradient(jax.nn.softmax(h @ head["kernel"] + head["bias"][None, :]))
  return _alo_mean(logp, q, b, mu, lam, c)


_private_head_grad = jax.jit(jax.grad(_private_head_ce))
_alo_head_grad = jax.jit(jax.grad(_alo_head_loss), static_argnums=5)


def alo_head_client(anchor, data: ClientData, num_steps, private_steps, key, *, lr, mu, lam, batch_size,
                    num_classes):
  """One client's ALO round under ``private="head"`` by hand, for a one-hidden-layer MLP whose
  params are ``{"model": {Dense_0, Dense_1}, "private_head": {kernel, bias}}``: ``private_steps``
  SGD steps of the private head alone on the cross-entropy of ``h(x) H + b_H`` (``h`` the hidden
  layer of the downloaded model, fixed), then ``num_steps`` SGD steps of the model on
  label-smoothed CE + λ · (−CE(softmax(h_w(x) H + b_H), softmax(h_w(x) W1 + b1))) with the
  private head fixed and ``h_w`` the current hidden layer. Returns the params sent up."""
  head = anchor["private_head"]
  for b in _batches(data, stream(key, "private"), private_steps, batch_size):
    g = _private_head_grad(head, anchor["model"], b)
    head = jax.tree.map(lambda w, gw: w - lr * gw, head, g)
  w = anchor["model"]
  for b in _batches(data, key, num_steps, batch_size):
    g = _alo_head_grad(w, head, b, mu, lam, num_classes)
    w = jax.tree.map(lambda a, ga: a - lr * ga, w, g)
  return {"model": w, "private_head": head}
