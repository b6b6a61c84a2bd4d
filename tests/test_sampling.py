"""fedtree.core.sampling: static-shape cohorts per parent and their chunk sizes."""

import jax
import numpy as np
import pytest

from fedtree.core.sampling import cohort_sampler


def test_cohort_sampler_static_shapes_and_membership():
  parent = np.array([0, 1, 0, 1, 1, 2, 2])
  s = cohort_sampler(parent, [1, 2, 2], chunk_size=4)
  assert s.cohort_size == 5 and s.padded_size == 8
  seen = set()
  for i in range(20):
    c = s(jax.random.key(i))
    clients, par, valid = map(np.asarray, c)
    assert clients.shape == (8,) and valid.sum() == 5
    np.testing.assert_array_equal(parent[clients[valid]], par[valid])
    for g in range(3):
      members = clients[valid & (par == g)]
      assert len(set(members.tolist())) == len(members)  # without replacement
    seen.add(tuple(clients[valid]))
  assert len(seen) > 1
  full = cohort_sampler(parent, -1)(jax.random.key(0))
  assert sorted(np.asarray(full.clients).tolist()) == list(range(7))


def test_cohort_larger_than_group_is_an_error():
  with pytest.raises(ValueError, match=r"cohort_size=3 exceeds group 0, which has 2 clients"):
    cohort_sampler(np.array([0, 0, 1, 1, 1]), 3)
  with pytest.raises(ValueError, match="must be >= 1"):
    cohort_sampler(np.array([0, 0]), 0)


def test_chunk_size_choices():
  from fedtree.core.tuning import default_chunk_size

  parent = np.zeros(10, int)
  assert cohort_sampler(parent, 10, chunk_size="auto").chunk_size == default_chunk_size(10, group_sizes=[10])
  assert cohort_sampler(parent, 10, chunk_size=None).chunk_size == 10
  with pytest.raises(ValueError, match="chunk_size='fast'; choose an int"):
    cohort_sampler(parent, 10, chunk_size="fast")
