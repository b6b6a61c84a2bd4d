"""FedFomo: the vectorized rounds against a per-client loop written from the paper (the authors'
ε-greedy choice, both validation splits and pools, flat and on a tree, where a client's candidates
are its parent's clients only), ``M = 0`` as local training, the bytes (``M`` models down, one up),
and the refusals."""

import chex
import jax
import ml_collections
import numpy as np
import optax
import pytest
import reference_pairwise as ref
from helpers import clipped, small_context

from fedtree.algorithms import fedavg, fedfomo
from fedtree.algorithms.personalized.fedfomo import SPLIT_SEED
from fedtree.core.data import as_device
from fedtree.core.local import LocalSchedule
from fedtree.core.personal import personal
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.experiment import registry
from fedtree.models import build_model
from fedtree.toolbox.compression import qsgd, uplink
from fedtree.toolbox.privacy import clip

LR, B = 0.1, 4


@pytest.fixture(scope="module")
def problem():
  data, groups = grouped_synthetic(group_sizes=(3, 3), dim=6, num_classes=3, mean_examples=10,
                                   min_examples=5, max_examples=14, test_examples=5, seed=4)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,))
  return as_device(data), groups, model


def _run(alg, data, rounds, key):
  state = jax.jit(alg.init)(jax.random.key(7))
  step = jax.jit(alg.round)
  for r in range(rounds):
    state, metrics = step(state, data, jax.random.fold_in(key, r))
  return state, metrics


def _check(state, theta, affinity, last, siblings):
  for k, want in enumerate(theta):
    got = ref.np64(jax.tree.map(lambda a, k=k: a[k], state.client_state.model))
    chex.assert_trees_all_close(got, want, atol=3e-5, rtol=2e-4)
  for k in range(len(theta)):   # the engine's row is over the client's parent's children
    np.testing.assert_allclose(np.asarray(state.client_state.affinity[k, :len(siblings[k])]),
                               affinity[k, siblings[k]], atol=1e-4, rtol=1e-3)
  np.testing.assert_array_equal(np.asarray(state.client_state.last), last)


@pytest.mark.parametrize("validation,pool,groups_as_tree", [
  ("last", "last_round", False),
  pytest.param("random", "all", False, marks=pytest.mark.slow),
  pytest.param("last", "last_round", True, marks=pytest.mark.slow),
])
def test_fedfomo_matches_the_per_client_loop(problem, validation, pool, groups_as_tree):
  data, groups, model = problem
  topo = Topology.from_labels(groups) if groups_as_tree else None
  parent = np.asarray(topo.parent(2)) if groups_as_tree else np.zeros(data.num_clients, int)
  cohort = 2 if groups_as_tree else 4
  kw = dict(num_candidates=1 if groups_as_tree else 2, epsilon=0.5, epsilon_decay=0.2)
  sched = LocalSchedule(batch_size=B, steps=3)
  alg = fedfomo(model=model, data=data, topology=topo, local_optimizer=optax.sgd(LR), schedule=sched,
                cohort_size=cohort, chunk_size=2, val_fraction=0.3, validation=validation, pool=pool, **kw)
  key = jax.random.key(3)
  rounds = 3 if groups_as_tree or validation == "random" else 2
  state, metrics = _run(alg, data, rounds, key)
  w0 = jax.tree.map(lambda a: a[0], jax.jit(alg.init)(jax.random.key(7)).client_state.model)
  theta, affinity, last = ref.fedfomo_reference(
    model, data, w0, parent, rounds, key, cohort_size=cohort, fraction=0.3, how=validation, pool=pool, lr=LR,
    batch_size=B, steps=np.full(data.num_clients, 3), seed=SPLIT_SEED, **kw)
  siblings = [[j for j in range(data.num_clients) if parent[j] == parent[k]] for k in range(data.num_clients)]
  _check(state, theta, affinity, last, siblings)
  assert np.any(affinity != 0)   # the candidates were weighed
  mb = 4 * sum(int(np.prod(np.shape(a))) for a in jax.tree.leaves(w0))
  m = kw["num_candidates"]
  assert int(metrics["downlink_bytes"]) == m * mb + 4 * m and int(metrics["uplink_bytes"]) == mb
  assert sorted(alg.models(state)) == ["personal"]


def test_fedfomo_sends_the_copies_its_clients_sent_through_their_path(problem):
  """With a client stage (a clip here: local DP's first half) every client's update is taken against
  the copy its parent holds of it, and the parent keeps ``h_i − clip(h_i − θ_i)`` and sends those as
  candidates, while each client moves and trains its own model: the per-client loop with the same copies;
  a compressor's bytes are counted up."""
  data, _, model = problem
  c = 0.05
  kw = dict(num_candidates=2, epsilon=0.5, epsilon_decay=0.2)
  sched = LocalSchedule(batch_size=B, steps=3)
  alg = fedfomo(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=4,
                chunk_size=2, val_fraction=0.3, validation="last", pool="all",
                update_paths=UpdatePath(client=clip(c)), **kw)
  key = jax.random.key(3)
  state, metrics = _run(alg, data, 3, key)
  assert float(metrics["dp_unclipped"]) < 1.0   # the clip bites

  w0 = jax.tree.map(lambda a: a[0], jax.jit(alg.init)(jax.random.key(7)).client_state.model)
  parent = np.zeros(data.num_clients, int)
  theta, affinity, last, held = ref.fedfomo_reference(
    model, data, w0, parent, 3, key, cohort_size=4, fraction=0.3, how="last", pool="all", lr=LR,
    batch_size=B, steps=np.full(data.num_clients, 3), seed=SPLIT_SEED, transform=clipped(c), **kw)
  _check(state, theta, affinity, last, [list(range(data.num_clients))] * data.num_clients)
  for k, want in enumerate(held):   # one parent: its rows are the clients
    chex.assert_trees_all_close(ref.np64(jax.tree.map(lambda a, k=k: a[0, k], state.server_state)), want,
                                atol=3e-5, rtol=2e-4)
  _, quantized = _run(fedfomo(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched,
                              cohort_size=4, chunk_size=2,
                              update_paths=UpdatePath(client=uplink(qsgd(4))), **kw),
                      data, 1, key)
  mb = 4 * sum(int(np.prod(np.shape(a))) for a in jax.tree.leaves(w0))
  assert 0 < int(quantized["uplink_bytes"]) < mb / 3   # 4 bits an entry, a norm a leaf


def test_no_candidate_is_local_training(problem):
  """``M = 0`` with no validation example (``⌊0.01 n⌋ = 0``, examples in stored order): every client
  trains its own model on all its examples, as local training (every parameter personal) does."""
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=3), cohort_size=4)
  key = jax.random.key(8)
  alg = fedfomo(num_candidates=0, val_fraction=0.01, validation="last", **common)
  fomo, metrics = _run(alg, data, 3, key)
  alone, _ = _run(fedavg(personal=personal(".*"), **common), data, 3, key)
  # every leaf is personal: the host keeps them as a tuple in leaf order
  chex.assert_trees_all_close(jax.tree.leaves(fomo.client_state.model), list(alone.personal), atol=1e-6)
  assert int(metrics["downlink_bytes"]) == 0


def test_a_separate_validation_split_is_the_held_out_one_when_they_agree(problem):
  """Issue 57 item 9: ``validation_data`` (the data's own validation split, FLGo's ``val_data``): the
  clients weigh their candidates on it and train on all their training examples. Given exactly the
  examples ``validation="last"`` holds out, and the training data without them, the run is the
  held-out run's; shapes that do not fit are refused."""
  data, _, model = problem
  n = np.asarray(data.n_train)
  n_val = np.floor(0.3 * n.astype(np.float32)).astype(int)
  v = int(n_val.max())
  x_val = np.zeros((data.num_clients, v) + data.example_shape, np.float32)
  y_val = np.zeros((data.num_clients, v), np.int32)
  for c in range(data.num_clients):
    x_val[c, :n_val[c]] = np.asarray(data.x_train[c, n[c] - n_val[c]:n[c]])
    y_val[c, :n_val[c]] = np.asarray(data.y_train[c, n[c] - n_val[c]:n[c]])
  train_only = data.replace(n_train=data.n_train - n_val)   # the rows past n are padding
  kw = dict(model=model, local_optimizer=optax.sgd(LR), schedule=LocalSchedule(batch_size=B, steps=3),
            cohort_size=4, num_candidates=2, epsilon=0.5, epsilon_decay=0.2)
  key = jax.random.key(3)
  held, _ = _run(fedfomo(data=data, val_fraction=0.3, validation="last", **kw), data, 2, key)
  given, _ = _run(fedfomo(data=train_only, validation_data=(x_val, y_val, n_val), **kw), train_only, 2, key)
  chex.assert_trees_all_close(given.client_state, held.client_state, atol=1e-6)
  with pytest.raises(ValueError, match=r"fedfomo: validation_data has shapes x \(6, 2, 6\), y \(6, 2\), "
                                       r"n \(5,\); give one row per client \(6\)"):
    fedfomo(data=data, validation_data=(x_val[:, :2], y_val[:, :2], n_val[:5]), **kw)
  with pytest.raises(ValueError, match=r"fedfomo: validation_data's examples have shape \(3,\)"):
    fedfomo(data=data, validation_data=(x_val[..., :3], y_val, n_val), **kw)


def test_fedfomo_refusals_name_the_value(problem):
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=1))
  for kw, match in [
    (dict(num_candidates=4, cohort_size=4), r"num_candidates=4 \(M\) exceeds the 3 models a client can"),
    (dict(num_candidates=6, pool="all"), r"num_candidates=6 \(M\) exceeds the 5 models"),
    (dict(num_candidates=-1), r"num_candidates=-1 \(M\) must be an integer >= 0"),
    (dict(val_fraction=1.0), r"val_fraction=1.0 leaves no example to train on"),
    (dict(epsilon=2.0), r"epsilon=2.0 is a probability"),
    (dict(pool="best"), r"pool='best'; choose one of \('last_round', 'all'\)"),
    (dict(validation="first"), r"validation='first'; choose one of \('random', 'last'\)"),
    (dict(schedule=LocalSchedule(batch_size=B, steps=1, batch_order="cyclic")), r"batch_order='cyclic'"),
  ]:
    with pytest.raises(ValueError, match=match) as err:
      fedfomo(**{**common, **kw})
    assert "fedfomo" in str(err.value)


def test_fedfomo_from_a_config_names_the_run():
  ctx = small_context()   # 2 parents of 3 clients on the config's tree
  run = ml_collections.ConfigDict({"algorithm": "fedfomo", "num_candidates": 3, "tree": "config",
                                   "cohort_size": 3})
  with pytest.raises(ValueError, match=r"config.runs.fomo \(algorithm='fedfomo'\): fedfomo: num_candidates=3 "
                                       r"\(M\) exceeds the 2 models"):
    registry.build_algorithm("fomo", run, ctx)
