"""Plain per-client references for the clustered-FL family (CFL, IFCA, AWCFL, MCFL).

Python loops over clients and clusters, numpy float64 arithmetic. Shared with the engine:
local SGD (``reference.local_sgd``, itself hand-written), the round's key streams, and the
k-means++ *seeding* (``fedtree.algorithms.clustering.ops.kmeans_plusplus``: the only random draw; the
Lloyd iterations, the label matching, the bipartition and every aggregation are written
out here).
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.algorithms.clustering.ops import kmeans_plusplus
from fedtree.core.local import ClientData, batch_at
from fedtree.core.rng import stream
from fedtree.models import masked_cross_entropy


@functools.cache
def _grad_fn(model):
  return jax.jit(jax.grad(lambda p, b: masked_cross_entropy(model.apply(p, b.x), b.y, b.mask)))


def local_sgd(model, params, data, client, num_steps, key, *, lr, batch_size):
  """Plain SGD by hand (as ``reference.local_sgd``, with the gradient compiled once per model)."""
  cd = ClientData(x=jnp.asarray(data.x_train[client]), y=jnp.asarray(data.y_train[client]),
                  n=jnp.asarray(data.n_train[client]))
  batch_key, _ = jax.random.split(key)
  p = params
  for t in range(int(num_steps)):
    g = _grad_fn(model)(p, batch_at(batch_key, cd, jnp.asarray(t), batch_size))
    p = jax.tree.map(lambda w, gw: w - lr * gw, p, g)
  return p


def flat(tree) -> np.ndarray:
  return np.concatenate([np.asarray(a, np.float64).ravel() for a in jax.tree.leaves(tree)])


def row(tree, i):
  return jax.tree.map(lambda a: np.asarray(a)[i], tree)


def stack(trees):
  return jax.tree.map(lambda *a: np.stack([np.asarray(x, np.float64) for x in a]), *trees)


def wavg(trees, weights):
  total = float(sum(weights))
  def avg(*a):
    return sum(w * np.asarray(x, np.float64) for w, x in zip(weights, a, strict=True)) / total

  return jax.tree.map(avg, *trees)


def lloyd(x: np.ndarray, init: np.ndarray, iters: int) -> tuple[np.ndarray, np.ndarray]:
  """Lloyd's K-means, one point at a time; empty clusters keep their centroid."""
  cents = np.array(init, np.float64)
  x = np.asarray(x, np.float64)

  def assign(c):
    out = []
    for p in x:
      d = [float(np.sum((p - ci) ** 2)) for ci in c]
      out.append(int(np.argmin(d)))
    return np.array(out)

  for _ in range(iters):
    a = assign(cents)
    for j in range(len(cents)):
      members = [x[i] for i in range(len(x)) if a[i] == j]
      if members:
        cents[j] = np.mean(members, axis=0)
  return cents, assign(cents)


def greedy_match(new: np.ndarray, prev: np.ndarray) -> np.ndarray:
  """labels[i] = previous id of new centroid i: repeatedly match the closest free pair."""
  k = len(new)
  cost = {(i, j): float(np.sum((new[i] - prev[j]) ** 2)) for i in range(k) for j in range(k)}
  labels = np.zeros(k, np.int64)
  free_i, free_j = set(range(k)), set(range(k))
  for _ in range(k):
    i, j = min(((i, j) for i in free_i for j in free_j), key=lambda p: (cost[p], p))
    labels[i] = j
    free_i.remove(i)
    free_j.remove(j)
  return labels


def optimal_match(new: np.ndarray, prev: np.ndarray) -> np.ndarray:
  """labels[i] = previous id of new centroid i, minimizing the total squared distance over
  every permutation (brute force; lexicographically first on ties)."""
  k = len(new)
  cost = np.array([[float(np.sum((new[i] - prev[j]) ** 2)) for j in range(k)] for i in range(k)])
  best = min(itertools.permutations(range(k)), key=lambda p: sum(cost[i, p[i]] for i in range(k)))
  return np.array(best, np.int64)


def adjusted_rand_index(a, b) -> float:
  """ARI from the pair counts: over all pairs of points, how often the labelings agree."""
  n = len(a)
  same_a = [(i, j) for i in range(n) for j in range(i + 1, n) if a[i] == a[j]]
  same_b = [(i, j) for i in range(n) for j in range(i + 1, n) if b[i] == b[j]]
  both = len(set(same_a) & set(same_b))
  pairs = n * (n - 1) / 2
  expected = len(same_a) * len(same_b) / pairs
  top = (len(same_a) + len(same_b)) / 2
  return 1.0 if top == expected else (both - expected) / (top - expected)


def complete_linkage_bipartition(sim: np.ndarray, members: list[int]) -> set[int]:
  """The members of the second group (the one without the lowest-index member)."""
  groups = [[m] for m in members]
  while len(groups) > 2:
    best = None
    for a in range(len(groups)):
      for b in range(a + 1, len(groups)):
        d = max(-sim[i, j] for i in groups[a] for j in groups[b])
        if best is None or d < best[0] - 1e-6:
          best = (d, a, b)
    _, a, b = best
    groups[a] = groups[a] + groups[b]
    del groups[b]
  if len(groups) < 2:
    return set()
  first = min(groups, key=min)
  return {m for g in groups if g is not first for m in g}


def median(trees, weights):
  """Every coordinate's median of the members' models (unweighted): a cluster's median aggregate
  (its model minus the median of the members' updates against it)."""
  return jax.tree.map(lambda *a: np.median(np.stack([np.asarray(x, np.float64) for x in a]), axis=0), *trees)


def train_all(model, params_of_client, data, round_key, *, lr, batch_size, num_steps):
  """Every client's trained model from ``params_of_client[c]``."""
  train_key = stream(round_key, "train")
  return [local_sgd(model, params_of_client[c], data, c, num_steps[c], jax.random.fold_in(train_key, c),
                    lr=lr, batch_size=batch_size) for c in range(data.num_clients)]


def awcfl_round(model, cluster_params, cluster_of, data, round_key, *, r, beta, start, iters, weights,
                lr, batch_size, num_steps, combine=wavg):
  """One AWCFL round, every client taking part; ``combine(models, weights)`` aggregates a cluster
  (the weighted mean, or :func:`median`). Returns (new cluster params, new cluster_of)."""
  k = len(cluster_params)
  c = data.num_clients
  trained = train_all(model, [cluster_params[cluster_of[i]] for i in range(c)], data, round_key,
                      lr=lr, batch_size=batch_size, num_steps=num_steps)
  if r <= start:
    g = combine(trained, weights)
    return [g] * k, np.zeros(c, np.int64)
  x = np.stack([flat(t) for t in trained])
  init = np.asarray(kmeans_plusplus(stream(round_key, "kmeans"), jnp.asarray(x), k))   # float32 but under x64
  cents, assign = lloyd(x, init, iters)
  labels = optimal_match(cents, np.stack([flat(p) for p in cluster_params]))
  assign = labels[assign]
  means = []
  for j in range(k):
    members = [i for i in range(c) if assign[i] == j]
    means.append(combine([trained[i] for i in members], [weights[i] for i in members]) if members
                 else cluster_params[j])
  if k == 1:
    return means, assign
  new = []
  for j in range(k):
    others = [means[i] for i in range(k) if i != j]
    other_mean = jax.tree.map(lambda *a: sum(a) / (k - 1), *others)
    new.append(jax.tree.map(lambda o, m: beta * o + (1 - beta) * m, other_mean, means[j]))
  return new, assign


def cluster_loss(model, params, data, c) -> float:
  n = int(data.n_train[c])
  logits = np.asarray(model.apply(params, jnp.asarray(data.x_train[c][:n])), np.float64)
  logp = logits - np.log(np.sum(np.exp(logits - logits.max(1, keepdims=True)), 1, keepdims=True)) \
    - logits.max(1, keepdims=True)
  return float(-np.mean([logp[i, int(data.y_train[c][i])] for i in range(n)]))


def ifca_round(model, cluster_params, data, round_key, *, weights, lr, batch_size, num_steps, combine=wavg,
               received=None):
  """One IFCA round, every client taking part; ``combine`` aggregates a cluster (as in
  :func:`awcfl_round`), ``received(model)`` is what a client receives of a cluster's model (default:
  the model). Returns (new params, picks, losses [C, K])."""
  k, c = len(cluster_params), data.num_clients
  sent = [p if received is None else received(p) for p in cluster_params]
  losses = np.array([[cluster_loss(model, sent[j], data, i) for j in range(k)] for i in range(c)])
  picks = losses.argmin(1)
  trained = train_all(model, [sent[picks[i]] for i in range(c)], data, round_key,
                      lr=lr, batch_size=batch_size, num_steps=num_steps)
  new = []
  for j in range(k):
    members = [i for i in range(c) if picks[i] == j]
    new.append(combine([trained[i] for i in members], [weights[i] for i in members]) if members
               else cluster_params[j])
  return new, picks, losses


def cfl_round(model, cluster_params, cluster_of, num_clusters, data, round_key, *, eps1, eps2, weights,
              lr, batch_size, num_steps, min_split_size=2, similarity_check=False, combine=wavg):
  """One CFL round, every client taking part; ``combine`` aggregates a cluster (as in
  :func:`awcfl_round`). Returns (params, cluster_of, num_clusters)."""
  k, c = len(cluster_params), data.num_clients
  trained = train_all(model, [cluster_params[cluster_of[i]] for i in range(c)], data, round_key,
                      lr=lr, batch_size=batch_size, num_steps=num_steps)
  upd = np.stack([flat(trained[i]) - flat(cluster_params[cluster_of[i]]) for i in range(c)])
  norms = np.linalg.norm(upd, axis=1)
  unit = upd / np.where(norms > 0, norms, 1.0)[:, None]
  sim = unit @ unit.T
  new_of = np.array(cluster_of, np.int64)
  origin = list(range(k))
  n_used = num_clusters
  for j in range(num_clusters):
    members = [i for i in range(c) if cluster_of[i] == j]
    if len(members) < min_split_size:
      continue
    mean = sum(weights[i] * upd[i] for i in members) / sum(weights[i] for i in members)
    if np.linalg.norm(mean) < eps1 and max(norms[i] for i in members) > eps2 and n_used < k:
      second = complete_linkage_bipartition(sim, members)
      if not second:
        continue
      if similarity_check:   # Sattler: gamma_max < sqrt((1 - alpha_cross_max) / 2)
        first = [i for i in members if i not in second]
        cross = max(sim[i, j] for i in first for j in second)
        gamma = 0.0
        for half in (first, sorted(second)):
          m = sum(weights[i] * upd[i] for i in half) / sum(weights[i] for i in half)
          for i in half:
            gamma = max(gamma, np.linalg.norm(upd[i] - m) / np.linalg.norm(m))
        if not gamma < np.sqrt((1 - cross) / 2):
          continue
      for i in second:
        new_of[i] = n_used
      origin[n_used] = j
      n_used += 1
  new = []
  for j in range(k):
    members = [i for i in range(c) if new_of[i] == j]
    new.append(combine([trained[i] for i in members], [weights[i] for i in members]) if members
               else cluster_params[origin[j]])
  return new, new_of, n_used


def feature_choice(data, cluster_of, metric: str) -> np.ndarray:
  """MCFL's pick with every client's whole training / test data as its feature sample."""
  c = data.num_clients
  def mean_of(x, n):
    rows = np.asarray(x, np.float64)[: int(n)]
    return rows.reshape(int(n), -1).mean(axis=0)

  means = [mean_of(data.x_train[i], data.n_train[i]) for i in range(c)]
  query = [mean_of(data.x_test[i], data.n_test[i]) for i in range(c)]
  clusters = sorted(set(int(v) for v in cluster_of))
  feats = {j: np.mean([means[i] for i in range(c) if cluster_of[i] == j], axis=0) for j in clusters}
  out = []
  for i in range(c):
    d = {j: (np.sum(np.abs(query[i] - f)) if metric == "l1" else np.sqrt(np.sum((query[i] - f) ** 2)))
         for j, f in feats.items()}
    out.append(min(d, key=lambda j: (d[j], j)))
  return np.array(out)
