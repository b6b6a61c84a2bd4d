"""Federated text: a tokenizer, sentences as padded token arrays, and offline corpora.

Paper 000 (GroupPerFL) evaluates word-level language models on clients that are video owners
or Wikipedia pages, grouped by video category or page topic; each page's sentences are split
75/25 into train and evaluation. This module builds the same shape of data:

* :class:`TextCorpus`: sentences per client, a group per client (host-side, plain Python).
* :func:`stdlib_corpus`: a corpus that ships with Python itself (no download): one client per
  standard-library module inside a package, its sentences taken from the docstrings of the
  module and of its classes and functions; one group per top-level package (``email``,
  ``asyncio``, ``xml``, ...). Construction (deterministic on one Python version): the ``.py``
  files under ``sysconfig.get_paths()["stdlib"]/<package>`` in sorted path order, test
  packages skipped; each file parsed with :mod:`ast` (never imported); docstrings in
  ``ast.walk`` order (module, then classes and functions breadth first); every docstring's
  whitespace collapsed and split after ``.``, ``!``, ``?`` or ``:`` followed by a space;
  sentences with fewer than ``min_words`` words or containing ``>>>`` dropped, duplicates
  within a module kept once (first occurrence). Other Python versions ship other docstrings,
  so the numbers in a config's docstring hold for the version named there.
* :func:`text_dir_corpus`: a user's corpus laid out as ``<root>/<group>/<client>.txt``, one
  sentence per line (the paper's wiki setup maps straight onto it: topic/page.txt).
* :func:`tfds_text_corpus`: a TFDS text dataset a user has prepared, grouped by a feature.

:func:`to_federated` splits every client's sentences into train and test (``test_fraction``;
paper: 0.25), builds the :class:`Vocabulary` from the training sentences only (the most
frequent ``vocab_size - 4`` tokens, ties by token), and encodes each sentence as
``x = [BOS, t_1, ..., t_n]`` and ``y = [t_1, ..., t_n, EOS]`` truncated to ``seq_len`` and
padded with ``PAD = 0``: ``FederatedData`` with ``x, y: int32[C, M, T]`` (see
:func:`fedtree.core.model.token_mask`); ``num_classes`` is the vocabulary size. Perplexity
then counts every real target token, EOS included.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import itertools
import os
import re
import sysconfig
from collections.abc import Sequence

import numpy as np

from fedtree.core.data import FederatedData, from_client_arrays

PAD, OOV, BOS, EOS = 0, 1, 2, 3
SPECIAL = ("<pad>", "<oov>", "<bos>", "<eos>")
LEVELS = ("word", "char")
_WORD = re.compile(r"[A-Za-z0-9_]+|[^\sA-Za-z0-9_]")
_SENTENCE_END = re.compile(r"(?<=[.!?:])\s+")


# ------------------------------------------------------------------ tokenizer
def tokenize(sentence: str, level: str = "word", lowercase: bool = True) -> list[str]:
  """Word tokens (runs of letters/digits/underscore, and every other non-space character) or
  characters (``level="char"``, spaces kept)."""
  if level not in LEVELS:
    raise ValueError(f"level={level!r}; choose one of {LEVELS}")
  if lowercase:
    sentence = sentence.lower()
  return list(sentence) if level == "char" else _WORD.findall(sentence)


def detokenize(tokens: Sequence[str], level: str = "word") -> str:
  """Inverse of :func:`tokenize` up to whitespace: words joined by a space, chars by nothing."""
  return ("" if level == "char" else " ").join(tokens)


@dataclasses.dataclass(frozen=True)
class Vocabulary:
  """Token <-> id. Ids 0-3 are ``<pad>``, ``<oov>``, ``<bos>``, ``<eos>``; then ``tokens``."""

  tokens: tuple[str, ...]
  level: str = "word"

  def __post_init__(self):
    if tuple(self.tokens[:4]) != SPECIAL:
      raise ValueError(f"a vocabulary starts with {SPECIAL}, got {tuple(self.tokens[:4])}")

  @property
  def size(self) -> int:
    return len(self.tokens)

  def index(self) -> dict[str, int]:
    return {t: i for i, t in enumerate(self.tokens)}

  def encode(self, tokens: Sequence[str], index: dict[str, int] | None = None) -> list[int]:
    index = index or self.index()
    return [index.get(t, OOV) for t in tokens]

  def decode(self, ids: Sequence[int]) -> list[str]:
    return [self.tokens[int(i)] for i in ids if int(i) != PAD]

  def char_table(self, max_chars: int = 16) -> np.ndarray:
    """``int32[V, max_chars]`` spelling of every token for a character-aware embedding: char
    ids are byte values + 1 (0 = no character), truncated; special tokens get one id each."""
    out = np.zeros((self.size, max_chars), np.int32)
    for i, tok in enumerate(self.tokens):
      if i < len(SPECIAL):
        out[i, 0] = 257 + i
        continue
      b = tok.encode("utf-8")[:max_chars]
      out[i, : len(b)] = np.frombuffer(b, np.uint8).astype(np.int32) + 1
    return out


def build_vocabulary(token_lists: Sequence[Sequence[str]], *, vocab_size: int, level: str = "word",
                     min_count: int = 1) -> Vocabulary:
  """The ``vocab_size - 4`` most frequent tokens of ``token_lists`` (ties broken by the token)
  seen at least ``min_count`` times, after the 4 special tokens."""
  counts = collections.Counter(t for toks in token_lists for t in toks)
  return vocabulary_from_counts(counts, vocab_size=vocab_size, level=level, min_count=min_count)


def vocabulary_from_counts(counts: collections.Counter, *, vocab_size: int, level: str = "word",
                           min_count: int = 1) -> Vocabulary:
  """:func:`build_vocabulary` from token counts gathered beforehand (a corpus read in a stream)."""
  if vocab_size < len(SPECIAL) + 1:
    raise ValueError(f"vocab_size={vocab_size} must be >= {len(SPECIAL) + 1} (4 special tokens + 1)")
  ranked = sorted((t for t, n in counts.items() if n >= min_count), key=lambda t: (-counts[t], t))
  return Vocabulary(SPECIAL + tuple(ranked[: vocab_size - len(SPECIAL)]), level)


def encode_sentences(token_lists: Sequence[Sequence[str]], vocab: Vocabulary, seq_len: int, *,
                     index: dict[str, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
  """``(x, y)`` each ``int32[M, seq_len]``: ``x = [BOS, t...]``, ``y = [t..., EOS]``, padded
  (``index``: ``vocab.index()``, built once by a caller encoding many clients).

  Sentence ``i`` of ``L`` tokens is the sequence ``s = [BOS, t_1 .. t_L, EOS]``; ``x[i, p] = s[p]``
  and ``y[i, p] = s[p + 1]`` for ``p < min(L + 1, seq_len)``, zero after. One lookup per token,
  the rest in numpy (a loop over sentences is ``tests/test_text.py``'s reference).
  """
  index = vocab.index() if index is None else index
  m = len(token_lists)
  lengths = np.fromiter(map(len, token_lists), np.int64, count=m)
  total = int(lengths.sum())
  flat = np.fromiter(map(index.get, itertools.chain.from_iterable(token_lists), itertools.repeat(OOV)),
                     np.int32, count=total)
  flat = np.append(flat, np.int32(PAD))   # a valid index for clipped gathers, never kept
  starts = (np.cumsum(lengths) - lengths)[:, None]
  p = np.arange(seq_len)[None, :]
  real = p < np.minimum(lengths + 1, seq_len)[:, None]
  word_x = flat[np.clip(starts + p - 1, 0, total)]
  x = np.where(p == 0, BOS, word_x)
  word_y = flat[np.clip(starts + p, 0, total)]
  y = np.where(p < lengths[:, None], word_y, EOS)
  return np.where(real, x, PAD).astype(np.int32), np.where(real, y, PAD).astype(np.int32)


# ------------------------------------------------------------------ corpora
@dataclasses.dataclass(frozen=True)
class TextCorpus:
  """Sentences per client and the group of every client (host-side).

  Attributes:
    clients: ``C`` client names.
    sentences: ``C`` tuples of sentences.
    groups: ``int[C]`` group of each client.
    group_names: name of every group.
  """

  clients: tuple[str, ...]
  sentences: tuple[tuple[str, ...], ...]
  groups: tuple[int, ...]
  group_names: tuple[str, ...]

  def __post_init__(self):
    if not self.clients:
      raise ValueError("the corpus has no clients")
    for name, s in zip(self.clients, self.sentences, strict=True):
      if not s:
        raise ValueError(f"client {name!r} has no sentences; drop it or add text")


def split_sentences(text: str) -> list[str]:
  """Whitespace collapsed, split after ``.``, ``!``, ``?`` or ``:`` followed by whitespace."""
  text = " ".join(text.split())
  return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def _module_sentences(path: str, min_words: int) -> list[str]:
  with open(path, "rb") as f:
    source = f.read()
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError):
    return []
  out, seen = [], set()
  for node in ast.walk(tree):
    if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    doc = ast.get_docstring(node, clean=True)
    if not doc:
      continue
    for s in split_sentences(doc):
      if ">>>" in s or len(s.split()) < min_words or s in seen:
        continue
      seen.add(s)
      out.append(s)
  return out


STDLIB_PACKAGES = ("asyncio", "email", "multiprocessing", "xml", "importlib", "logging",
                   "concurrent", "http", "json", "urllib", "unittest", "sqlite3", "ctypes",
                   "tkinter", "curses", "wsgiref", "dbm", "html", "zoneinfo", "tomllib", "venv")


def stdlib_corpus(*, packages: Sequence[str] = STDLIB_PACKAGES, min_sentences: int = 4,
                  min_words: int = 3, min_clients: int = 2, max_clients_per_group: int | None = None,
                  max_sentences: int | None = None, stdlib_dir: str | None = None) -> TextCorpus:
  """The standard-library docstring corpus (see the module docstring): one client per module
  of each package in ``packages`` with at least ``min_sentences`` sentences, one group per
  package with at least ``min_clients`` such modules (at most ``max_clients_per_group``, the
  first in path order); a module keeps its first ``max_sentences`` sentences (all: ``None``).

  Raises:
    ValueError: a package is not in the standard library, or no group is left.
  """
  root = stdlib_dir or sysconfig.get_paths()["stdlib"]
  clients, sentences, groups, names = [], [], [], []
  for pkg in packages:
    pdir = os.path.join(root, pkg)
    if not os.path.isdir(pdir):
      raise ValueError(f"package {pkg!r} is not a directory under {root}; choose among "
                       f"{sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))[:40]}")
    members = []
    for dirpath, dirnames, filenames in os.walk(pdir):
      dirnames[:] = sorted(d for d in dirnames if d not in ("test", "tests", "__pycache__", "idle_test"))
      for fn in sorted(filenames):
        if fn.endswith(".py"):
          path = os.path.join(dirpath, fn)
          s = _module_sentences(path, min_words)
          if max_sentences is not None:
            s = s[: int(max_sentences)]
          if len(s) >= min_sentences:
            rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
            members.append((rel, tuple(s)))
    members.sort()
    if max_clients_per_group is not None:
      members = members[: int(max_clients_per_group)]
    if len(members) < min_clients:
      continue
    g = len(names)
    names.append(pkg)
    for rel, s in members:
      clients.append(rel)
      sentences.append(s)
      groups.append(g)
  if not names:
    raise ValueError(f"no package of {tuple(packages)} has {min_clients} modules with "
                     f">= {min_sentences} docstring sentences")
  return TextCorpus(tuple(clients), tuple(sentences), tuple(groups), tuple(names))


def text_dir_corpus(root: str, *, encoding: str = "utf-8") -> TextCorpus:
  """``<root>/<group>/<client>.txt``, one sentence per line (blank lines skipped); groups and
  clients in sorted name order; a client is named ``<group>/<client>``.

  Raises:
    ValueError: ``root`` is missing or holds no ``<group>/<client>.txt``, or a client file
      has no sentence.
  """
  if not os.path.isdir(root):
    raise ValueError(f"text_dir root={root!r} is not a directory; expected <root>/<group>/<client>.txt")
  clients, sentences, groups, names = [], [], [], []
  for group in sorted(os.listdir(root)):
    gdir = os.path.join(root, group)
    if not os.path.isdir(gdir):
      continue
    files = sorted(f for f in os.listdir(gdir) if f.endswith(".txt"))
    if not files:
      continue
    names.append(group)
    for fn in files:
      with open(os.path.join(gdir, fn), encoding=encoding) as f:
        lines = tuple(line.strip() for line in f if line.strip())
      if not lines:
        raise ValueError(f"client file {os.path.join(gdir, fn)!r} has no sentence (empty client)")
      clients.append(f"{group}/{fn[:-4]}")
      sentences.append(lines)
      groups.append(len(names) - 1)
  if not clients:
    raise ValueError(f"text_dir root={root!r} holds no <group>/<client>.txt files")
  return TextCorpus(tuple(clients), tuple(sentences), tuple(groups), tuple(names))


def tfds_text_corpus(name: str, *, split: str = "train", text_key: str = "text",
                     client_key: str = "client_id", group_key: str | None = None,
                     data_dir: str | None = None, max_examples: int | None = None) -> TextCorpus:
  """A prepared TFDS text dataset (``download=False``): one client per value of
  ``client_key``, one group per value of ``group_key`` (one group without); each example's
  ``text_key`` split into sentences. Clients and groups in sorted order."""
  import tensorflow_datasets as tfds

  ds = tfds.load(name, split=split, data_dir=data_dir, download=False)
  per_client: dict[str, list[str]] = collections.defaultdict(list)
  group_of: dict[str, str] = {}
  for i, ex in enumerate(tfds.as_numpy(ds)):
    if max_examples is not None and i >= max_examples:
      break
    c = _as_str(ex[client_key])
    per_client[c].extend(split_sentences(_as_str(ex[text_key])))
    group_of[c] = _as_str(ex[group_key]) if group_key else "all"
  names = sorted(set(group_of.values()))
  clients = sorted(c for c in per_client if per_client[c])
  return TextCorpus(tuple(clients), tuple(tuple(per_client[c]) for c in clients),
                    tuple(names.index(group_of[c]) for c in clients), tuple(names))


def _as_str(v) -> str:
  return v.decode("utf-8") if isinstance(v, bytes) else str(v)


# ------------------------------------------------------------------ to arrays
def split_train_test_sentences(sentences: Sequence[str], test_fraction: float, rng: np.random.Generator,
                               ) -> tuple[list[str], list[str]]:
  """A random ``test_fraction`` (rounded down, leaving at least one for training) to test."""
  order = rng.permutation(len(sentences))
  n_test = min(int(np.floor(test_fraction * len(sentences))), len(sentences) - 1)
  return [sentences[i] for i in np.sort(order[n_test:])], [sentences[i] for i in np.sort(order[:n_test])]


def to_federated(corpus: TextCorpus, *, seq_len: int = 20, vocab_size: int = 5000, level: str = "word",
                 lowercase: bool = True, test_fraction: float = 0.25, min_count: int = 1,
                 seed: int = 0) -> tuple[FederatedData, np.ndarray, Vocabulary]:
  """``(data with x, y int32[C, M, seq_len], groups int32[C], vocabulary)``: sentences split
  per client (client ``c`` shuffled by ``default_rng([seed, c])``), the vocabulary built from
  the training sentences only, sentences encoded by :func:`encode_sentences`."""
  if not 0.0 <= test_fraction < 1.0:
    raise ValueError(f"test_fraction={test_fraction} must be in [0, 1)")
  if seq_len < 1:
    raise ValueError(f"seq_len={seq_len} must be >= 1")
  train_tok, test_tok = [], []
  for c, sents in enumerate(corpus.sentences):
    tr, te = split_train_test_sentences(sents, test_fraction, np.random.default_rng([seed, c]))
    train_tok.append([tokenize(s, level, lowercase) for s in tr])
    test_tok.append([tokenize(s, level, lowercase) for s in te])
  vocab = build_vocabulary([t for client in train_tok for t in client], vocab_size=vocab_size,
                           level=level, min_count=min_count)
  train = [encode_sentences(t, vocab, seq_len) for t in train_tok]
  test = [encode_sentences(t, vocab, seq_len) for t in test_tok]
  data = from_client_arrays(train, test, num_classes=vocab.size, dtype=np.int32)
  return data, np.asarray(corpus.groups, np.int32), vocab


def sequences_from_text(text: str, vocab_index: dict[str, int], seq_len: int) -> np.ndarray:
  """Characters of ``text`` cut into ``[n, seq_len + 1]`` id windows (last one zero-padded);
  ``x = w[:, :-1]``, ``y = w[:, 1:]`` gives next-character training sequences."""
  ids = [BOS] + [vocab_index.get(ch, OOV) for ch in text] + [EOS]
  n = max(1, int(np.ceil((len(ids) - 1) / seq_len)))
  out = np.zeros((n, seq_len + 1), np.int32)
  for i in range(n):
    w = ids[i * seq_len: i * seq_len + seq_len + 1]
    out[i, : len(w)] = w
  return out
