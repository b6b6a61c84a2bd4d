"""Issue 49, the cohort reader: the blocks of the cohorts to come, in order, read ahead by Grain's
prefetch; its LRU cache by client id bounded in bytes; the consumer's waits; its refusals. And the
evaluation plans (a seeded sample per evaluation, per group, or every client in chunks)."""

import threading
import time

import numpy as np
import pytest

pytest.importorskip("grain")
pytest.importorskip("datasets")

from fedtree.datasets.synthetic import synthetic_alpha_beta  # noqa: E402
from fedtree.population import every_client, sample_clients  # noqa: E402
from fedtree.population.reader import CohortReader, cohort_bytes  # noqa: E402
from fedtree.population.store import write_federated_data  # noqa: E402


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  data = synthetic_alpha_beta(num_clients=40, dim=4, seed=2)
  return data, write_federated_data(str(tmp_path_factory.mktemp("s") / "store"), data, source={"name": "s"})


def cohorts(rounds=12, k=5, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.choice(40, k, replace=False) for _ in range(rounds)]


@pytest.mark.parametrize("depth,cache", [(0, 0), (1, 0), (3, 0), (2, "one cohort"), (2, "all")])
def test_blocks_come_in_order_and_equal_direct_reads(store, depth, cache):
  data, s = store
  plan = cohorts()
  cache_bytes = {0: 0, "one cohort": cohort_bytes(s, 5), "all": 10 ** 9}[cache]
  with CohortReader(s, plan, depth=depth, cache_bytes=cache_bytes, start=2) as reader:
    blocks = list(reader)
  assert len(blocks) == len(plan) - 2
  for ids, block in zip(plan[2:], blocks, strict=True):
    sub = data.take(ids)
    np.testing.assert_array_equal(block.x, sub.x_train)
    np.testing.assert_array_equal(block.y, sub.y_train)
    np.testing.assert_array_equal(block.n, sub.n_train)
  stats = reader.stats
  assert stats.cohorts == len(plan) - 2 and 0 <= stats.stall_fraction <= 1
  if cache == "all":   # every client is read from the store once
    assert stats.cache_misses == len(np.unique(np.concatenate(plan[2:])))
    assert stats.cache_hits == 5 * (len(plan) - 2) - stats.cache_misses


def test_reads_run_ahead_of_the_consumer(store):
  """With depth 3, after the first block the next three are read while the consumer works: the
  reads of blocks it has not asked for have started (Grain's prefetch threads)."""
  _, s = store
  started = []
  lock = threading.Lock()

  class Watched(list):
    def __getitem__(self, i):
      with lock:
        started.append(i)
      return list.__getitem__(self, i)

  with CohortReader(s, Watched(cohorts()), depth=3) as reader:
    next(reader)
    deadline = time.time() + 20
    while time.time() < deadline and len(started) < 4:
      time.sleep(0.01)
    assert {0, 1, 2, 3} <= set(started)
  with CohortReader(s, Watched(cohorts()), depth=0) as reader:   # synchronous: nothing ahead
    started.clear()
    next(reader)
    time.sleep(0.2)
    assert started == [0]


def test_the_waits_and_the_work_are_accounted(store):
  """Lower bounds only (a sleep lasts at least its time): a consumer asking for blocks read when
  asked waits at least the reads; the time between its requests is its work."""
  _, s = store
  plan = cohorts(rounds=6)

  def slow_read(block):
    time.sleep(0.05)
    return block

  with CohortReader(s, plan, depth=0, transfer=slow_read) as reader:
    for _ in reader:
      pass
  assert reader.stats.wait_s >= 6 * 0.05 and reader.stats.stall_fraction > 0
  with CohortReader(s, plan, depth=2, transfer=slow_read) as reader:
    for _ in reader:
      time.sleep(0.1)    # the round
  assert reader.stats.busy_s >= 6 * 0.1 and reader.stats.cohorts == 6


def test_refusals(store):
  _, s = store
  need = cohort_bytes(s, 5)
  assert need == int(np.sort(s.counts())[-5:].sum()) * s.example_bytes()
  message = (f"cache_bytes={need - 1} is smaller than one cohort: 5 clients hold up to {need} bytes "
             "of train rows")
  with pytest.raises(ValueError, match=message):
    CohortReader(s, cohorts(), cache_bytes=need - 1)
  with pytest.raises(ValueError, match="depth=-1 must be >= 0"):
    CohortReader(s, cohorts(), depth=-1)
  with pytest.raises(ValueError, match="start=13 is outside the 12 rounds"):
    CohortReader(s, cohorts(), start=13)
  bad = cohorts(rounds=3)
  bad[1] = np.array([3, 40])
  with CohortReader(s, bad, depth=2) as reader:
    next(reader)
    with pytest.raises(ValueError, match="client id 40 is outside store"):
      next(reader)


def test_the_cache_stays_within_its_bytes(store):
  _, s = store
  budget = cohort_bytes(s, 5)
  with CohortReader(s, cohorts(rounds=20), depth=1, cache_bytes=budget) as reader:
    for _ in reader:
      assert reader._cache.bytes <= budget


# ------------------------------------------------------------------------ evaluation plans
def test_a_client_two_threads_want_at_once_is_read_once():
  """The read-ahead threads can miss the same client together (CI saw 32 misses for 31 clients):
  the second waits for the first's read, and a failed read reaches both and is not cached."""
  from fedtree.population.reader import _LRU

  lru, started, release, reads = _LRU(10 ** 6), threading.Event(), threading.Event(), []

  def read(key):
    reads.append(key)
    started.set()
    release.wait(5)
    return np.zeros(3), np.ones(3)

  got = []
  first = threading.Thread(target=lambda: got.append(lru.get_or_read(7, read)))
  first.start()
  started.wait(5)
  second = threading.Thread(target=lambda: got.append(lru.get_or_read(7, read)))
  second.start()
  time.sleep(0.05)   # the second thread is now waiting on the first's read
  release.set()
  first.join(5), second.join(5)
  assert reads == [7] and len(got) == 2 and got[0] is got[1]
  assert (lru.misses, lru.hits) == (1, 1)

  def fail(key):
    raise OSError(f"client {key} unreadable")

  with pytest.raises(OSError, match="client 8"):
    lru.get_or_read(8, fail)
  assert lru.get_or_read(8, read)[1].sum() == 3   # the failure was not cached


def test_a_seeded_sample_is_uniform_and_reproducible():
  plan = sample_clients(size=20, num_clients=100, seed=3, chunk_size=8)
  assert plan.name == "a seeded sample of 20 of 100 clients per evaluation (seed 3)" and plan.num_scored == 20
  draws = [np.concatenate(plan.chunks(e)) for e in range(2000)]
  assert all(len(d) == 20 and len(np.unique(d)) == 20 for d in draws[:50])
  assert [len(c) for c in plan.chunks(0)] == [8, 8, 4]
  again = sample_clients(size=20, num_clients=100, seed=3)
  np.testing.assert_array_equal(draws[7], np.concatenate(again.chunks(7)))
  assert not np.array_equal(draws[0], draws[1])
  # every client is drawn with probability 0.2: 2,000 draws give 400 +- 4.5 standard deviations
  freq = np.bincount(np.concatenate(draws), minlength=100)
  sd = np.sqrt(2000 * 0.2 * 0.8)
  assert np.all(np.abs(freq - 400) < 4.5 * sd), (freq.min(), freq.max())


def test_a_sample_per_group_takes_small_groups_whole():
  groups = np.array([0] * 30 + [1] * 3 + [2] * 12)
  rng = np.random.default_rng(0)
  groups = groups[rng.permutation(groups.size)]
  plan = sample_clients(size=5, groups=groups, seed=1)
  assert plan.num_scored == 13 and "per group of 3 groups" in plan.name
  draws = [np.concatenate(plan.chunks(e)) for e in range(1500)]
  for d in draws[:20]:
    assert np.bincount(groups[d], minlength=3).tolist() == [5, 3, 5] and len(np.unique(d)) == 13
  freq = np.bincount(np.concatenate(draws), minlength=groups.size)
  for g, share in ((0, 5 / 30), (2, 5 / 12)):
    members = np.flatnonzero(groups == g)
    sd = np.sqrt(1500 * share * (1 - share))
    assert np.all(np.abs(freq[members] - 1500 * share) < 4.5 * sd)
  assert np.all(freq[groups == 1] == 1500)


def test_every_client_in_chunks_and_the_plans_refusals():
  plan = every_client(10, chunk_size=4)
  assert plan.name == "every client (10) in chunks of 4" and plan.num_scored == 10
  np.testing.assert_array_equal(np.concatenate(plan.chunks(3)), np.arange(10))
  with pytest.raises(ValueError, match="size=11 exceeds the 10 clients"):
    sample_clients(size=11, num_clients=10)
  with pytest.raises(ValueError, match="give num_clients .* or groups"):
    sample_clients(size=1)
  with pytest.raises(ValueError, match="size=0 must be >= 1"):
    sample_clients(size=0, num_clients=3)
  with pytest.raises(ValueError, match="chunk_size=0 must be >= 1"):
    every_client(3, chunk_size=0)
  with pytest.raises(ValueError, match="chunk_size=None"):
    every_client(3, chunk_size=None)
  with pytest.raises(ValueError, match="groups must be a non-empty 1-D integer array"):
    sample_clients(size=1, groups=np.zeros((2, 2), int))
