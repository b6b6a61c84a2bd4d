"""The per-client reference comparisons of tests/x64_driver.py beyond its first seven (issue 57, items
1-3, the last gap): each runs an algorithm's vectorized rounds in float64 (x64, ``f64_model``) and its
per-client reference loop of tests/reference*.py, built as its float32 test builds them, and returns
``{"maxdiff": largest deviation over every compared model and statistic, "dtypes": the state's}``.

Imported by the driver only: x64 must be on before JAX runs anything.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import reference as ref
import reference_baselines as bref
import reference_personalization as pref

from fedtree import algorithms as A
from fedtree.core.local import LocalSchedule
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.core.topology import Topology

LR, B = 0.1, 4


def f64_model(model):
  """``model`` whose parameters start in float64 (the state of every algorithm follows)."""
  return model._replace(init=lambda k: jax.tree.map(lambda p: p.astype(jnp.float64), model.init(k)))


def f64_data(data):
  """``data`` with float64 features."""
  return data.replace(x_train=data.x_train.astype(jnp.float64), x_test=data.x_test.astype(jnp.float64))


def maxdiff(a, b) -> float:
  return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)), initial=0.0))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def row(tree, i):
  return jax.tree.map(lambda a: a[i], tree)


def _out(diffs, *states):
  return {"maxdiff": max(diffs), "dtypes": sorted({str(a.dtype) for a in jax.tree.leaves(states)
                                                   if jnp.issubdtype(a.dtype, jnp.floating)})}


def _global_and_own(state, theta, own, refs):
  """:func:`_out` of the global model against ``theta`` and every client's own model (rows of ``own``)
  against ``refs[c]``."""
  diffs = [maxdiff(row(own, c), r) for c, r in enumerate(refs)]
  return _out([maxdiff(row(state.params[0], 0), theta), *diffs], state.params, own)


def _cohort(sampler, rk):
  drawn = sampler(stream(rk, "cohort"))
  return [(int(k), int(p)) for k, p, v in zip(np.asarray(drawn.clients), np.asarray(drawn.parent),
                                              np.asarray(drawn.valid), strict=True) if v]


def _epochs(data):
  sched = LocalSchedule(batch_size=B, epochs=1)   # unequal step counts, as the float32 tests
  return sched, sched.num_steps(np.asarray(data.n_train))


def _flat(data):
  return np.zeros(data.num_clients, int)


# ------------------------------------------------------------------------ optimization baselines
def feddyn_vs_reference(model, data, groups):
  """test_feddyn's flat loop (α = 0.3 by data size, examples weighting), three rounds."""
  from test_feddyn import _reference

  sched, steps = _epochs(data)
  alg = A.feddyn(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=4,
                 chunk_size=2, alpha=0.3, weighting="examples", alpha_by_data_size=True)
  key = jax.random.key(11)
  state, _ = bref.run_jit(alg, data, 3, key)
  n = np.asarray(data.n_train, np.float64)
  x, h, grad_l = _reference(model, data, bref.start(alg), _flat(data), 3, key, cohort_size=4, alpha=0.3,
                            steps=steps, weights=n, alpha_scale=n.mean() / n, dtype=np.float64)
  return _out([maxdiff(row(state.params[0], 0), x[0]), maxdiff(row(state.server_state, 0), h[0])]
              + [maxdiff(row(state.client_state, k), grad_l[k]) for k in range(data.num_clients)],
              state.params, state.server_state, state.client_state)


def fedex_vs_reference(model, data, groups):
  """test_fedex's flat loop (three scales, a held-out 30 %), θ too, three rounds."""
  scales = (0.25, 1.0, 4.0)
  alg = A.fedex(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=3), cohort_size=4, chunk_size=2, lr_scales=scales,
                val_fraction=0.3, baseline_discount=0.5)
  key = jax.random.key(5)
  state, _ = bref.run_jit(alg, data, 3, key)
  c = data.num_clients
  models, log_theta = bref.fedex_rounds(model, data, bref.start(alg), np.zeros(c, np.int64), 3, key,
                                        cohort_size=4, weights=np.asarray(data.n_train, np.float64),
                                        steps=[3] * c, lr=LR, batch_size=B, scales=scales, val_fraction=0.3,
                                        discount=0.5, dtype=np.float64)
  return _out([maxdiff(row(state.params[0], 0), models[0]),
               maxdiff(state.server_state["log_theta"][0], log_theta[0])], state.params, state.server_state)


def _mime(method, model, data, weighting, eta_g):
  from test_mime import _reference, _trace

  sched, steps = _epochs(data)
  alg = method(model=model, data=data, local_optimizer=optax.sgd(LR, momentum=0.9), schedule=sched,
               cohort_size=4, chunk_size=2, weighting=weighting, server_learning_rate=eta_g)
  key = jax.random.key(11)
  state, _ = bref.run_jit(alg, data, 3, key)
  n = np.asarray(data.n_train, np.float64)
  corrected = method is A.mime
  x, m, c = _reference(model, data, bref.start(alg), _flat(data), 3, key, cohort_size=4, corrected=corrected,
                       momentum=0.9, eta_g=eta_g, weights=n if weighting == "examples" else np.ones_like(n),
                       steps=steps, dtype=np.float64)
  diffs = [maxdiff(row(state.params[0], 0), x[0]), maxdiff(row(_trace(state), 0), m[0])]
  if corrected:
    diffs.append(maxdiff(row(state.server_state.variate, 0), c[0]))
  return _out(diffs, state.params, state.server_state)


def mime_vs_reference(model, data, groups):
  """test_mime's loop: Mime, examples weighting, three rounds."""
  return _mime(A.mime, model, data, "examples", 1.0)


def mimelite_vs_reference(model, data, groups):
  """test_mime's loop: MimeLite, uniform weighting, η_g = 0.7, three rounds."""
  return _mime(A.mimelite, model, data, "uniform", 0.7)


def qffl_vs_reference(model, data, groups):
  """test_qffl's loop (Algorithm 2, q = 0.5, L = 3, the last epoch's loss, examples), two rounds."""
  sched = LocalSchedule(batch_size=B, epochs=2)
  alg = A.qffl(model=model, data=data, local_optimizer=optax.sgd(LR), local_learning_rate=LR, schedule=sched,
               cohort_size=4, chunk_size=2, q=0.5, lipschitz=3.0, loss_at="last_epoch", weighting="examples")
  key = jax.random.key(11)
  state, _ = bref.run_jit(alg, data, 2, key)
  steps, sampler = sched.num_steps(np.asarray(data.n_train)), cohort_sampler(_flat(data), 4)
  x = bref.start(alg)
  for r in range(2):
    rk = jax.random.fold_in(key, r)
    cohort = [k for k, _ in _cohort(sampler, rk)]
    x = bref.qffedavg_round(model, x, data, cohort, [bref.train_key(rk, k) for k in cohort], q=0.5, lr=LR,
                            lipschitz=3.0, batch_size=B, steps=steps, loss_at="last_epoch",
                            weights=np.asarray(data.n_train, np.float64))
  return _out([maxdiff(row(state.params[0], 0), x)], state.params)


def afl_vs_reference(model, data, groups):
  """test_afl's loop (Stochastic-AFL, domains the groups, the exponentiated step), three rounds: the
  model and λ."""
  sched, steps = _epochs(data)
  groups = np.asarray(groups)
  alg = A.afl(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=4,
              chunk_size=2, domain_learning_rate=0.5, domain_step="exponentiated", domains=tuple(groups))
  key = jax.random.key(11)
  state, _ = bref.run_jit(alg, data, 3, key)
  lam = np.full(len(set(groups.tolist())), 1.0 / len(set(groups.tolist())))
  x, sampler = bref.start(alg), cohort_sampler(_flat(data), 4)
  for r in range(3):
    rk = jax.random.fold_in(key, r)
    cohort = [k for k, _ in _cohort(sampler, rk)]
    keys = [bref.train_key(rk, k) for k in cohort]
    x, lam = bref.afl_round(model, x, lam, groups, data, cohort, keys, lr=LR, batch_size=B, steps=steps,
                            gamma=0.5, step="exponentiated")
  return _out([maxdiff(row(state.params[0], 0), x), maxdiff(state.server_state[0], lam)],
              state.params, state.server_state)


def moon_vs_reference(model, data, groups):
  """test_moon's loop (μ = 2, τ = 0.5, the received model as the first previous), three rounds: the
  model and every trained client's previous model."""
  sched, steps = _epochs(data)
  mu, tau = 2.0, 0.5
  alg = A.moon(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=4,
               chunk_size=2, mu=mu, temperature=tau, first_previous="received")
  key = jax.random.key(11)
  state, _ = bref.run_jit(alg, data, 3, key)
  x, n = bref.start(alg), np.asarray(data.n_train, np.float64)
  prev, trained = [x] * data.num_clients, [False] * data.num_clients
  sampler = cohort_sampler(_flat(data), 4)
  for r in range(3):
    rk = jax.random.fold_in(key, r)
    cohort = [k for k, _ in _cohort(sampler, rk)]
    ys = {k: bref.moon_client(x, prev[k] if trained[k] else x, data, k, steps[k], bref.train_key(rk, k),
                              lr=LR, batch_size=B, mu=mu, tau=tau) for k in cohort}
    x = ref.weighted_average([ys[k] for k in cohort], [n[k] for k in cohort])
    for k in cohort:
      prev[k], trained[k] = ys[k], True
  previous, _ = state.client_state
  return _out([maxdiff(row(state.params[0], 0), x)]
              + [maxdiff(row(previous, k), prev[k]) for k in range(data.num_clients) if trained[k]],
              state.params, previous)


def hierfavg_vs_reference(model, data, groups):
  """test_core_algorithms' HierFAVG loop on a root over the three groups (edges every round, the root
  every second), four rounds: every node's model."""
  topo = Topology.from_labels(groups)
  sched, steps = _epochs(data)
  alg = A.hierfavg(model=model, topology=topo, data=data, local_optimizer=optax.sgd(LR), schedule=sched,
                   periods=(2,), cohort_size=2, chunk_size=3)
  key = jax.random.key(2)
  state, _ = bref.run_jit(alg, data, 4, key)
  parent, n = topo.parent(2), np.asarray(data.n_train, np.float64)
  edges = [bref.start(alg)] * 3
  sampler = cohort_sampler(parent, 2)
  for r in range(4):
    rk = jax.random.fold_in(key, r)
    slots = _cohort(sampler, rk)
    trained = ref.client_models(model, edges, data, slots, rk, lr=LR, batch_size=B, num_steps=steps)
    kids = [[c for c, p in slots if p == g] for g in range(3)]
    edges = [ref.weighted_average([trained[c] for c in kids[g]], [n[c] for c in kids[g]]) for g in range(3)]
    if (r + 1) % 2 == 0:
      root = ref.weighted_average(edges, [n[parent == g].sum() for g in range(3)])
      edges = [root] * 3
  return _out([maxdiff(row(state.params[0], 0), edges[0])]
              + [maxdiff(row(state.params[1], g), edges[g]) for g in range(3)], state.params)


def mobile_hierfavg_vs_reference(model, data, groups):
  """test_mobility's moving HierFAVG against its per-edge loop (``test_mobility._reference``), issue 54:
  a Markov membership over the three groups' edges with an edge down two rounds (its clients wait),
  edges every round, the root every second, every member of a live edge trains; four rounds."""
  from test_mobility import STEPS, _reference

  from fedtree.toolbox import mobility

  groups = np.asarray(groups)
  membership = mobility.fail_edges(mobility.markov(groups, num_edges=3, num_rounds=4, dwell=2.0, seed=4),
                                   mobility.outage_trace([(1, 2, 3)], 3, 4), rule="wait")
  alg = A.hierfavg(model=model, topology=Topology.from_labels(groups), data=data,
                   local_optimizer=optax.sgd(LR), schedule=LocalSchedule(batch_size=B, steps=STEPS),
                   periods=(2,), chunk_size=3, membership=membership)
  key = jax.random.key(2)
  state, _ = bref.run_jit(alg, data, 4, key)
  edges = _reference(model, data, membership, bref.start(alg), 4, key, period=2)
  return _out([maxdiff(row(state.params[1], g), edges[g]) for g in range(3)], state.params)


# ------------------------------------------------------------------------ local objectives
def _every_client(alg, model, data, rounds, client, weights=None):
  """``rounds`` rounds of ``alg`` over every client; the reference: ``client(theta, c, key)`` (its sent
  model) per client, the server the mean by examples (``weights``)."""
  key = jax.random.key(11)
  state, _ = bref.run_jit(alg, data, rounds, key)
  theta = bref.start(alg)
  n = np.asarray(data.n_train, np.float64) if weights is None else weights
  for r in range(rounds):
    rk = jax.random.fold_in(key, r)
    theta = ref.weighted_average([client(theta, c, bref.train_key(rk, c)) for c in range(data.num_clients)],
                                 list(n))
  return state, theta


def fedprox_vs_reference(model, data, groups):
  """test_objectives' proximal SGD (μ = 0.7) per client, FedAvg's mean, every client, two rounds."""
  sched, steps = _epochs(data)
  alg = A.fedprox(mu=0.7, model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched)
  state, theta = _every_client(alg, model, data, 2, lambda t, c, k: pref.sgd(
    model, t, pref.client_cdata(data, c), int(steps[c]), k, lr=LR, batch_size=B, mu=0.7))
  return _out([maxdiff(row(state.params[0], 0), theta)], state.params)


def perfedavg_vs_reference(model, data, groups, variant="fo"):
  """test_objectives' Per-FedAvg client (α = 0.3, β = 0.1), every client, two rounds."""
  sched, steps = _epochs(data)
  alg = A.perfedavg(alpha=0.3, beta=0.1, variant=variant, model=model, data=data,
                    local_optimizer=optax.sgd(LR), schedule=sched)
  state, theta = _every_client(alg, model, data, 2, lambda t, c, k: pref.perfedavg(
    model, t, pref.client_cdata(data, c), int(steps[c]), k, alpha=0.3, beta=0.1, variant=variant,
    batch_size=B))
  return _out([maxdiff(row(state.params[0], 0), theta)], state.params)


def perfedavg_hf_vs_reference(model, data, groups):
  """As :func:`perfedavg_vs_reference`, the Hessian-free variant."""
  return perfedavg_vs_reference(model, data, groups, variant="hf")


def ditto_vs_reference(model, data, groups):
  """test_objectives' Ditto client (λ = 0.5), every client, two rounds: the global model and every
  personal model."""
  sched, steps = _epochs(data)
  alg = A.ditto(lam=0.5, model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched)
  personal = [bref.start(alg)] * data.num_clients

  def client(theta, c, key):
    sent, personal[c] = pref.ditto(model, theta, personal[c], pref.client_cdata(data, c), int(steps[c]), key,
                                   lr=LR, lam=0.5, batch_size=B)
    return sent

  state, theta = _every_client(alg, model, data, 2, client)
  return _global_and_own(state, theta, state.client_state.personal, personal)


def fedkws_vs_reference(model, data, groups):
  """FedKWS-UI: test_fedkws's ALO client (μ = 0.3, λ = 0.5: the adversarial term shows, a persistent
  private model) with reference_fedkws's ALT step counts (E = 3), every client, two rounds: the global
  model and every private model."""
  import reference_fedkws as kref

  from fedtree.core.local import ClientData

  alg = A.fedkws(mu=0.3, lam=0.5, model=model, data=data, local_optimizer=optax.sgd(LR),
                 schedule=LocalSchedule(batch_size=B, steps=3))
  steps, _ = kref.alt_steps(np.asarray(data.n_train), np.asarray(data.y_train), data.num_classes, 3)
  private = [bref.start(alg)] * data.num_clients

  def client(theta, c, key):
    cd = ClientData(data.x_train[c], data.y_train[c], data.n_train[c])
    sent, private[c] = kref.alo_client(model, theta, private[c], cd, steps[c], key, lr=LR, mu=0.3, lam=0.5,
                                       batch_size=B)
    return sent

  state, theta = _every_client(alg, model, data, 2, client)
  return _global_and_own(state, theta, state.client_state.private, private)


# ------------------------------------------------------------------------ mixtures and memories
def apfl_vs_reference(model, data, groups):
  """test_apfl's loop (Algorithm 1, α = 0.3 adapted every step), three rounds: w, every v and α."""
  from test_apfl import _reference

  sched, steps = _epochs(data)
  alg = A.apfl(model=model, data=data, local_optimizer=optax.sgd(LR), local_learning_rate=LR, schedule=sched,
               cohort_size=4, chunk_size=2, alpha=0.3, alpha_lr=0.05)
  key = jax.random.key(11)
  state, _ = bref.run_jit(alg, data, 3, key)
  w, v, a = _reference(model, data, bref.start(alg), _flat(data), 3, key, cohort_size=4, steps=steps,
                       alpha=0.3, adaptive=True, alpha_lr=0.05)
  return _out([maxdiff(row(state.params[0], 0), w[0]), maxdiff(state.client_state.alpha, np.asarray(a))]
              + [maxdiff(row(state.client_state.personal, k), v[k]) for k in range(data.num_clients)],
              state.params, state.client_state)


def fedala_vs_reference(model, data, groups):
  """test_fedala's loop (ALA on the top layer), four rounds: the server's model, every local model
  and its ALA weights."""
  from test_fedala import ALA, _fedala, _reference

  from fedtree.algorithms.personalized.fedala import higher_mask

  sched, steps = _epochs(data)
  alg = _fedala(model, data, layers=1, schedule=sched, cohort_size=5, chunk_size=2)
  key = jax.random.key(11)
  state, _ = bref.run_jit(alg, data, 4, key)
  w0 = bref.start(alg)
  higher = higher_mask(model, w0, data.example_shape, 1)
  w, local, weights, _ = _reference(model, data, w0, _flat(data), 4, key, cohort_size=5, steps=steps,
                                    higher=higher, **ALA)
  return _out([maxdiff(row(state.params[0], 0), w[0])]
              + [maxdiff(row(state.client_state.local, k), local[k]) for k in range(data.num_clients)]
              + [maxdiff([g[k] for g in state.client_state.weights], weights[k])
                 for k in range(data.num_clients)],
              state.params, state.client_state.local)


def fedem_vs_reference(model, data, groups):
  """test_fedem's loop (Algorithm 1, three components), three rounds: every component and every π."""
  from test_fedem import _components, _reference

  sched, steps = _epochs(data)
  alg = A.fedem(num_components=3, model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched,
                cohort_size=5, chunk_size=2)
  key = jax.random.key(11)
  state, _ = bref.run_jit(alg, data, 3, key)
  comps, pi = _reference(model, data, _components(alg.init(jax.random.key(7)).params[0], 0), _flat(data), 3,
                         key, cohort_size=5, steps=steps)
  return _out([maxdiff(_components(state.params[0], 0), comps[0]),
               maxdiff(state.client_state.weights, np.stack(pi))], state.params, state.client_state)


# ------------------------------------------------------------------------ clustered FL
def _clustering_problem():
  """test_clustering's problem in float64: 6 clients of 4x4 images, 3 of them flipped; a tiny MLP."""
  from fedtree.core.data import as_device
  from fedtree.datasets.prototypes import prototype_images
  from fedtree.datasets.transforms import transform_random_clients
  from fedtree.models import build_model

  data = prototype_images(num_clients=6, num_examples=150, num_classes=3, image_size=4, blobs=2, noise=0.2,
                          alpha=1.0, test_fraction=0.25, seed=0)
  data = f64_data(as_device(transform_random_clients(data, num_transformed=3, kind="hflip", seed=0)[0]))
  model = f64_model(build_model("mlp", example_shape=data.example_shape, num_classes=data.num_classes,
                                hidden=(5,)))
  kw = dict(model=model, data=data, local_optimizer=optax.sgd(0.2),
            schedule=LocalSchedule(batch_size=8, steps=3), weighting="examples")
  return kw, dict(weights=np.asarray(data.n_train, np.float64), lr=0.2, batch_size=8, num_steps=np.full(6, 3))


def _clustered(alg, kw, seed, rounds, reference):
  """``rounds`` jitted rounds of ``alg`` (round ``r``'s key ``key(seed + r)``) against ``reference(params,
  cluster_of, key, r) -> (params, cluster_of)``: every cluster's model and the assignments (a client in
  another cluster is a deviation of 1)."""
  import reference_clustering as cref

  step = jax.jit(alg.round)
  state = alg.init(jax.random.key(0))
  k = jax.tree.leaves(state.params)[0].shape[0]
  params, cluster_of = [cref.row(state.params, j) for j in range(k)], np.zeros(6, np.int64)
  diffs = []
  for r in range(1, rounds + 1):
    key = jax.random.key(seed + r)
    state, _ = step(state, kw["data"], key)
    params, cluster_of = reference(params, cluster_of, key, r)
    diffs += [maxdiff(state.params, cref.stack(params)),
              float(np.any(np.asarray(state.cluster_of) != cluster_of))]
  return _out(diffs, state.params)


def ifca_vs_reference(model, data, groups):
  """test_clustering's IFCA loop (three clusters, every client picks its lowest loss), two rounds."""
  import reference_clustering as cref

  kw, hp = _clustering_problem()
  return _clustered(A.ifca(num_clusters=3, **kw), kw, 20, 2, lambda p, _, key, r: cref.ifca_round(
    kw["model"], p, kw["data"], key, **hp)[:2])


def cfl_vs_reference(model, data, groups):
  """test_clustering's CFL loop with Sattler's similarity check (up to three clusters, splitting whenever
  the criterion allows), two rounds."""
  import reference_clustering as cref

  kw, hp = _clustering_problem()
  used = [1]

  def reference(params, cluster_of, key, r):
    params, cluster_of, used[0] = cref.cfl_round(kw["model"], params, cluster_of, used[0], kw["data"], key,
                                                 eps1=1e3, eps2=1e-4, similarity_check=True, **hp)
    return params, cluster_of

  return _clustered(A.cfl(max_clusters=3, eps1=1e3, eps2=1e-4, similarity_check=True, **kw), kw, 30, 2,
                    reference)


def awcfl_vs_reference(model, data, groups):
  """test_clustering's AWCFL loop (two clusters by K-means after round 1, β = 0.3), two rounds."""
  import reference_clustering as cref

  kw, hp = _clustering_problem()
  return _clustered(A.awcfl(num_clusters=2, beta=0.3, cluster_start_round=1, kmeans_iters=5, **kw), kw, 10, 2,
                    lambda p, of, key, r: cref.awcfl_round(kw["model"], p, of, kw["data"], key, r=r, beta=0.3,
                                                           start=1, iters=5, **hp))


def mcfl_vs_reference(model, data, groups):
  """test_clustering's MCFL loop (AWCFL with β = 0 on whole-data features), three rounds."""
  import reference_clustering as cref

  kw, hp = _clustering_problem()
  big = int(max(kw["data"].max_train, kw["data"].x_test.shape[1]))
  alg = A.mcfl(num_clusters=2, cluster_start_round=1, kmeans_iters=5, feature_examples=big, **kw)
  return _clustered(alg, kw, 50, 3, lambda p, of, key, r: cref.awcfl_round(
    kw["model"], p, of, kw["data"], key, r=r, beta=0.0, start=1, iters=5, **hp))


# ------------------------------------------------------------------------ partial personalization
def _partial(method, keep_of, client_of, weighting="examples", norm="none", personal=None, **kw):
  """test_partial's loop for ``method`` (``keep_of(start)``: the leaves a client keeps), three rounds of
  3 sampled clients: the server's model and every client's personal model (``personal(state, server,
  own, keep)``: the deviations of the method's own personal models instead)."""
  from test_partial import LR as PLR
  from test_partial import STEPS, _common

  from fedtree.core.data import as_device
  from fedtree.datasets.synthetic import grouped_synthetic
  from fedtree.models import build_model

  data, _ = grouped_synthetic(group_sizes=(3, 2, 4), dim=6, num_classes=3, mean_examples=9, min_examples=3,
                              max_examples=14, test_examples=5, seed=3)
  data = f64_data(as_device(data))
  model = f64_model(build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,),
                                norm=norm))
  alg = method(**kw, **_common(model, data))
  key = jax.random.key(5)
  state = alg.init(jax.random.key(7))
  for r in range(3):
    state, _ = jax.jit(alg.round)(state, data, jax.random.fold_in(key, r))
  start = bref.start(alg)
  keep = keep_of(start)
  client = client_of(model, data, keep, lambda c, rk: jax.random.fold_in(stream(rk, "train"), c), PLR, STEPS,
                     start)
  server, own = pref.partial_rounds(model, data, start, 3, key, keep=keep, client=client, cohort_size=3,
                                    weighting=weighting, dtype=jnp.float64)
  if personal is not None:
    return _out([maxdiff(row(state.params[0], 0), server)] + personal(alg, state, server, own, keep),
                state.params, state.client_state)
  mine = alg.models(state)["personal"].params
  return _out([maxdiff(row(state.params[0], 0), server)]
              + [maxdiff(row(mine, c), pref.own_model(server, own[c], keep))
                 for c in range(data.num_clients)],
              state.params, mine)


def _head(params):
  return pref.flags(params, lambda p: p.split("/")[-2] == "Dense_1")


def _plain(model, data, keep, key_of, lr, steps, start):
  return lambda params, c, rk: pref.sgd_steps(model, params, pref.client_cdata(data, c), steps, key_of(c, rk),
                                              lr=lr, batch_size=B)


def fedper_vs_reference(model, data, groups):
  """test_partial's FedPer loop (the head personal)."""
  return _partial(A.fedper, _head, _plain)


def fedmmd_vs_reference(model, data, groups):
  """test_fedmmd's per-client loop (λ = 2: the penalty shows) under FedAvg's mean by examples, every
  client, two rounds."""
  import reference_fedkws as kref

  from fedtree.core.local import ClientData

  sched, steps = _epochs(data)
  alg = A.fedmmd(lam=2.0, model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched)
  key = jax.random.key(11)
  state, _ = bref.run_jit(alg, data, 2, key)
  theta, n = bref.start(alg), np.asarray(data.n_train, np.float64)
  clients = [ClientData(data.x_train[c], data.y_train[c], data.n_train[c]) for c in range(data.num_clients)]
  for r in range(2):
    rk = jax.random.fold_in(key, r)
    trained = kref.fedmmd_clients(model, theta, clients, list(steps), [bref.train_key(rk, c) for c in
                                                                      range(data.num_clients)],
                                  lr=LR, lam=2.0, batch_size=B)
    theta = ref.weighted_average(trained, list(n))
  return _out([maxdiff(row(state.params[0], 0), theta)], state.params)


def pfedmt_vs_reference(model, data, groups):
  """test_pfedmt's per-device loop of a global round (two teams, K = 2 team iterations of L = 3 Moreau
  steps, examples weighting), two global rounds: the global model, every team's and every device's."""
  from test_pfedmt import HP, _data, _reference_round, _sched

  from fedtree.models import build_model

  data = f64_data(_data([6, 9, 4, 11, 5], dim=4, classes=3, seed=3))
  labels = np.array([0, 0, 0, 1, 1])
  model = f64_model(build_model("mlp", example_shape=(4,), num_classes=3, hidden=(5,)))
  alg = A.pfedmt(model=model, topology=Topology.from_labels(labels), data=data, schedule=_sched(B, 3),
                 team_iters=2, weighting="examples", **HP)
  state = alg.init(jax.random.key(0))
  x, pm = state.params, None
  for r in range(2):
    key = jax.random.key(7 + r)
    x, w, pm = _reference_round(model, x, data, labels, key, L=3, K=2, B=B, weighting="examples", hp=HP,
                                pm=pm)
    state, _ = jax.jit(alg.round)(state, data, key)
  return _out([maxdiff(state.params, x)] + [maxdiff(row(state.team_params, i), w[i]) for i in range(2)]
              + [maxdiff(row(state.client_state, c), pm[c]) for c in range(5)],
              state.params, state.team_params, state.client_state)


def fedamp_vs_reference(model, data, groups):
  """test_fedamp's per-client loop (Algorithm 1, attention by distance, α = 0.2, λ = 0.5, σ = 2, each
  client from its own model, a cohort of 4), two rounds: every client's personal model."""
  import reference_pairwise as pw

  sched, steps = _epochs(data)
  kw = dict(attention="distance", alpha=0.2, lam=0.5, sigma=2.0, self_attention=0.4, start="own")
  alg = A.fedamp(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=4,
                 chunk_size=2, **kw)
  key = jax.random.key(11)
  state, _ = bref.run_jit(alg, data, 2, key)
  w0 = jax.tree.map(lambda a: a[0], alg.init(jax.random.key(7)).client_state)
  w = pw.fedamp_reference(model, data, w0, _flat(data), 2, key, cohort_size=4, lr=LR, batch_size=B,
                          steps=steps, dtype=np.float64, **kw)
  return _out([maxdiff(row(state.client_state, c), w[c]) for c in range(data.num_clients)],
              state.client_state)


def fedfomo_vs_reference(model, data, groups):
  """test_fedfomo's per-client loop (Algorithm 1 with the authors' ε-greedy choice: two candidates, ε = 0.5
  decaying by 0.2, the last 30 % of a client's rows for validation, a cohort of 4), two rounds: every
  client's model and the affinities."""
  import reference_pairwise as pw

  from fedtree.algorithms.personalized.fedfomo import SPLIT_SEED

  sched = LocalSchedule(batch_size=B, steps=3)
  kw = dict(num_candidates=2, epsilon=0.5, epsilon_decay=0.2)
  alg = A.fedfomo(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=4,
                  chunk_size=2, val_fraction=0.3, validation="last", pool="last_round", **kw)
  key = jax.random.key(3)
  state, _ = bref.run_jit(alg, data, 2, key)
  w0 = jax.tree.map(lambda a: a[0], alg.init(jax.random.key(7)).client_state.model)
  theta, affinity, _ = pw.fedfomo_reference(
    model, data, w0, _flat(data), 2, key, cohort_size=4, fraction=0.3, how="last", pool="last_round", lr=LR,
    batch_size=B, steps=np.full(data.num_clients, 3), seed=SPLIT_SEED, dtype=np.float64, **kw)
  assert np.any(affinity != 0)
  return _out([maxdiff(row(state.client_state.model, c), theta[c]) for c in range(data.num_clients)]
              + [maxdiff(state.client_state.affinity, affinity)], state.client_state)


def pfedhn_vs_reference(model, data, groups):
  """test_pfedhn's per-client loop (Algorithm 1, a cohort of 2, 3 local steps, the hypernetwork's SGD with
  momentum, weight decay and clipping), three rounds: the hypernetwork and every embedding."""
  import reference_pairwise as pw
  from test_pfedhn import HN

  sched = LocalSchedule(batch_size=B, steps=3)
  alg = A.pfedhn(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=2,
                 hidden=6, n_hidden=1, embed_dim=3, **HN)
  key = jax.random.key(9)
  start = alg.init(jax.random.key(7)).server_state
  state, _ = bref.run_jit(alg, data, 3, key)
  leaves, treedef = jax.tree.flatten(model.init(jax.random.key(0)))
  hnet, emb = pw.pfedhn_reference(
    model, data, row(start.hnet, 0), start.embeddings[0], treedef, [a.shape for a in leaves], 3, key,
    cohort_size=2, lr=LR, batch_size=B, steps=np.full(data.num_clients, 3), hn_lr=HN["hn_learning_rate"],
    momentum=HN["hn_momentum"], weight_decay=HN["hn_weight_decay"], clip_norm=HN["clip_norm"],
    dtype=np.float64)
  return _out([maxdiff(row(state.server_state.hnet, 0), hnet),
               maxdiff(state.server_state.embeddings[0], emb)],
              state.server_state.hnet, state.server_state.embeddings)


def fedproto_vs_reference(model, data, groups):
  """test_fedproto's per-client loop (λ = 2, prototypes averaged by class counts, a cohort of 4, 3 local
  steps), three rounds: every client's model and the prototypes."""
  import reference_pairwise as pw

  alg = A.fedproto(model=model, data=data, local_optimizer=optax.sgd(LR), lam=2.0, weighting="examples",
                   schedule=LocalSchedule(batch_size=B, steps=3), cohort_size=4, chunk_size=2)
  key = jax.random.key(4)
  state, _ = bref.run_jit(alg, data, 3, key)
  own = alg.models(state)["personal"].params
  w0 = row(alg.models(alg.init(jax.random.key(7)))["personal"].params, 0)
  w, protos = pw.fedproto_reference(data, w0, _flat(data), 3, key, cohort_size=4, lam=2.0,
                                    weighting="examples", lr=LR, batch_size=B,
                                    steps=np.full(data.num_clients, 3), num_classes=3, dtype=np.float64)
  return _out([maxdiff(row(own, c), w[c]) for c in range(data.num_clients)]
              + [maxdiff(state.server_state[0][p], c) for p, (c, _) in protos.items()],
              own, state.server_state)


def knnper_vs_reference(model, data, groups):
  """test_knnper's scoring (k = 3, λ = 0.5, T = 1) after two rounds of its training (FedAvg's, a cohort of
  4): the memory (every client's penultimate features) and the personal models' mean loss against the
  numpy interpolation of kNN and model scores."""
  from test_knnper import _reference_scores

  from fedtree.evaluation import evaluate_models
  from fedtree.objectives.fedmmd import penultimate

  alg = A.knnper(k=3, lam=0.5, temperature=1.0, memory_chunk=4, model=model, data=data,
                 local_optimizer=optax.sgd(LR), schedule=LocalSchedule(batch_size=B, steps=3), cohort_size=4)
  state, _ = bref.run_jit(alg, data, 2, jax.random.key(3))
  owner = np.zeros(data.num_clients, int)
  diffs = []
  for c in range(data.num_clients):
    n = int(data.n_train[c])
    feats, _ = penultimate(model, row(state.params[-1], 0), data.x_train[c][:n])
    diffs.append(maxdiff(state.client_state.features[c][:n], feats))
  out = evaluate_models(alg, state, model, data)
  acc, loss = _reference_scores(model, state, data, owner, k=3, lam=0.5, temperature=1.0)
  diffs += [abs(out["personal"]["accuracy"] - acc), abs(out["personal"]["loss"] - loss)]
  return _out(diffs, state.params, state.client_state.features)


def grouppfl_vs_reference(model, data, groups):
  """GroupPerFL's two pieces against test_grouppfl's loops: its group stage (FedAdam per data group on
  its own clients' updates, one round, every group's model) and its fine-tuning sweep (every client
  from its group's model at three rates, two epochs, every personal model)."""
  from fedtree.algorithms.hierarchical.grouppfl.grouppfl import group_fedopt
  from fedtree.core import finetune
  from fedtree.core.local import ClientData
  from fedtree.core.server import fedopt

  groups = np.asarray(groups)
  schedule = LocalSchedule(batch_size=B, epochs=1)
  server = fedopt("adam", learning_rate=0.05)
  start = model.init(jax.random.key(1))
  alg = group_fedopt(model=model, groups=groups, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule,
                     server_optimizer=server, start_params=start)
  key = jax.random.key(5)
  new, _ = jax.jit(alg.round)(alg.init(jax.random.key(0)), data, key)
  steps = schedule.num_steps(np.asarray(data.n_train))
  n = np.asarray(data.n_train, np.float64)
  cdata = [ClientData(data.x_train[c], data.y_train[c], data.n_train[c]) for c in range(data.num_clients)]
  diffs = []
  for g in range(int(groups.max()) + 1):
    members = np.flatnonzero(groups == g)
    thetas = [pref.sgd(model, start, cdata[c], int(steps[c]), jax.random.fold_in(stream(key, "train"), c),
                       lr=0.1, batch_size=B) for c in members]
    w = n[members] / n[members].sum()
    delta = jax.tree.map(lambda s, *t, w=w: s - sum(wi * ti for wi, ti in zip(w, t, strict=True)), start,
                         *thetas)
    upd, _ = server.update(delta, server.init(start), start)
    diffs.append(maxdiff(row(new.params[1], g), optax.apply_updates(start, upd)))
  params = new.params[1]
  sweep = LocalSchedule(batch_size=B, epochs=2)
  rates = (0.01, 0.5, 1.0)
  fkey = jax.random.key(3)
  personal, _ = finetune.finetune(model, params, groups, data, learning_rates=rates, schedule=sweep, key=fkey)
  fsteps = sweep.num_steps(np.asarray(data.n_train))
  for c in range(data.num_clients):
    for i, lr in enumerate(rates):
      want = pref.sgd(model, row(params, int(groups[c])), cdata[c], int(fsteps[c]),
                      jax.random.fold_in(fkey, c), lr=lr, batch_size=B)
      diffs.append(maxdiff(jax.tree.map(lambda a, i=i, c=c: a[i, c], personal), want))
  return _out(diffs, new.params, personal)


def _lora_problem():
  """test_llm_methods' problem in float64: 6 clients, an MLP of 8 hidden units as the frozen base."""
  from test_llm_methods import _problem

  data, model, _ = _problem()
  model = f64_model(model)
  return f64_data(data), model, model.init(jax.random.key(0))


def ffa_lora_vs_reference(model, data, groups):
  """test_llm_methods' FFA-LoRA loop (:func:`test_llm_methods.ffa_lora_case`) on a float64 base: the
  global ``B``."""
  from test_llm_methods import ffa_lora_case

  from fedtree.toolbox import lora as L

  _, _, _, glob, want, _, _ = ffa_lora_case(*_lora_problem())
  return _out([maxdiff(L.adapter_half(glob, "b"), want)], glob)


def fedsa_lora_vs_reference(model, data, groups):
  """test_llm_methods' FedSA-LoRA loop (:func:`test_llm_methods.fedsa_lora_case`) on a float64 base:
  every client's model after two rounds."""
  from test_llm_methods import fedsa_lora_case

  _, _, pairs = fedsa_lora_case(*_lora_problem())
  return _out([maxdiff(got, want) for got, want in pairs], [got for got, _ in pairs])


def hetlora_vs_reference(model, data, groups):
  """test_llm_methods' HetLoRA loop (:func:`test_llm_methods.hetlora_case`) on a float64 base: the
  global adapters and every client's truncated ones."""
  from test_llm_methods import RANKS, _row, hetlora_case

  from fedtree.toolbox import lora as L

  alg, state, _, glob, want = hetlora_case(*_lora_problem())
  truncated = alg.models(state)["truncated"].params
  return _out([maxdiff(glob, want)] + [maxdiff(_row(truncated, c), L.truncate(want, RANKS[c]))
                                       for c in range(len(RANKS))], glob, truncated)


def local_vs_reference(model, data, groups):
  """test_partial's loop with every leaf personal: local training only (the server's model stays the
  start, every sampled client trains its own)."""
  return _partial(A.local, lambda s: pref.flags(s, lambda p: True), _plain)


def lgfedavg_vs_reference(model, data, groups):
  """test_partial's LG-FedAvg loop (the representation personal)."""
  return _partial(A.lgfedavg, lambda s: [not h for h in _head(s)], _plain)


def fedbn_vs_reference(model, data, groups):
  """test_partial's FedBN loop (an MLP with BatchNorm; its layers and statistics personal)."""
  return _partial(A.fedbn, lambda s: pref.flags(s, lambda p: "BatchNorm" in p), _plain, norm="batch")


def fedrep_vs_reference(model, data, groups):
  """test_partial's FedRep loop (3 head steps, then the body), uniform weighting."""
  def client_of(model, data, keep, key_of, lr, steps, start):
    return lambda params, c, rk: pref.fedrep_client(model, params, keep, pref.client_cdata(data, c), 3, steps,
                                                    key_of(c, rk), lr=lr, batch_size=B)

  return _partial(A.fedrep, _head, client_of, weighting="uniform", head_steps=3)


def fedbabu_vs_reference(model, data, groups):
  """test_partial's FedBABU loop (the head frozen at its start, the body trained and averaged): the
  server's model."""
  def client_of(model, data, keep, key_of, lr, steps, start):
    return lambda params, c, rk: pref.sgd_steps(model, params, pref.client_cdata(data, c), steps,
                                                key_of(c, rk), lr=lr, batch_size=B,
                                                trainable=[not h for h in keep])

  return _partial(A.fedbabu, _head, client_of, personal=lambda *_: [], finetune_epochs=0, finetune_steps=3)


def fedrod_vs_reference(model, data, groups):
  """test_partial's FedRoD loop (the generic model on the balanced softmax loss, a personal head per
  client): the server's model, every client's personal model and head."""
  heads: dict = {}

  def client_of(model, data, keep, key_of, lr, steps, start):
    head = _head(start)
    heads.update({c: [np.asarray(a) for a, h in zip(jax.tree.leaves(start), head, strict=True) if h]
                  for c in range(data.num_clients)})   # a copy of the initial generic head

    def client(params, c, rk):
      p, heads[c] = pref.fedrod_client(model, params, heads[c], head, pref.client_cdata(data, c), steps,
                                       key_of(c, rk), lr=lr, batch_size=B, num_classes=3)
      return p

    return client

  def personal(alg, state, server, own, keep):
    mine, out = alg.models(state)["personal"].params, []
    for c, h in heads.items():
      it = iter(h)
      want = jax.tree.unflatten(jax.tree.structure(server), [w + next(it) if k else w for w, k in zip(
        jax.tree.leaves(server), _head(server), strict=True)])
      out += [maxdiff(row(mine, c), want), maxdiff(jax.tree.leaves(row(state.client_state, c)), h)]
    return out

  return _partial(A.fedrod, lambda s: [False] * len(jax.tree.leaves(s)), client_of, personal=personal)


# ------------------------------------------------------------------------ B-HFL
def _bhfl(rounds, **kw):
  """test_bhfl's pair (the vectorized algorithm and the per-node loop) on its problem in float64,
  ``rounds`` rounds: every node's model at every level."""
  import test_bhfl

  setup = test_bhfl._setup
  test_bhfl._setup = lambda: (lambda t, d, m: (t, f64_data(d), f64_model(m)))(*setup())
  try:
    topo, data, alg, reference = test_bhfl._pair(**kw)
  finally:
    test_bhfl._setup = setup
  state, step, diffs = alg.init(jax.random.key(0)), jax.jit(alg.round), []
  for t in range(rounds):
    k = jax.random.fold_in(jax.random.key(3), t)
    state, _ = step(state, data, k)
    reference.round_(k, data)
    diffs += [maxdiff(state.params[lv], reference.stacked(lv)) for lv in range(topo.depth + 1)]
  return _out(diffs, state.params)


def bhfl_vs_reference(model, data, groups):
  """test_bhfl's synchronous loop with everything on (per-node periods, proxy sets, a residual link
  sent down), four rounds."""
  return _bhfl(4, periods=(2, [2, 1], 1), proxy={0: 6, 1: 5}, residual_k=1, residual_optimizer=optax.sgd(0.3),
               residual_down=True)


def bhfl_async_vs_reference(model, data, groups):
  """test_bhfl's asynchronous loop (latencies at every level, buffers, (1 + τ)^-½), six rounds."""
  from fedtree.algorithms.hierarchical.bhfl.asynchrony import Latency

  return _bhfl(6, latencies=(Latency("uniform", low=0.0, high=1.5), Latency("constant", mean=0.4),
                             Latency("exponential", mean=0.7)),
               buffers=(None, 1, 2), staleness_exponent=0.5, residual_k=1, cohort=[2, 2, 2])


# ------------------------------------------------------------------------ width sub-models (issue 51)
def _width(method, mode, scaler, dynamic=False, **distill):
  """tests/test_heterogeneous.py's problem in float64: an MLP of two hidden layers (6, 4), three widths
  on the driver's 8 clients, 5 a round, three rounds; the per-client loop of sliced sub-models (FjORD's
  self-distillation with ``distill_weight`` and ``temperature``; ``dynamic``: every client's level drawn
  every round)."""
  import reference_heterogeneous as href

  from fedtree.models import build_model

  def compare(model, data, groups):
    mlp = f64_model(build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(6, 4)))
    rates, shares = (1.0, 0.5, 0.25), (0.4, 0.3, 0.3)
    alg = method(model=mlp, data=data, local_optimizer=optax.sgd(LR), rates=rates, proportions=shares,
                 schedule=LocalSchedule(batch_size=B, steps=3), capacity_seed=1, cohort_size=5,
                 capacities="dynamic" if dynamic else "seeded",
                 **({"distill": True, **distill} if distill else {}))
    key = jax.random.key(3)
    state, _ = bref.run_jit(alg, data, 3, key)
    theta = href.reference(data, bref.start(alg), 3, key, cohort_size=5, mode=mode, scaler=scaler,
                           rates=rates, shares=shares, seed=1, lr=LR, steps=3, batch_size=B,
                           distill=(distill["distill_weight"], distill["temperature"]) if distill else None,
                           dynamic=dynamic)
    return _out([maxdiff(row(state.params[0], 0), theta)], state.params)

  return compare


def feddf_vs_reference(model, data, groups):
  """test_feddf's FedAvg and distillation in float64: 5 of 8 clients a round, 4 Adam steps on 12 public
  inputs, two rounds."""
  import reference_heterogeneous as href

  public = np.asarray(jax.random.normal(jax.random.key(5), (12,) + tuple(data.example_shape)), np.float64)
  distill = dict(distill_steps=4, distill_batch_size=5, temperature=2.0)
  alg = A.feddf(model=model, data=data, local_optimizer=optax.sgd(LR), public=public, cohort_size=5,
                schedule=LocalSchedule(batch_size=B, steps=3), distill_learning_rate=0.01, **distill)
  key = jax.random.key(2)
  state, _ = bref.run_jit(alg, data, 2, key)
  theta = href.feddf_reference(model, data, bref.start(alg), 2, key, cohort_size=5, lr=LR, steps=3,
                               batch_size=B, public=public, distill_lr=0.01, **distill)
  return _out([maxdiff(row(state.params[0], 0), theta)], state.params)


def fedmd_vs_reference(model, data, groups):
  """test_feddf's FedMD in float64: 5 of 8 clients a round, 3 digest steps on 5 of 12 public inputs, three
  rounds; every client's own model."""
  import reference_heterogeneous as href

  public = np.asarray(jax.random.normal(jax.random.key(5), (12,) + tuple(data.example_shape)), np.float64)
  alg = A.fedmd(model=model, data=data, local_optimizer=optax.sgd(LR), public=public, cohort_size=5,
                schedule=LocalSchedule(batch_size=B, steps=3), public_subset=5, digest_steps=3,
                digest_learning_rate=0.01)
  key = jax.random.key(4)
  state, _ = bref.run_jit(alg, data, 3, key)
  own = href.fedmd_reference(model, data, bref.start(alg), 3, key, cohort_size=5, lr=LR, steps=3,
                             batch_size=B, public=public, subset=5, digest_steps=3, digest_lr=0.01)
  personal = alg.models(state)["personal"].params
  return _out([maxdiff(row(personal, c), own[c]) for c in range(data.num_clients)], personal)


def depthfl_vs_reference(model, data, groups):
  """test_depthfl's DepthFL in float64: an MLP of two hidden layers (6, 4), depths 1-3, 5 of 8 clients a
  round, three rounds; the blocks and exits."""
  import reference_heterogeneous as href

  from fedtree.models import build_model

  mlp = f64_model(build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(6, 4)))
  shares = (0.3, 0.3, 0.4)
  alg = A.depthfl(model=mlp, data=data, local_optimizer=optax.sgd(LR), proportions=shares, cohort_size=5,
                  schedule=LocalSchedule(batch_size=B, steps=3))
  key = jax.random.key(1)
  state, _ = bref.run_jit(alg, data, 3, key)
  want = href.depthfl_reference(data, bref.start(alg), 3, key, cohort_size=5, shares=shares, lr=LR, steps=3,
                                batch_size=B)
  got = row(state.params[0], 0)
  return _out([maxdiff({**got["body"], **got["exits"]}, want)], state.params)


REFERENCES = {
  "feddyn_ref": feddyn_vs_reference, "mime_ref": mime_vs_reference, "mimelite_ref": mimelite_vs_reference,
  "qffl_ref": qffl_vs_reference, "afl_ref": afl_vs_reference, "moon_ref": moon_vs_reference,
  "hierfavg_ref": hierfavg_vs_reference, "fedprox_ref": fedprox_vs_reference, "ditto_ref": ditto_vs_reference,
  "perfedavg_ref": perfedavg_vs_reference, "perfedavg_hf_ref": perfedavg_hf_vs_reference,
  "apfl_ref": apfl_vs_reference, "fedala_ref": fedala_vs_reference, "fedem_ref": fedem_vs_reference,
  "ifca_ref": ifca_vs_reference, "cfl_ref": cfl_vs_reference, "awcfl_ref": awcfl_vs_reference,
  "mcfl_ref": mcfl_vs_reference, "fedper_ref": fedper_vs_reference, "lgfedavg_ref": lgfedavg_vs_reference,
  "fedbn_ref": fedbn_vs_reference, "fedrep_ref": fedrep_vs_reference, "bhfl_ref": bhfl_vs_reference,
  "bhfl_async_ref": bhfl_async_vs_reference, "fedkws_ref": fedkws_vs_reference,
  "fedbabu_ref": fedbabu_vs_reference, "fedrod_ref": fedrod_vs_reference,
  "heterofl_ref": _width(A.heterofl, "static", True), "fedrolex_ref": _width(A.fedrolex, "rolling", True),
  "fjord_ref": _width(A.fjord, "ordered", False), "feddf_ref": feddf_vs_reference,
  "heterofl_dynamic_ref": _width(A.heterofl, "static", True, dynamic=True),
  "fjord_distill_ref": _width(A.fjord, "ordered", False, distill_weight=0.5, temperature=2.0),
  "fedmd_ref": fedmd_vs_reference, "depthfl_ref": depthfl_vs_reference, "fedex_ref": fedex_vs_reference,
  "mobile_hierfavg_ref": mobile_hierfavg_vs_reference, "local_ref": local_vs_reference,
  "fedmmd_ref": fedmmd_vs_reference, "pfedmt_ref": pfedmt_vs_reference,
  "fedamp_ref": fedamp_vs_reference, "fedfomo_ref": fedfomo_vs_reference,
  "pfedhn_ref": pfedhn_vs_reference, "fedproto_ref": fedproto_vs_reference,
  "knnper_ref": knnper_vs_reference, "grouppfl_ref": grouppfl_vs_reference,
  "ffa_lora_ref": ffa_lora_vs_reference, "fedsa_lora_ref": fedsa_lora_vs_reference,
  "hetlora_ref": hetlora_vs_reference,
}
