"""LEAF's natural federated splits (Caldas et al. 2018, "LEAF: a benchmark for federated
settings") from their JSON files: FEMNIST by writer, Shakespeare by speaking role.

A LEAF dataset directory holds ``train/*.json`` and ``test/*.json``; every file is
``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``
with an optional ``"hierarchies"`` list beside ``"users"`` (Shakespeare: the play of each
role). One client per user of the training files (sorted by name; a user split over several
files is merged in file-name order); its test examples come from the test files (none if
absent there). With ``group_key="hierarchies"`` the groups are the distinct hierarchy values
(sorted), e.g. one group per play; otherwise one group.

* ``kind="femnist"``: ``x`` 784 floats -> ``float32[28, 28, 1]``, ``y`` one of 62 classes.
* ``kind="shakespeare"``: ``x`` an 80-character string and ``y`` its next character; the
  example becomes a next-character sequence (``x = chars[0:80]``, ``y = chars[1:80] + next``,
  ids from a character vocabulary built from the training data only) for the language
  models of :mod:`fedtree.models.lm` (:mod:`fedtree.datasets.text`'s layout).

Every example of the files lands in exactly one client's train or test split (tested).
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np

from fedtree.core.data import FederatedData, from_client_arrays
from fedtree.datasets.text import SPECIAL, Vocabulary, build_vocabulary

KINDS = ("femnist", "shakespeare")
PREPARE = {
  "femnist": ("git clone https://github.com/TalwalkarLab/leaf && cd leaf/data/femnist && ./preprocess.sh "
              "-s niid --sf 0.05 -k 100 -t sample --smplseed 1549786595 --spltseed 1549786796"),
  "shakespeare": ("git clone https://github.com/TalwalkarLab/leaf && cd leaf/data/shakespeare && "
                  "./preprocess.sh -s niid --sf 0.05 -k 64 -tf 0.9 -t sample"),
}
"""LEAF's preprocessing of each kind as its paper's experiments run it (``paper_experiments/*.sh``)."""


def read_split(directory: str) -> tuple[dict[str, dict[str, list]], dict[str, str]]:
  """``({user: {"x": [...], "y": [...]}}, {user: hierarchy})`` merged over ``directory/*.json``
  in sorted file order.

  Raises:
    ValueError: the directory has no JSON file, or a file is not LEAF JSON (named).
  """
  files = sorted(glob.glob(os.path.join(directory, "*.json")))
  if not files:
    raise ValueError(f"LEAF directory {directory!r} holds no *.json file")
  users: dict[str, dict[str, list]] = {}
  hier: dict[str, str] = {}
  for path in files:
    try:
      with open(path) as f:
        blob = json.load(f)
      names, data = blob["users"], blob["user_data"]
      h = blob.get("hierarchies")
      for i, u in enumerate(names):
        d = users.setdefault(u, {"x": [], "y": []})
        d["x"].extend(data[u]["x"])
        d["y"].extend(data[u]["y"])
        if len(data[u]["x"]) != len(data[u]["y"]):
          raise ValueError(f"user {u!r} has {len(data[u]['x'])} x but {len(data[u]['y'])} y")
        if h is not None:
          hier[u] = str(h[i])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
      raise ValueError(f"{path!r} is not LEAF JSON ({type(e).__name__}: {e}); expected keys "
                       "'users', 'user_data' and optionally 'num_samples', 'hierarchies'") from e
  return users, hier


def check_leaf_prepared(root: str, kind: str) -> None:
  """Refuses a LEAF ``root`` without ``train/`` and ``test/``, naming the command that prepares
  ``kind`` (any name, when ``kind`` is not LEAF's).

  Raises:
    ValueError: a directory is missing.
  """
  for split in ("train", "test"):
    if not os.path.isdir(os.path.join(root, split)):
      how = (f" Prepare them once where internet is available: `{PREPARE[kind]}`, then set config.data.root "
             f"to leaf/data/{kind}/data") if kind in PREPARE else ""
      raise ValueError(f"LEAF root {root!r} has no {split}/ directory: the LEAF {kind} data are not "
                       f"prepared there.{how}")


def load_leaf(root: str, *, kind: str, group_key: str | None = None, seq_len: int = 80,
              ) -> tuple[FederatedData, np.ndarray, dict[str, np.ndarray]]:
  """``(data, groups int32[C], extras)`` from ``root/train`` and ``root/test``; ``extras``
  holds ``clients`` and ``group_names`` (and ``vocab`` for Shakespeare) as string arrays.

  Raises:
    ValueError: unknown ``kind`` or ``group_key``, a missing directory, malformed JSON, an
      empty client.
  """
  if kind not in KINDS:
    raise ValueError(f"LEAF kind={kind!r}; choose one of {KINDS}")
  if group_key not in (None, "hierarchies"):
    raise ValueError(f"group_key={group_key!r}; choose None or 'hierarchies'")
  check_leaf_prepared(root, kind)
  train, hier = read_split(os.path.join(root, "train"))
  test, _ = read_split(os.path.join(root, "test"))
  clients = sorted(train)
  for c in clients:
    if not train[c]["y"]:
      raise ValueError(f"LEAF user {c!r} has no training example (empty client)")
  unknown = sorted(set(test) - set(train))
  if unknown:
    raise ValueError(f"{len(unknown)} test users have no training data, e.g. {unknown[:3]}")
  empty = {"x": [], "y": []}
  extras = {"clients": np.asarray(clients)}
  if kind == "femnist":
    def arrays(d):
      x = np.asarray(d["x"], np.float32).reshape((-1, 28, 28, 1))
      return x, np.asarray(d["y"], np.int32)

    data = from_client_arrays([arrays(train[c]) for c in clients],
                              [arrays(test.get(c, empty)) for c in clients], num_classes=62)
  else:
    vocab = build_vocabulary(
      [list(s) + [y] for c in clients for s, y in zip(train[c]["x"], train[c]["y"], strict=True)],
      vocab_size=10_000, level="char")
    index = vocab.index()

    def arrays(d):
      n = len(d["y"])
      x = np.zeros((n, seq_len), np.int32)
      y = np.zeros((n, seq_len), np.int32)
      for i, (s, nxt) in enumerate(zip(d["x"], d["y"], strict=True)):
        ids = [index.get(ch, 1) for ch in (s + nxt)][-(seq_len + 1):]
        x[i, : len(ids) - 1], y[i, : len(ids) - 1] = ids[:-1], ids[1:]
      return x, y

    data = from_client_arrays([arrays(train[c]) for c in clients],
                              [arrays(test.get(c, empty)) for c in clients],
                              num_classes=vocab.size, dtype=np.int32)
    extras["vocab"] = np.asarray(vocab.tokens)
  if group_key is None:
    names = ["all"]
    groups = np.zeros(len(clients), np.int32)
  else:
    missing = [c for c in clients if c not in hier]
    if missing:
      raise ValueError(f"group_key='hierarchies' but users {missing[:3]} have no hierarchy")
    names = sorted({hier[c] for c in clients})
    groups = np.asarray([names.index(hier[c]) for c in clients], np.int32)
  extras["group_names"] = np.asarray(names)
  return data, groups, extras


def vocabulary_from_extras(extras: dict[str, np.ndarray]) -> Vocabulary:
  """The character vocabulary stored by :func:`load_leaf` (Shakespeare)."""
  tokens = tuple(str(t) for t in extras["vocab"])
  if tokens[:4] != SPECIAL:
    raise ValueError("extras['vocab'] is not a fedtree vocabulary")
  return Vocabulary(tokens, "char")
