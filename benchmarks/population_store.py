r"""Populations on disk: which file format a store of client data should use, measured.

  python -m benchmarks.population_store                      # 20,000 clients, every format
  python -m benchmarks.population_store --clients=2000 --cohorts=50
  python -m benchmarks.population_store --write-h5=DIR --clients=342477   # the synthetic TFF h5 files
  python -m benchmarks.population_store --store=STORE --round-s=0.05      # cohorts read from a store

**The comparison.** The same synthetic StackOverflow-shaped population (:func:`client_sizes`:
long-tailed sentence counts, at most 1,000 per client; every sentence ``x`` and ``y`` of 20
``int32`` tokens, as :func:`fedtree.datasets.text.encode_sentences` makes them) is written in each
candidate format, client after client, the train split only, then read back by random cohorts
(50 client ids drawn uniformly, all their rows, into the padded ``[50, W, 20]`` blocks the
device takes). For each format it prints the conversion time (writing only; the population is
generated beforehand), the bytes on disk, and cohorts read per second twice: *warm* (best of
three passes over the cohorts; the files in the page cache, as after the first reads of a run
whose store fits in memory) and *cold* (every file's cached pages dropped with
``posix_fadvise(DONTNEED)`` before each cohort, so the cohort's rows come from the disk), each as a
ratio to the best. Candidates, each in its random-access setting:

* ``arrow``: Apache Arrow IPC files as Hugging Face ``datasets`` writes them, opened with
  ``datasets.Dataset.from_file`` (memory-mapped); a client's rows are a zero-copy slice of the
  mapped table;
* ``array_record``: ArrayRecord files (``group_size:1``, one record per client: its rows' bytes),
  read with Grain's ``ArrayRecordDataSource`` (one batched ``__getitems__`` per cohort); with its
  default zstd compression and uncompressed;
* ``hdf5``: one ``[N, 20]`` dataset per array (h5py), contiguous, and chunked (1,024 rows) with
  gzip level 4; a client's rows are one slice;
* ``zarr3``: a tensorstore zarr v3 array per array, chunks of 4,096 rows with zstd; a cohort's
  slices read concurrently.

**A converted store** (``--store``): random cohorts read from it warm and cold, and the share of
a loop's time spent waiting for data when a :class:`fedtree.population.reader.CohortReader` reads
``--depth`` cohorts ahead of rounds of ``--round-s`` seconds (a sleep), against depth 0.

**The synthetic TFF files** (``--write-h5``): :func:`write_stackoverflow_h5` writes
``stackoverflow_train.h5`` and ``stackoverflow_test.h5`` in TFF's layout (``examples/<client
id>/tokens``: one byte string of space-separated words per sentence) with StackOverflow's shape:
342,477 clients by default, :func:`client_sizes` sentences each for training, about a tenth as
many for test (clients with none are absent from the test file, as in TFF's), words drawn from a
Zipf-like law over 12,000 words (so the 10,000 most frequent of a vocabulary of 10,004 leave some
out of vocabulary), 1 to 40 words a sentence. Written client by client (memory stays flat).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np

RESULTS = os.path.join(os.path.dirname(__file__), "results")
SEQ_LEN = 20
SO_CLIENTS = 342_477
SO_MEAN_SENTENCES = 135_818_730 / 342_477
"""TFF StackOverflow's training sentences per client (135,818,730 over 342,477 clients), before the
1,000-sentence cap of Reddi et al. 2021."""
SIGMA = 1.5
MAX_SENTENCES = 1000


def client_sizes(num_clients: int, seed: int = 0, *, cap: int = MAX_SENTENCES) -> np.ndarray:
  """``int64[num_clients]`` training sentences per client: lognormal with StackOverflow's mean
  (:data:`SO_MEAN_SENTENCES`) and ``sigma`` 1.5, at least 1, at most ``cap`` (about 263 a client
  on average after the cap)."""
  mu = np.log(SO_MEAN_SENTENCES) - SIGMA ** 2 / 2
  n = np.random.default_rng([seed, 0]).lognormal(mu, SIGMA, num_clients)
  return np.clip(n.astype(np.int64), 1, cap)


def _word_probabilities(num_words: int) -> np.ndarray:
  p = 1.0 / (np.arange(num_words) + 10.0) ** 1.1
  return p / p.sum()


def client_tokens(c: int, n: int, seed: int = 0, *, vocab_size: int = 10_004,
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Client ``c``'s ``n`` sentences as ``(x, y)`` ``int32[n, 20]`` token ids in fedtree's text
  layout (``x = [BOS, t...]``, ``y = [t..., EOS]``, 0-padded; :mod:`fedtree.datasets.text`),
  deterministic in ``(seed, c)``."""
  rng = np.random.default_rng([seed, 1, c])
  lengths = np.minimum(1 + rng.poisson(11, n), SEQ_LEN)
  ids = rng.choice(vocab_size - 4, size=(n, SEQ_LEN), p=_word_probabilities(vocab_size - 4)) + 4
  seq = np.concatenate([np.full((n, 1), 2), ids, np.zeros((n, 1), np.int64)], axis=1)
  seq[np.arange(n), lengths + 1] = 3                    # EOS after the words
  pos = np.arange(SEQ_LEN + 2)[None, :]
  seq = np.where(pos <= lengths[:, None] + 1, seq, 0)
  return seq[:, :SEQ_LEN].astype(np.int32), seq[:, 1:SEQ_LEN + 1].astype(np.int32)


# ------------------------------------------------------------------ the synthetic TFF h5 files
def write_stackoverflow_h5(directory: str, num_clients: int = SO_CLIENTS, *, seed: int = 0,
                           num_words: int = 12_000, progress: bool = True) -> tuple[str, str]:
  """Writes ``stackoverflow_{train,test}.h5`` in TFF's layout into ``directory`` (see the module
  docstring); returns their paths."""
  import h5py
  import tqdm

  os.makedirs(directory, exist_ok=True)
  words = np.asarray([f"w{i}".encode() for i in range(num_words)], dtype=object)
  p = _word_probabilities(num_words)
  sizes = client_sizes(num_clients, seed)
  paths = tuple(os.path.join(directory, f"stackoverflow_{s}.h5") for s in ("train", "test"))
  text = h5py.string_dtype(encoding="utf-8")
  with h5py.File(paths[0], "w") as train, h5py.File(paths[1], "w") as test:
    groups = (train.create_group("examples"), test.create_group("examples"))
    for c in tqdm.trange(num_clients, disable=not progress, desc="synthetic StackOverflow h5", unit="client",
                         mininterval=2.0):
      rng = np.random.default_rng([seed, 2, c])
      n_train = int(sizes[c])
      n_test = int(rng.binomial(n_train, 0.1))
      n = n_train + n_test
      lengths = 1 + np.minimum(rng.poisson(11, n), 39)
      ids = rng.choice(num_words, size=int(lengths.sum()), p=p)
      flat = words[ids]
      cuts = np.cumsum(lengths)[:-1]
      sentences = [b" ".join(s) for s in np.split(flat, cuts)]
      name = f"{c:08d}"
      groups[0].create_group(name).create_dataset("tokens", data=sentences[:n_train], dtype=text)
      if n_test:
        groups[1].create_group(name).create_dataset("tokens", data=sentences[n_train:], dtype=text)
  return paths


# ------------------------------------------------------------------ the formats compared
class _Arrow:
  name, variant = "arrow", "memory-mapped (datasets.Dataset.from_file)"

  def write(self, root, clients):
    import pyarrow as pa

    path = os.path.join(root, "train.arrow")
    fields = [pa.field(k, pa.list_(pa.int32(), SEQ_LEN)) for k in ("x", "y")]
    schema = pa.schema(fields)
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
      pending, rows = [], 0
      for x, y in clients:
        pending.append((x, y))
        rows += len(x)
        if rows >= 16_384:
          writer.write_batch(_arrow_batch(pending, schema))
          pending, rows = [], 0
      if pending:
        writer.write_batch(_arrow_batch(pending, schema))
    return [path]

  def open(self, root, offsets):
    import datasets

    self.table = datasets.Dataset.from_file(os.path.join(root, "train.arrow")).data.table
    # every record batch's values as a numpy view of the mapped file (nothing read yet)
    self.views = {k: [c.flatten().to_numpy(zero_copy_only=True).reshape(-1, SEQ_LEN)
                      for c in self.table.column(k).chunks] for k in ("x", "y")}
    self.starts = np.concatenate([[0], np.cumsum([len(v) for v in self.views["x"]])])
    self.offsets = offsets

  def read(self, ids, width):
    out = [np.zeros((len(ids), width, SEQ_LEN), np.int32) for _ in range(2)]
    for i, c in enumerate(ids):
      o, e = int(self.offsets[c]), int(self.offsets[c + 1])
      b = int(np.searchsorted(self.starts, o, side="right")) - 1
      at = 0
      while o < e:   # the client's rows may span record batches
        end = min(e, int(self.starts[b + 1]))
        for k, key in enumerate(("x", "y")):
          out[k][i, at:at + end - o] = self.views[key][b][o - self.starts[b]:end - self.starts[b]]
        at, o, b = at + end - o, end, b + 1
    return out

  def close(self):
    del self.table, self.views


def _arrow_batch(pending, schema):
  import pyarrow as pa

  cols = []
  for k in range(2):
    flat = np.concatenate([p[k] for p in pending]).reshape(-1)
    cols.append(pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.int32()), SEQ_LEN))
  return pa.RecordBatch.from_arrays(cols, schema=schema)


class _ArrayRecord:
  name = "array_record"

  def __init__(self, compression: str | None):
    self.compression = compression
    self.variant = f"group_size:1, {compression or 'uncompressed'} (grain ArrayRecordDataSource)"

  def write(self, root, clients):
    from array_record.python.array_record_module import ArrayRecordWriter

    path = os.path.join(root, "train.array_record")
    options = "group_size:1," + (f"{self.compression}" if self.compression else "uncompressed")
    writer = ArrayRecordWriter(path, options)
    for x, y in clients:
      writer.write(x.tobytes() + y.tobytes())
    writer.close()
    return [path]

  def open(self, root, offsets):
    import grain.python as grain

    self.source = grain.ArrayRecordDataSource([os.path.join(root, "train.array_record")])
    self.counts = np.diff(offsets)

  def read(self, ids, width):
    records = self.source.__getitems__([int(c) for c in ids])
    out = [np.zeros((len(ids), width, SEQ_LEN), np.int32) for _ in range(2)]
    for i, (c, rec) in enumerate(zip(ids, records, strict=True)):
      n = int(self.counts[c])
      v = np.frombuffer(rec, np.int32).reshape(2, n, SEQ_LEN)
      out[0][i, :n], out[1][i, :n] = v[0], v[1]
    return out

  def close(self):
    self.source.__exit__(None, None, None) if hasattr(self.source, "__exit__") else None
    del self.source


class _HDF5:
  name = "hdf5"

  def __init__(self, compression: str | None):
    self.compression = compression
    self.variant = "contiguous" if compression is None else f"chunks of 1,024 rows, {compression}"

  def write(self, root, clients, total_rows):
    import h5py

    path = os.path.join(root, "train.h5")
    opts = {} if self.compression is None else dict(chunks=(1024, SEQ_LEN), compression="gzip",
                                                    compression_opts=4)
    with h5py.File(path, "w") as f:
      arrays = [f.create_dataset(k, (total_rows, SEQ_LEN), np.int32, **opts) for k in ("x", "y")]
      at = 0
      for x, y in clients:
        arrays[0][at:at + len(x)] = x
        arrays[1][at:at + len(x)] = y
        at += len(x)
    return [path]

  def open(self, root, offsets):
    import h5py

    self.file = h5py.File(os.path.join(root, "train.h5"), "r")
    self.arrays = (self.file["x"], self.file["y"])
    self.offsets = offsets

  def read(self, ids, width):
    out = [np.zeros((len(ids), width, SEQ_LEN), np.int32) for _ in range(2)]
    for i, c in enumerate(ids):
      o, e = int(self.offsets[c]), int(self.offsets[c + 1])
      for k in range(2):
        self.arrays[k].read_direct(out[k], np.s_[o:e], np.s_[i, :e - o])
    return out

  def close(self):
    self.file.close()


class _Zarr:
  name, variant = "zarr3", "tensorstore, chunks of 4,096 rows, zstd"

  def write(self, root, clients, total_rows):
    import tensorstore as ts

    arrays = [ts.open(self._spec(root, k, total_rows), create=True, delete_existing=True).result()
              for k in ("x", "y")]
    pending, at, start = [], 0, 0
    for x, y in clients:   # written in whole chunks (a partial chunk written twice costs twice)
      pending.append((x, y))
      at += len(x)
      if at - start >= 4096 * 16 or at == total_rows:
        for k in range(2):
          block = np.concatenate([p[k] for p in pending])
          arrays[k][start:at].write(block).result()
        pending, start = [], at
    return [os.path.join(root, k) for k in ("x", "y")]

  @staticmethod
  def _spec(root, key, rows):
    return {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(root, key)},
            "metadata": {"shape": [rows, SEQ_LEN], "data_type": "int32",
                         "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4096, SEQ_LEN]}},
                         "codecs": [{"name": "bytes"}, {"name": "zstd", "configuration": {"level": 3}}]}}

  def open(self, root, offsets):
    import tensorstore as ts

    self.arrays = [ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(root, k)}},
                           context=ts.Context({"cache_pool": {"total_bytes_limit": 0}})).result()
                   for k in ("x", "y")]
    self.offsets = offsets

  def read(self, ids, width):
    futures = [[a[int(self.offsets[c]):int(self.offsets[c + 1])].read() for a in self.arrays] for c in ids]
    out = [np.zeros((len(ids), width, SEQ_LEN), np.int32) for _ in range(2)]
    for i, fs in enumerate(futures):
      for k, f in enumerate(fs):
        v = f.result()
        out[k][i, :len(v)] = v
    return out

  def close(self):
    del self.arrays


FORMATS = {
  "arrow": _Arrow,
  "array_record": lambda: _ArrayRecord(None),
  "array_record_zstd": lambda: _ArrayRecord("zstd"),
  "hdf5": lambda: _HDF5(None),
  "hdf5_gzip": lambda: _HDF5("gzip"),
  "zarr3": _Zarr,
}


def _disk_bytes(paths) -> int:
  total = 0
  for p in paths:
    if os.path.isdir(p):
      for dirpath, _, files in os.walk(p):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    else:
      total += os.path.getsize(p)
  return total


def _evict(paths) -> None:
  """Drops the cached pages of every file under ``paths`` (``posix_fadvise(DONTNEED)``: this
  process's files only, the rest of the page cache untouched)."""
  for p in paths:
    files = [p] if not os.path.isdir(p) else [os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs]
    for f in files:
      fd = os.open(f, os.O_RDONLY)
      try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
      finally:
        os.close(fd)


def compare(num_clients: int = 20_000, *, cohort: int = 50, cohorts: int = 200, cold_cohorts: int = 30,
            formats=tuple(FORMATS), seed: int = 0, root: str | None = None) -> list[dict]:
  """Writes the population in every format of ``formats`` and times it; returns one row each."""
  sizes = client_sizes(num_clients, seed)
  offsets = np.concatenate([[0], np.cumsum(sizes)])
  pop = [client_tokens(c, int(n), seed) for c, n in enumerate(sizes)]
  width = int(sizes.max())
  rng = np.random.default_rng([seed, 3])
  draws = [rng.choice(num_clients, cohort, replace=False) for _ in range(cohorts)]
  rows = []
  base = tempfile.mkdtemp(prefix="population_store_", dir=root)
  try:
    for name in formats:
      fmt = FORMATS[name]()
      where = os.path.join(base, name)
      os.makedirs(where)
      t0 = time.perf_counter()
      args = (iter(pop),) if name in ("arrow",) or name.startswith("array_record") else \
        (iter(pop), int(offsets[-1]))
      paths = fmt.write(where, *args)
      for p in paths:   # on disk, not in the page cache only: part of the conversion
        _sync(p)
      convert_s = time.perf_counter() - t0
      fmt.open(where, offsets)
      got = fmt.read(draws[0], width)   # read back what was written
      for k in range(2):
        for i, c in enumerate(draws[0]):
          np.testing.assert_array_equal(got[k][i, :sizes[c]], pop[c][k])
      fmt.read(draws[0], width)
      warm = 0.0
      for _ in range(3):   # the best of three passes (the machine is shared)
        t0 = time.perf_counter()
        for ids in draws:
          fmt.read(ids, width)
        warm = max(warm, cohorts / (time.perf_counter() - t0))
      cold_time = 0.0
      for ids in draws[:cold_cohorts]:
        _evict(paths)
        t0 = time.perf_counter()
        fmt.read(ids, width)
        cold_time += time.perf_counter() - t0
      fmt.close()
      rows.append(dict(format=name, variant=fmt.variant, convert_s=convert_s, disk_bytes=_disk_bytes(paths),
                       warm_cohorts_per_s=warm, cold_cohorts_per_s=cold_cohorts / cold_time))
      shutil.rmtree(where)
  finally:
    shutil.rmtree(base, ignore_errors=True)
  return rows


def _sync(path):
  files = [path] if not os.path.isdir(path) else \
    [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
  for f in files:
    fd = os.open(f, os.O_RDONLY)
    try:
      os.fsync(fd)
    finally:
      os.close(fd)


def measure_store(path: str, *, cohort: int = 50, cohorts: int = 200, cold_cohorts: int = 30,
                  round_s: float = 0.05, depth: int = 2, seed: int = 0) -> dict:
  """Random cohorts read from an existing store (``python -m fedtree.convert``'s), warm and cold,
  and a :class:`fedtree.population.reader.CohortReader` feeding a loop whose rounds take
  ``round_s`` seconds (a sleep standing in for training): its stall fraction at ``depth`` and at
  depth 0 (every cohort read when the round asks for it)."""
  from fedtree.population import CohortReader, open_store

  store = open_store(path)
  rng = np.random.default_rng([seed, 4])
  draws = [rng.choice(store.num_clients, cohort, replace=False) for _ in range(cohorts)]
  store.read(draws[0])
  warm = 0.0
  for _ in range(3):
    t0 = time.perf_counter()
    for ids in draws:
      store.read(ids)
    warm = max(warm, cohorts / (time.perf_counter() - t0))
  files = [os.path.join(store.path, s, "data.arrow") for s in store.splits]
  cold = 0.0
  for ids in draws[:cold_cohorts]:
    _evict(files)
    t0 = time.perf_counter()
    store.read(ids)
    cold += time.perf_counter() - t0
  stalls = {}
  for d in (depth, 0):
    _evict(files)
    with CohortReader(store, draws, depth=d) as reader:
      for _ in reader:
        time.sleep(round_s)
    stalls[d] = reader.stats.stall_fraction
  return dict(store=path, clients=store.num_clients, rows=int(store.counts().sum()), width=store.width(),
              cohort=cohort, warm_cohorts_per_s=warm, cold_cohorts_per_s=cold_cohorts / cold, round_s=round_s,
              depth=depth, stall_fraction=stalls[depth], stall_fraction_depth0=stalls[0],
              block_mb=store.read(draws[0]).nbytes / 1e6)


def table(rows: list[dict]) -> str:
  """The comparison as text: every figure and its ratio to the best of its column."""
  best_convert = min(r["convert_s"] for r in rows)
  best_disk = min(r["disk_bytes"] for r in rows)
  best_warm = max(r["warm_cohorts_per_s"] for r in rows)
  best_cold = max(r["cold_cohorts_per_s"] for r in rows)
  lines = [f"{'format':<18} {'convert s':>10} {'x best':>7} {'disk MB':>9} {'x best':>7} "
           f"{'warm cohorts/s':>15} {'/ best':>7} {'cold cohorts/s':>15} {'/ best':>7}"]
  for r in rows:
    lines.append(
      f"{r['format']:<18} {r['convert_s']:>10.2f} {r['convert_s'] / best_convert:>7.2f} "
      f"{r['disk_bytes'] / 1e6:>9.1f} {r['disk_bytes'] / best_disk:>7.2f} "
      f"{r['warm_cohorts_per_s']:>15.1f} {r['warm_cohorts_per_s'] / best_warm:>7.2f} "
      f"{r['cold_cohorts_per_s']:>15.1f} {r['cold_cohorts_per_s'] / best_cold:>7.2f}")
  return "\n".join(lines)


def main(argv=None) -> list[dict] | tuple[str, str]:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--clients", type=int, default=None, help="clients (20,000 compared; 342,477 written)")
  p.add_argument("--cohort", type=int, default=50)
  p.add_argument("--cohorts", type=int, default=200, help="cohorts read warm")
  p.add_argument("--cold-cohorts", type=int, default=30, help="cohorts read cold")
  p.add_argument("--formats", default=",".join(FORMATS))
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--root", default=None, help="where the formats are written (default: the temp dir)")
  p.add_argument("--write-h5", default=None, metavar="DIR",
                 help="write the synthetic TFF StackOverflow h5 files into DIR instead")
  p.add_argument("--store", default=None, metavar="DIR",
                 help="read random cohorts from this store (python -m fedtree.convert's) instead")
  p.add_argument("--round-s", type=float, default=0.05, help="--store: the simulated round's seconds")
  p.add_argument("--depth", type=int, default=2, help="--store: the reader's depth")
  p.add_argument("--tag", default="population_store")
  p.add_argument("--out-dir", default=RESULTS)
  args = p.parse_args(argv)
  if args.write_h5:
    t0 = time.perf_counter()
    paths = write_stackoverflow_h5(args.write_h5, args.clients or SO_CLIENTS, seed=args.seed)
    print(f"wrote {paths[0]} ({os.path.getsize(paths[0]) / 1e9:.2f} GB) and {paths[1]} "
          f"({os.path.getsize(paths[1]) / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s")
    return paths
  if args.store:
    r = measure_store(args.store, cohort=args.cohort, cohorts=args.cohorts, cold_cohorts=args.cold_cohorts,
                      round_s=args.round_s, depth=args.depth, seed=args.seed)
    print(f"{r['store']}: {r['clients']:,} clients, {r['rows']:,} train rows (widest {r['width']}); cohorts "
          f"of {r['cohort']} ({r['block_mb']:.1f} MB blocks): {r['warm_cohorts_per_s']:.1f}/s warm, "
          f"{r['cold_cohorts_per_s']:.1f}/s cold; {len(range(args.cohorts))} rounds of {r['round_s']} s wait "
          f"{100 * r['stall_fraction']:.2f} % of the time for data at depth {r['depth']}, "
          f"{100 * r['stall_fraction_depth0']:.2f} % at depth 0 (from cold files)")
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, f"{args.tag}.json"), "w") as f:
      json.dump(dict(results=[r]), f, indent=1)
    return [r]
  formats = tuple(f for f in args.formats.split(",") if f)
  unknown = sorted(set(formats) - set(FORMATS))
  if unknown:
    raise SystemExit(f"--formats={args.formats}: unknown {unknown}; choose among {sorted(FORMATS)}")
  rows = compare(args.clients or 20_000, cohort=args.cohort, cohorts=args.cohorts,
                 cold_cohorts=args.cold_cohorts, formats=formats, seed=args.seed, root=args.root)
  sizes = client_sizes(args.clients or 20_000, args.seed)
  head = (f"{args.clients or 20_000:,} clients, {int(sizes.sum()):,} sentences (x, y int32[{SEQ_LEN}]; "
          f"{int(sizes.min())} to {int(sizes.max())} per client), cohorts of {args.cohort}")
  text = head + "\n" + table(rows)
  print(text)
  os.makedirs(args.out_dir, exist_ok=True)
  with open(os.path.join(args.out_dir, f"{args.tag}.json"), "w") as f:
    json.dump(dict(setting=head, table=text, results=rows), f, indent=1)
  return rows


if __name__ == "__main__":
  main()
