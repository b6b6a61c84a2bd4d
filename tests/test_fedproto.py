"""FedProto: the vectorized rounds against a per-client loop written from the paper (both prototype
weightings, flat and on a tree, where prototypes are averaged within a parent), λ = 0 as local
training, prototypes (not models) in the byte columns, and the refusals."""

import chex
import jax
import ml_collections
import numpy as np
import optax
import pytest
import reference_pairwise as ref
from helpers import small_context

from fedtree.algorithms import fedavg, fedproto
from fedtree.core.data import as_device
from fedtree.core.local import LocalSchedule
from fedtree.core.personal import personal
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.experiment import registry
from fedtree.models import build_model
from fedtree.toolbox.privacy import clip

LR, B, H = 0.1, 4, 5


@pytest.fixture(scope="module")
def problem():
  data, groups = grouped_synthetic(group_sizes=(3, 3), dim=6, num_classes=3, mean_examples=9,
                                   min_examples=4, max_examples=12, test_examples=5, seed=2)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(H,))
  return as_device(data), groups, model


def _run(alg, data, rounds, key):
  state = jax.jit(alg.init)(jax.random.key(7))
  step = jax.jit(alg.round)
  for r in range(rounds):
    state, metrics = step(state, data, jax.random.fold_in(key, r))
  return state, metrics


def _models(alg, state):
  return alg.models(state)["personal"].params


@pytest.mark.parametrize("weighting,tree", [
  ("examples", False), pytest.param("uniform", True, marks=pytest.mark.slow)])
def test_fedproto_matches_the_per_client_loop(problem, weighting, tree):
  data, groups, model = problem
  topo = Topology.from_labels(groups) if tree else None
  parent = np.asarray(topo.parent(2)) if tree else np.zeros(data.num_clients, int)
  cohort = 2 if tree else 4
  alg = fedproto(model=model, data=data, topology=topo, local_optimizer=optax.sgd(LR), lam=2.0,
                 weighting=weighting, schedule=LocalSchedule(batch_size=B, steps=3), cohort_size=cohort,
                 chunk_size=2)
  key = jax.random.key(4)
  state, metrics = _run(alg, data, 3, key)
  w0 = jax.tree.map(lambda a: a[0], _models(alg, jax.jit(alg.init)(jax.random.key(7))))
  w, protos = ref.fedproto_reference(data, w0, parent, 3, key, cohort_size=cohort, lam=2.0,
                                     weighting=weighting, lr=LR, batch_size=B,
                                     steps=np.full(data.num_clients, 3), num_classes=3)
  got = _models(alg, state)
  for k, want in enumerate(w):
    chex.assert_trees_all_close(ref.np64(jax.tree.map(lambda a, k=k: a[k], got)), want, atol=3e-5,
                                rtol=2e-4)
  for p, (c, present) in protos.items():
    np.testing.assert_array_equal(np.asarray(state.server_state[1][p]), present)
    np.testing.assert_allclose(np.asarray(state.server_state[0][p]), c, atol=3e-5, rtol=2e-4)
  # prototypes, never models: K x d sums and K counts up, K x d prototypes and K flags down
  assert int(metrics["uplink_bytes"]) == 4 * (3 * H + 3) and int(metrics["downlink_bytes"]) == 4 * 3 * H + 3


def test_no_prototype_term_is_local_training(problem):
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=3), cohort_size=4)
  key = jax.random.key(6)
  proto_state, _ = _run(fedproto(lam=0.0, **common), data, 3, key)
  alone, _ = _run(fedavg(personal=personal(".*"), **common), data, 3, key)
  chex.assert_trees_all_close(list(proto_state.personal), list(alone.personal), atol=1e-6)


def test_fedproto_refusals_name_the_value(problem):
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=1))
  for kw, match in [
    (dict(lam=-1.0), r"lam=-1.0 must be a finite number >= 0"),
    (dict(weighting="size"), r"weighting='size'; choose one of \('examples', 'uniform'\)"),
    (dict(update_paths=UpdatePath(client=clip(1.0))), r"update paths .* act on a model delta"),
  ]:
    with pytest.raises(ValueError, match=match) as err:
      fedproto(**{**common, **kw})
    assert "fedproto" in str(err.value)
  bn = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(H,), norm="batch")
  with pytest.raises(ValueError, match=r"fedproto: the model keeps state \['batch_stats'\]"):
    fedproto(**{**common, "model": bn})
  ctx = small_context()
  with pytest.raises(ValueError, match=r"config.runs.proto \(algorithm='fedproto'\): fedproto: lam=-0.5"):
    registry.build_algorithm("proto", ml_collections.ConfigDict({"algorithm": "fedproto", "lam": -0.5}), ctx)
