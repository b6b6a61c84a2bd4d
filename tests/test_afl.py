"""AFL: the vectorized rounds against a per-client loop written from Mohri et al. 2019 (FedJAX's
agnostic_fed_avg; projected and exponentiated steps, clients or groups as domains, on a tree), the
simplex projection against bisection, the reductions to FedAvg, the bytes, and bad input."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
import reference_baselines as ref
from helpers import small_context

from fedtree.algorithms import afl, fedavg
from fedtree.algorithms.optimization.afl import project_simplex
from fedtree.core.data import as_device
from fedtree.core.local import LocalSchedule
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.experiment import registry
from fedtree.models import build_model
from fedtree.toolbox import privacy as dp
from fedtree.toolbox.robust import median

LR, B = 0.1, 4


@pytest.fixture(scope="module")
def problem():
  data, groups = grouped_synthetic(group_sizes=(3, 2, 4), dim=6, num_classes=3, mean_examples=9,
                                   min_examples=3, max_examples=14, test_examples=5, seed=3)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,))
  return as_device(data), np.asarray(groups), model


def _run(alg, data, rounds, key):
  state, metrics = alg.init(jax.random.key(7)), None
  step = jax.jit(alg.round)
  for r in range(rounds):
    state, metrics = step(state, data, jax.random.fold_in(key, r))
  return state, metrics


def _slots(sampler, rk):
  drawn = sampler(stream(rk, "cohort"))
  return [(int(k), int(p)) for k, p, v in zip(np.asarray(drawn.clients), np.asarray(drawn.parent),
                                              np.asarray(drawn.valid), strict=True) if v]


@pytest.mark.parametrize("step,by_group", [("projected", False),
                                           pytest.param("exponentiated", True, marks=pytest.mark.slow)])
def test_afl_matches_the_per_client_loop(problem, step, by_group):
  data, groups, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)
  gamma = 0.5
  alg = afl(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=4,
            chunk_size=2, domain_learning_rate=gamma, domain_step=step,
            domains=tuple(groups) if by_group else None)
  key = jax.random.key(11)
  state, _ = _run(alg, data, 3, key)
  domain = groups if by_group else np.arange(data.num_clients)
  lam = np.full(len(set(domain.tolist())), 1.0 / len(set(domain.tolist())))
  x = jax.tree.map(lambda p: p[0], alg.init(jax.random.key(7)).params[0])
  steps = sched.num_steps(np.asarray(data.n_train))
  sampler = cohort_sampler(np.zeros(data.num_clients, int), 4)
  for r in range(3):
    rk = jax.random.fold_in(key, r)
    cohort = [k for k, _ in _slots(sampler, rk)]
    keys = [jax.random.fold_in(stream(rk, "train"), k) for k in cohort]
    new, lam = ref.afl_round(model, x, lam, domain, data, cohort, keys, lr=LR, batch_size=B, steps=steps,
                             gamma=gamma, step=step)
    x = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), new)
  ref.close(jax.tree.map(lambda p: p[0], state.params[0]), x)
  np.testing.assert_allclose(np.asarray(state.server_state[0]), lam, atol=2e-6)
  assert lam.max() > 1.0 / len(lam) + 0.01   # the weights moved


@pytest.mark.slow   # (the flat reference test is its fast sibling)
def test_afl_on_a_tree_keeps_a_mixture_per_edge(problem):
  """One round (the root waits, periods=(2,)): every edge runs AFL over its own clients; λ is
  [edges, the largest edge's clients], zero past each edge's clients."""
  data, groups, model = problem
  topo = Topology.from_labels(groups)
  alg = afl(model=model, data=data, topology=topo, local_optimizer=optax.sgd(LR),
            schedule=LocalSchedule(batch_size=B, steps=2), cohort_size=2, periods=(2,),
            domain_learning_rate=1.0)
  key = jax.random.key(4)
  state, _ = _run(alg, data, 1, key)
  lam = np.asarray(state.server_state)
  parent = topo.parent(2)
  sizes = np.bincount(parent)
  assert lam.shape == (3, sizes.max())
  rk = jax.random.fold_in(key, 0)
  slots = _slots(cohort_sampler(parent, 2), rk)
  for g in range(3):
    members = np.flatnonzero(parent == g)
    domain = np.full(data.num_clients, -1)
    domain[members] = np.arange(len(members))
    cohort = [k for k, p in slots if p == g]
    x0 = ref.start(alg)
    keys = [jax.random.fold_in(stream(rk, "train"), k) for k in cohort]
    lam0 = np.full(len(members), 1.0 / len(members))
    new, lam_g = ref.afl_round(model, x0, lam0, domain, data, cohort, keys, lr=LR, batch_size=B,
                               steps=np.full(data.num_clients, 2), gamma=1.0)
    ref.close(jax.tree.map(lambda p, g=g: p[g], state.params[1]), new)
    np.testing.assert_allclose(lam[g, :len(members)], lam_g, atol=2e-6)
    assert np.all(lam[g, len(members):] == 0)


def test_projection_onto_the_simplex_matches_bisection():
  rng = np.random.default_rng(0)
  v = rng.normal(size=(6, 7)) * 2
  mask = rng.random((6, 7)) < 0.7
  mask[:, 0] = True
  got = np.asarray(project_simplex(jnp.asarray(v), jnp.asarray(mask)))
  for i in range(6):
    want = np.zeros(7)
    want[mask[i]] = ref.simplex_projection(v[i][mask[i]])
    np.testing.assert_allclose(got[i], want, atol=1e-6)


@pytest.mark.parametrize("init,weighting", [("uniform", "uniform"),
                                            pytest.param("examples", "examples", marks=pytest.mark.slow)])
def test_afl_without_a_step_is_fedavg(problem, init, weighting):
  """Fixed λ: uniform over the clients is FedAvg with uniform weights; λ by examples is FedAvg's
  example weights."""
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=3), cohort_size=4)
  key = jax.random.key(2)
  a, _ = _run(afl(domain_learning_rate=0.0, init_weights=init, **common), data, 3, key)
  b, _ = _run(fedavg(weighting=weighting, **common), data, 3, key)
  ref.close(a.params[0], b.params[0], atol=2e-6)


def test_afl_sends_a_model_and_two_floats(problem):
  data, _, model = problem
  alg = afl(model=model, data=data, local_optimizer=optax.sgd(LR),
            schedule=LocalSchedule(batch_size=B, steps=1), cohort_size=3)
  _, metrics = _run(alg, data, 1, jax.random.key(0))
  size = sum(int(np.prod(np.shape(p))) * 4 for p in jax.tree.leaves(model.init(jax.random.key(0))))
  assert float(metrics["uplink_bytes"]) == size + 8
  assert float(metrics["downlink_bytes"]) == size


def test_afl_refusals(problem):
  data, groups, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=1))
  with pytest.raises(ValueError, match=r"afl: domain_learning_rate=-0.1 must be a finite number >= 0"):
    afl(domain_learning_rate=-0.1, **common)
  with pytest.raises(ValueError, match=r"domain_step='mirror'; choose one of \('projected', 'exponentiated'"):
    afl(domain_step="mirror", **common)
  with pytest.raises(ValueError, match=r"init_weights='random'; choose one of"):
    afl(init_weights="random", **common)
  with pytest.raises(ValueError, match=r"afl: domains has 3 entries for 9 clients"):
    afl(domains=(0, 1, 0), **common)
  with pytest.raises(ValueError, match=r"afl: privacy stage 'dp_local_noise' at the clients' tier"):
    afl(update_paths=UpdatePath(client=dp.local_noise(1.0, 1.0)), weighting="uniform", **common)
  with pytest.raises(ValueError, match=r"afl: a robust \(blockwise\) aggregator"):
    afl(update_paths=UpdatePath(aggregator=median()), cohort_size=4, **common)
  ctx = small_context()
  run = ml_collections.ConfigDict({"algorithm": "afl", "domains": "groups"})
  kw = registry.factory_kwargs("a", run, ctx)
  assert kw["domains"] == tuple(int(g) for g in ctx.groups)
  assert registry.factory_kwargs("a", ml_collections.ConfigDict({"algorithm": "afl"}), ctx)["domains"] is None
  with pytest.raises(ValueError, match=r"config.runs.a \(algorithm='afl'\): domains='labels'; choose "
                                       r"'clients', 'groups' or one integer per client"):
    registry.factory_kwargs("a", ml_collections.ConfigDict({"algorithm": "afl", "domains": "labels"}), ctx)
  with pytest.raises(ValueError, match=r"config.runs.a \(algorithm='afl'\): afl: domain_step='eg'"):
    registry.build_algorithm("a", ml_collections.ConfigDict({"algorithm": "afl", "domain_step": "eg"}), ctx)
