"""FedAMP and HeurFedAMP: the vectorized rounds against a per-client loop written from the paper (flat
and on a tree, where a client is paired only with its parent's clients), uniform attention as
FedAvg's mixing, the pairwise weights against numpy, the bytes, and the refusals."""

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
import reference_pairwise as ref
from helpers import clipped, small_context

from fedtree.algorithms import fedamp, fedavg
from fedtree.algorithms.personalized.fedamp import attention_weights
from fedtree.core.data import as_device
from fedtree.core.local import LocalSchedule
from fedtree.core.personal import personal
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.experiment import registry
from fedtree.models import build_model
from fedtree.toolbox.privacy import central, clip

LR, B = 0.1, 4


@pytest.fixture(scope="module")
def problem():
  data, groups = grouped_synthetic(group_sizes=(3, 2, 4), dim=6, num_classes=3, mean_examples=9,
                                   min_examples=3, max_examples=14, test_examples=5, seed=3)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,))
  return as_device(data), groups, model


def _run(alg, data, rounds, key):
  state = jax.jit(alg.init)(jax.random.key(7))
  step = jax.jit(alg.round)
  for r in range(rounds):
    state, metrics = step(state, data, jax.random.fold_in(key, r))
  return state, metrics


def _same_models(stacked, reference):
  for k, want in enumerate(reference):
    got = ref.np64(jax.tree.map(lambda a, k=k: a[k], stacked))
    chex.assert_trees_all_close(got, want, atol=3e-5, rtol=2e-4)


def _start(alg):
  return jax.tree.map(lambda a: a[0], jax.jit(alg.init)(jax.random.key(7)).client_state)


@pytest.mark.parametrize("attention,start,alpha,sigma,rounds", [
  ("distance", "own", 0.2, 2.0, 2),
  pytest.param("cosine", "cloud", 1.0, 5.0, 3, marks=pytest.mark.slow),
])
def test_fedamp_matches_the_per_client_loop(problem, attention, start, alpha, sigma, rounds):
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)   # unequal step counts
  kw = dict(attention=attention, alpha=alpha, lam=0.5, sigma=sigma, self_attention=0.4, start=start)
  alg = fedamp(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=4,
               chunk_size=2, **kw)
  key = jax.random.key(11)
  state, metrics = _run(alg, data, rounds, key)
  steps = sched.num_steps(np.asarray(data.n_train))
  w = ref.fedamp_reference(model, data, _start(alg), np.zeros(data.num_clients, int), rounds, key,
                           cohort_size=4, lr=LR, batch_size=B, steps=steps, **kw)
  _same_models(state.client_state, w)
  assert "uplink_bytes" not in metrics   # one model each way: the host's count (cloud model down, w_i up)


def test_fedamp_pairs_what_its_clients_sent_through_their_path(problem):
  """With a client stage (a clip here: local DP's first half) every client sends ``u_i − clip(u_i − w_i)``,
  its update against the cloud model it received; the server keeps that copy of each client and pairs
  the copies, while every client keeps its own model: the per-client loop with the same server copies."""
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)
  c = 0.05
  kw = dict(attention="distance", alpha=0.2, lam=0.5, sigma=2.0, self_attention=0.4, start="own")
  alg = fedamp(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=4,
               chunk_size=2, update_paths=UpdatePath(client=clip(c)), **kw)
  key = jax.random.key(11)
  state, metrics = _run(alg, data, 3, key)
  assert float(metrics["dp_unclipped"]) < 1.0   # the clip bites

  w, held = ref.fedamp_reference(model, data, _start(alg), np.zeros(data.num_clients, int), 3, key,
                                 cohort_size=4, lr=LR, batch_size=B,
                                 steps=sched.num_steps(np.asarray(data.n_train)), transform=clipped(c), **kw)
  _same_models(state.client_state, w)
  _same_models(jax.tree.map(lambda a: a[0], state.server_state), held)   # one parent: rows = clients
  pairs = zip(jax.tree.leaves(state.server_state), jax.tree.leaves(state.client_state), strict=True)
  gap = max(float(jnp.max(jnp.abs(a[0] - b))) for a, b in pairs)
  assert gap > 1e-3   # the server pairs the clipped copies, not the clients' own models


@pytest.mark.slow
def test_fedamp_on_a_tree_pairs_a_parents_clients_only(problem):
  data, groups, model = problem
  topo = Topology.from_labels(groups)   # 3 parents of 3, 2 and 4 clients
  sched = LocalSchedule(batch_size=B, steps=3)
  kw = dict(attention="distance", alpha=0.1, lam=1.0, sigma=3.0, self_attention=0.5, start="own")
  alg = fedamp(model=model, data=data, topology=topo, local_optimizer=optax.sgd(LR), schedule=sched,
               cohort_size=2, **kw)
  key = jax.random.key(5)
  state, _ = _run(alg, data, 3, key)
  w = ref.fedamp_reference(model, data, _start(alg), np.asarray(topo.parent(2)), 3, key, cohort_size=2, lr=LR,
                           batch_size=B, steps=np.full(data.num_clients, 3), **kw)
  _same_models(state.client_state, w)
  assert sorted(alg.models(state)) == ["personal"]


def test_uniform_attention_without_the_proximal_term_is_fedavg(problem):
  """``ξ_ij = 1/n``, ``λ = 0``, starting from the cloud model: every client starts from the cohort's mean
  model, FedAvg's (uniform weights, every client every round); their mean is FedAvg's global model."""
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=3))
  amp = fedamp(attention="uniform", lam=0.0, start="cloud", **common)
  avg = fedavg(weighting="uniform", **common)
  key = jax.random.key(2)
  a, _ = _run(amp, data, 3, key)
  b, _ = _run(avg, data, 3, key)
  mean = jax.tree.map(lambda w: jnp.mean(w, axis=0), a.client_state)
  chex.assert_trees_all_close(mean, jax.tree.map(lambda g: g[0], b.params[0]), atol=2e-6)


def test_attention_weights_against_numpy():
  rng = np.random.default_rng(0)
  models = [{"w": rng.normal(size=(3, 2)), "b": rng.normal(size=(2,))} for _ in range(4)]
  valid = np.array([[True, True, True, False]])
  blocks = jax.tree.map(lambda *a: jnp.asarray(np.stack(a)[None], jnp.float32), *models)
  for attention, kw in [("distance", dict(alpha=0.3, sigma=20.0)), ("cosine", dict(alpha=1.0, sigma=2.0))]:
    got = np.asarray(attention_weights(blocks, jnp.asarray(valid), attention=attention, self_attention=0.3,
                                       **kw))[0]
    want = ref.fedamp_weights(models[:3], attention=attention, self_attention=0.3, **kw)
    np.testing.assert_allclose(got[:3, :3], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[:, 3], 0.0)   # an invalid slot takes no part
    np.testing.assert_allclose(got[:3].sum(axis=1), 1.0, rtol=1e-6)


def test_fedamp_refusals_name_the_value(problem):
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=1))
  for kw, match in [
    (dict(attention="softmax"), r"attention='softmax'; choose one of \('distance', 'cosine', 'uniform'\)"),
    (dict(sigma=0.0), r"sigma=0.0 must be a finite number > 0"),
    (dict(alpha=-1.0), r"alpha=-1.0 must be a finite number > 0"),
    (dict(self_attention=1.5), r"self_attention=1.5 is HeurFedAMP's ξ_ii, a weight in \[0, 1\]"),
    (dict(start="global"), r"start='global'; choose one of \('own', 'cloud'\)"),
    (dict(cohort_size=1), r"as few as 1 client a round \(cohort_size\)"),
    (dict(update_paths=UpdatePath(node=central(0.5, 1.0))), r"node transform 'dp' .* never their sum"),
    (dict(personal=personal("Dense_1")), r"personal parameters are not supported"),
  ]:
    with pytest.raises(ValueError, match=match) as err:
      fedamp(**common, **kw)
    assert "fedamp" in str(err.value)
  bn = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,), norm="batch")
  with pytest.raises(ValueError, match=r"fedamp: the model keeps state \['batch_stats'\]"):
    fedamp(**{**common, "model": bn})


def test_fedamp_from_a_config_names_the_run():
  ctx = small_context()
  with pytest.raises(ValueError, match=r"config.runs.amp \(algorithm='fedamp'\): fedamp: sigma=-2.0"):
    registry.build_algorithm("amp", ml_collections.ConfigDict({"algorithm": "fedamp", "sigma": -2.0}), ctx)
