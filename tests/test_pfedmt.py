"""pFedMT (paper 003): hand-checked equations, vectorized vs per-device loop, compile once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import count_traces, np_grad

from fedtree.algorithms.hierarchical.pfedmt import pfedmt
from fedtree.core.data import as_device, from_client_arrays
from fedtree.core.local import ClientData, LocalSchedule, run_local_steps
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.core.topology import Topology
from fedtree.models import build_model
from fedtree.objectives.moreau import MoreauCarry, moreau_step


def _data(sizes, dim=3, classes=3, seed=0):
  rng = np.random.default_rng(seed)
  train, test = [], []
  for n in sizes:
    x = rng.normal(size=(n, dim)).astype(np.float32)
    y = rng.integers(0, classes, n).astype(np.int32)
    train.append((x, y))
    test.append((x[:2], y[:2]))
  return as_device(from_client_arrays(train, test, num_classes=classes))


def _sched(batch, steps):
  return LocalSchedule(batch_size=batch, epochs=None, steps=steps)


HP = dict(learning_rate=0.1, lam=2.0, gamma=0.5, eta=0.1, beta=0.8)


@pytest.mark.parametrize("sizes,weighting", [([5], "examples"), ([5, 7], "examples"),
                                             ([5, 7], "uniform")])
def test_one_device_per_team_by_hand(sizes, weighting):
  """1 or 2 teams of one device each; full-batch gradients (batch >= n), so exact."""
  data = _data(sizes)
  topo = Topology.from_labels(list(range(len(sizes))))
  model = build_model("logreg", example_shape=(3,), num_classes=3)
  L, K = 3, 2
  alg = pfedmt(model=model, topology=topo, data=data, schedule=_sched(8, L),
               team_iters=K, weighting=weighting, **HP)
  state = alg.init(jax.random.key(1))
  p0 = state.params["Dense_0"]
  x_k, x_b = np.asarray(p0["kernel"], np.float64), np.asarray(p0["bias"], np.float64)
  a, lam, g, eta, beta = HP["learning_rate"], HP["lam"], HP["gamma"], HP["eta"], HP["beta"]
  m = len(sizes)
  tau = np.asarray(sizes, float) / sum(sizes) if weighting == "examples" else np.full(m, 1.0 / m)
  step = jax.jit(alg.round)
  for t in range(3):
    state, _ = step(state, data, jax.random.fold_in(jax.random.key(2), t))
    w = [(x_k.copy(), x_b.copy()) for _ in sizes]
    for _ in range(K):
      new_w, pm = [], []
      for i, n in enumerate(sizes):
        xs = np.asarray(data.x_train[i, :n], np.float64)
        ys = np.asarray(data.y_train[i, :n])
        th_k, th_b = w[i][0].copy(), w[i][1].copy()
        for _ in range(L):
          gk, gb = np_grad(th_k, th_b, xs, ys)
          th_k, th_b = (th_k - a * gk - a * lam * (th_k - w[i][0]),
                        th_b - a * gb - a * lam * (th_b - w[i][1]))
        pm.append((th_k, th_b))
        # one device per team: θ̄_i = θ_i1
        new_w.append(tuple((1 - eta * lam - eta * g) * wv + eta * g * xv + eta * lam * tv
                           for wv, xv, tv in zip(w[i], (x_k, x_b), (th_k, th_b), strict=True)))
      w = new_w
    wbar = [sum(tau[i] * w[i][j] for i in range(m)) for j in range(2)]
    x_k = (1 - beta * g) * x_k + beta * g * wbar[0]
    x_b = (1 - beta * g) * x_b + beta * g * wbar[1]
    got = state.params["Dense_0"]
    np.testing.assert_allclose(got["kernel"], x_k, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["bias"], x_b, rtol=1e-5, atol=1e-6)
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for i in range(m):
      close(state.team_params["Dense_0"]["kernel"][i], w[i][0])
      close(state.client_state["Dense_0"]["kernel"][i], pm[i][0])
      close(state.client_state["Dense_0"]["bias"][i], pm[i][1])


def _reference_round(model, x, data, team_of, key, *, L, K, B, weighting, hp, device_lam=None,
                     team_weighting=None, cohort_size=None, pm=None):
  """Per-device Python loop of one global round (same keys, and the same sampled devices, as
  the vectorized program)."""
  a, lam, g, eta, beta = hp["learning_rate"], hp["lam"], hp["gamma"], hp["eta"], hp["beta"]
  num_teams = int(team_of.max()) + 1
  n = np.asarray(data.n_train)
  wts = n.astype(np.float64) if weighting == "examples" else np.ones_like(n, np.float64)
  step = moreau_step(model, learning_rate=a, lam=lam if device_lam is None else device_lam)
  train = jax.jit(lambda carry, cd, k: run_local_steps(step, carry, cd, jnp.int32(L), k,
                                                       batch_size=B, max_steps=L)[0])
  sampler = cohort_sampler(team_of, cohort_size)
  w = [x for _ in range(num_teams)]
  pm = [x for _ in range(len(n))] if pm is None else list(pm)
  for k in range(K):
    kk = jax.random.fold_in(stream(key, "train"), k)
    cohort = sampler(jax.random.fold_in(stream(key, "cohort"), k))
    sampled = set(np.asarray(cohort.clients)[np.asarray(cohort.valid)].tolist())
    thetas = {}
    for c in sorted(sampled):
      cd = ClientData(data.x_train[c], data.y_train[c], data.n_train[c])
      carry = train(MoreauCarry(w[team_of[c]], w[team_of[c]]), cd, jax.random.fold_in(kk, c))
      thetas[c] = carry.params
      pm[c] = carry.params
    new_w = []
    for i in range(num_teams):
      mem = [c for c in range(len(n)) if team_of[c] == i and c in sampled]
      tot = sum(wts[c] for c in mem)
      tbar = jax.tree.map(
        lambda *ts, mem=mem, tot=tot: sum(wts[c] * t for c, t in zip(mem, ts, strict=True)) / tot,
        *[thetas[c] for c in mem])
      new_w.append(jax.tree.map(
        lambda wi, xi, tb: (1 - eta * lam - eta * g) * wi + eta * g * xi + eta * lam * tb,
        w[i], x, tbar))
    w = new_w
  if team_weighting is None:
    team_weighting = "examples" if weighting == "examples" else "devices"
  by = {"examples": n.astype(np.float64), "devices": np.ones(len(n)), "uniform": None}[team_weighting]
  team_w = (np.ones(num_teams) if by is None else
            np.array([sum(by[c] for c in range(len(n)) if team_of[c] == i) for i in range(num_teams)]))
  tau = team_w / team_w.sum()
  wbar = jax.tree.map(lambda *ws: sum(t * wi for t, wi in zip(tau, ws, strict=True)), *w)
  x = jax.tree.map(lambda xi, wb: (1 - beta * g) * xi + beta * g * wb, x, wbar)
  return x, w, pm


@pytest.mark.parametrize("weighting,chunk", [("examples", None), ("uniform", 2)])
def test_vectorized_matches_per_device_loop(weighting, chunk):
  sizes = [6, 9, 4, 11, 5]
  labels = np.array([0, 0, 0, 1, 1])
  data = _data(sizes, dim=4, classes=3, seed=3)
  topo = Topology.from_labels(labels)
  model = build_model("mlp", example_shape=(4,), num_classes=3, hidden=(5,))
  L, K, B = 3, 2, 4
  alg = pfedmt(model=model, topology=topo, data=data, schedule=_sched(B, L),
               team_iters=K, weighting=weighting, chunk_size=chunk, **HP)
  state = alg.init(jax.random.key(0))
  key = jax.random.key(7)
  x_ref, w_ref, pm_ref = _reference_round(model, state.params, data, labels, key, L=L, K=K, B=B,
                                          weighting=weighting, hp=HP)
  state, metrics = jax.jit(alg.round)(state, data, key)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  jax.tree.map(close, state.params, x_ref)
  for i in range(2):
    jax.tree.map(close, jax.tree.map(lambda p, i=i: p[i], state.team_params), w_ref[i])
  for c in range(len(sizes)):
    jax.tree.map(close, jax.tree.map(lambda p, c=c: p[c], state.client_state), pm_ref[c])
  assert np.isfinite(float(metrics["train_loss"]))
  models = alg.models(state)
  assert set(models) == {"global", "team", "personal"}
  np.testing.assert_array_equal(models["team"].model_of_client, labels)


@pytest.mark.parametrize("opts", [
  dict(device_lam=0.5),
  dict(team_weighting="uniform"),
  dict(team_weighting="devices"),
  dict(cohort_size=2, chunk_size=2),
  dict(cohort_size=1, device_lam=4.0, team_weighting="uniform"),
])
def test_reproduction_options_match_per_device_loop(opts):
  """Device λ apart from the team's, device sampling per team and team weights by examples,
  devices or 1/M, over two rounds (the second starts from sampled devices' state)."""
  sizes = [6, 9, 4, 11, 5]
  labels = np.array([0, 0, 0, 1, 1])
  data = _data(sizes, dim=4, classes=3, seed=3)
  model = build_model("logreg", example_shape=(4,), num_classes=3)
  L, K, B = 2, 3, 4
  alg = pfedmt(model=model, topology=Topology.from_labels(labels), data=data,
               schedule=_sched(B, L), team_iters=K, **HP, **opts)
  state = alg.init(jax.random.key(0))
  x, pm = state.params, [jax.tree.map(lambda p, c=c: p[c], state.client_state) for c in range(5)]
  ref_opts = {k: v for k, v in opts.items() if k != "chunk_size"}
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  step = jax.jit(alg.round)
  for r in range(2):
    key = jax.random.key(7 + r)
    x, w, pm = _reference_round(model, x, data, labels, key, L=L, K=K, B=B, weighting="examples",
                                hp=HP, pm=pm, **ref_opts)
    state, _ = step(state, data, key)
    jax.tree.map(close, state.params, x)
    for c in range(len(sizes)):
      jax.tree.map(close, jax.tree.map(lambda p, c=c: p[c], state.client_state), pm[c])
  if opts.get("device_lam") or opts.get("team_weighting") == "uniform":  # the option matters
    plain = pfedmt(model=model, topology=Topology.from_labels(labels), data=data,
                   schedule=_sched(B, L), team_iters=K, **HP,
                   cohort_size=opts.get("cohort_size"))
    s0, _ = plain.round(plain.init(jax.random.key(0)), data, jax.random.key(7))
    s1, _ = alg.round(alg.init(jax.random.key(0)), data, jax.random.key(7))
    assert not np.allclose(s0.params["Dense_0"]["kernel"], s1.params["Dense_0"]["kernel"])


def test_custom_client_update_init_state_is_honoured():
  from flax import struct

  from fedtree.core.algorithm import stack
  from fedtree.core.local import ClientUpdate
  from fedtree.objectives.moreau import moreau_client_update

  @struct.dataclass
  class Counted:
    personal: object  # [C, ...] personalized models
    trained: jax.Array  # int32[C] team iterations each device trained in

  data = _data([4, 5, 6, 3])
  topo = Topology.from_labels([0, 0, 1, 1])
  model = build_model("logreg", example_shape=(3,), num_classes=3)
  sched, K = _sched(2, 2), 3
  base = moreau_client_update(model, learning_rate=HP["learning_rate"], lam=HP["lam"],
                              batch_size=2, max_steps=2)

  def apply(anchor, state, cd, num_steps, key):
    params, _, loss = base.apply(anchor, state.personal, cd, num_steps, key)
    return params, Counted(personal=params, trained=state.trained + 1), loss

  update = ClientUpdate(apply=apply, init_state=lambda p, c: Counted(
    personal=stack(p, c), trained=jnp.zeros((c,), jnp.int32)))
  alg = pfedmt(model=model, topology=topo, data=data, schedule=sched, team_iters=K,
               client_update=update, **HP)
  plain = pfedmt(model=model, topology=topo, data=data, schedule=sched, team_iters=K, **HP)
  state = alg.init(jax.random.key(0))
  assert isinstance(state.client_state, Counted)
  state, _ = jax.jit(alg.round)(state, data, jax.random.key(3))
  ref, _ = jax.jit(plain.round)(plain.init(jax.random.key(0)), data, jax.random.key(3))
  np.testing.assert_array_equal(state.client_state.trained, K)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  jax.tree.map(close, state.client_state.personal, ref.client_state)
  jax.tree.map(close, alg.models(state)["personal"].params, ref.client_state)


def test_round_compiles_once():
  from fedtree.core import loop

  data = _data([4, 5, 6, 3])
  topo = Topology.from_labels([0, 0, 1, 1])
  model = build_model("logreg", example_shape=(3,), num_classes=3)
  alg = pfedmt(model=model, topology=topo, data=data, schedule=_sched(2, 2),
               team_iters=2, **HP)
  counted, traces = count_traces(alg)
  state = alg.init(jax.random.key(0))
  step = loop.compile_rounds(counted, 2)
  for _ in range(3):
    state, _ = step(state, data, jax.random.key(0))
  assert len(traces) == 1
  assert int(state.round) == 6


def test_rejects_bad_trees_and_hyperparameters():
  data = _data([4, 5, 6, 3])
  model = build_model("logreg", example_shape=(3,), num_classes=3)
  sched = LocalSchedule(batch_size=2, epochs=None, steps=1)
  with pytest.raises(ValueError, match="depth 2"):
    pfedmt(model=model, topology=Topology.from_sizes([[2], [2]]), data=data, schedule=sched)
  with pytest.raises(ValueError, match="depth 2"):
    pfedmt(model=model, topology=Topology.flat(4), data=data, schedule=sched)
  topo = Topology.from_labels([0, 0, 1, 1])
  with pytest.raises(ValueError, match="team_iters"):
    pfedmt(model=model, topology=topo, data=data, schedule=sched, team_iters=0)
  with pytest.raises(ValueError, match="lam"):
    pfedmt(model=model, topology=topo, data=data, schedule=sched, lam=-1.0)
  with pytest.raises(ValueError, match="weighting"):
    pfedmt(model=model, topology=topo, data=data, schedule=sched, weighting="size")
  with pytest.raises(ValueError, match="team_weighting='teams'; choose one of"):
    pfedmt(model=model, topology=topo, data=data, schedule=sched, team_weighting="teams")
  with pytest.raises(ValueError, match="device_lam"):
    pfedmt(model=model, topology=topo, data=data, schedule=sched, device_lam=-1.0)
