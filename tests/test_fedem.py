"""FedEM: the vectorized rounds against a per-client loop written from Algorithm 1 (E-step,
mixture weights, weighted local steps of every component, per-component averaging; flat and on a
tree), its reduction to FedAvg (one component), the mixture each client is scored with, the bytes
it sends, and its refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference_baselines as rb
import reference_personalization as ref

from fedtree.algorithms import fedavg, fedem
from fedtree.core.local import LocalSchedule
from fedtree.core.personal import personal
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.core.topology import Topology
from fedtree.evaluation import evaluate_models
from fedtree.models import build_model

LR, B, K = 0.1, 4, 3


@pytest.fixture(scope="module")
def problem():
  return rb.small_problem()


def _row(tree, i):
  return jax.tree.map(lambda a: a[i], tree)


def _mean(models, weights):
  return jax.tree.map(lambda *m: sum(x * c for x, c in zip(m, weights, strict=True)) / sum(weights), *models)


def _reference(model, data, comps0, parent, rounds, key, *, cohort_size, steps, root_period=None):
  """Algorithm 1 per parent of clients (its K components, each averaged by the trained clients'
  examples), the root (if any) averaging the parents' components by their examples."""
  num_parents = int(parent.max()) + 1
  n = np.asarray(data.n_train, np.float64)
  comps = [list(comps0) for _ in range(num_parents)]
  pi = [np.full(len(comps0), 1.0 / len(comps0)) for _ in range(data.num_clients)]
  sampler = cohort_sampler(parent, cohort_size)
  for r in range(rounds):
    rk = jax.random.fold_in(key, r)
    cohort = sampler(stream(rk, "cohort"))
    slots = [(int(k), int(p)) for k, p, ok in zip(np.asarray(cohort.clients), np.asarray(cohort.parent),
                                                  np.asarray(cohort.valid), strict=True) if ok]
    sent = [[] for _ in range(num_parents)]
    for k, p in slots:
      trained, pi[k] = ref.fedem(model, comps[p], pi[k], rb.client_data(data, k), int(steps[k]),
                                 jax.random.fold_in(stream(rk, "train"), k), lr=LR, batch_size=B)
      sent[p].append((trained, n[k]))
    for p in range(num_parents):
      if sent[p]:
        comps[p] = [_mean([t[c] for t, _ in sent[p]], [m for _, m in sent[p]]) for c in range(len(comps0))]
    if root_period and (r + 1) % root_period == 0:
      size = [float(n[parent == g].sum()) for g in range(num_parents)]
      root = [_mean([comps[g][c] for g in range(num_parents)], size) for c in range(len(comps0))]
      comps = [list(root) for _ in range(num_parents)]
  return comps, pi


def _components(stacked, row):
  count = jax.tree.leaves(stacked)[0].shape[1]
  return [jax.tree.map(lambda a, c=c: a[row, c], stacked) for c in range(count)]


def test_fedem_matches_algorithm_1_per_client(problem):
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)   # unequal step counts
  alg = fedem(num_components=K, model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched,
              cohort_size=5, chunk_size=2)
  key = jax.random.key(11)
  state, metrics = rb.run_jit(alg, data, 3, key)
  start = _components(alg.init(jax.random.key(7)).params[0], 0)
  comps, pi = _reference(model, data, start, np.zeros(data.num_clients, int), 3, key, cohort_size=5,
                         steps=sched.num_steps(np.asarray(data.n_train)))
  for got, want in zip(_components(state.params[0], 0), comps[0], strict=True):
    rb.close(got, want)
  np.testing.assert_allclose(np.asarray(state.client_state.weights), np.stack(pi), atol=2e-5)
  assert np.ptp(np.stack(pi)) > 1e-3   # the clients' mixtures differ
  one = sum(int(np.prod(np.shape(a))) * 4 for a in jax.tree.leaves(model.init(jax.random.key(0))))
  assert float(metrics["uplink_bytes"]) == float(metrics["downlink_bytes"]) == K * one   # K models each way


def test_every_client_is_scored_with_its_own_mixture(problem):
  data, _, model = problem
  alg = fedem(num_components=K, model=model, data=data, local_optimizer=optax.sgd(LR),
              schedule=LocalSchedule(batch_size=B, steps=3), cohort_size=5)
  state, _ = rb.run_jit(alg, data, 2, jax.random.key(3))
  out = evaluate_models(alg, state, model, data)
  comps = _components(state.params[0], 0)
  pi = np.asarray(state.client_state.weights, np.float64)
  share = np.asarray(data.n_train, np.float64) / float(np.sum(data.n_train))
  for name, weights in (("personal", pi), ("global", np.tile(share @ pi, (data.num_clients, 1)))):
    correct = loss = count = 0.0
    for c in range(data.num_clients):
      n = int(data.n_test[c])
      x, y = np.asarray(data.x_test[c])[:n], np.asarray(data.y_test[c])[:n]
      probs = [np.exp(-np.stack([ref.example_nll(model, comp, x, np.full(n, j)) for j in range(3)], 1))
               for comp in comps]                                          # [n, classes] per component
      mixture = sum(w * p for w, p in zip(weights[c], probs, strict=True))
      correct += float(np.sum(np.argmax(mixture, 1) == y))
      loss += float(-np.sum(np.log(mixture[np.arange(n), y])))
      count += n
    assert out[name]["accuracy"] == pytest.approx(correct / count, abs=1e-9)
    assert out[name]["loss"] == pytest.approx(loss / count, rel=1e-4)


def test_one_component_is_fedavg(problem):
  data, _, model = problem
  p0 = model.init(jax.random.key(5))
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=3), cohort_size=4, init_params=p0)
  key = jax.random.key(2)
  s, _ = rb.run_jit(fedem(num_components=1, **common), data, 3, key)
  f, _ = rb.run_jit(fedavg(**common), data, 3, key)
  rb.close(_components(s.params[0], 0)[0], _row(f.params[0], 0), atol=1e-6)
  assert np.asarray(s.client_state.weights).tolist() == [[1.0]] * data.num_clients


@pytest.mark.slow
def test_fedem_on_a_tree(problem):
  data, groups, model = problem
  topo = Topology.from_labels(groups)
  alg = fedem(num_components=2, model=model, data=data, topology=topo, local_optimizer=optax.sgd(LR),
              schedule=LocalSchedule(batch_size=B, steps=2), cohort_size=2, periods=(2,))
  key = jax.random.key(4)
  state, metrics = rb.run_jit(alg, data, 3, key)
  start = _components(alg.init(jax.random.key(7)).params[0], 0)
  comps, pi = _reference(model, data, start, topo.parent(2), 3, key, cohort_size=2,
                         steps=np.full(data.num_clients, 2), root_period=2)
  for g in range(3):
    for got, want in zip(_components(state.params[1], g), comps[g], strict=True):
      rb.close(got, want)
  np.testing.assert_allclose(np.asarray(state.client_state.weights), np.stack(pi), atol=2e-5)
  assert "level0_uplink_bytes" in metrics
  personal_models = alg.models(state)["personal"]
  assert np.asarray(personal_models.model_of_client).tolist() == topo.ancestor(1).tolist()


def test_fedem_refusals(problem):
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=1))
  for bad in (0, -2, 2.5, True):
    with pytest.raises(ValueError, match=rf"num_components={bad!r} must be an int >= 1"):
      fedem(num_components=bad, **common)
  with pytest.raises(ValueError, match="personal parameters are not supported"):
    fedem(personal=personal("Dense_1"), **common)
  bn = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,), norm="batch")
  with pytest.raises(ValueError, match=r"fedem: the model keeps state \['batch_stats'\]"):
    fedem(**{**common, "model": bn})
  assert jnp.allclose(fedem(**common).init(jax.random.key(0)).client_state.weights, 1 / 3)
