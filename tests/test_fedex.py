"""FedEx (Khodak et al. 2021): the vectorized rounds against a per-client loop written from the authors'
exponentiated-gradient step (flat and on a tree of two parents), one scale as FedAvg, and refusals."""

import jax
import numpy as np
import optax
import pytest
import reference_baselines as ref

from fedtree.algorithms import fedex
from fedtree.core.local import LocalSchedule
from fedtree.core.personal import personal
from fedtree.core.topology import Topology

LR, B, STEPS = 0.1, 4, 3
SCALES = (0.25, 1.0, 4.0)


@pytest.fixture(scope="module")
def problem():
  return ref.small_problem()


@pytest.mark.parametrize("tree,discount", [("flat", 0.0),
                                           pytest.param("groups", 0.5, marks=pytest.mark.slow)])
def test_fedex_matches_the_authors_step_per_client(problem, tree, discount):
  data, groups, model = problem
  c = data.num_clients
  topology = Topology.flat(c) if tree == "flat" else Topology.from_labels(groups)   # root -> 3 edges
  tree_kw = {} if tree == "flat" else {"periods": (1_000_000,)}   # (each edge its own θ and model)
  cohort = 4 if tree == "flat" else 2
  alg = fedex(model=model, data=data, local_optimizer=optax.sgd(LR),
              schedule=LocalSchedule(batch_size=B, steps=STEPS), cohort_size=cohort, chunk_size=2,
              topology=topology,
              lr_scales=SCALES, val_fraction=0.3, baseline_discount=discount, **tree_kw)
  key = jax.random.key(5)
  state, metrics = ref.run_jit(alg, data, 3, key)
  parent = np.zeros(c, np.int64) if tree == "flat" else np.asarray(topology.parent(2))
  models, log_theta = ref.fedex_rounds(
    model, data, ref.start(alg), parent, 3, key, cohort_size=cohort,
    weights=np.asarray(data.n_train, np.float64),
    steps=[STEPS] * c, lr=LR, batch_size=B, scales=SCALES, val_fraction=0.3, discount=discount)
  for p, m in enumerate(models):
    ref.close(ref.row(state.params[-1], p), m)
    np.testing.assert_allclose(np.asarray(state.server_state["log_theta"][p], np.float64), log_theta[p],
                               atol=2e-4, rtol=2e-4)
  assert not np.allclose(log_theta[0], -np.log(3))   # θ moved


def test_theta_moves_to_the_learning_rate_that_lowers_the_validation_loss(problem):
  """Of a learning rate 1000 times too small and a useful one, θ prefers the useful one within a few
  rounds, and the round reports its entropy falling from log 2."""
  data, _, model = problem
  alg = fedex(model=model, data=data, local_optimizer=optax.sgd(LR), cohort_size=6,
              schedule=LocalSchedule(batch_size=B, steps=STEPS), lr_scales=(0.001, 1.0), val_fraction=0.3)
  state, metrics = ref.run_jit(alg, data, 6, jax.random.key(2))
  theta = np.exp(np.asarray(state.server_state["log_theta"][0], np.float64))
  assert theta[1] > 0.8, theta
  assert float(metrics["fedex_entropy"]) < np.log(2) and float(metrics["fedex_mode_scale"]) == 1.0


@pytest.mark.parametrize("kw,match", [
  (dict(lr_scales=()), "lr_scales=()"),
  (dict(lr_scales=(1.0, -2.0)), "positive multiples"),
  (dict(val_fraction=1.0), "val_fraction=1.0"),
  (dict(baseline_discount=2.0), "baseline_discount=2.0"),
  (dict(mu=-1.0), "mu=-1.0"),
])
def test_bad_hyperparameters_are_refused_by_name(problem, kw, match):
  data, _, model = problem
  with pytest.raises(ValueError, match=match):
    fedex(model=model, data=data, local_optimizer=optax.sgd(LR),
          schedule=LocalSchedule(batch_size=B, steps=1),
          **kw)


def test_personal_parameters_are_refused(problem):
  data, _, model = problem
  with pytest.raises(ValueError, match="personal parameters"):
    fedex(model=model, data=data, local_optimizer=optax.sgd(LR),
          schedule=LocalSchedule(batch_size=B, steps=1),
          personal=personal(["Dense_1"]))
