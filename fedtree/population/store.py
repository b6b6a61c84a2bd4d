"""A population of clients on disk, read by client id.

A :class:`ClientStore` holds every client's examples, train and test (and a central test set where
the source has one), once, in Apache Arrow IPC files memory-mapped through Hugging Face
``datasets`` (``datasets.Dataset.from_file``), with an index of each client's rows. Reading a cohort
(:meth:`ClientStore.read`) copies its clients' rows out of the mapped files into the padded block
the device takes, ``x [K, W, ...]``, ``y [K, W, ...]``, ``n int32[K]``, zero past ``n``: exactly the
rows of the resident :class:`fedtree.core.data.FederatedData` for those clients, or into the flat
layout of :class:`fedtree.core.ragged.RaggedData` (:meth:`ClientStore.read_ragged`). Why Arrow:
``benchmarks/population_store.py`` compared it with ArrayRecord (Grain), HDF5 and zarr v3
(tensorstore) on this machine (docs/scaling.md, "Populations on disk").

On disk, a store is a folder::

  manifest.json         written last: schema, splits, the source's options, content fingerprint
  index.npz             rows of every client per split, client names, groups, vocabulary
  train/data.arrow      Arrow IPC stream: columns x and y, one row per example, clients in order
  test/data.arrow
  central/data.arrow    (only where the source has a central test set)

A :class:`StoreWriter` writes one into ``<path>.partial`` and renames it to ``<path>`` when the
manifest is written, so a conversion that stops half way leaves no store behind (and
:func:`open_store` says so). Record batches end at client boundaries, so a client's rows are one
slice of one mapped buffer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from fedtree.core.data import FederatedData
from fedtree.core.ragged import RaggedData

FORMAT = "fedtree.population.ClientStore"
VERSION = 1
SPLITS = ("train", "test", "central")
"""A store's splits: ``train`` and ``test`` have a row count for every client of the population;
``central`` (optional) is a test set apart from the clients (TFF CIFAR-100's test clients, FLAIR's
test users), with clients of its own."""
MANIFEST = "manifest.json"
INDEX = "index.npz"
DATA_FILE = "data.arrow"
LABEL_KINDS = ("class", "tokens", "multi_hot")
SOURCE_IGNORES = ("cache_dir", "layout", "store", "path", "train_path", "test_path", "root", "data_dir")
"""``config.data`` fields that do not change a store's content (where the files are, how a run lays
the data out), left out when a config is compared with the source a store was converted from."""


class Feature(NamedTuple):
  """The shape and dtype of one example's ``x`` or ``y``.

  Attributes:
    shape: the example's shape (``()`` for a class label).
    dtype: a numpy dtype name (``"float32"``, ``"int32"``, ``"uint8"``, ...).
  """

  shape: tuple[int, ...]
  dtype: str


class ClientBlock(NamedTuple):
  """A cohort's rows, padded as :class:`fedtree.core.data.FederatedData` pads a split.

  Attributes:
    x: ``[K, W, ...]`` inputs; rows past ``n[k]`` are zeros.
    y: ``[K, W, ...]`` labels (``[K, W]`` class labels, ``[K, W, T]`` next tokens).
    n: ``int32[K]`` real rows of every client.
  """

  x: np.ndarray
  y: np.ndarray
  n: np.ndarray

  @property
  def nbytes(self) -> int:
    return int(self.x.nbytes + self.y.nbytes + self.n.nbytes)


def normalized_source(source: dict[str, Any] | None) -> dict[str, Any]:
  """``source`` (a ``config.data`` block as a plain dict) as JSON stores it (tuples as lists),
  without the fields of :data:`SOURCE_IGNORES`."""
  if not source:
    return {}
  plain = json.loads(json.dumps(dict(source), default=_json_default, sort_keys=True))
  return {k: v for k, v in plain.items() if k not in SOURCE_IGNORES}


def _json_default(v):
  if isinstance(v, np.generic):
    return v.item()
  if isinstance(v, np.ndarray):
    return v.tolist()
  if hasattr(v, "items"):
    return dict(v.items())
  return str(v)


# ------------------------------------------------------------------ reading
class _Split:
  """One split's mapped columns: every record batch's ``x`` and ``y`` as numpy views of the file."""

  def __init__(self, path: str, features: dict[str, Feature]):
    import datasets

    table = datasets.Dataset.from_file(path).data.table   # memory-mapped; nothing read yet
    self.views = {k: [_column_view(table.column(k).chunk(b), features[k]) for b in
                      range(table.column(k).num_chunks)] for k in ("x", "y")}
    sizes = [len(v) for v in self.views["x"]]
    self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    self.rows = int(table.num_rows)
    self._table = table   # keeps the mapping alive

  def take(self, key: str, rows: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = row rows[i]`` of column ``key`` (``int64[R]``, any order): one fancy index per record
    batch the rows fall in, no Python loop over clients or rows."""
    batch = np.searchsorted(self.starts, rows, side="right") - 1
    for b in np.unique(batch):
      at = np.flatnonzero(batch == b)
      out[at] = self.views[key][b][rows[at] - self.starts[b]]


def _client_rows(offsets: np.ndarray, ids: np.ndarray, counts: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``(rows, slot, pos)``: the store rows of clients ``ids`` (``counts`` each) back to back, and for
  each the client's place in ``ids`` and the row's place in its client."""
  total = int(counts.sum())
  slot = np.repeat(np.arange(ids.size), counts)
  first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
  pos = np.arange(total, dtype=np.int64) - np.repeat(first, counts)
  return np.asarray(offsets, np.int64)[ids][slot] + pos, slot, pos


def _column_view(chunk, feature: Feature) -> np.ndarray:
  shape = tuple(feature.shape)
  values = chunk.flatten() if shape else chunk
  return values.to_numpy(zero_copy_only=True).reshape((-1,) + shape)


class ClientStore:
  """A population on disk, read by client id (open one with :func:`open_store`).

  Attributes:
    path: the store's folder.
    manifest: the parsed ``manifest.json``.
  """

  def __init__(self, path: str, manifest: dict[str, Any], index: dict[str, np.ndarray],
               splits: dict[str, _Split]):
    self.path = path
    self.manifest = manifest
    self._index = index
    self._splits = splits
    self._offsets = {s: np.concatenate([[0], np.cumsum(index[f"{s}_counts"])]).astype(np.int64)
                     for s in splits}

  # -- metadata
  @property
  def num_clients(self) -> int:
    """Clients of the population (of the ``train`` and ``test`` splits)."""
    return int(self.manifest["num_clients"])

  @property
  def num_classes(self) -> int:
    """Label values (classes, or the vocabulary's size for next tokens)."""
    return int(self.manifest["num_classes"])

  @property
  def features(self) -> dict[str, Feature]:
    """``{"x": Feature, "y": Feature}``: one example's shape and dtype."""
    return {k: Feature(tuple(v["shape"]), v["dtype"]) for k, v in self.manifest["features"].items()}

  @property
  def label_kind(self) -> str:
    """One of :data:`LABEL_KINDS`."""
    return str(self.manifest["label_kind"])

  @property
  def source(self) -> dict[str, Any]:
    """The ``config.data`` block (or source options) the store was converted from."""
    return dict(self.manifest["source"])

  @property
  def fingerprint(self) -> str:
    """sha256 of the schema, the index and every split's rows (:meth:`verify` recomputes it)."""
    return str(self.manifest["fingerprint"])

  @property
  def splits(self) -> tuple[str, ...]:
    return tuple(self._splits)

  @property
  def client_names(self) -> np.ndarray:
    """The source's name of every client (``str[C]``)."""
    return self._index["client_names"]

  def extra(self, name: str) -> np.ndarray | None:
    """An array the converter kept beside the rows (``groups`` ``int32[C]`` or ``[L, C]``,
    ``group_names``, ``vocab``, ``central_client_names``), or ``None``."""
    return self._index.get(name)

  def counts(self, split: str = "train") -> np.ndarray:
    """``int64[C]`` rows of every client of ``split``."""
    return self._index[f"{self._check_split(split)}_counts"]

  def width(self, split: str = "train") -> int:
    """The padded length of a block of ``split``: its largest client (at least 1), as
    :func:`fedtree.core.data.from_client_arrays` pads."""
    counts = self.counts(split)
    return max(1, int(counts.max()) if counts.size else 0)

  def example_bytes(self) -> int:
    """Bytes of one example, ``x`` and ``y``."""
    return int(sum(int(np.prod(f.shape, dtype=np.int64)) * np.dtype(f.dtype).itemsize
                   for f in self.features.values()))

  def __repr__(self) -> str:
    rows = ", ".join(f"{s} {self._splits[s].rows:,} rows" for s in self._splits)
    return f"ClientStore({self.path!r}: {self.num_clients:,} clients, {rows})"

  # -- reading
  def _check_split(self, split: str) -> str:
    if split not in self._splits:
      raise ValueError(f"split={split!r}; store {self.path} has splits {list(self._splits)}")
    return split

  def check_clients(self, clients, split: str = "train") -> np.ndarray:
    """``clients`` as ``int64[K]``; raises a ``ValueError`` naming the first id outside the store."""
    ids = np.asarray(clients)
    if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
      raise ValueError(f"client ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
    ids = ids.astype(np.int64)
    n = len(self.counts(split))
    bad = np.flatnonzero((ids < 0) | (ids >= n))
    if bad.size:
      raise ValueError(f"client id {int(ids[bad[0]])} is outside store {self.path} (its {split} split has "
                       f"clients 0..{n - 1}); {bad.size} of {ids.size} ids are out of range")
    return ids

  def read(self, clients, split: str = "train", *, width: int | None = None) -> ClientBlock:
    """The rows of ``clients`` in ``split``, padded to ``width``.

    Args:
      clients: ``int[K]`` client ids (``0 .. C-1``; repeats allowed).
      split: ``"train"``, ``"test"`` or ``"central"``.
      width: rows per client in the block; default :meth:`width` (the resident layout's).

    Returns:
      A :class:`ClientBlock`: ``x``, ``y`` ``[K, width, ...]`` in the store's dtypes, zero past
      ``n``, and ``n``.

    Raises:
      ValueError: an id outside the store, or a client with more rows than ``width`` (named).
    """
    ids = self.check_clients(clients, split)
    counts = self.counts(split)[ids]
    w = self.width(split) if width is None else int(width)
    over = np.flatnonzero(counts > w)
    if over.size:
      c = int(ids[over[0]])
      raise ValueError(f"client {c} has {int(counts[over[0]])} {split} rows, more than width={w}; read with "
                       f"width >= {int(counts.max())} (the store's widest client: {self.width(split)})")
    feats = self.features
    out = {k: np.zeros((len(ids), w) + feats[k].shape, feats[k].dtype) for k in ("x", "y")}
    rows, slot, pos = _client_rows(self._offsets[split], ids, counts)
    for k in ("x", "y"):
      got = np.empty((rows.size,) + feats[k].shape, feats[k].dtype)
      self._splits[split].take(k, rows, got)
      out[k][slot, pos] = got
    return ClientBlock(x=out["x"], y=out["y"], n=counts.astype(np.int32))

  def read_ragged(self, clients, split: str = "train", *, rows: int | None = None) -> RaggedData:
    """The rows of ``clients`` in ``split`` back to back (:class:`fedtree.core.ragged.RaggedData`).

    Args:
      clients: ``int[K]`` client ids.
      split: the split.
      rows: the flat arrays' length (a static size for the device); rows past the clients' are
        zeros. Default: exactly their rows.

    Raises:
      ValueError: an id outside the store, or more rows than ``rows``.
    """
    ids = self.check_clients(clients, split)
    counts = self.counts(split)[ids]
    total = int(counts.sum())
    r = total if rows is None else int(rows)
    if total > r:
      more = "..." if ids.size > 5 else ""
      raise ValueError(f"clients {ids[:5].tolist()}{more} hold {total} {split} rows, more than rows={r}")
    feats = self.features
    out = {k: np.zeros((r,) + feats[k].shape, feats[k].dtype) for k in ("x", "y")}
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    rows, _, _ = _client_rows(self._offsets[split], ids, counts)
    for k in ("x", "y"):
      self._splits[split].take(k, rows, out[k][:total])
    return RaggedData(x=out["x"], y=out["y"], offsets=offsets, num_classes=self.num_classes)

  def to_federated_data(self) -> FederatedData:
    """Every client's train and test rows, resident and padded (a small store; tests).

    Raises:
      ValueError: what :meth:`fedtree.core.data.FederatedData.validate` refuses (e.g. the
        multi-hot labels of FLAIR, which ``FederatedData`` does not hold).
    """
    every = np.arange(self.num_clients)
    train, test = self.read(every, "train"), self.read(every, "test")
    return FederatedData(x_train=train.x, y_train=train.y, n_train=train.n, x_test=test.x, y_test=test.y,
                         n_test=test.n, num_classes=self.num_classes).validate()

  def verify(self) -> str:
    """Recomputes the content fingerprint from the files and returns it.

    Raises:
      ValueError: the files' content differs from what the manifest recorded.
    """
    digest = _fingerprint(self.manifest, self._index,
                          {s: _batches(self._splits[s]) for s in self._splits})
    if digest != self.fingerprint:
      raise ValueError(f"store {self.path}: its rows do not match its manifest (content sha256 "
                       f"{digest[:16]}..., recorded {self.fingerprint[:16]}...): the files changed after "
                       "conversion; convert again")
    return digest

  def check_source(self, source: dict[str, Any]) -> None:
    """Refuses a ``config.data`` block (a plain dict) that names another dataset than the one the
    store was converted from (fields of :data:`SOURCE_IGNORES` aside).

    Raises:
      ValueError: naming the fields that differ, both ways.
    """
    mine, theirs = normalized_source(self.source), normalized_source(source)
    if mine == theirs:
      return
    keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    diff = ", ".join(f"{k}: {mine.get(k)!r} in the store vs {theirs.get(k)!r} in the config" for k in keys)
    raise ValueError(f"store {self.path} was converted from another dataset than the config names ({diff}); "
                     "convert this config's data (python -m fedtree.convert) or point at the right store")


def _batches(split: _Split):
  for b in range(len(split.views["x"])):
    yield split.views["x"][b], split.views["y"][b]


def open_store(path: str, *, source: dict[str, Any] | None = None) -> ClientStore:
  """Opens the store at ``path`` (memory-mapped; nothing is read but the index).

  Args:
    path: the store's folder (written by :class:`StoreWriter` or ``python -m fedtree.convert``).
    source: the ``config.data`` block of the run (a plain dict), checked against the source the
      store was converted from (:meth:`ClientStore.check_source`); ``None``: not checked.

  Returns:
    The :class:`ClientStore`.

  Raises:
    FileNotFoundError: no store at ``path`` (naming a half-written one where there is one).
    ValueError: a half-written store, an index that does not match the rows, files whose size
      differs from the manifest's, or a store of another dataset than ``source``.
  """
  path = os.path.abspath(path)
  manifest_path = os.path.join(path, MANIFEST)
  if not os.path.isdir(path):
    partial = path + ".partial"
    if os.path.isdir(partial):
      raise FileNotFoundError(f"no store at {path}: a conversion stopped before it finished ({partial} is "
                              "half-written); delete it and convert again")
    raise FileNotFoundError(f"no store at {path}; convert the data first (python -m fedtree.convert)")
  if not os.path.isfile(manifest_path):
    raise ValueError(f"{path} holds no finished store (no {MANIFEST}): a half-written or foreign folder; "
                     "convert again")
  with open(manifest_path) as f:
    manifest = json.load(f)
  if manifest.get("format") != FORMAT or manifest.get("version") != VERSION or not manifest.get("complete"):
    raise ValueError(f"{manifest_path} is not a finished {FORMAT} of version {VERSION} (format="
                     f"{manifest.get('format')!r}, version={manifest.get('version')!r}, complete="
                     f"{manifest.get('complete')!r})")
  with np.load(os.path.join(path, INDEX), allow_pickle=False) as z:
    index = {k: z[k] for k in z.files}
  features = {k: Feature(tuple(v["shape"]), v["dtype"]) for k, v in manifest["features"].items()}
  splits = {}
  for split, info in manifest["splits"].items():
    file = os.path.join(path, split, DATA_FILE)
    if not os.path.isfile(file) or os.path.getsize(file) != int(info["bytes"]):
      have = os.path.getsize(file) if os.path.isfile(file) else "no file"
      raise ValueError(f"store {path}: {split}/{DATA_FILE} has {have} bytes, the manifest recorded "
                       f"{info['bytes']}: a damaged or half-copied store; convert or copy it again")
    counts = index.get(f"{split}_counts")
    if counts is None:
      raise ValueError(f"store {path}: {INDEX} has no {split}_counts for its {split} split")
    expected = manifest["num_clients"] if split != "central" else info["clients"]
    data = _Split(file, features)
    if (counts.ndim != 1 or len(counts) != int(expected) or (counts < 0).any()
        or int(counts.sum()) != data.rows or data.rows != int(info["rows"])):
      raise ValueError(f"store {path}: the index does not match the rows of its {split} split: "
                       f"{len(counts)} clients (expected {expected}) whose counts sum to "
                       f"{int(counts.sum())}, {data.rows} rows in {split}/{DATA_FILE}, {info['rows']} in the "
                       "manifest")
    splits[split] = data
  if "client_names" in index and len(index["client_names"]) != int(manifest["num_clients"]):
    raise ValueError(f"store {path}: {len(index['client_names'])} client names for {manifest['num_clients']} "
                     "clients")
  store = ClientStore(path, manifest, index, splits)
  if source is not None:
    store.check_source(source)
  return store


# ------------------------------------------------------------------ writing
@dataclasses.dataclass
class _SplitWriter:
  """A split's Arrow stream, flushed in record batches that end at client boundaries."""

  path: str
  features: dict[str, Feature]
  batch_bytes: int
  writer: Any = None
  pending: list = dataclasses.field(default_factory=list)
  pending_bytes: int = 0
  counts: list = dataclasses.field(default_factory=list)
  rows: int = 0
  digest: Any = dataclasses.field(default_factory=hashlib.sha256)

  def open(self) -> None:
    import pyarrow as pa

    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    self._schema = pa.schema([pa.field(k, _arrow_type(self.features[k])) for k in ("x", "y")])
    self._sink = pa.OSFile(self.path, "wb")
    self.writer = pa.ipc.new_stream(self._sink, self._schema)

  def add(self, x: np.ndarray, y: np.ndarray) -> None:
    self.counts.append(len(x))
    self.rows += len(x)
    if len(x):
      self.pending.append((x, y))
      self.pending_bytes += x.nbytes + y.nbytes
    if self.pending_bytes >= self.batch_bytes:
      self.flush()

  def flush(self) -> None:
    import pyarrow as pa

    if not self.pending:
      return
    cols = []
    for k, key in enumerate(("x", "y")):
      block = np.ascontiguousarray(np.concatenate([p[k] for p in self.pending]))
      self.digest.update(block.tobytes())
      cols.append(_arrow_array(block, self.features[key]))
    self.writer.write_batch(pa.RecordBatch.from_arrays(cols, schema=self._schema))
    self.pending, self.pending_bytes = [], 0

  def close(self) -> int:
    self.flush()
    self.writer.close()
    self._sink.close()
    with open(self.path, "rb+") as f:
      os.fsync(f.fileno())
    return os.path.getsize(self.path)


def _arrow_type(feature: Feature):
  import pyarrow as pa

  value = pa.from_numpy_dtype(np.dtype(feature.dtype))
  size = int(np.prod(feature.shape, dtype=np.int64))
  return pa.list_(value, size) if feature.shape else value


def _arrow_array(block: np.ndarray, feature: Feature):
  import pyarrow as pa

  if not feature.shape:
    return pa.array(block.reshape(-1))
  size = int(np.prod(feature.shape, dtype=np.int64))
  return pa.FixedSizeListArray.from_arrays(pa.array(block.reshape(-1)), size)


class StoreWriter:
  """Writes a :class:`ClientStore`, client after client, in bounded memory.

  Every client is added with :meth:`add` (its train and test rows; ids are ``0, 1, ...`` in that
  order), a central test set with :meth:`add_central`, then :meth:`finish` writes the index and the
  manifest and renames ``<path>.partial`` to ``<path>``. Used as a context manager, an exception
  removes the partial folder.

  Args:
    path: the store's folder (must not exist unless ``overwrite``).
    x: one example's input :class:`Feature`.
    y: one example's label :class:`Feature` (``()`` for a class label).
    source: the ``config.data`` block or source options the store is converted from (recorded;
      :func:`open_store` compares a run's with it).
    overwrite: replace an existing store at ``path`` once the new one is complete.
    batch_bytes: bytes of rows per Arrow record batch (a client larger than this is a batch of its own).

  Example:
    >>> import tempfile, numpy as np
    >>> path = tempfile.mkdtemp() + "/store"
    >>> x, y = Feature((2,), "float32"), Feature((), "int32")
    >>> with StoreWriter(path, x=x, y=y, source={"name": "toy"}) as w:
    ...   for n in (3, 1):
    ...     c = w.add((np.ones((n, 2), np.float32), np.zeros(n, np.int32)),
    ...               (np.ones((1, 2), np.float32), np.zeros(1, np.int32)))
    ...   store = w.finish(num_classes=2)
    >>> store.read([1, 0]).n.tolist(), store.read([1, 0]).x.shape
    ([1, 3], (2, 3, 2))
  """

  def __init__(self, path: str, *, x: Feature, y: Feature, source: dict[str, Any], overwrite: bool = False,
               batch_bytes: int = 32 << 20):
    self.path = os.path.abspath(path)
    if os.path.exists(self.path) and not overwrite:
      raise ValueError(f"{self.path} exists; choose another path or overwrite it (--overwrite)")
    self.features = {"x": Feature(tuple(int(d) for d in x.shape), np.dtype(x.dtype).name),
                     "y": Feature(tuple(int(d) for d in y.shape), np.dtype(y.dtype).name)}
    for k, f in self.features.items():
      if np.dtype(f.dtype).kind not in "iuf":
        raise ValueError(f"{k} dtype {f.dtype}: a store holds integer or float features")
    self.source = json.loads(json.dumps(dict(source), default=_json_default, sort_keys=True))
    self._batch_bytes = int(batch_bytes)
    self.partial = self.path + ".partial"
    if os.path.exists(self.partial):   # a conversion that stopped before it finished
      shutil.rmtree(self.partial)
    os.makedirs(self.partial)
    self._splits: dict[str, _SplitWriter] = {}
    for s in ("train", "test"):
      self._split(s)
    self._names: list[str] = []
    self._central_names: list[str] = []
    self._label_range = [np.inf, -np.inf]
    self._done = False

  def _split(self, name: str) -> _SplitWriter:
    if name not in self._splits:
      w = _SplitWriter(os.path.join(self.partial, name, DATA_FILE), self.features, self._batch_bytes)
      w.open()
      self._splits[name] = w
    return self._splits[name]

  def _rows(self, arrays, what: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = (np.asarray(a) for a in arrays)
    fx, fy = self.features["x"], self.features["y"]
    if x.shape[1:] != fx.shape or y.shape[1:] != fy.shape or len(x) != len(y):
      want = f"x [n, {', '.join(map(str, fx.shape))}], y [n{''.join(', ' + str(d) for d in fy.shape)}]"
      raise ValueError(f"{what}: x {x.shape} and y {y.shape} do not match the store's examples ({want})")
    x, y = x.astype(fx.dtype, copy=False), y.astype(fy.dtype, copy=False)
    if np.dtype(fx.dtype).kind == "f" and x.size and not np.isfinite(x).all():
      i = int(np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))[0])
      raise ValueError(f"{what}: example {i} holds a non-finite input; clean or drop it before converting")
    if y.size:
      lo, hi = self._label_range
      self._label_range = [min(lo, float(y.min())), max(hi, float(y.max()))]
    return x, y

  @property
  def label_range(self) -> tuple[float, float]:
    """The smallest and largest label added so far (``(inf, -inf)`` before any)."""
    return self._label_range[0], self._label_range[1]

  def add(self, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray] | None = None,
          *, name: str | None = None) -> int:
    """Adds the next client (``train`` and ``test`` as ``(x [n, ...], y [n, ...])``; no test rows
    when ``None``); returns its id.

    Raises:
      ValueError: rows of another shape than the store's, no training row, a non-finite input.
    """
    c = len(self._names)
    who = f"client {c}" + (f" ({name!r})" if name is not None else "")
    x, y = self._rows(train, f"{who}, train")
    if len(x) == 0:
      raise ValueError(f"{who} has no training examples; every client needs one")
    if test is None:
      fx, fy = self.features["x"], self.features["y"]
      test = (np.zeros((0,) + fx.shape, fx.dtype), np.zeros((0,) + fy.shape, fy.dtype))
    tx, ty = self._rows(test, f"{who}, test")
    self._splits["train"].add(x, y)
    self._splits["test"].add(tx, ty)
    self._names.append(str(c) if name is None else str(name))
    return c

  def add_central(self, x: np.ndarray, y: np.ndarray, *, name: str | None = None) -> None:
    """Adds rows of the central test set (one call per client of it, or one call for all)."""
    x, y = self._rows((x, y), f"central test set part {len(self._central_names)}")
    self._split("central").add(x, y)
    self._central_names.append(str(len(self._central_names)) if name is None else str(name))

  def finish(self, *, num_classes: int, label_kind: str | None = None, groups: np.ndarray | None = None,
             extras: dict[str, np.ndarray] | None = None) -> ClientStore:
    """Writes the index and the manifest, renames the folder into place and opens the store.

    Args:
      num_classes: label values (every real label must be below it).
      label_kind: one of :data:`LABEL_KINDS`; default ``"class"`` for scalar labels, ``"tokens"``
        for labels shaped like the inputs.
      groups: the group of every client, ``int[C]`` or ``int[L, C]`` coarsest first.
      extras: more arrays kept in the index (``group_names``, ``vocab``, ...).

    Raises:
      ValueError: no client, a label outside ``[0, num_classes)``, groups of another length.
    """
    c = len(self._names)
    if c == 0:
      raise ValueError(f"store {self.path}: no client was added")
    kind = label_kind or ("class" if not self.features["y"].shape else "tokens")
    if kind not in LABEL_KINDS:
      raise ValueError(f"label_kind={kind!r}; choose one of {LABEL_KINDS}")
    lo, hi = self._label_range
    if kind != "multi_hot" and (lo < 0 or hi >= int(num_classes)):
      raise ValueError(f"store {self.path}: labels span [{lo:g}, {hi:g}], outside [0, {num_classes}) "
                       f"(num_classes={num_classes})")
    index: dict[str, np.ndarray] = {f"{s}_counts": np.asarray(w.counts, np.int64)
                                    for s, w in self._splits.items()}
    index["client_names"] = np.asarray(self._names)
    if self._central_names:
      index["central_client_names"] = np.asarray(self._central_names)
    if groups is not None:
      groups = np.asarray(groups, np.int32)
      if groups.shape[-1] != c or groups.ndim not in (1, 2):
        raise ValueError(f"groups has shape {groups.shape}; need [C] or [L, C] with C={c}")
      index["groups"] = groups
    for k, v in (extras or {}).items():
      index[k] = np.asarray(v)
    splits = {}
    for s, w in self._splits.items():
      size = w.close()
      splits[s] = dict(rows=w.rows, clients=len(w.counts), bytes=size)
    manifest = dict(format=FORMAT, version=VERSION, complete=False, num_clients=c,
                    num_classes=int(num_classes), label_kind=kind,
                    features={k: dict(shape=list(f.shape), dtype=f.dtype) for k, f in self.features.items()},
                    splits=splits, source=self.source)
    manifest["fingerprint"] = _fingerprint(manifest, index, {s: None for s in splits},
                                           digests={s: w.digest.hexdigest() for s, w in self._splits.items()})
    manifest["complete"] = True
    np.savez(os.path.join(self.partial, INDEX), **index)
    _write_json(os.path.join(self.partial, MANIFEST), manifest)
    if os.path.exists(self.path):
      old = self.path + ".old"
      shutil.rmtree(old, ignore_errors=True)
      os.replace(self.path, old)
      os.replace(self.partial, self.path)
      shutil.rmtree(old)
    else:
      os.replace(self.partial, self.path)
    self._done = True
    return open_store(self.path)

  def abort(self) -> None:
    """Removes the partial folder (nothing is left at ``path``)."""
    if not self._done:
      for w in self._splits.values():
        if w.writer is not None:
          try:
            w.writer.close()
            w._sink.close()
          except Exception:  # noqa: BLE001 - already closed or broken: the folder goes anyway
            pass
      shutil.rmtree(self.partial, ignore_errors=True)
      self._done = True

  def __enter__(self) -> StoreWriter:
    return self

  def __exit__(self, kind, value, traceback) -> None:
    if kind is not None or not self._done:
      self.abort()


def _write_json(path: str, blob: dict) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(blob, f, indent=1, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def _fingerprint(manifest: dict, index: dict[str, np.ndarray], splits: dict[str, Iterable | None], *,
                 digests: dict[str, str] | None = None) -> str:
  """sha256 over the schema, the index arrays and every split's rows (batch by batch, ``x`` then
  ``y``; ``digests``: the splits' row digests already computed while writing)."""
  h = hashlib.sha256()
  h.update(json.dumps([manifest["features"], manifest["num_classes"], manifest["label_kind"]],
                      sort_keys=True).encode())
  for k in sorted(index):
    h.update(k.encode())
    h.update(np.ascontiguousarray(index[k]).tobytes())
  for s in sorted(splits):
    if digests is not None:
      h.update(digests[s].encode())
      continue
    d = hashlib.sha256()
    for x, y in splits[s]:
      d.update(np.ascontiguousarray(x).tobytes())
      d.update(np.ascontiguousarray(y).tobytes())
    h.update(d.hexdigest().encode())
  return h.hexdigest()


def write_federated_data(path: str, data: FederatedData, *, source: dict[str, Any],
                         groups: np.ndarray | None = None,
                         central: tuple[np.ndarray, np.ndarray] | None = None,
                         extras: dict[str, np.ndarray] | None = None,
                         client_names: Sequence[str] | None = None, overwrite: bool = False,
                         progress: bool = False) -> ClientStore:
  """Writes resident :class:`~fedtree.core.data.FederatedData` (padded or ragged) to a store.

  Args:
    path: the store's folder.
    data: the clients' data.
    source: the ``config.data`` block it was loaded from (recorded).
    groups: ``int[C]`` or ``int[L, C]`` group labels.
    central: a central test set ``(x, y)``.
    extras: more index arrays (``group_names``, ``vocab``).
    client_names: the source's name of every client.
    overwrite: replace an existing store.
    progress: a progress bar (tqdm).

  Returns:
    The opened :class:`ClientStore`; ``store.read(ids)`` gives bitwise the rows of ``data.take(ids)``.
  """
  import tqdm

  x_test, y_test = np.asarray(data.x_test), np.asarray(data.y_test)
  n_train, n_test = np.asarray(data.n_train), np.asarray(data.n_test)
  x_train, y_train = np.asarray(data.x_train), np.asarray(data.y_train)
  offsets = np.asarray(data.train_offset) if data.ragged else None
  lead = 1 if data.ragged else 2
  x = Feature(tuple(x_train.shape[lead:]), x_train.dtype.name)
  y = Feature(tuple(y_train.shape[lead:]), y_train.dtype.name)
  names = list(client_names) if client_names is not None else [None] * data.num_clients
  with StoreWriter(path, x=x, y=y, source=source, overwrite=overwrite) as w:
    for c in tqdm.trange(data.num_clients, disable=not progress, desc="clients", unit="client"):
      n, m = int(n_train[c]), int(n_test[c])
      if offsets is None:
        train = (x_train[c, :n], y_train[c, :n])
      else:
        o = int(offsets[c])
        train = (x_train[o:o + n], y_train[o:o + n])
      w.add(train, (x_test[c, :m], y_test[c, :m]), name=names[c])
    if central is not None:
      w.add_central(np.asarray(central[0]), np.asarray(central[1]))
    return w.finish(num_classes=data.num_classes, groups=groups, extras=extras)
