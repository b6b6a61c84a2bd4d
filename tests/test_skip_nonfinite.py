"""``skip_nonfinite`` in every family that aggregates client updates: a client whose data holds
a NaN is left out (weight 0, counted in ``clients_skipped``), so the run equals the same run
on the data without that client (batches in a fixed order and every client sampled, so
nothing else depends on which clients exist)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import close, poisoned_problem, tier_kw

from fedtree.algorithms.clustering import ifca
from fedtree.algorithms.hierarchical.bhfl import bhfl
from fedtree.algorithms.hierarchical.grouppfl import grouppfl
from fedtree.algorithms.hierarchical.pfedmt import pfedmt
from fedtree.algorithms.optimization.fedkws import fedkws
from fedtree.algorithms.optimization.fedmmd import fedmmd
from fedtree.core import loop
from fedtree.core.data import as_device
from fedtree.core.local import LocalSchedule
from fedtree.core.topology import Topology
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.models import build_model

BAD = 1  # the client whose data is poisoned
ROUNDS = 2


@pytest.fixture(scope="module")
def problem():
  data, groups = grouped_synthetic(group_sizes=(3, 3), dim=4, num_classes=3, mean_examples=6,
                                   min_examples=3, max_examples=8, test_examples=3, seed=1)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(4,))
  return model, as_device(data), np.asarray(groups, np.int32)


def poisoned(data, client=BAD):
  """``data`` with every training feature of ``client`` NaN."""
  return data.replace(x_train=data.x_train.at[client].set(np.nan))


def without(data, client=BAD):
  """``data`` with ``client``'s row removed from every per-client array."""
  keep = np.delete(np.arange(data.num_clients), client)
  return data.replace(**{f: getattr(data, f)[keep]
                         for f in ("x_train", "y_train", "n_train", "x_test", "y_test", "n_test")})


def check_skips(make, data, groups, models, skips_per_round=1, seed=0):
  """Runs ``make(data, groups)`` on the poisoned data (it sets ``skip_nonfinite=True``) and
  ``make(without(data), groups without the client)``; ``models(alg, state)`` (the aggregated
  models compared) must be finite and equal, and every round must count ``skips_per_round``
  skipped client updates. Returns the poisoned run's state."""
  key = jax.random.key(seed)
  rows = []
  bad = poisoned(data)
  alg = make(bad, groups)
  state = loop.run(alg, bad, num_rounds=ROUNDS, key=key, on_metrics=lambda r, m: rows.append(m))
  assert [int(m["clients_skipped"]) for m in rows] == [skips_per_round] * ROUNDS
  got = models(alg, state)
  assert all(np.isfinite(np.asarray(a)).all() for a in jax.tree.leaves(got))
  clean = without(data)
  ref_alg = make(clean, np.delete(groups, BAD))
  want = models(ref_alg, loop.run(ref_alg, clean, num_rounds=ROUNDS, key=key))
  close(got, want, tol=1e-5)
  return state


def _schedule():
  return LocalSchedule(batch_size=2, epochs=1, batch_order="fixed")


def _global(alg, state):
  return alg.models(state)["global"].params


@pytest.mark.slow  # ~15 s each: two compiled runs (the poisoned data and the data without the client)
@pytest.mark.parametrize("method", ["fedmmd", "fedkws"])
def test_objective_wrappers_skip_a_nonfinite_client(problem, method):
  """FedMMD and FedKWS-UI (ALO) take HierFAVG's ``skip_nonfinite`` through ``with_objective``."""
  model, data, groups = problem

  def make(d, _):
    kw = dict(model=model, data=d, local_optimizer=optax.sgd(0.1), schedule=_schedule(),
              skip_nonfinite=True)
    if method == "fedmmd":
      return fedmmd(lam=0.01, **kw)
    return fedkws(alt=False, **kw)

  check_skips(make, data, groups, _global)


@pytest.mark.slow  # ~20 s: two compiled runs (the poisoned data and the data without the client)
def test_bhfl_skips_a_nonfinite_client(problem):
  """B-HFL: the skipped client sends nothing (one server over the clients: with a deeper tree
  its examples would still weigh its edge at the root, as for an unsampled client)."""
  model, data, groups = problem

  def make(d, _):
    return bhfl(model=model, topology=Topology.flat(d.num_clients), data=d, local_optimizer=optax.sgd(0.1),
                schedule=_schedule(), down_optimizers=optax.sgd(0.5), skip_nonfinite=True)

  check_skips(make, data, groups, lambda alg, s: alg.models(s)["root"].params)


@pytest.mark.slow  # ~25 s: two compiled runs (the poisoned data and the data without the client)
def test_clustered_family_skips_a_nonfinite_client(problem):
  """IFCA: the skipped client has no weight in any cluster's mean."""
  model, data, groups = problem

  def make(d, _):
    return ifca(model=model, data=d, local_optimizer=optax.sgd(0.1), schedule=_schedule(), num_clusters=2,
                skip_nonfinite=True)

  def clusters(alg, state):
    return alg.models(state)["cluster"].params

  check_skips(make, data, groups, clusters)


@pytest.mark.slow  # ~7 s: two compiled runs (the poisoned data and the data without the client)
def test_pfedmt_skips_a_nonfinite_device(problem):
  """pFedMT: the skipped device has no weight in its team's δ at any team iteration (τ
  uniform here: by examples or devices it would count the device, fixed by the data)."""
  model, data, groups = problem

  def make(d, g):
    return pfedmt(model=model, topology=Topology.from_labels(g), data=d,
                  schedule=LocalSchedule(batch_size=2, steps=2, batch_order="fixed"), team_iters=2,
                  team_weighting="uniform", skip_nonfinite=True)

  check_skips(make, data, groups, lambda alg, s: {k: alg.models(s)[k].params for k in ("global", "team")},
              skips_per_round=2)   # one per team iteration


@pytest.mark.slow  # ~25 s: two compiled runs (the poisoned data and the data without the client)
def test_grouppfl_skips_a_nonfinite_client(problem):
  """GroupPerFL: both stages (global FedAdam, then per-group FedAdam) skip the client."""
  model, data, groups = problem

  def make(d, g):
    return grouppfl(model=model, data=d, groups=g, local_optimizer=optax.sgd(0.1), schedule=_schedule(),
                    global_rounds=1, group_rounds=1, stages=("global", "group"), skip_nonfinite=True)

  check_skips(make, data, groups, lambda alg, s: {k: alg.models(s)[k].params for k in ("FL", "GroupFL")})


# ------------------------------------------------------------------------ the tier and the loop
def test_skip_nonfinite_gives_a_bad_client_weight_zero():
  """train_cohort(skip_nonfinite=True) on data where client 1 is NaN = the weighted mean of
  the other clients' deltas from a clean run (clients are keyed by index, so they match)."""
  import optax

  from fedtree.core.algorithm import local_training
  from fedtree.core.local import LocalSchedule
  from fedtree.core.sampling import cohort_sampler

  model, data, bad = poisoned_problem()
  sched = LocalSchedule(batch_size=2, epochs=1)
  update = local_training(None, model, optax.sgd(0.1), sched, data)
  theta = jax.tree.map(lambda p: p[None], model.init(jax.random.key(0)))
  cohort = cohort_sampler(np.zeros(data.num_clients, np.int32), None)(jax.random.key(1))
  kw = dict(num_steps=sched.num_steps(data.n_train), weights=data.n_train.astype(jnp.float32),
            key=jax.random.key(2), chunk_size=2)
  clean = tier_kw(update, theta, cohort, data, keep_client_params=True, **kw)
  skipped = tier_kw(update, theta, cohort, bad, skip_nonfinite=True, **kw)
  assert int(skipped.num_skipped) == 1 and int(skipped.num_trained) == data.num_clients - 1
  slot = {int(c): i for i, c in enumerate(np.asarray(cohort.clients))}
  w = np.asarray(data.n_train, np.float64)
  w[1] = 0.0
  expect = jax.tree.map(
    lambda t, cp: sum(w[c] * (np.asarray(t[0]) - np.asarray(cp[slot[c]])) for c in range(len(w)))
    / w.sum(), theta, clean.client_params)
  for a, b in zip(jax.tree.leaves(skipped.pseudo_gradient()), jax.tree.leaves(expect), strict=True):
    np.testing.assert_allclose(np.asarray(a)[0], b, atol=1e-6)
  unskipped = tier_kw(update, theta, cohort, bad, **kw)
  assert not all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(unskipped.pseudo_gradient()))


def test_fedavg_skip_nonfinite_counts_skipped_clients_and_stays_finite():
  import optax

  from fedtree.algorithms import fedavg
  from fedtree.core.local import LocalSchedule

  model, _, bad = poisoned_problem()
  kw = dict(model=model, data=bad, local_optimizer=optax.sgd(0.1),
            schedule=LocalSchedule(batch_size=2, epochs=1))
  rows = []
  state = loop.run(fedavg(skip_nonfinite=True, **kw), bad, num_rounds=2, key=jax.random.key(0),
                   on_metrics=lambda r, m: rows.append(m))
  assert [m["clients_skipped"] for m in rows] == [1, 1]
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.params))
  with pytest.raises(loop.NonFiniteLossError, match="diverged at round 1"):
    loop.run(fedavg(**kw), bad, num_rounds=2, key=jax.random.key(0))
