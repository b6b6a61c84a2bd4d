"""Sources converted to a :class:`~fedtree.population.store.ClientStore` client by client.

The sources too large to load whole are read one client at a time, so memory stays flat whatever
the population: TensorFlow Federated's h5 files (:func:`convert_tff_h5`: EMNIST, Shakespeare,
StackOverflow; a first pass counts the vocabulary of the text kinds) and FLAIR in pfl-research's
HDF5 layout (:func:`convert_flair`). Every other source fedtree reads (``.npz`` arrays, LEAF JSON,
Hugging Face / Flower partitions, TFDS, TFF CIFAR-100) is loaded by its loader and written with
:func:`fedtree.population.store.write_federated_data`; ``python -m fedtree.convert`` picks the path.
The rows stored are bitwise those of the resident loader (:func:`fedtree.datasets.tff_h5.load_tff_h5`
for TFF), client for client.
"""

from __future__ import annotations

import collections
import json
from typing import Any

import numpy as np

from fedtree.datasets import tff_h5
from fedtree.datasets.text import vocabulary_from_counts
from fedtree.population.store import ClientStore, Feature, StoreWriter, write_federated_data

STREAMED_TFF = ("emnist", "shakespeare", "stackoverflow")
"""TFF kinds converted client by client (CIFAR-100's 50,000 images and its central test set are
loaded whole, as :func:`fedtree.datasets.tff_h5.load_tff_h5` reads them)."""


def _bar(total: int, desc: str, progress: bool):
  import tqdm

  return tqdm.tqdm(total=total, desc=desc, unit="client", disable=not progress, mininterval=1.0)


def convert_tff_h5(path: str, *, train_path: str, test_path: str, kind: str, seq_len: int = 80,
                   vocab_size: int = 10_000, num_classes: int | None = None, max_clients: int | None = None,
                   max_examples_per_client: int | None = None, crop: int | None = None,
                   normalize: str | None = None, source: dict[str, Any] | None = None,
                   overwrite: bool = False, progress: bool = True) -> ClientStore:
  """A TFF h5 train/test pair (``examples/<client id>/<feature>``) as a store.

  Args:
    path: the store's folder.
    train_path: TFF's ``*_train.h5``.
    test_path: TFF's ``*_test.h5``.
    kind: one of :data:`fedtree.datasets.tff_h5.KINDS`.
    seq_len: tokens per example of the text kinds.
    vocab_size: the text kinds' vocabulary, the 4 special tokens included.
    num_classes: default: EMNIST's largest label + 1, CIFAR-100's 100, the vocabulary's size.
    max_clients: the first clients only (sorted ids).
    max_examples_per_client: every client's first training examples only.
    crop: CIFAR-100's central crop.
    normalize: CIFAR-100's ``"per_image"`` standardization.
    source: what the manifest records as the source (default: these options, ``name="tff_h5"``).
    overwrite: replace an existing store.
    progress: progress bars (tqdm).

  Returns:
    The store: the clients of :func:`fedtree.datasets.tff_h5.load_tff_h5`, in its order, with the
    same rows, ``groups`` zeros, ``vocab`` for the text kinds.

  Raises:
    ValueError: what :func:`~fedtree.datasets.tff_h5.load_tff_h5` refuses (an unknown kind, a missing
      or broken file, an empty client, test ids missing from the training file), before the store
      is written.
  """
  options = dict(train_path=train_path, test_path=test_path, kind=kind, seq_len=seq_len,
                 vocab_size=vocab_size, num_classes=num_classes, max_clients=max_clients,
                 max_examples_per_client=max_examples_per_client, crop=crop, normalize=normalize)
  source = dict(name="tff_h5", **options) if source is None else source
  tff_h5.check_options(kind, crop=crop, normalize=normalize, max_examples_per_client=max_examples_per_client)
  tff_h5.check_prepared(kind, train_path, test_path)
  if kind not in STREAMED_TFF:
    data, groups, extras = tff_h5.load_tff_h5(**options)
    return write_federated_data(path, data, source=source, groups=groups,
                                central=(extras["central_x"], extras["central_y"]),
                                client_names=[str(c) for c in extras["clients"]], overwrite=overwrite,
                                progress=progress)
  feats = tff_h5.FEATURES[kind]
  with tff_h5.open_h5(train_path) as train, tff_h5.open_h5(test_path) as test:
    ids = sorted(train["examples"].keys())
    if max_clients is not None:
      ids = ids[: int(max_clients)]
    if not ids:
      raise ValueError(f"{train_path!r} has no client")
    extra = sorted(set(test["examples"].keys()) - set(ids))
    if extra and max_clients is None:
      raise ValueError(f"{len(extra)} test clients are not in {train_path!r}, e.g. {extra[:3]}")
    cap = None if max_examples_per_client is None else int(max_examples_per_client)

    def client(f, path_, cid):
      g = f["examples"][cid]
      missing = [k for k in feats if k not in g]
      if missing:
        raise ValueError(f"{path_!r}: client {cid!r} lacks feature(s) {missing}; has {sorted(g.keys())}")
      return {k: g[k][()] for k in feats}

    def train_client(cid):
      d = client(train, train_path, cid)
      if len(d[feats[0]]) == 0:
        raise ValueError(f"{train_path!r}: client {cid!r} has no example (empty client)")
      return d if cap is None else {k: v[:cap] for k, v in d.items()}

    vocab, index = None, None
    if kind != "emnist":   # first pass: the vocabulary of the training file
      counts: collections.Counter = collections.Counter()
      with _bar(len(ids), "vocabulary", progress) as bar:
        for cid in ids:
          tff_h5.count_tokens(kind, train_client(cid), counts)
          bar.update()
      level = "char" if kind == "shakespeare" else "word"
      vocab = vocabulary_from_counts(counts, vocab_size=vocab_size, level=level)
      index = vocab.index()
      del counts
    x_feature = Feature((28, 28, 1), "float32") if kind == "emnist" else Feature((seq_len,), "int32")
    y_feature = Feature((), "int32") if kind == "emnist" else Feature((seq_len,), "int32")
    test_ids = set(test["examples"].keys())
    with StoreWriter(path, x=x_feature, y=y_feature, source=source, overwrite=overwrite) as w:
      with _bar(len(ids), "clients", progress) as bar:
        for cid in ids:
          tr = tff_h5.client_examples(kind, train_client(cid), seq_len=seq_len, vocab=vocab, index=index)
          d = client(test, test_path, cid) if cid in test_ids else None
          te = tff_h5.client_examples(kind, d, seq_len=seq_len, vocab=vocab, index=index)
          w.add(tr, te, name=cid)
          bar.update()
      extras = {} if vocab is None else {"vocab": np.asarray(vocab.tokens)}
      k = num_classes or (int(w.label_range[1]) + 1 if kind == "emnist" else vocab.size)
      return w.finish(num_classes=int(k), groups=np.zeros(len(ids), np.int32), extras=extras)


FLAIR_LABELS = ("coarse", "fine")
FLAIR_PARTITIONS = ("train", "val", "test")


def convert_flair(path: str, *, h5_path: str, labels: str = "coarse", central: str | None = "test",
                  max_clients: int | None = None, source: dict[str, Any] | None = None,
                  overwrite: bool = False, progress: bool = True) -> ClientStore:
  """FLAIR (Song et al. 2022) in pfl-research's HDF5 layout as a store.

  pfl-research's ``benchmarks/dataset/flair/prepare_dataset.py`` writes one group per user under its
  partition, ``/<train|val|test>/<user id>/`` with ``images`` (``uint8[n, H, W, 3]``), ``labels_row`` /
  ``labels_col`` (the coarse labels as the row (image) and column (label) of every 1 of a multi-hot
  matrix), ``fine_grained_labels_row`` / ``_col`` likewise, and ``image_ids``; and
  ``/metadata/label_mapping``, ``/metadata/fine_grained_label_mapping`` (JSON ``{label: index}``).
  Every user is in one partition, so the clients are the users of ``train`` (sorted ids) with no test
  rows of their own, and the users of ``central`` are the central test set (each a client of that
  split). Inputs stay ``uint8`` images (a model scales them); labels are multi-hot ``uint8[K]``
  (``label_kind="multi_hot"``: 17 coarse labels, or the fine-grained ones).

  Args:
    path: the store's folder.
    h5_path: pfl-research's FLAIR ``.hdf5`` file.
    labels: ``"coarse"`` or ``"fine"``.
    central: the partition kept as the central test set (``"test"``, ``"val"``), or ``None``.
    max_clients: the first training users only.
    source: what the manifest records (default: these options, ``name="flair"``).
    overwrite: replace an existing store.
    progress: a progress bar.

  Raises:
    ValueError: a missing file, a file without ``/train`` or ``/metadata``, a user without images
      or without a label array, an unknown ``labels`` or ``central``.
  """
  if labels not in FLAIR_LABELS:
    raise ValueError(f"FLAIR labels={labels!r}; choose one of {FLAIR_LABELS}")
  if central is not None and central not in FLAIR_PARTITIONS[1:]:
    raise ValueError(f"FLAIR central={central!r}; choose one of {FLAIR_PARTITIONS[1:]} or None")
  source = dict(name="flair", path=h5_path, labels=labels, central=central, max_clients=max_clients) \
    if source is None else source
  prefix = "labels" if labels == "coarse" else "fine_grained_labels"
  with tff_h5.open_h5(h5_path, tff=False) as f:
    mapping_key = "label_mapping" if labels == "coarse" else "fine_grained_label_mapping"
    if "train" not in f or "metadata" not in f or mapping_key not in f["metadata"]:
      raise ValueError(f"{h5_path!r} is not FLAIR in pfl-research's layout: it needs /train/<user>/images "
                       f"and /metadata/{mapping_key}; it has {sorted(f.keys())}")
    k = len(json.loads(_text(f["metadata"][mapping_key][()])))
    users = sorted(f["train"].keys())[: None if max_clients is None else int(max_clients)]
    if not users:
      raise ValueError(f"{h5_path!r}: /train has no user")

    def user(part, uid):
      g = f[part][uid]
      missing = [n for n in ("images", f"{prefix}_row", f"{prefix}_col") if n not in g]
      if missing:
        raise ValueError(f"{h5_path!r}: user /{part}/{uid} lacks {missing}; has {sorted(g.keys())}")
      images = np.asarray(g["images"][()])
      y = np.zeros((len(images), k), np.uint8)
      y[np.asarray(g[f"{prefix}_row"][()], np.int64), np.asarray(g[f"{prefix}_col"][()], np.int64)] = 1
      return images, y

    if "images" not in f["train"][users[0]]:
      user("train", users[0])   # names what is missing
    shape = tuple(int(d) for d in f["train"][users[0]]["images"].shape[1:])
    with StoreWriter(path, x=Feature(shape, "uint8"), y=Feature((k,), "uint8"), source=source,
                     overwrite=overwrite) as w:
      with _bar(len(users), "FLAIR users", progress) as bar:
        for uid in users:
          w.add(user("train", uid), name=uid)
          bar.update()
      if central is not None and central in f:
        for uid in sorted(f[central].keys()):
          w.add_central(*user(central, uid), name=uid)
      return w.finish(num_classes=k, label_kind="multi_hot")


def _text(v) -> str:
  if isinstance(v, bytes):
    return v.decode("utf-8")
  if isinstance(v, np.ndarray):
    return _text(v.item())
  return str(v)
