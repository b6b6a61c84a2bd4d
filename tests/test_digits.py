"""scikit-learn's digits as federated data (fedtree.datasets.digits) and its config dispatch."""

import sys

import ml_collections
import numpy as np
import pytest

from fedtree.datasets.digits import PARTITIONS, digits_arrays, sklearn_digits
from fedtree.experiment.data import consecutive_groups, load

pytest.importorskip("sklearn")


def _rows(x, y):
  """Every example as one sortable row (pixels then label)."""
  return np.concatenate([np.asarray(x).reshape(len(y), -1), np.asarray(y, np.float32)[:, None]], axis=1)


def _examples(data):
  """The real (unpadded) train and test examples of every client, as rows."""
  rows = []
  for c in range(data.num_clients):
    nt, ne = int(data.n_train[c]), int(data.n_test[c])
    rows.append(_rows(np.asarray(data.x_train)[c, :nt], np.asarray(data.y_train)[c, :nt]))
    rows.append(_rows(np.asarray(data.x_test)[c, :ne], np.asarray(data.y_test)[c, :ne]))
  return np.concatenate(rows)


def _sorted(rows):
  return rows[np.lexsort(rows.T[::-1])]


def _label_shares(data):
  """``[C, 10]`` share of every class in each client's train + test examples."""
  counts = np.zeros((data.num_clients, 10))
  for c in range(data.num_clients):
    for y, n in ((data.y_train, data.n_train), (data.y_test, data.n_test)):
      counts[c] += np.bincount(np.asarray(y)[c, : int(n[c])], minlength=10)
  return counts / counts.sum(1, keepdims=True)


def test_arrays_are_the_real_digits():
  x, y = digits_arrays()
  assert x.shape == (1797, 8, 8, 1) and x.dtype == np.float32 and y.dtype == np.int32
  assert x.min() == 0.0 and x.max() == 1.0
  assert np.bincount(y).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


@pytest.mark.parametrize("partition", PARTITIONS)
def test_every_example_in_exactly_one_client(partition):
  data = sklearn_digits(num_clients=12, partition=partition, alpha=0.3, seed=4)
  assert data.x_train.shape[0] == 12 and data.example_shape == (8, 8, 1)
  assert data.x_train.dtype == np.float32 and data.num_classes == 10
  assert int(np.sum(data.n_train) + np.sum(data.n_test)) == 1797
  assert np.all(np.asarray(data.n_train) >= 1)
  x, y = digits_arrays()
  # the multiset of (image, label) rows is the dataset's: nothing lost, nothing duplicated
  np.testing.assert_array_equal(_sorted(_examples(data)), _sorted(_rows(x, y)))


def test_deterministic_for_a_seed_and_split_per_client():
  a = sklearn_digits(num_clients=5, partition="dirichlet", alpha=0.5, test_fraction=0.25, seed=1)
  b = sklearn_digits(num_clients=5, partition="dirichlet", alpha=0.5, test_fraction=0.25, seed=1)
  for f in ("x_train", "y_train", "n_train", "x_test", "y_test", "n_test"):
    np.testing.assert_array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)))
  c = sklearn_digits(num_clients=5, partition="dirichlet", alpha=0.5, test_fraction=0.25, seed=2)
  assert not np.array_equal(np.asarray(a.n_train), np.asarray(c.n_train))
  total = np.asarray(a.n_train) + np.asarray(a.n_test)
  np.testing.assert_array_equal(np.asarray(a.n_test), np.floor(0.25 * total).astype(int))


def test_dirichlet_partition_is_label_skewed():
  iid = _label_shares(sklearn_digits(num_clients=10, partition="iid", seed=0))
  skew = _label_shares(sklearn_digits(num_clients=10, partition="dirichlet", alpha=0.1, seed=0))
  # IID: every client near 1/10 of each class; Dirichlet(0.1): a few classes dominate a client
  assert iid.max(1).mean() < 0.2 and np.all(iid.min(1) > 0.0)
  assert skew.max(1).mean() > 0.4
  assert (skew < 0.01).sum(1).mean() >= 3      # most clients lack several classes
  shards = _label_shares(sklearn_digits(num_clients=20, partition="shards", shards_per_client=2))
  assert np.all((shards > 0).sum(1) <= 4)      # 2 shards, each spanning at most 2 labels


def test_bad_partition_and_missing_sklearn_are_named(monkeypatch):
  with pytest.raises(ValueError, match=r"partition='pathological'.*'iid', 'dirichlet', 'shards'"):
    sklearn_digits(partition="pathological")
  with pytest.raises(ValueError, match="alpha=0"):
    sklearn_digits(partition="dirichlet", alpha=0.0)
  monkeypatch.setitem(sys.modules, "sklearn.datasets", None)   # import fails as when not installed
  with pytest.raises(ImportError, match=r"\.\[digits\]"):
    sklearn_digits()


def test_config_dispatch_groups_and_transform():
  cfg = ml_collections.ConfigDict(dict(name="sklearn_digits", num_clients=6, partition="iid",
                                       team_size=3, seed=0))
  data, groups, central = load(cfg)
  assert data.num_clients == 6 and central is None and groups.tolist() == [0, 0, 0, 1, 1, 1]
  cfg.team_size, cfg.num_groups = None, 3
  assert load(cfg)[1].tolist() == [0, 0, 1, 1, 2, 2]
  cfg.num_groups = None
  cfg.transform = ml_collections.ConfigDict(dict(kind="hflip", num_transformed=2, seed=1))
  flipped, flags, _ = load(cfg)
  assert flags.sum() == 2
  for c in range(6):
    want = np.asarray(data.x_train)[c][:, :, ::-1] if flags[c] else np.asarray(data.x_train)[c]
    np.testing.assert_array_equal(np.asarray(flipped.x_train)[c], want)
  assert consecutive_groups(4).tolist() == [0, 0, 0, 0]
  with pytest.raises(ValueError, match="set one of them"):
    consecutive_groups(4, team_size=2, num_groups=2)
