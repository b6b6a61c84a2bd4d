"""fedtree.core.data: padded client arrays and the partitioners, against plain counts."""

import numpy as np
import pytest

from fedtree.core.data import (
  from_client_arrays,
  partition_by_id,
  partition_dirichlet,
  partition_iid,
  partition_shards,
)
from fedtree.core.topology import Topology
from fedtree.datasets.synthetic import grouped_synthetic, synthetic_alpha_beta


def test_from_client_arrays_pads_and_validates():
  rng = np.random.default_rng(0)
  train = [(rng.normal(size=(n, 3)).astype(np.float32), np.arange(n) % 2) for n in (2, 5)]
  test = [(rng.normal(size=(n, 3)).astype(np.float32), np.zeros(n, int)) for n in (1, 3)]
  d = from_client_arrays(train, test, num_classes=2)
  assert d.x_train.shape == (2, 5, 3) and d.x_test.shape == (2, 3, 3)
  np.testing.assert_array_equal(d.n_train, [2, 5])
  assert np.all(np.asarray(d.x_train)[0, 2:] == 0)
  with pytest.raises(ValueError, match="the tree has 3 clients but the data has 2"):
    d.validate(Topology.flat(3))
  with pytest.raises(ValueError, match=r"n_train\[1\]=9 is outside"):
    d.replace(n_train=np.array([2, 9])).validate()
  with pytest.raises(ValueError, match="no training examples"):
    d.replace(n_train=np.array([0, 5])).validate()


@pytest.mark.parametrize("part", ["iid", "dirichlet", "shards", "by_id"])
def test_partitioners_cover_every_example_once(part):
  rng = np.random.default_rng(1)
  labels = rng.integers(0, 5, size=300)
  if part == "iid":
    parts = partition_iid(300, 7, rng)
  elif part == "dirichlet":
    parts = partition_dirichlet(labels, 7, 0.3, rng, min_size=5)
    assert min(len(p) for p in parts) >= 5
  elif part == "shards":
    parts = partition_shards(labels, 10, 2, rng)
    assert max(len(np.unique(labels[p])) for p in parts) <= 4  # 2 shards: few labels each
  else:
    parts, ids = partition_by_id(labels)
    assert len(parts) == 5 and all(np.all(labels[p] == i) for p, i in zip(parts, ids, strict=True))
  allidx = np.sort(np.concatenate(parts))
  np.testing.assert_array_equal(allidx, np.arange(300))


def test_dirichlet_small_alpha_skews_labels():
  rng = np.random.default_rng(2)
  labels = rng.integers(0, 10, size=5000)
  skewed = partition_dirichlet(labels, 20, 0.05, rng)
  even = partition_dirichlet(labels, 20, 100.0, rng)
  ent = lambda ps: np.mean([len(np.unique(labels[p])) for p in ps])  # noqa: E731
  assert ent(skewed) < ent(even)
  with pytest.raises(ValueError, match="alpha=0"):
    partition_dirichlet(labels, 20, 0, rng)


def test_synthetic_recipes_are_deterministic_and_shaped():
  a = synthetic_alpha_beta(num_clients=5, samples_scale=1, max_examples=300, seed=1)
  b = synthetic_alpha_beta(num_clients=5, samples_scale=1, max_examples=300, seed=1)
  np.testing.assert_array_equal(a.x_train, b.x_train)
  assert a.x_train.shape[2] == 60 and a.num_classes == 10
  total = np.asarray(a.n_train) + np.asarray(a.n_test)
  assert total.min() >= 50
  # labels are the argmax of a linear model: more than one class per client in general
  assert len(np.unique(np.asarray(a.y_train)[0, : int(a.n_train[0])])) > 1
  d, g = grouped_synthetic(group_sizes=(5, 2), seed=0)
  assert d.num_clients == 7 and list(np.bincount(g)) == [5, 2]
