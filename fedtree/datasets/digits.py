"""scikit-learn's bundled handwritten digits as federated data: real images, no download.

:func:`sklearn_digits` reads :func:`sklearn.datasets.load_digits` (the UCI "optical
recognition of handwritten digits" test set: 1,797 images of 8×8 pixels with 17 grey levels,
10 classes, shipped inside scikit-learn), scales the pixels to ``[0, 1]`` (divided by 16) as
float32 images ``[8, 8, 1]``, deals the examples to clients with a partitioner of
:mod:`fedtree.core.data` (IID, Dirichlet label skew, label shards) and splits every client's
examples into train and test (:func:`fedtree.core.data.split_train_test`). Everything is
drawn from one ``seed``: the same seed gives the same clients and splits.

It is the real-data stand-in for MNIST in quick experiments (paper 003's pFedMT teams, paper
004's flipped clients through ``config.data.transform``) on machines without TFDS data.
Needs the ``digits`` extra (``pip install -e ".[digits]"``, i.e. scikit-learn).
"""

from __future__ import annotations

import numpy as np

from fedtree.core.data import (
  FederatedData,
  partition_dirichlet,
  partition_iid,
  partition_shards,
  split_train_test,
)

PARTITIONS = ("iid", "dirichlet", "shards")
NUM_CLASSES = 10


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
  """All 1,797 digits: ``(x float32 [N, 8, 8, 1] in [0, 1], y int32 [N])``.

  Raises:
    ImportError: scikit-learn is not installed (names the ``digits`` extra).
  """
  try:
    from sklearn.datasets import load_digits
  except ImportError as e:
    raise ImportError(
      "config.data.name='sklearn_digits' needs scikit-learn, which is not installed: "
      "pip install -e '.[digits]' (or pip install scikit-learn)"
    ) from e
  bunch = load_digits()
  x = (np.asarray(bunch.images, np.float32) / 16.0)[..., None]
  return x, np.asarray(bunch.target, np.int32)


def sklearn_digits(
  *,
  num_clients: int = 10,
  partition: str = "dirichlet",
  alpha: float = 0.5,
  shards_per_client: int = 2,
  min_examples: int = 4,
  test_fraction: float = 0.25,
  seed: int = 0,
) -> FederatedData:
  """The digits over ``num_clients`` clients (module docstring).

  Args:
    num_clients: number of clients (at most 1,797, one example each at least).
    partition: ``iid`` (equal shares), ``dirichlet`` (every class shared out by
      ``Dirichlet(alpha)``, redrawn until every client holds ``min_examples``) or ``shards``
      (sorted by label and cut into ``num_clients × shards_per_client`` shards, McMahan et
      al.'s pathological split).
    alpha: Dirichlet concentration (smaller: more label skew).
    shards_per_client: label shards per client.
    min_examples: the Dirichlet partition's minimum examples per client (so that every
      client keeps a test example at the usual ``test_fraction``).
    test_fraction: share of every client's examples kept as its test data (each client keeps
      at least one training example).
    seed: the partition and the train/test splits.

  Returns:
    :class:`~fedtree.core.data.FederatedData` with ``x [C, M, 8, 8, 1]`` float32 in ``[0, 1]``
    and 10 classes; every one of the 1,797 examples is in exactly one client's train or test
    split.

  Raises:
    ValueError: an unknown ``partition`` (the choices are listed) or impossible sizes.
    ImportError: scikit-learn is missing.
  """
  if partition not in PARTITIONS:
    raise ValueError(f"config.data.partition={partition!r}; choose one of {PARTITIONS}")
  x, y = digits_arrays()
  rng = np.random.default_rng(seed)
  if partition == "iid":
    parts = partition_iid(len(y), num_clients, rng)
  elif partition == "dirichlet":
    parts = partition_dirichlet(y, num_clients, alpha, rng, min_size=int(min_examples))
  else:
    parts = partition_shards(y, num_clients, int(shards_per_client), rng)
  return split_train_test(x, y, parts, test_fraction=test_fraction, rng=rng, num_classes=NUM_CLASSES)
