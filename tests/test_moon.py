"""MOON: the vectorized rounds against a per-client loop written from Li et al. 2021 (Algorithm 1,
both first-previous options), its reduction to FedAvg at μ = 0, BatchNorm models, and bad input."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
import reference_baselines as ref
from helpers import small_context

from fedtree.algorithms import fedavg, moon
from fedtree.core.data import as_device
from fedtree.core.local import LocalSchedule
from fedtree.core.model import from_flax
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.experiment import registry
from fedtree.models import build_model

LR, B = 0.1, 4


@pytest.fixture(scope="module")
def problem():
  data, _ = grouped_synthetic(group_sizes=(3, 2, 4), dim=6, num_classes=3, mean_examples=9, min_examples=3,
                              max_examples=14, test_examples=5, seed=3)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,))
  return as_device(data), model


@pytest.mark.parametrize("first_previous", ["received", pytest.param("initial", marks=pytest.mark.slow)])
def test_moon_matches_the_per_client_loop(problem, first_previous):
  data, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)   # unequal step counts
  mu, tau = 2.0, 0.5
  alg = moon(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=4,
             chunk_size=2, mu=mu, temperature=tau, first_previous=first_previous)
  key = jax.random.key(11)
  state, _ = ref.run_jit(alg, data, 3, key)
  x = jax.tree.map(lambda p: p[0], alg.init(jax.random.key(7)).params[0])
  x0 = x
  steps = sched.num_steps(np.asarray(data.n_train))
  n = np.asarray(data.n_train, np.float64)
  prev, trained = [x0] * data.num_clients, [False] * data.num_clients
  sampler = cohort_sampler(np.zeros(data.num_clients, int), 4)
  for r in range(3):
    rk = jax.random.fold_in(key, r)
    drawn = sampler(stream(rk, "cohort"))
    cohort = [int(k) for k, v in zip(drawn.clients, drawn.valid, strict=True) if v]
    ys = {}
    for k in cohort:
      previous = prev[k] if trained[k] or first_previous == "initial" else x
      ys[k] = ref.moon_client(x, previous, data, k, steps[k], jax.random.fold_in(stream(rk, "train"), k),
                              lr=LR, batch_size=B, mu=mu, tau=tau)
    total = sum(n[k] for k in cohort)

    def mean(*ws, cohort=cohort, total=total):
      weighted = sum(n[k] * np.asarray(w, np.float64) for k, w in zip(cohort, ws, strict=True))
      return jnp.asarray(weighted / total, jnp.float32)

    x = jax.tree.map(mean, *[ys[k] for k in cohort])
    for k in cohort:
      prev[k], trained[k] = ys[k], True
  ref.close(jax.tree.map(lambda p: p[0], state.params[0]), x)
  previous, seen = state.client_state
  assert np.asarray(seen).tolist() == trained
  for k in range(data.num_clients):
    if trained[k]:
      ref.close(jax.tree.map(lambda p, k=k: p[k], previous), prev[k])


def test_mu_zero_is_fedavg(problem):
  data, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=3), cohort_size=4)
  key = jax.random.key(2)
  a, _ = ref.run_jit(moon(mu=0.0, **common), data, 3, key)
  b, _ = ref.run_jit(fedavg(**common), data, 3, key)
  ref.close(a.params[0], b.params[0], atol=1e-6)


@pytest.mark.slow   # (test_mu_zero_is_fedavg is its fast sibling)
def test_moon_keeps_batchnorm_statistics(problem):
  """A BatchNorm model trains under MOON (its statistics from the step's forward pass), and at
  μ = 0 it is FedAvg's BatchNorm run."""
  data, _ = problem
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,), norm="batch")
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=2), cohort_size=4)
  key = jax.random.key(5)
  a, _ = ref.run_jit(moon(mu=0.0, **common), data, 2, key)
  b, _ = ref.run_jit(fedavg(**common), data, 2, key)
  ref.close(a.params[0], b.params[0], atol=1e-6)
  c, _ = ref.run_jit(moon(mu=1.0, **common), data, 2, key)
  start = jax.tree.map(lambda p: p[0], moon(mu=1.0, **common).init(jax.random.key(7)).params[0])
  moved = jax.tree.map(lambda s, p: float(jnp.max(jnp.abs(s - p[0]))), start["batch_stats"],
                       c.params[0]["batch_stats"])
  assert max(jax.tree.leaves(moved)) > 0
  assert all(np.all(np.isfinite(np.asarray(v))) for v in jax.tree.leaves(c.params))


class _NotDense(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    return nn.Dense(3)(x.reshape((x.shape[0], -1))) * 1.0   # logits are not a Dense's output


def test_moon_refusals(problem):
  data, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=1))
  with pytest.raises(ValueError, match=r"moon: mu=-1.0 must be a finite number >= 0"):
    moon(mu=-1.0, **common)
  with pytest.raises(ValueError, match=r"moon: temperature=0.0 must be a finite number > 0"):
    moon(temperature=0.0, **common)
  with pytest.raises(ValueError, match=r"first_previous='last'; choose one of \('received', 'initial'\)"):
    moon(first_previous="last", **common)
  odd = from_flax(_NotDense(), data.example_shape, 3)
  with pytest.raises(ValueError, match=r"moon needs features: the model's logits must be the output of"):
    moon(**{**common, "model": odd})
  ctx = small_context()
  with pytest.raises(ValueError, match=r"config.runs.m \(algorithm='moon'\): moon: temperature=-0.5 must be"):
    registry.build_algorithm("m", ml_collections.ConfigDict({"algorithm": "moon", "temperature": -0.5}), ctx)
