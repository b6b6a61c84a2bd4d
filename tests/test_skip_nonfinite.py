"""``skip_nonfinite`` in every family that aggregates client updates: a client whose data holds
a NaN is left out (weight 0, counted in ``clients_skipped``), so the run equals the same run
on the data without that client (batches in a fixed order and every client sampled, so
nothing else depends on which clients exist)."""

import jax
import numpy as np
import optax
import pytest
from helpers import close

from fedtree.algorithms.bhfl import bhfl
from fedtree.algorithms.clustering import ifca
from fedtree.algorithms.fedkws import fedkws
from fedtree.algorithms.fedmmd import fedmmd
from fedtree.algorithms.grouppfl import grouppfl
from fedtree.algorithms.pfedmt import pfedmt
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
