"""``skip_nonfinite`` in every family that aggregates client updates: a client whose data holds
a NaN is left out (weight 0, counted in ``clients_skipped``), so the run equals the same run
on the data without that client (batches in a fixed order and every client sampled, so
nothing else depends on which clients exist)."""

import jax
import numpy as np
import optax
import pytest
from helpers import close

from fedtree.algorithms.fedkws import fedkws
from fedtree.algorithms.fedmmd import fedmmd
from fedtree.core import loop
from fedtree.core.data import as_device
from fedtree.core.local import LocalSchedule
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


def check_skips(make, data, models, seed=0):
  """Runs ``make(data)`` on the poisoned data with ``skip_nonfinite=True`` and
  ``make(without(data))``; ``models(alg, state)`` (the aggregated models compared) must be
  finite and equal, and every round must count one skipped client."""
  key = jax.random.key(seed)
  rows = []
  bad = poisoned(data)
  alg = make(bad)
  state = loop.run(alg, bad, num_rounds=ROUNDS, key=key, on_metrics=lambda r, m: rows.append(m))
  assert [int(m["clients_skipped"]) for m in rows] == [1] * ROUNDS
  got = models(alg, state)
  assert all(np.isfinite(np.asarray(a)).all() for a in jax.tree.leaves(got))
  clean = without(data)
  ref_alg = make(clean)
  want = models(ref_alg, loop.run(ref_alg, clean, num_rounds=ROUNDS, key=key))
  close(got, want, tol=1e-5)
  return rows


def _schedule():
  return LocalSchedule(batch_size=2, epochs=1, batch_order="fixed")


def _global(alg, state):
  return alg.models(state)["global"].params


@pytest.mark.slow  # ~15 s each: two compiles of an MMD / ALO round
@pytest.mark.parametrize("method", ["fedmmd", "fedkws"])
def test_objective_wrappers_skip_a_nonfinite_client(problem, method):
  """FedMMD and FedKWS-UI (ALO) take HierFAVG's ``skip_nonfinite`` through ``with_objective``."""
  model, data, _ = problem

  def make(d):
    kw = dict(model=model, data=d, local_optimizer=optax.sgd(0.1), schedule=_schedule(),
              skip_nonfinite=True)
    if method == "fedmmd":
      return fedmmd(lam=0.01, **kw)
    return fedkws(alt=False, **kw)

  check_skips(make, data, _global)
