"""APFL: the vectorized rounds against a per-client loop written from Algorithm 1 (adaptive α every
step; once a round with FedTorch's decay; flat and on a tree), its reductions (α = 0 is FedAvg's
global model, α = 1 local training), the personalized model it scores, and its refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference_baselines as rb
import reference_personalization as ref

from fedtree.algorithms import apfl, fedavg
from fedtree.core.local import LocalSchedule
from fedtree.core.personal import personal
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.core.topology import Topology
from fedtree.models import build_model

LR, B = 0.1, 4


@pytest.fixture(scope="module")
def problem():
  return rb.small_problem()


def _row(tree, i):
  return jax.tree.map(lambda a: a[i], tree)


def _run(alg, data, rounds, key):
  state = alg.init(jax.random.key(7))
  step = jax.jit(alg.round)
  for r in range(rounds):
    state, _ = step(state, data, jax.random.fold_in(key, r))
  return state


def _reference(model, data, w0, parent, rounds, key, *, cohort_size, steps, alpha, adaptive, alpha_lr,
               alpha_decay=0.0, schedule="every_step", root_period=None, weights=None):
  """Algorithm 1 per parent of clients (its own w, averaged uniformly over the clients that trained),
  the root (if any) averaging the parents' models every ``root_period`` rounds."""
  num_parents = int(parent.max()) + 1
  w = [w0 for _ in range(num_parents)]
  v = [w0 for _ in range(data.num_clients)]
  a = [alpha for _ in range(data.num_clients)]
  sampler = cohort_sampler(parent, cohort_size)
  for r in range(rounds):
    rk = jax.random.fold_in(key, r)
    cohort = sampler(stream(rk, "cohort"))
    slots = [(int(k), int(p)) for k, p, ok in zip(np.asarray(cohort.clients), np.asarray(cohort.parent),
                                                  np.asarray(cohort.valid), strict=True) if ok]
    sent = [[] for _ in range(num_parents)]
    for k, p in slots:
      wk, v[k], a[k] = ref.apfl(model, w[p], v[k], a[k], rb.client_data(data, k), int(steps[k]),
                                jax.random.fold_in(stream(rk, "train"), k), lr=LR, alpha_lr=alpha_lr,
                                adaptive=adaptive, alpha_decay=alpha_decay, schedule=schedule, batch_size=B)
      sent[p].append(wk)
    for p in range(num_parents):
      if sent[p]:
        w[p] = jax.tree.map(lambda *m: sum(m) / len(m), *sent[p])
    if root_period and (r + 1) % root_period == 0:
      root = jax.tree.map(lambda *m: sum(x * y for x, y in zip(weights, m, strict=True)) / sum(weights), *w)
      w = [root for _ in range(num_parents)]
  return w, v, a


@pytest.mark.parametrize("schedule,decay", [("every_step", 0.0),
                                            pytest.param("first_step", 0.02, marks=pytest.mark.slow)])
def test_apfl_matches_algorithm_1_per_client(problem, schedule, decay):
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)  # unequal step counts
  alg = apfl(model=model, data=data, local_optimizer=optax.sgd(LR), local_learning_rate=LR, schedule=sched,
             cohort_size=4, chunk_size=2, alpha=0.3, alpha_lr=0.05, alpha_decay=decay,
             alpha_schedule=schedule)
  key = jax.random.key(11)
  state = _run(alg, data, 3, key)
  w0 = _row(alg.init(jax.random.key(7)).params[0], 0)
  w, v, a = _reference(model, data, w0, np.zeros(data.num_clients, int), 3, key, cohort_size=4,
                       steps=sched.num_steps(np.asarray(data.n_train)), alpha=0.3, adaptive=True,
                       alpha_lr=0.05, alpha_decay=decay, schedule=schedule)
  rb.close(_row(state.params[0], 0), w[0])
  np.testing.assert_allclose(np.asarray(state.client_state.alpha), a, atol=2e-5)
  assert len({round(x, 6) for x in a}) > 2   # α moved, differently per client
  mixed = alg.models(state)["personal"].params
  for k in range(data.num_clients):
    rb.close(_row(state.client_state.personal, k), v[k])
    rb.close(_row(mixed, k), jax.tree.map(lambda x, y, al=a[k]: al * x + (1 - al) * y, v[k], w[0]))


@pytest.mark.slow
def test_apfl_on_a_tree_mixes_with_the_leaf_parent(problem):
  data, groups, model = problem
  topo = Topology.from_labels(groups)  # root -> 3 edges -> 9 clients
  alg = apfl(model=model, data=data, topology=topo, local_optimizer=optax.sgd(LR), local_learning_rate=LR,
             schedule=LocalSchedule(batch_size=B, steps=3), cohort_size=2, periods=(2,), alpha=0.4)
  key = jax.random.key(4)
  state = _run(alg, data, 3, key)
  w0 = _row(alg.init(jax.random.key(7)).params[0], 0)
  parent = topo.parent(2)
  weights = [float(np.sum(parent == g)) for g in range(3)]   # uniform weighting: clients under each edge
  w, v, a = _reference(model, data, w0, parent, 3, key, cohort_size=2, steps=np.full(data.num_clients, 3),
                       alpha=0.4, adaptive=True, alpha_lr=LR, root_period=2, weights=weights)
  for g in range(3):
    rb.close(_row(state.params[1], g), w[g])
  mixed = alg.models(state)["personal"].params
  for k in range(data.num_clients):
    rb.close(_row(mixed, k), jax.tree.map(lambda x, y, al=a[k]: al * x + (1 - al) * y, v[k], w[parent[k]]))
  assert sorted(alg.models(state)) == ["global", "level1", "personal"]


def test_alpha_zero_is_fedavgs_global_model_and_one_is_local_training(problem):
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=3), cohort_size=4)
  key = jax.random.key(2)
  zero = apfl(alpha=0.0, adaptive=False, **common)
  s0 = _run(zero, data, 3, key)
  sf = _run(fedavg(weighting="uniform", **common), data, 3, key)
  rb.close(s0.params[0], sf.params[0], atol=1e-6)
  for k in range(data.num_clients):   # every client is scored with FedAvg's global model
    rb.close(_row(zero.models(s0)["personal"].params, k), _row(sf.params[0], 0), atol=1e-6)

  one = apfl(alpha=1.0, adaptive=False, **common)
  s1 = _run(one, data, 3, key)
  w0 = _row(one.init(jax.random.key(7)).params[0], 0)
  local = [w0] * data.num_clients
  sampler = cohort_sampler(np.zeros(data.num_clients, int), 4)
  for r in range(3):   # each client's own SGD over the rounds it is sampled, nothing else
    rk = jax.random.fold_in(key, r)
    cohort = sampler(stream(rk, "cohort"))
    for k, ok in zip(np.asarray(cohort.clients), np.asarray(cohort.valid), strict=True):
      if ok:
        local[k] = ref.sgd(model, local[k], rb.client_data(data, int(k)), 3,
                           jax.random.fold_in(stream(rk, "train"), int(k)), lr=LR, batch_size=B)
  for k in range(data.num_clients):
    rb.close(_row(one.models(s1)["personal"].params, k), local[k])


def test_apfl_refusals(problem):
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=1), local_learning_rate=LR)
  with pytest.raises(ValueError, match=r"alpha=1.5 must be in \[0, 1\]"):
    apfl(alpha=1.5, **common)
  with pytest.raises(ValueError, match=r"alpha=-0.1 must be in \[0, 1\]"):
    apfl(alpha=-0.1, adaptive=False, **common)
  with pytest.raises(ValueError, match=r"alpha_schedule='often'; choose one of \('every_step', "):
    apfl(alpha_schedule="often", **common)
  with pytest.raises(ValueError, match="needs a step size"):
    apfl(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=LocalSchedule(batch_size=B, steps=1))
  with pytest.raises(ValueError, match="personal parameters are not supported"):
    apfl(personal=personal("Dense_1"), **common)
  bn = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,), norm="batch")
  with pytest.raises(ValueError, match=r"apfl: the model keeps state \['batch_stats'\]"):
    apfl(**{**common, "model": bn})
  assert jnp.isfinite(apfl(**common).init(jax.random.key(0)).client_state.alpha).all()
