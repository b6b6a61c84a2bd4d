"""FedALA: the vectorized rounds against a per-client loop written from Algorithm 1 (ALA of the
received model into the local one on the higher layers, the first phase to convergence, then one
epoch a round), the layers it adapts, its reduction to FedAvg (η = 0), and its refusals."""

import jax
import numpy as np
import optax
import pytest
import reference_baselines as rb
import reference_personalization as ref

from fedtree.algorithms import fedala, fedavg
from fedtree.algorithms.personalized.fedala import higher_mask, layer_order
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


def _weighted_mean(models, weights):
  return jax.tree.map(lambda *m: sum(x * c for x, c in zip(m, weights, strict=True)) / sum(weights), *models)


def _reference(model, data, w0, parent, rounds, key, *, cohort_size, steps, higher, root_period=None, **ala):
  """Algorithm 1 per parent of clients (its model averaged by the trained clients' examples), the
  root (if any) averaging the parents' models by their examples every ``root_period`` rounds."""
  num_parents = int(parent.max()) + 1
  n = np.asarray(data.n_train, np.float64)
  w = [w0 for _ in range(num_parents)]
  local = [w0 for _ in range(data.num_clients)]
  weights = [[np.ones(np.shape(a)) for a, h in zip(jax.tree.leaves(w0), higher, strict=True) if h]
             for _ in range(data.num_clients)]
  started = [False] * data.num_clients
  sampler = cohort_sampler(parent, cohort_size)
  for r in range(rounds):
    rk = jax.random.fold_in(key, r)
    cohort = sampler(stream(rk, "cohort"))
    slots = [(int(k), int(p)) for k, p, ok in zip(np.asarray(cohort.clients), np.asarray(cohort.parent),
                                                  np.asarray(cohort.valid), strict=True) if ok]
    sent = [[] for _ in range(num_parents)]
    for k, p in slots:
      local[k], weights[k], started[k] = ref.fedala(
        model, w[p], local[k], weights[k], started[k], rb.client_data(data, k), int(steps[k]),
        jax.random.fold_in(stream(rk, "train"), k), higher=higher, lr=LR, batch_size=B, **ala)
      sent[p].append((local[k], n[k]))
    for p in range(num_parents):
      if sent[p]:
        w[p] = _weighted_mean([x for x, _ in sent[p]], [c for _, c in sent[p]])
    if root_period and (r + 1) % root_period == 0:
      root = _weighted_mean(w, [float(n[parent == g].sum()) for g in range(num_parents)])
      w = [root for _ in range(num_parents)]
  return w, local, weights, started


ALA = dict(eta=1.0, fraction=0.8, threshold=0.05, num_pre_loss=3, max_epochs=8)


def _fedala(model, data, **kw):
  return fedala(model=model, data=data, local_optimizer=optax.sgd(LR), eta=ALA["eta"],
                sample_fraction=ALA["fraction"], threshold=ALA["threshold"], num_pre_loss=ALA["num_pre_loss"],
                max_ala_epochs=ALA["max_epochs"], **kw)


@pytest.mark.parametrize("layers", [1, pytest.param(None, marks=pytest.mark.slow)])
def test_fedala_matches_algorithm_1_per_client(problem, layers):
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)  # unequal step counts
  alg = _fedala(model, data, layers=layers, schedule=sched, cohort_size=5, chunk_size=2)
  key = jax.random.key(11)
  state = _run(alg, data, 4, key)
  w0 = _row(alg.init(jax.random.key(7)).params[0], 0)
  higher = higher_mask(model, w0, data.example_shape, layers)
  w, local, weights, started = _reference(model, data, w0, np.zeros(data.num_clients, int), 4, key,
                                          cohort_size=5, steps=sched.num_steps(np.asarray(data.n_train)),
                                          higher=higher, **ALA)
  rb.close(_row(state.params[0], 0), w[0])
  assert np.asarray(state.client_state.started).tolist() == started and any(started)
  personal_models = alg.models(state)["personal"].params
  for k in range(data.num_clients):
    rb.close(_row(state.client_state.local, k), local[k])
    rb.close(_row(personal_models, k), local[k])
    for got, want in zip(state.client_state.weights, weights[k], strict=True):
      np.testing.assert_allclose(np.asarray(got[k]), want, atol=2e-5)
  learned = np.concatenate([np.ravel(np.asarray(x)) for x in state.client_state.weights])
  assert learned.min() < 1.0   # the weights moved off ones


@pytest.mark.slow
def test_fedala_on_a_tree(problem):
  data, groups, model = problem
  topo = Topology.from_labels(groups)
  sched = LocalSchedule(batch_size=B, steps=2)
  alg = _fedala(model, data, topology=topo, schedule=sched, cohort_size=2, periods=(2,))
  key = jax.random.key(5)
  state = _run(alg, data, 4, key)
  w0 = _row(alg.init(jax.random.key(7)).params[0], 0)
  higher = higher_mask(model, w0, data.example_shape, 1)
  w, local, _, _ = _reference(model, data, w0, topo.parent(2), 4, key, cohort_size=2,
                              steps=np.full(data.num_clients, 2), higher=higher, root_period=2, **ALA)
  for g in range(3):
    rb.close(_row(state.params[1], g), w[g])
  for k in range(data.num_clients):
    rb.close(_row(state.client_state.local, k), local[k])


def test_eta_zero_is_fedavg(problem):
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=3), cohort_size=4)
  key = jax.random.key(2)
  s = _run(fedala(eta=0.0, **common), data, 3, key)
  f = _run(fedavg(**common), data, 3, key)
  rb.close(s.params[0], f.params[0], atol=1e-6)


def test_the_higher_layers_are_the_last_the_forward_pass_reads():
  mlp = build_model("mlp", example_shape=(4,), num_classes=3, hidden=(3,) * 11)   # Dense_0 .. Dense_11
  params = jax.eval_shape(mlp.init, jax.random.key(0))
  assert layer_order(mlp, params, (4,)) == [f"Dense_{i}" for i in range(12)]   # not Dense_10 < Dense_2
  mask = higher_mask(mlp, params, (4,), 2)
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  chosen = {jax.tree_util.keystr(p[:1], simple=True) for (p, _), m in zip(leaves, mask, strict=True) if m}
  assert chosen == {"Dense_10", "Dense_11"}
  cnn = build_model("cnn", example_shape=(10, 10), num_classes=3, features=(2, 2), dense=4)
  assert layer_order(cnn, jax.eval_shape(cnn.init, jax.random.key(0)), (10, 10)) == [
    "Conv_0", "Conv_1", "Dense_0", "Dense_1"]
  assert all(higher_mask(cnn, jax.eval_shape(cnn.init, jax.random.key(0)), (10, 10), None))


def test_fedala_refusals(problem):
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=1))
  with pytest.raises(ValueError, match=r"layers=3: the model has 2 layers \['Dense_0', 'Dense_1'\]; "):
    fedala(layers=3, **common)
  with pytest.raises(ValueError, match="layers=0: the model has 2 layers"):
    fedala(layers=0, **common)
  with pytest.raises(ValueError, match=r"sample_fraction=1.5 must be in \(0, 1\]"):
    fedala(sample_fraction=1.5, **common)
  with pytest.raises(ValueError, match="sample_fraction=0.0 must be a finite number > 0"):
    fedala(sample_fraction=0.0, **common)
  with pytest.raises(ValueError, match="num_pre_loss=0 must be >= 1"):
    fedala(num_pre_loss=0, **common)
  with pytest.raises(ValueError, match="eta=-1.0 must be a finite number >= 0"):
    fedala(eta=-1.0, **common)
  with pytest.raises(ValueError, match="personal parameters are not supported"):
    fedala(personal=personal("Dense_1"), **common)
  bn = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,), norm="batch")
  with pytest.raises(ValueError, match=r"fedala: the model keeps state \['batch_stats'\]"):
    fedala(**{**common, "model": bn})
