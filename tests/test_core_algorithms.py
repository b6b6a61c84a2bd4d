"""FedAvg, FedOpt and HierFAVG: vectorized rounds against per-client reference loops, and the
known reductions between them."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference as ref
from helpers import count_traces, tier_kw

from fedtree.algorithms import fedavg, hierfavg
from fedtree.core.data import as_device
from fedtree.core.local import LocalSchedule
from fedtree.core.loop import compile_rounds
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.core.server import fedopt, server_optimizer
from fedtree.core.topology import Topology
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.models import build_model

LR, B = 0.1, 4


@pytest.fixture(scope="module")
def problem():
  data, groups = grouped_synthetic(group_sizes=(3, 2, 4), dim=6, num_classes=3, mean_examples=9,
                                   min_examples=3, max_examples=14, test_examples=5, seed=3)
  assert len(set(np.asarray(data.n_train).tolist())) > 2, "want unequal client sizes"
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,))
  return as_device(data), groups, model


def _params_close(a, b, atol=2e-5):
  chex.assert_trees_all_close(ref.to_np(a), ref.to_np(b), atol=atol, rtol=1e-4)


def _run(alg, data, rounds, key):
  state = alg.init(jax.random.key(7))
  for r in range(rounds):
    state, _ = alg.round(state, data, jax.random.fold_in(key, r))
  return state


def test_fedavg_matches_per_client_loop(problem):
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)
  alg = fedavg(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched,
               cohort_size=5, chunk_size=2)
  key = jax.random.key(11)
  state = _run(alg, data, 3, key)

  theta = alg.init(jax.random.key(7)).params[0]
  theta = jax.tree.map(lambda p: p[0], theta)
  sampler = cohort_sampler(np.zeros(data.num_clients, int), 5)
  steps = sched.num_steps(np.asarray(data.n_train))
  for r in range(3):
    rk = jax.random.fold_in(key, r)
    cohort = np.asarray(sampler(stream(rk, "cohort")).clients)
    models = ref.client_models(model, {0: theta}, data, [(int(c), 0) for c in cohort], rk,
                               lr=LR, batch_size=B, num_steps=steps)
    theta = ref.weighted_average([models[int(c)] for c in cohort],
                                 [float(data.n_train[c]) for c in cohort])
  _params_close(jax.tree.map(lambda p: p[0], state.params[0]), theta)


def test_fedadam_matches_paper_equations_per_client(problem):
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, steps=3)
  server = fedopt("adam", learning_rate=0.05, b1=0.9, b2=0.99, tau=1e-2)
  alg = fedavg(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched,
               server_optimizer=server, weighting="uniform", cohort_size=4)
  key = jax.random.key(5)
  state = _run(alg, data, 3, key)

  theta = jax.tree.map(lambda p: np.asarray(p[0], np.float64), alg.init(jax.random.key(7)).params[0])
  adam = ref.PaperFedAdam(theta, lr=0.05, b1=0.9, b2=0.99, tau=1e-2)
  sampler = cohort_sampler(np.zeros(data.num_clients, int), 4)
  for r in range(3):
    rk = jax.random.fold_in(key, r)
    cohort = np.asarray(sampler(stream(rk, "cohort")).clients)
    start = jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), theta)
    models = ref.client_models(model, {0: start}, data, [(int(c), 0) for c in cohort], rk,
                               lr=LR, batch_size=B, num_steps=np.full(data.num_clients, 3))
    mean = ref.weighted_average([models[int(c)] for c in cohort], [1.0] * len(cohort))
    delta = jax.tree.map(lambda t, m: t - m, theta, mean)
    theta = adam.step(theta, delta)
  _params_close(jax.tree.map(lambda p: p[0], state.params[0]), theta, atol=5e-5)


@pytest.mark.parametrize("sizes,periods", [([3, 2, 4], (3,)), ([[3, 2], [4]], (4, 2))])
def test_hierfavg_matches_per_client_loop(problem, sizes, periods):
  data, _, model = problem
  topo = Topology.from_sizes(sizes)
  sched = LocalSchedule(batch_size=B, epochs=1)
  alg = hierfavg(model=model, topology=topo, data=data, local_optimizer=optax.sgd(LR),
                 schedule=sched, periods=periods, cohort_size=2, chunk_size=3)
  key = jax.random.key(2)
  rounds = 5
  state = _run(alg, data, rounds, key)

  # Reference: a dict of models per level, numpy aggregation, loops over nodes.
  d = topo.depth
  init = jax.tree.map(lambda p: np.asarray(p[0], np.float64), alg.init(jax.random.key(7)).params[0])
  models = [{n: init for n in range(topo.num_nodes(lv))} for lv in range(d)]
  n_train = np.asarray(data.n_train, np.float64)
  sampler = cohort_sampler(topo.parent(d), 2)
  steps = sched.num_steps(np.asarray(data.n_train))
  for r in range(1, rounds + 1):
    rk = jax.random.fold_in(key, r - 1)
    cohort = sampler(stream(rk, "cohort"))
    clients, parents = np.asarray(cohort.clients), np.asarray(cohort.parent)
    slots = [(int(c), int(p)) for c, p in zip(clients, parents, strict=True)]
    start = {n: jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), m) for n, m in models[d - 1].items()}
    trained = ref.client_models(model, start, data, slots, rk, lr=LR, batch_size=B, num_steps=steps)
    for node in range(topo.num_nodes(d - 1)):
      kids = [c for c, p in slots if p == node]
      models[d - 1][node] = ref.weighted_average([trained[c] for c in kids], [n_train[c] for c in kids])
    top = None
    for lv in range(d - 2, -1, -1):
      if r % periods[lv]:
        continue
      top = lv
      for node in range(topo.num_nodes(lv)):
        kids = [k for k in range(topo.num_nodes(lv + 1)) if topo.parent(lv + 1)[k] == node]
        w = [n_train[topo.ancestor(lv + 1) == k].sum() for k in kids]
        models[lv][node] = ref.weighted_average([models[lv + 1][k] for k in kids], w)
    if top is not None:
      for lv in range(top + 1, d):
        for node in range(topo.num_nodes(lv)):
          models[lv][node] = models[lv - 1][int(topo.parent(lv)[node])]
  for lv in range(d):
    for node in range(topo.num_nodes(lv)):
      _params_close(jax.tree.map(lambda p, i=node: p[i], state.params[lv]), models[lv][node])


def test_hierfavg_one_group_period_one_is_fedavg(problem):
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=4)
  flat = fedavg(**common)
  one_group = hierfavg(topology=Topology.from_labels(np.zeros(data.num_clients, int)), periods=(1,), **common)
  key = jax.random.key(3)
  a, b = _run(flat, data, 4, key), _run(one_group, data, 4, key)
  _params_close(a.params[0], b.params[0], atol=1e-6)
  _params_close(b.params[1], b.params[0], atol=0)


@pytest.mark.slow  # ~20-50 s on the shared CPU: two compiled runs (group_fedopt's test covers it by hand)
def test_hierfavg_top_level_is_a_root_that_never_aggregates(problem):
  """``top_level=1``: every group learns on its own, as under a root whose period is longer
  than the run; the root (the start model) is not in ``models()``."""
  from fedtree.core import loop

  data, groups, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR), topology=Topology.from_labels(groups),
                schedule=LocalSchedule(batch_size=B, epochs=1), server_optimizers=optax.adam(0.05))
  key = jax.random.key(3)
  alone = hierfavg(top_level=1, **common)
  a = loop.run(alone, data, num_rounds=3, key=key)
  b = loop.run(hierfavg(periods=(1000,), **common), data, num_rounds=3, key=key)
  _params_close(a.params, b.params, atol=0)
  assert sorted(alone.models(a)) == ["level1"]


def test_hierfavg_bad_top_level_is_refused(problem):
  data, groups, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR), topology=Topology.from_labels(groups),
                schedule=LocalSchedule(batch_size=B, epochs=1))
  for bad in (-1, 2):
    with pytest.raises(ValueError, match=f"top_level={bad} must be a server level, 0..1"):
      hierfavg(top_level=bad, **common)


def test_fedavg_is_sgd_one_on_the_pseudo_gradient(problem):
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=5)
  key = jax.random.key(4)
  default = _run(fedavg(**common), data, 2, key)
  by_name = _run(fedavg(server_optimizer=server_optimizer("sgd", learning_rate=1.0), **common), data, 2, key)
  _params_close(default.params[0], by_name.params[0], atol=0)
  # And sgd(1.0) on Δ = Θ - mean θ lands exactly on the weighted mean of the client models.

  alg = fedavg(**common)
  s0 = alg.init(jax.random.key(7))
  rk = jax.random.fold_in(key, 0)
  cohort = cohort_sampler(np.zeros(data.num_clients, int), 5)(stream(rk, "cohort"))
  res = tier_kw(
    __import__("fedtree.core.local", fromlist=["x"]).sgd_client_update(
      model, optax.sgd(LR), batch_size=B, max_steps=sched.max_steps(data.max_train)),
    s0.params[0], cohort, data, num_steps=sched.num_steps(data.n_train),
    weights=data.n_train.astype(jnp.float32), key=stream(rk, "train"), keep_client_params=True,
  )
  w = np.asarray(data.n_train, np.float64)[np.asarray(cohort.clients)]
  mean = jax.tree.map(lambda p: np.tensordot(w / w.sum(), np.asarray(p, np.float64), axes=1),
                      res.client_params)
  s1, _ = alg.round(s0, data, rk)
  _params_close(jax.tree.map(lambda p: p[0], s1.params[0]), mean)


@pytest.mark.parametrize("kind", ["adagrad", "adam", "yogi"])
@pytest.mark.parametrize("bias_correction", [False, True])
def test_fedopt_paper_form_step_by_step(kind, bias_correction):
  b1, b2, tau, lr = 0.9, 0.99, 1e-3, 0.1
  opt = fedopt(kind, learning_rate=lr, b1=b1, b2=b2, tau=tau, bias_correction=bias_correction)
  rng = np.random.default_rng(0)
  theta = rng.normal(size=5)
  x = jnp.asarray(theta, jnp.float32)
  state = opt.init(x)
  m, v = np.zeros(5), np.full(5, tau**2)
  for t in range(1, 6):
    delta = rng.normal(size=5)
    m = b1 * m + (1 - b1) * delta
    if kind == "adagrad":
      v = v + delta**2
    elif kind == "adam":
      v = b2 * v + (1 - b2) * delta**2
    else:
      v = v - (1 - b2) * delta**2 * np.sign(v - delta**2)
    step = lr * (np.sqrt(1 - b2**t) / (1 - b1**t) if bias_correction else 1.0)
    theta = theta - step * m / (np.sqrt(v) + tau)
    upd, state = opt.update(jnp.asarray(delta, jnp.float32), state, x)
    x = optax.apply_updates(x, upd)
    np.testing.assert_allclose(np.asarray(x), theta, rtol=1e-5, atol=1e-6)


def test_fedopt_initial_accumulator_option():
  opt = fedopt("adam", learning_rate=1.0, initial_accumulator=0.0, tau=0.0, b1=0.0, b2=0.0)
  upd, _ = opt.update(jnp.array([2.0, -3.0]), opt.init(jnp.zeros(2)))
  np.testing.assert_allclose(np.asarray(upd), [-1.0, 1.0], rtol=1e-6)  # sign step from v0 = 0


def test_padding_is_never_used(problem):
  data, _, model = problem
  n = np.asarray(data.n_train)
  pad = np.arange(data.max_train)[None, :] >= n[:, None]
  x = np.asarray(data.x_train).copy()
  y = np.asarray(data.y_train).copy()
  x[pad] = np.nan
  y[pad] = 2
  xt = np.asarray(data.x_test).copy()
  corrupted = data.replace(x_train=jnp.asarray(x), y_train=jnp.asarray(y))
  sched = LocalSchedule(batch_size=B, epochs=2)
  alg = fedavg(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=5)
  key = jax.random.key(9)
  a, b = _run(alg, data, 2, key), _run(alg, corrupted, 2, key)
  chex.assert_trees_all_equal(a.params, b.params)
  assert np.isfinite(xt).all()


def test_round_compiles_once(problem):
  data, groups, model = problem
  alg = hierfavg(model=model, topology=Topology.from_labels(groups), data=data,
                 local_optimizer=optax.sgd(LR), schedule=LocalSchedule(batch_size=B, epochs=1),
                 periods=(2,), cohort_size=2)
  counted, traces = count_traces(alg)
  step = compile_rounds(counted, rounds_per_call=3)
  state = counted.init(jax.random.key(0))
  for _ in range(6):
    state, metrics = step(state, data, jax.random.key(1))
  assert int(state.round) == 18
  assert len(traces) == 1, f"round traced {len(traces)} times"
  assert step._cache_size() == 1


def test_same_seed_same_result_other_seed_other_cohort(problem):
  data, _, model = problem
  alg = fedavg(model=model, data=data, local_optimizer=optax.sgd(LR),
               schedule=LocalSchedule(batch_size=B, epochs=1), cohort_size=3)
  a = _run(alg, data, 2, jax.random.key(1))
  b = _run(alg, data, 2, jax.random.key(1))
  c = _run(alg, data, 2, jax.random.key(2))
  chex.assert_trees_all_equal(a.params, b.params)
  sampler = cohort_sampler(np.zeros(data.num_clients, int), 3)
  cohorts = {tuple(np.asarray(sampler(jax.random.key(s)).clients)) for s in range(6)}
  assert len(cohorts) > 1
  assert not np.allclose(np.asarray(jax.tree.leaves(a.params)[0]), np.asarray(jax.tree.leaves(c.params)[0]))


def test_explicit_per_client_steps_match_the_loop(problem):
  """Clients take exactly their own step count (0 means: sends back the model unchanged)."""
  data, _, model = problem
  steps = tuple(int(s) for s in np.arange(data.num_clients) % 4)
  sched = LocalSchedule(batch_size=B, steps=steps)
  alg = fedavg(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=-1)
  key = jax.random.key(8)
  state = _run(alg, data, 1, key)
  theta = jax.tree.map(lambda p: p[0], alg.init(jax.random.key(7)).params[0])
  rk = jax.random.fold_in(key, 0)
  models = ref.client_models(model, {0: theta}, data, [(c, 0) for c in range(data.num_clients)], rk,
                             lr=LR, batch_size=B, num_steps=np.asarray(steps))
  chex.assert_trees_all_equal(models[0], theta)
  mean = ref.weighted_average([models[c] for c in range(data.num_clients)], np.asarray(data.n_train, float))
  _params_close(jax.tree.map(lambda p: p[0], state.params[0]), mean)
