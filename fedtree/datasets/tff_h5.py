"""TensorFlow Federated's h5 federated datasets (EMNIST, Shakespeare, StackOverflow, CIFAR-100),
read with ``h5py`` (``pip install -e ".[h5]"``); no TensorFlow needed.

TFF's ``*.h5`` files (``fed_emnist_{train,test}.h5``, ``shakespeare_{train,test}.h5``,
``stackoverflow_{train,test}.h5``, ``fed_cifar100_{train,test}.h5``) hold one group per client
under ``examples/<client id>`` with one dataset per feature:

* ``kind="emnist"``: ``pixels float[n, 28, 28]``, ``label int[n]`` -> ``x float32[C, M, 28,
  28, 1]``, 62 classes (10 with ``only_digits``: whatever the labels hold, ``num_classes``
  is ``max label + 1`` over both files unless given);
* ``kind="shakespeare"``: ``snippets bytes[n]`` (a role's lines) -> next-character
  sequences of ``seq_len`` (:func:`fedtree.datasets.text.sequences_from_text`) over a
  character vocabulary built from the training file only;
* ``kind="stackoverflow"``: ``tokens bytes[n]`` (space-separated words of a post) -> word
  sentences (:func:`fedtree.datasets.text.encode_sentences`) over the ``vocab_size`` most
  frequent training words (``vocab_size`` counts the 4 special tokens: 10,004 is Reddi et al.
  2021's 10,000 words);
* ``kind="cifar100"``: ``image uint8[n, 32, 32, 3]``, ``label int[n]`` (the 100 fine classes;
  ``num_classes`` 100 unless given) ->
  ``x float32[C, M, 32, 32, 3]`` in ``[0, 1]``, or with ``crop`` the central ``crop x crop``
  window and with ``normalize="per_image"`` each image standardized (TensorFlow's
  ``per_image_standardization`` of the 0-255 values, as Reddi et al. 2021 evaluate). The test
  file's 100 clients are not training clients (TFF's Pachinko split): their examples, pooled,
  are the *central* test set (``extras["central_x"]``, ``extras["central_y"]``) and no client has
  test examples of its own.

One client per id of the training file, in sorted order, each keeping at most
``max_examples_per_client`` training examples (the first ones, as Reddi et al. 2021's Stack
Overflow task takes 1,000); test examples from the test file (none for an id absent there). One
group (TFF's splits have no group column).
"""

from __future__ import annotations

import collections
import os

import numpy as np

from fedtree.core.data import FederatedData, from_client_arrays
from fedtree.datasets.text import build_vocabulary, encode_sentences, sequences_from_text

KINDS = ("emnist", "shakespeare", "stackoverflow", "cifar100")
FEATURES = {"emnist": ("pixels", "label"), "shakespeare": ("snippets",), "stackoverflow": ("tokens",),
            "cifar100": ("image", "label")}
NORMALIZE = (None, "per_image")
ARCHIVES = {
  "emnist": ("fed_emnist.tar.bz2", "fed_emnist_train.h5", "fed_emnist_test.h5"),
  "shakespeare": ("shakespeare.tar.bz2", "shakespeare_train.h5", "shakespeare_test.h5"),
  "stackoverflow": ("stackoverflow.tar.bz2", "stackoverflow_train.h5", "stackoverflow_test.h5"),
  "cifar100": ("fed_cifar100.tar.bz2", "fed_cifar100_train.h5", "fed_cifar100_test.h5"),
}
"""TFF's archive of every kind (``https://storage.googleapis.com/tff-datasets-public/<archive>``, the
files ``tff.simulation.datasets.<name>.load_data()`` downloads) and the train and test files in it."""


def prepare_command(kind: str, directory: str = "DIR") -> str:
  """The shell command that downloads and unpacks ``kind``'s TFF h5 files into ``directory``."""
  archive = ARCHIVES[kind][0]
  return (f"mkdir -p {directory} && curl -L https://storage.googleapis.com/tff-datasets-public/{archive} "
          f"| tar -xj -C {directory}")


def check_prepared(kind: str, train_path: str, test_path: str) -> None:
  """Refuses, before anything is read, a ``kind`` whose h5 files are not at the given paths,
  naming the command that prepares them.

  Raises:
    ValueError: a file is missing.
  """
  for path in (train_path, test_path):
    if not os.path.isfile(path):
      archive, train, test = ARCHIVES[kind]
      directory = os.path.dirname(os.path.abspath(path))
      raise ValueError(
        f"TFF h5 file {path!r} does not exist: the TFF {kind} data are not prepared. Prepare them once "
        f"where internet is available ({archive}): `{prepare_command(kind, directory)}`, then set "
        f"config.data.train_path={os.path.join(directory, train)!r} and "
        f"config.data.test_path={os.path.join(directory, test)!r}")


def open_h5(path: str, *, tff: bool = True):
  """``path`` opened for reading with ``h5py`` (a context manager).

  Raises:
    ValueError: the file is missing, not h5, or (``tff``) has no ``examples`` group.
  """
  import h5py

  if not os.path.isfile(path):
    raise ValueError(f"h5 file {path!r} does not exist")
  try:
    f = h5py.File(path, "r")
  except OSError as e:
    raise ValueError(f"{path!r} is not an h5 file ({e})") from e
  if tff and "examples" not in f:
    f.close()
    raise ValueError(f"{path!r} has no 'examples' group (TFF layout: examples/<client>/<feature>)")
  return f


def read_h5(path: str, features: tuple[str, ...], max_clients: int | None = None,
            ) -> dict[str, dict[str, np.ndarray]]:
  """``{client id: {feature: array}}`` of ``path``'s ``examples`` group, ids sorted.

  Raises:
    ValueError: the file is missing, not h5, has no ``examples`` group, or a client lacks
      a feature.
  """
  with open_h5(path) as f:
    ids = sorted(f["examples"].keys())
    if max_clients is not None:
      ids = ids[: int(max_clients)]
    out = {}
    for cid in ids:
      g = f["examples"][cid]
      missing = [k for k in features if k not in g]
      if missing:
        raise ValueError(f"{path!r}: client {cid!r} lacks feature(s) {missing}; has {sorted(g.keys())}")
      out[cid] = {k: g[k][()] for k in features}
  return out


def _text(v) -> str:
  return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def per_image_standardization(x: np.ndarray) -> np.ndarray:
  """TensorFlow's ``tf.image.per_image_standardization`` of images ``x [..., H, W, C]``: each image
  minus its mean, divided by ``max(std, 1 / sqrt(H W C))``."""
  x = np.asarray(x, np.float32)
  axes = (-3, -2, -1)
  mean = x.mean(axis=axes, keepdims=True)
  std = x.std(axis=axes, keepdims=True)
  floor = 1.0 / np.sqrt(float(np.prod(x.shape[-3:])))
  return ((x - mean) / np.maximum(std, floor)).astype(np.float32)


def _images(image: np.ndarray, crop: int | None, normalize: str | None) -> np.ndarray:
  x = np.asarray(image)
  if crop is not None:
    h, w = x.shape[-3], x.shape[-2]
    if not 1 <= crop <= min(h, w):
      raise ValueError(f"crop={crop} must be in [1, {min(h, w)}] (the images are {h}x{w})")
    top, left = (h - crop) // 2, (w - crop) // 2
    x = x[..., top:top + crop, left:left + crop, :]
  if normalize == "per_image":
    return per_image_standardization(x.astype(np.float32))
  return (x.astype(np.float32) / 255.0) if x.dtype == np.uint8 else x.astype(np.float32)


def check_options(kind: str, *, crop: int | None = None, normalize: str | None = None,
                  max_examples_per_client: int | None = None) -> None:
  """Refuses options :func:`load_tff_h5` does not take, before anything is read.

  Raises:
    ValueError: unknown ``kind`` or ``normalize``, ``crop`` or ``normalize`` for a kind without
      images, or ``max_examples_per_client < 1``.
  """
  if kind not in KINDS:
    raise ValueError(f"TFF kind={kind!r}; choose one of {KINDS}")
  if normalize not in NORMALIZE:
    raise ValueError(f"TFF normalize={normalize!r}; choose one of {NORMALIZE}")
  if (crop is not None or normalize is not None) and kind != "cifar100":
    raise ValueError(f"crop={crop} / normalize={normalize!r} are options of kind='cifar100', not {kind!r}")
  if max_examples_per_client is not None and int(max_examples_per_client) < 1:
    raise ValueError(f"max_examples_per_client={max_examples_per_client} must be >= 1")


def client_tokens(kind: str, d: dict[str, np.ndarray]) -> list:
  """The tokens of one client's text (``kind`` ``"shakespeare"``: every snippet's characters;
  ``"stackoverflow"``: every sentence's words) that the vocabulary counts."""
  if kind == "shakespeare":
    return [list(_text(s)) for s in d["snippets"]]
  return [_text(s).split() for s in d["tokens"]]


def count_tokens(kind: str, d: dict[str, np.ndarray], counts: collections.Counter) -> None:
  """Adds the tokens of :func:`client_tokens` to ``counts``, in one pass over the client's text
  joined (the same tokens: the words of sentences joined by a space are the sentences' words)."""
  texts = [s.decode("utf-8") if isinstance(s, bytes) else str(s) for s in d[FEATURES[kind][0]]]
  counts.update("".join(texts) if kind == "shakespeare" else " ".join(texts).split())


def client_examples(kind: str, d: dict[str, np.ndarray] | None, *, seq_len: int = 80, crop: int | None = None,
                    normalize: str | None = None, vocab=None, index: dict[str, int] | None = None,
                    ) -> tuple[np.ndarray, np.ndarray]:
  """``(x, y)`` of one client's features ``d`` (``None``: a client without examples in this file)
  as :func:`load_tff_h5` stores them; ``vocab`` (and its ``index``) for the text kinds."""
  if kind == "cifar100":
    return _images(d["image"], crop, normalize), np.asarray(d["label"], np.int32).reshape(-1)
  if kind == "emnist":
    if d is None:
      return np.zeros((0, 28, 28, 1), np.float32), np.zeros((0,), np.int32)
    return (np.asarray(d["pixels"], np.float32).reshape((-1, 28, 28, 1)),
            np.asarray(d["label"], np.int32).reshape(-1))
  index = vocab.index() if index is None else index
  if kind == "shakespeare":
    if d is None or len(d["snippets"]) == 0:
      return np.zeros((0, seq_len), np.int32), np.zeros((0, seq_len), np.int32)
    w = np.concatenate([sequences_from_text(_text(s), index, seq_len) for s in d["snippets"]])
    return w[:, :-1], w[:, 1:]
  if d is None:
    return np.zeros((0, seq_len), np.int32), np.zeros((0, seq_len), np.int32)
  return encode_sentences(client_tokens(kind, d), vocab, seq_len, index=index)


def load_tff_h5(train_path: str, test_path: str, *, kind: str, seq_len: int = 80,
                vocab_size: int = 10_000, num_classes: int | None = None,
                max_clients: int | None = None, max_examples_per_client: int | None = None,
                crop: int | None = None, normalize: str | None = None,
                ) -> tuple[FederatedData, np.ndarray, dict[str, np.ndarray]]:
  """``(data, groups int32[C] (zeros), extras)`` of a TFF h5 train/test pair; ``extras``
  holds ``clients`` (and ``vocab`` for the text kinds) as string arrays, and for
  ``kind="cifar100"`` the central test set (``central_x``, ``central_y``).

  Raises:
    ValueError: unknown ``kind`` or ``normalize``, a bad file (see :func:`read_h5`), an empty
      client, test ids missing from the training file (CIFAR-100's excepted), ``crop`` or
      ``normalize`` for a kind without images, or ``max_examples_per_client < 1``.
  """
  check_options(kind, crop=crop, normalize=normalize, max_examples_per_client=max_examples_per_client)
  check_prepared(kind, train_path, test_path)
  feats = FEATURES[kind]
  train = read_h5(train_path, feats, max_clients)
  test = read_h5(test_path, feats)
  clients = sorted(train)
  if not clients:
    raise ValueError(f"{train_path!r} has no client")
  for c in clients:
    if len(train[c][feats[0]]) == 0:
      raise ValueError(f"{train_path!r}: client {c!r} has no example (empty client)")
  if max_examples_per_client is not None:
    train = {c: {k: v[: int(max_examples_per_client)] for k, v in d.items()} for c, d in train.items()}
  extra_ids = sorted(set(test) - set(train))
  if extra_ids and max_clients is None and kind != "cifar100":
    raise ValueError(f"{len(extra_ids)} test clients are not in {train_path!r}, e.g. {extra_ids[:3]}")
  extras = {"clients": np.asarray(clients)}
  groups = np.zeros(len(clients), np.int32)
  if kind == "cifar100":
    def pooled(split):
      return (np.concatenate([_images(split[c]["image"], crop, normalize) for c in sorted(split)]),
              np.concatenate([np.asarray(split[c]["label"], np.int32).reshape(-1) for c in sorted(split)]))

    tr = [client_examples(kind, train[c], crop=crop, normalize=normalize) for c in clients]
    extras["central_x"], extras["central_y"] = pooled(test)
    shape = tr[0][0].shape[1:]
    te = [(np.zeros((0,) + shape, np.float32), np.zeros((0,), np.int32)) for _ in clients]
    k = int(num_classes or 100)   # CIFAR-100's fine labels, whatever labels a small file holds
    top = max(int(y.max(initial=0)) for y in [extras["central_y"]] + [y for _, y in tr])
    if top >= k:
      raise ValueError(f"label {top} in {train_path!r} / {test_path!r} >= num_classes={k}")
    return from_client_arrays(tr, te, num_classes=k), groups, extras
  if kind == "emnist":
    tr = [client_examples(kind, train[c]) for c in clients]
    te = [client_examples(kind, test.get(c)) for c in clients]
    k = num_classes or int(max(int(y.max(initial=0)) for _, y in tr + te)) + 1
    return from_client_arrays(tr, te, num_classes=k), groups, extras
  level = "char" if kind == "shakespeare" else "word"
  vocab = build_vocabulary([t for c in clients for t in client_tokens(kind, train[c])], vocab_size=vocab_size,
                           level=level)
  index = vocab.index()
  data = from_client_arrays([client_examples(kind, train[c], seq_len=seq_len, vocab=vocab, index=index)
                             for c in clients],
                            [client_examples(kind, test.get(c), seq_len=seq_len, vocab=vocab, index=index)
                             for c in clients], num_classes=vocab.size, dtype=np.int32)
  extras["vocab"] = np.asarray(vocab.tokens)
  return data, groups, extras
