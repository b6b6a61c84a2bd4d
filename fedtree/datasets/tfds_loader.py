"""Real datasets through TensorFlow Datasets' ``data_source`` (ArrayRecord, no TensorFlow).

:func:`load_tfds` reads a TFDS dataset's train split, partitions it into clients (IID,
Dirichlet label skew, label shards, or by a natural id feature such as the writer), splits
every client's examples into train and test, and keeps the dataset's test split as the
*central* test set (B-HFL evaluates the root on it). Images become float32 in ``[0, 1]``.

Datasets must already be prepared in ``data_dir``, in TFDS's random-access ArrayRecord format
(``tfds build mnist --data_dir=DIR --file_format=array_record`` on a machine with internet:
:func:`prepare_command`); nothing is downloaded at run time (``download=False``), and a dataset
that is not there is refused naming the dataset, the folder searched and that command. Tests run
this code under ``tfds.testing.mock_data``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedtree.core.data import (
  FederatedData,
  partition_by_id,
  partition_dirichlet,
  partition_dirichlet_balanced,
  partition_iid,
  partition_shards,
  split_train_test,
)

PARTITIONS = ("iid", "dirichlet", "dirichlet_balanced", "shards", "by_id")
NORMALIZE = (None, "per_channel", "per_image")


def prepare_command(name: str, data_dir: str | None) -> str:
  """The command that prepares TFDS dataset ``name`` in ``data_dir`` for :func:`load_tfds` (its
  random-access ArrayRecord format), run once where internet is available."""
  where = f" --data_dir={data_dir}" if data_dir else ""
  return f"tfds build {name}{where} --file_format=array_record"


def searched_dir(name: str, data_dir: str | None) -> str:
  """Where TFDS looks for ``name``: ``data_dir``, else TFDS's default (``$TFDS_DATA_DIR`` or
  ``~/tensorflow_datasets``), with the dataset's folder when TFDS knows the dataset."""
  import tensorflow_datasets as tfds

  root = data_dir or tfds.core.constants.get_default_data_dir()
  try:
    return str(tfds.builder(name, data_dir=root).data_dir)
  except Exception:  # noqa: BLE001 - an unknown name: the root alone
    return str(root)


def _read_split(name: str, split: str, data_dir: str | None, keys: tuple[str, ...], limit: int | None):
  import tensorflow_datasets as tfds

  try:   # never downloads: a dataset is prepared once, beforehand (prepare_command)
    source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except Exception as e:  # noqa: BLE001 - re-raised with what to do
    raise FileNotFoundError(
      f"TFDS dataset {name!r} (split {split!r}) is not prepared in "
      f"{'config.data.data_dir=' + repr(data_dir) if data_dir else 'the default TFDS data_dir'} "
      f"(searched {searched_dir(name, data_dir)}); nothing is downloaded at run time. Prepare it "
      f"once where internet is available: `{prepare_command(name, data_dir)}`"
      f"{'' if data_dir else ' (or with --data_dir=DIR, then --config.data.data_dir=DIR)'}. "
      f"TFDS said: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    ) from e
  n = len(source) if limit is None else min(int(limit), len(source))
  cols: dict[str, list] = {k: [] for k in keys}
  for i in range(n):
    ex = source[i]
    for k in keys:
      if k not in ex:
        raise KeyError(f"TFDS dataset {name!r} has no feature {k!r}; it has {sorted(ex)}")
      cols[k].append(np.asarray(ex[k]))
  return {k: np.stack(v) for k, v in cols.items()}


def _to_float(x: np.ndarray) -> np.ndarray:
  if x.dtype == np.uint8:
    return (x.astype(np.float32) / 255.0)
  return x.astype(np.float32)


def load_tfds(
  *,
  name: str = "mnist",
  num_clients: int = 100,
  partition: str = "dirichlet",
  alpha: float = 0.5,
  shards_per_client: int = 2,
  id_feature: str | None = None,
  image_key: str = "image",
  label_key: str = "label",
  train_split: str = "train",
  test_split: str | None = "test",
  test_fraction: float = 0.2,
  team_size: int | None = None,
  num_groups: int | None = None,
  max_examples: int | None = None,
  examples_per_client: int | None = None,
  normalize: str | None = None,
  data_dir: str | None = None,
  seed: int = 0,
) -> tuple[FederatedData, np.ndarray, Any]:
  """A federated version of a TFDS classification dataset.

  Args:
    name: TFDS name (``mnist``, ``emnist/byclass``, ``cifar10``, ``fashion_mnist``, ...).
    num_clients: number of clients (ignored by ``partition="by_id"``).
    partition: ``iid``, ``dirichlet`` (``alpha``: every class's examples shared among the
      clients by ``Dirichlet(alpha)``), ``dirichlet_balanced`` (``alpha``: every client draws
      ``examples_per_client`` examples from its class mix ``Dirichlet(alpha p)``,
      :func:`fedtree.core.data.partition_dirichlet_balanced`), ``shards``
      (``shards_per_client``) or ``by_id`` (one client per value of ``id_feature``).
    examples_per_client: ``dirichlet_balanced``'s client size (default: the examples divided by
      the clients).
    normalize: ``None`` (images in ``[0, 1]``), ``"per_channel"`` (minus the training images'
      mean and divided by their standard deviation, per channel; applied to every split) or
      ``"per_image"`` (each image standardized on its own, TensorFlow's
      ``per_image_standardization``).
    test_fraction: share of each client's examples held out as its test data.
    team_size: groups of this many consecutive clients (pFedMT's teams); or
    num_groups: that many groups of consecutive clients; default one group.
    max_examples: read at most this many training examples (quick experiments).
    data_dir: where the prepared dataset lives (TFDS default if ``None``).
    seed: partition and split randomness.

  Returns:
    ``(data, group labels [C], central test (x, y) or None)``.
  """
  if partition not in PARTITIONS:
    raise ValueError(f"config.data.partition={partition!r}; choose one of {PARTITIONS}")
  if normalize not in NORMALIZE:
    raise ValueError(f"config.data.normalize={normalize!r}; choose one of {NORMALIZE}")
  if partition == "by_id" and not id_feature:
    raise ValueError("partition='by_id' needs config.data.id_feature (e.g. 'speaker_id')")
  keys = (image_key, label_key) + ((id_feature,) if partition == "by_id" else ())
  train = _read_split(name, train_split, data_dir, keys, max_examples)
  x, y = _to_float(train[image_key]), train[label_key].astype(np.int32)
  stats = (x.mean(axis=tuple(range(x.ndim - 1))), x.std(axis=tuple(range(x.ndim - 1)))) \
    if normalize == "per_channel" else None
  x = _normalize(x, normalize, stats)
  rng = np.random.default_rng(seed)
  if partition == "iid":
    parts = partition_iid(len(y), num_clients, rng)
  elif partition == "dirichlet":
    parts = partition_dirichlet(y, num_clients, alpha, rng, min_size=2)
  elif partition == "dirichlet_balanced":
    parts = partition_dirichlet_balanced(y, num_clients, alpha, rng, examples_per_client=examples_per_client)
  elif partition == "shards":
    parts = partition_shards(y, num_clients, shards_per_client, rng)
  else:
    parts, _ = partition_by_id(train[id_feature])
  num_classes = _num_classes(name, label_key, data_dir, y)
  data = split_train_test(x, y, parts, test_fraction=test_fraction, rng=rng, num_classes=num_classes)
  c = data.num_clients
  if team_size:
    groups = np.arange(c) // int(team_size)
  elif num_groups:
    if not 1 <= int(num_groups) <= c:
      raise ValueError(f"num_groups={num_groups} must be in [1, {c}] (the number of clients)")
    groups = np.arange(c) * int(num_groups) // c
  else:
    groups = np.zeros(c, np.int64)
  central = None
  if test_split:
    test = _read_split(name, test_split, data_dir, (image_key, label_key), None)
    central = (_normalize(_to_float(test[image_key]), normalize, stats), test[label_key].astype(np.int32))
  return data, groups.astype(np.int32), central


def _normalize(x: np.ndarray, how: str | None, stats) -> np.ndarray:
  if how == "per_channel":
    mean, std = stats
    return ((x - mean) / np.maximum(std, 1e-12)).astype(np.float32)
  if how == "per_image":
    from fedtree.datasets.tff_h5 import per_image_standardization

    return per_image_standardization(x)
  return x


def _num_classes(name: str, label_key: str, data_dir: str | None, y: np.ndarray) -> int:
  try:
    import tensorflow_datasets as tfds

    return int(tfds.builder(name, data_dir=data_dir).info.features[label_key].num_classes)
  except Exception:  # noqa: BLE001 - fall back to the labels seen
    return int(y.max()) + 1
