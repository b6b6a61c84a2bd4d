"""TensorFlow Federated's h5 federated datasets (EMNIST, Shakespeare, StackOverflow), read with
``h5py`` (``pip install -e ".[h5]"``); no TensorFlow needed.

TFF's ``*.h5`` files (``fed_emnist_{train,test}.h5``, ``shakespeare_{train,test}.h5``,
``stackoverflow_{train,test}.h5``) hold one group per client under ``examples/<client id>``
with one dataset per feature:

* ``kind="emnist"``: ``pixels float[n, 28, 28]``, ``label int[n]`` -> ``x float32[C, M, 28,
  28, 1]``, 62 classes (10 with ``only_digits``: whatever the labels hold, ``num_classes``
  is ``max label + 1`` over both files unless given);
* ``kind="shakespeare"``: ``snippets bytes[n]`` (a role's lines) -> next-character
  sequences of ``seq_len`` (:func:`fedtree.datasets.text.sequences_from_text`) over a
  character vocabulary built from the training file only;
* ``kind="stackoverflow"``: ``tokens bytes[n]`` (space-separated words of a post) -> word
  sentences (:func:`fedtree.datasets.text.encode_sentences`) over the ``vocab_size`` most
  frequent training words.

One client per id of the training file, in sorted order; test examples from the test file
(none for an id absent there). One group (TFF's splits have no group column).
"""

from __future__ import annotations

import os

import numpy as np

from fedtree.core.data import FederatedData, from_client_arrays
from fedtree.datasets.text import build_vocabulary, encode_sentences, sequences_from_text

KINDS = ("emnist", "shakespeare", "stackoverflow")
FEATURES = {"emnist": ("pixels", "label"), "shakespeare": ("snippets",), "stackoverflow": ("tokens",)}


def read_h5(path: str, features: tuple[str, ...], max_clients: int | None = None,
            ) -> dict[str, dict[str, np.ndarray]]:
  """``{client id: {feature: array}}`` of ``path``'s ``examples`` group, ids sorted.

  Raises:
    ValueError: the file is missing, not h5, has no ``examples`` group, or a client lacks
      a feature.
  """
  import h5py

  if not os.path.isfile(path):
    raise ValueError(f"TFF h5 file {path!r} does not exist")
  try:
    f = h5py.File(path, "r")
  except OSError as e:
    raise ValueError(f"{path!r} is not an h5 file ({e})") from e
  with f:
    if "examples" not in f:
      raise ValueError(f"{path!r} has no 'examples' group (TFF layout: examples/<client>/<feature>)")
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


def load_tff_h5(train_path: str, test_path: str, *, kind: str, seq_len: int = 80,
                vocab_size: int = 10_000, num_classes: int | None = None,
                max_clients: int | None = None) -> tuple[FederatedData, np.ndarray, dict[str, np.ndarray]]:
  """``(data, groups int32[C] (zeros), extras)`` of a TFF h5 train/test pair; ``extras``
  holds ``clients`` (and ``vocab`` for the text kinds) as string arrays.

  Raises:
    ValueError: unknown ``kind``, a bad file (see :func:`read_h5`), an empty client, or
      test ids missing from the training file.
  """
  if kind not in KINDS:
    raise ValueError(f"TFF kind={kind!r}; choose one of {KINDS}")
  feats = FEATURES[kind]
  train = read_h5(train_path, feats, max_clients)
  test = read_h5(test_path, feats)
  clients = sorted(train)
  if not clients:
    raise ValueError(f"{train_path!r} has no client")
  for c in clients:
    if len(train[c][feats[0]]) == 0:
      raise ValueError(f"{train_path!r}: client {c!r} has no example (empty client)")
  extra_ids = sorted(set(test) - set(train))
  if extra_ids and max_clients is None:
    raise ValueError(f"{len(extra_ids)} test clients are not in {train_path!r}, e.g. {extra_ids[:3]}")
  extras = {"clients": np.asarray(clients)}
  groups = np.zeros(len(clients), np.int32)
  if kind == "emnist":
    def arrays(d):
      if d is None:
        return np.zeros((0, 28, 28, 1), np.float32), np.zeros((0,), np.int32)
      return (np.asarray(d["pixels"], np.float32).reshape((-1, 28, 28, 1)),
              np.asarray(d["label"], np.int32).reshape(-1))

    tr = [arrays(train[c]) for c in clients]
    te = [arrays(test.get(c)) for c in clients]
    k = num_classes or int(max(int(y.max(initial=0)) for _, y in tr + te)) + 1
    return from_client_arrays(tr, te, num_classes=k), groups, extras
  if kind == "shakespeare":
    vocab = build_vocabulary([list(_text(s)) for c in clients for s in train[c]["snippets"]],
                             vocab_size=vocab_size, level="char")
    index = vocab.index()

    def arrays(d):
      if d is None or len(d["snippets"]) == 0:
        return np.zeros((0, seq_len), np.int32), np.zeros((0, seq_len), np.int32)
      w = np.concatenate([sequences_from_text(_text(s), index, seq_len) for s in d["snippets"]])
      return w[:, :-1], w[:, 1:]
  else:
    vocab = build_vocabulary([_text(s).split() for c in clients for s in train[c]["tokens"]],
                             vocab_size=vocab_size, level="word")

    def arrays(d):
      if d is None:
        return np.zeros((0, seq_len), np.int32), np.zeros((0, seq_len), np.int32)
      return encode_sentences([_text(s).split() for s in d["tokens"]], vocab, seq_len)

  data = from_client_arrays([arrays(train[c]) for c in clients],
                            [arrays(test.get(c)) for c in clients], num_classes=vocab.size,
                            dtype=np.int32)
  extras["vocab"] = np.asarray(vocab.tokens)
  return data, groups, extras
