"""kNN-Per: the global model trains as FedAvg's; every client's memory holds its training
examples' features under its parent's model (flat, on a tree, on ragged data); each client is
scored with the interpolation of the model and a k-NN over its memory, against a numpy loop written
from the paper (λ = 0 is the global model); refusals."""

import jax
import numpy as np
import optax
import pytest
import reference_personalization as ref

from fedtree.algorithms import fedavg, knnper
from fedtree.core.data import as_device
from fedtree.core.local import LocalSchedule
from fedtree.core.model import Model
from fedtree.core.ragged import to_ragged_train
from fedtree.core.topology import Topology
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.evaluation import evaluate_models
from fedtree.models import build_model
from fedtree.objectives.fedmmd import penultimate

LR, B = 0.1, 4


@pytest.fixture(scope="module")
def problem():
  data, groups = grouped_synthetic(group_sizes=(3, 2, 4), dim=6, num_classes=3, mean_examples=9,
                                   min_examples=3, max_examples=14, test_examples=5, seed=3)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,))
  return as_device(data), groups, model


def _run(alg, data, rounds, key):
  state = alg.init(jax.random.key(7))
  step = jax.jit(alg.round)
  for r in range(rounds):
    state, _ = step(state, data, jax.random.fold_in(key, r))
  return state


def _check_memory(model, state, data, owner):
  mem = state.client_state
  for c in range(data.num_clients):
    n = int(data.n_train[c])
    params = jax.tree.map(lambda a, g=int(owner[c]): a[g], state.params[-1])
    feats, _ = penultimate(model, params, data.x_train[c][:n])
    np.testing.assert_allclose(np.asarray(mem.features[c][:n]), np.asarray(feats), atol=1e-5)
    assert not np.asarray(mem.features[c][n:]).any()
    assert np.asarray(mem.labels[c][:n]).tolist() == np.asarray(data.y_train[c][:n]).tolist()
  assert np.asarray(mem.count).tolist() == np.asarray(data.n_train).tolist()


def _reference_scores(model, state, data, owner, *, k, lam, temperature):
  """Accuracy and mean loss of every client's interpolation (numpy, float64)."""
  mem = state.client_state
  correct = loss = count = 0.0
  for c in range(data.num_clients):
    n = int(data.n_test[c])
    params = jax.tree.map(lambda a, g=int(owner[c]): a[g], state.params[-1])
    feats, logits = penultimate(model, params, data.x_test[c][:n])
    p = ref.knn_scores(feats, logits, mem.features[c], np.asarray(mem.labels[c]), int(mem.count[c]), k=k,
                       lam=lam, temperature=temperature)
    y = np.asarray(data.y_test[c][:n])
    correct += float(np.sum(np.argmax(p, 1) == y))
    loss += float(-np.sum(np.log(np.maximum(p[np.arange(n), y], 1e-12))))
    count += n
  return correct / count, loss / count


@pytest.mark.parametrize("k,lam,temperature", [
  (3, 0.5, 1.0), pytest.param(50, 0.8, 0.3, marks=pytest.mark.slow)])   # k above every count
def test_each_client_is_scored_with_its_memory(problem, k, lam, temperature):
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=3), cohort_size=4)
  alg = knnper(k=k, lam=lam, temperature=temperature, memory_chunk=4, **common)
  key = jax.random.key(3)
  state = _run(alg, data, 2, key)
  plain = _run(fedavg(**common), data, 2, key)
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(plain.params), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))   # the global model is FedAvg's
  owner = np.zeros(data.num_clients, int)
  _check_memory(model, state, data, owner)
  out = evaluate_models(alg, state, model, data)
  acc, loss = _reference_scores(model, state, data, owner, k=k, lam=lam, temperature=temperature)
  assert out["personal"]["accuracy"] == pytest.approx(acc, abs=1e-9)
  assert out["personal"]["loss"] == pytest.approx(loss, rel=1e-4)
  assert out["personal"]["accuracy"] != out["global"]["accuracy"]


def test_lam_zero_is_the_global_model(problem):
  data, _, model = problem
  alg = knnper(k=3, lam=0.0, model=model, data=data, local_optimizer=optax.sgd(LR),
               schedule=LocalSchedule(batch_size=B, steps=3))
  state = _run(alg, data, 2, jax.random.key(1))
  out = evaluate_models(alg, state, model, data)
  assert out["personal"]["accuracy"] == out["global"]["accuracy"]
  assert out["personal"]["loss"] == pytest.approx(out["global"]["loss"], rel=1e-5)


@pytest.mark.slow
def test_memory_on_a_tree_and_on_ragged_data(problem):
  data, groups, model = problem
  topo = Topology.from_labels(groups)
  alg = knnper(k=3, model=model, data=data, topology=topo, local_optimizer=optax.sgd(LR),
               schedule=LocalSchedule(batch_size=B, steps=2), cohort_size=2, periods=(2,))
  state = _run(alg, data, 3, jax.random.key(4))   # round 3: the edges differ again
  _check_memory(model, state, data, topo.ancestor(1))
  assert np.asarray(alg.models(state)["personal"].model_of_client).tolist() == topo.ancestor(1).tolist()
  flat = to_ragged_train(data)
  alg = knnper(k=3, model=model, data=flat, local_optimizer=optax.sgd(LR),
               schedule=LocalSchedule(batch_size=B, steps=2))
  ragged = _run(alg, flat, 1, jax.random.key(4))
  padded = _run(knnper(k=3, model=model, data=data, local_optimizer=optax.sgd(LR),
                       schedule=LocalSchedule(batch_size=B, steps=2)), data, 1, jax.random.key(4))
  for a, b in zip(jax.tree.leaves(ragged.client_state), jax.tree.leaves(padded.client_state), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_knnper_refusals(problem):
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=1))
  for bad in (0, 2.5, True):
    with pytest.raises(ValueError, match=rf"k={bad!r} must be an int >= 1"):
      knnper(k=bad, **common)
  with pytest.raises(ValueError, match=r"lam=1.5 must be in \[0, 1\]"):
    knnper(lam=1.5, **common)
  with pytest.raises(ValueError, match="temperature=0.0 must be a finite number > 0"):
    knnper(temperature=0.0, **common)
  matrix = Model(init=lambda key: {"w": jax.numpy.zeros((6, 3))},
                 apply=lambda p, x, train=False, rng=None: x @ p["w"], num_classes=3)
  with pytest.raises(ValueError, match="kNN-Per needs features"):
    knnper(**{**common, "model": matrix})
