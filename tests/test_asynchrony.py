"""Simulated latencies and buffered asynchronous aggregation (B-HFL's
fedtree.algorithms.hierarchical.bhfl.asynchrony)."""

import jax
import numpy as np
import optax
import pytest

from fedtree.algorithms.hierarchical.bhfl.asynchrony import (
  Latency,
  first_arrivals,
  latency_from_config,
  segment_rank,
)
from fedtree.core.aggregation import staleness_weight


def _rank_reference(key, eligible, segment):
  rank = np.zeros(len(key), np.int64)
  for i in range(len(key)):
    if not eligible[i]:
      continue
    rank[i] = sum(1 for j in range(len(key)) if segment[j] == segment[i] and eligible[j]
                  and (key[j], j) < (key[i], i))
  return rank


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_segment_rank_matches_loop(seed):
  rng = np.random.default_rng(seed)
  n, s = 23, 4
  segment = np.sort(rng.integers(0, s, n))
  segment[:s] = np.arange(s)
  segment = np.sort(segment)
  key = rng.integers(0, 5, n).astype(np.float32)      # many ties: broken by index
  eligible = rng.random(n) < 0.7
  got = np.asarray(segment_rank(key, eligible, segment, s))
  want = _rank_reference(key, eligible, segment)
  np.testing.assert_array_equal(got[eligible], want[eligible])
  for b in (1, 2, 3):
    sel = np.asarray(first_arrivals(key, eligible, segment, s, b))
    np.testing.assert_array_equal(sel, eligible & (want < b))
  all_sel = np.asarray(first_arrivals(key, eligible, segment, s, None))
  np.testing.assert_array_equal(all_sel, eligible)


def test_staleness_weight():
  s = np.array([0, 1, 3])
  np.testing.assert_allclose(staleness_weight(s, 0.5), (1.0 + s) ** -0.5, rtol=1e-6)
  np.testing.assert_array_equal(staleness_weight(s, 0.0), np.ones(3))


def test_latency_distributions():
  key = jax.random.key(0)
  n = 20000
  assert np.all(np.asarray(Latency().sample(key, 5)) == 0)
  assert Latency().is_zero and not Latency("exponential").is_zero
  np.testing.assert_allclose(Latency("constant", mean=0.3).sample(key, 3), 0.3)
  e = np.asarray(Latency("exponential", mean=0.7).sample(key, n))
  assert abs(e.mean() - 0.7) < 0.03 and e.min() >= 0
  ln = np.asarray(Latency("lognormal", mean=0.5, sigma=0.5).sample(key, n))
  assert abs(ln.mean() - 0.5) < 0.02 and ln.min() > 0
  u = np.asarray(Latency("uniform", low=0.2, high=0.9).sample(key, n))
  assert u.min() >= 0.2 and u.max() < 0.9
  sc = np.asarray(Latency("constant", mean=1.0, scale=(1.0, 2.0, 0.0)).sample(key, 3))
  np.testing.assert_allclose(sc, [1.0, 2.0, 0.0])
  # deterministic for a key, different across keys
  lat = Latency("exponential", mean=1.0)
  np.testing.assert_array_equal(lat.sample(key, 7), lat.sample(key, 7))
  assert not np.array_equal(lat.sample(key, 7), lat.sample(jax.random.key(1), 7))
  want = Latency("uniform", high=2.0)
  assert latency_from_config(dict(kind="uniform", low=0.0, high=2.0)) == want
  assert latency_from_config("exponential").kind == "exponential"
  with pytest.raises(ValueError, match="latency kind"):
    Latency("pareto")
  with pytest.raises(ValueError, match="low"):
    Latency("uniform", low=1.0, high=0.5)


def _async_run(seed):
  from test_bhfl import _setup

  from fedtree.algorithms.hierarchical.bhfl.bhfl import bhfl
  from fedtree.core.local import LocalSchedule
  from fedtree.core.loop import run

  topo, data, model = _setup()
  alg = bhfl(model=model, topology=topo, data=data, local_optimizer=optax.sgd(0.1),
             schedule=LocalSchedule(batch_size=3),
             cohort_size=(2, 1, 1), down_optimizers=optax.sgd(0.5), buffer_sizes=(1, 1, 1),
             latencies=(Latency("uniform", high=1.5), Latency("exponential", mean=0.5),
                        Latency("lognormal", mean=0.6)),
             staleness_exponent=0.5)
  return run(alg, data, num_rounds=6, key=jax.random.key(seed), rounds_per_call=3)


def test_async_bhfl_is_deterministic_for_a_seed():
  a, b, c = _async_run(0), _async_run(0), _async_run(1)
  same = jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), a, b)
  assert all(jax.tree.leaves(same))
  assert not np.array_equal(np.asarray(a.pending[2].arrival), np.asarray(c.pending[2].arrival))
  diff = jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), a.params[0], c.params[0])
  assert not all(jax.tree.leaves(diff))
