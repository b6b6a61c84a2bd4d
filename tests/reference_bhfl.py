"""A per-node Python-loop reference of B-HFL (one round), for tests.

Everything that is a choice of the method is re-implemented here with plain loops over
nodes and children, one (unstacked) optax state per node; only the random draws (cohort,
latencies, the per-client SGD steps and keys) are shared with the vectorized code.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.core.local import ClientData, SGDCarry, make_sgd_step, run_local_steps
from fedtree.core.rng import stream

tmap = jax.tree.map


def _row(tree, i):
  return tmap(lambda a: a[i], tree)


def _stack(rows):
  return tmap(lambda *xs: jnp.stack(xs), *rows)


def unstack(tree, n):
  return [_row(tree, i) for i in range(n)]


def sq_norm(tree):
  return float(sum(np.sum(np.square(np.asarray(a, np.float64))) for a in jax.tree.leaves(tree)))


class ReferenceBHFL:
  """Per-node state lists; ``round(key, data)`` mutates them like one call of ``round``."""

  def __init__(self, *, model, topology, schedule, local_opt, up_opts, down_opts, periods,
               sampler, weighting, buffers, latencies, exponent, proxy, proxy_opt, proxy_sched,
               residual_k, residual_opt, residual_down, direct_opt, init_params, edge_combine=None,
               received=None):
    """``edge_combine(updates, weights)``: an edge's aggregate of the updates it takes (default their
    weighted mean); ``received(model)``: what a client receives of its edge's model (default: it)."""
    self.__dict__.update(locals())
    d = topology.depth
    self.depth = d
    self.params = [[init_params for _ in range(topology.num_nodes(lv))] for lv in range(d + 1)]
    self.up_state = [[up_opts[lv].init(init_params) for _ in range(topology.num_nodes(lv))]
                     for lv in range(d)]
    self.down_state = [None] + [[down_opts[lv - 1].init(init_params)
                                 for _ in range(topology.num_nodes(lv))] for lv in range(1, d + 1)]
    self.pending = [None] + [[None] * topology.num_nodes(lv) for lv in range(1, d + 1)]
    self.version = [[0] * topology.num_nodes(lv) for lv in range(d)]
    self.round = 0
    n_edges = topology.num_nodes(d - 1)
    self.res_state = [residual_opt.init(init_params) for _ in range(n_edges * residual_k)]
    self.direct_state = [direct_opt.init(init_params) for _ in range(n_edges)]

  def _client_trainer(self, max_steps):
    if not hasattr(self, "_ct"):
      step = make_sgd_step(self.model, self.local_opt)
      self._ct = jax.jit(lambda carry, cd, n, k: run_local_steps(
        step, carry, cd, n, k, batch_size=self.schedule.batch_size, max_steps=max_steps)[0])
    return self._ct

  def _proxy_trainer(self, m):
    cache = self.__dict__.setdefault("_pt", {})
    if m not in cache:
      step = make_sgd_step(self.model, self.proxy_opt)
      cache[m] = jax.jit(lambda carry, cd, n, k: run_local_steps(
        step, carry, cd, n, k, batch_size=self.proxy_sched.batch_size,
        max_steps=self.proxy_sched.max_steps(m))[0])
    return cache[m]

  def _down(self, opt, child, state, target):
    d = tmap(jnp.subtract, child, target)
    upd, state = opt.update(d, state, child)
    return tmap(lambda t, a, b: t + (a + b), target, d, upd), state

  def round_(self, key, data):
    topo, d = self.topology, self.depth
    r, t0 = self.round + 1, float(self.round)
    n_train = np.asarray(data.n_train)
    w_client = n_train.astype(np.float64) if self.weighting == "examples" else np.ones(len(n_train))
    w_node = [np.bincount(topo.ancestor(lv), weights=w_client, minlength=topo.num_nodes(lv))
              for lv in range(d)] + [w_client]
    lat_key = stream(key, "latency")
    # clients
    cohort = self.sampler(stream(key, "cohort"))
    steps = np.asarray(self.schedule.num_steps(data.n_train))
    train = self._client_trainer(self.schedule.max_steps(data.max_train))
    lat = np.asarray(self.latencies[d - 1].sample(jax.random.fold_in(lat_key, d), topo.num_clients))
    edge_of = topo.parent(d)
    for c, valid in zip(np.asarray(cohort.clients), np.asarray(cohort.valid), strict=True):
      if not valid:
        continue
      c = int(c)
      own, edge = self.params[d][c], self.params[d - 1][edge_of[c]]
      carry = SGDCarry(own, self.local_opt.init(own), edge)
      cd = ClientData(data.x_train[c], data.y_train[c], data.n_train[c])
      carry = train(carry, cd, jnp.int32(steps[c]), jax.random.fold_in(stream(key, "train"), c))
      self.params[d][c] = carry.params
      self.pending[d][c] = dict(u=tmap(jnp.subtract, edge, carry.params), arrival=t0 + lat[c],
                                version=self.version[d - 1][edge_of[c]])
    aggregated = [None] * d
    links = {}
    for lv in range(d - 1, -1, -1):
      par = topo.parent(lv + 1)
      agg = [False] * topo.num_nodes(lv)
      send_time = [t0] * topo.num_nodes(lv)
      for n in range(topo.num_nodes(lv)):
        if r % int(self.periods[lv][n]):
          continue
        kids = [i for i in range(len(par)) if par[i] == n and self.pending[lv + 1][i] is not None
                and self.pending[lv + 1][i]["arrival"] < t0 + 1]
        kids.sort(key=lambda i, lv=lv: (self.pending[lv + 1][i]["arrival"], i))
        b = self.buffers[lv]
        used = kids if b is None else kids[:b]
        if len(used) < (1 if b is None else b):
          continue
        agg[n] = True
        ws = [w_node[lv + 1][i] * (1 + self.version[lv][n] - self.pending[lv + 1][i]["version"])
              ** (-self.exponent) for i in used]
        us = [self.pending[lv + 1][i]["u"] for i in used]
        if lv == d - 1 and self.edge_combine is not None:
          delta = self.edge_combine(us, ws)
        else:
          delta = tmap(lambda *us, ws=ws: sum(w * u for w, u in zip(ws, us, strict=True)) / sum(ws), *us)
        upd, self.up_state[lv][n] = self.up_opts[lv].update(delta, self.up_state[lv][n],
                                                            self.params[lv][n])
        self.params[lv][n] = optax.apply_updates(self.params[lv][n], upd)
        self.version[lv][n] += 1
        send_time[n] = max([t0] + [self.pending[lv + 1][i]["arrival"] for i in used])
        if self.residual_k and lv == d - 1:
          by_norm = sorted(used, key=lambda i, lv=lv: (-sq_norm(self.pending[lv + 1][i]["u"]), i))
          for k, i in enumerate(by_norm[: self.residual_k]):
            links[n * self.residual_k + k] = self.pending[lv + 1][i]["u"]
        for i in used:
          self.pending[lv + 1][i] = None
        if lv in self.proxy:
          pd = self.proxy[lv]
          if n in pd.node:
            j = list(pd.node).index(n)
            p = self.params[lv][n]
            carry = self._proxy_trainer(pd.x.shape[1])(
              SGDCarry(p, self.proxy_opt.init(p), p), ClientData(pd.x[j], pd.y[j], pd.n[j]),
              self.proxy_sched.num_steps(pd.n[j]),
              jax.random.fold_in(jax.random.fold_in(stream(key, "proxy"), lv), n))
            self.params[lv][n] = carry.params
      if lv >= 1:
        lat = np.asarray(self.latencies[lv - 1].sample(jax.random.fold_in(lat_key, lv),
                                                       topo.num_nodes(lv)))
        up_par = topo.parent(lv)
        for n in range(topo.num_nodes(lv)):
          if agg[n]:
            self.pending[lv][n] = dict(
              u=tmap(jnp.subtract, self.params[lv - 1][up_par[n]], self.params[lv][n]),
              arrival=send_time[n] + lat[n], version=self.version[lv - 1][up_par[n]])
      aggregated[lv] = agg
    if self.residual_k and links:
      steps_ = []
      for j, g in sorted(links.items()):
        s, self.res_state[j] = self.residual_opt.update(g, self.res_state[j], self.params[0][0])
        steps_.append(s)
      mean = tmap(lambda *xs: sum(xs) / len(xs), *steps_)
      self.params[0][0] = tmap(jnp.add, self.params[0][0], mean)
    sent = aggregated[0]
    for lv in range(d):
      par = topo.parent(lv + 1)
      recv = [sent[par[i]] for i in range(len(par))]
      for i in range(len(par)):
        if recv[i]:
          source = self.params[lv][par[i]]
          if lv + 1 == d and self.received is not None:
            source = self.received(source)
          self.params[lv + 1][i], self.down_state[lv + 1][i] = self._down(
            self.down_opts[lv], self.params[lv + 1][i], self.down_state[lv + 1][i], source)
      if self.residual_down and lv + 1 == d - 1 and aggregated[0][0]:
        for i in range(len(par)):
          self.params[lv + 1][i], self.direct_state[i] = self._down(
            self.direct_opt, self.params[lv + 1][i], self.direct_state[i], self.params[0][0])
          recv[i] = True
      if lv + 1 < d:
        sent = [aggregated[lv + 1][i] or recv[i] for i in range(len(par))]
    self.round += 1

  def stacked(self, lv):
    return _stack(self.params[lv])
