"""The rows of the next rounds' cohorts, read on the host while this round trains.

:class:`CohortReader` takes the cohorts of the rounds to come (client ids per round, a sequence
indexed by round: the draws of a sampler that does not depend on the rounds' outcomes) and hands
over, round after round, in order, every cohort's padded block (:class:`ClientBlock`). It reads up
to ``depth`` cohorts ahead in background threads through Grain's prefetch
(``grain.MapDataset.source(cohorts).map(read).to_iter_dataset(grain.ReadOptions(...))``: a
thread pool and an ordered buffer of futures), optionally keeping clients' rows in a bytes-bounded
LRU cache by client id, and measures how long its consumer waited for data (the stall fraction).
``depth=0`` reads each cohort when it is asked for (a draw that depends on the last round).
Threads, not processes: a cohort is a few memory copies out of the store's memory-mapped files,
which numpy makes without holding the GIL, and a worker process would pickle every block back.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from fedtree.population.store import ClientBlock, ClientStore


class ReaderStats(NamedTuple):
  """How a :class:`CohortReader`'s consumer was served.

  Attributes:
    cohorts: blocks handed over.
    wait_s: seconds the consumer spent waiting for a block (inside ``next``).
    busy_s: seconds the consumer spent between handovers (its own work: the round).
    cache_hits: clients served from the cache.
    cache_misses: clients read from the store.
  """

  cohorts: int
  wait_s: float
  busy_s: float
  cache_hits: int
  cache_misses: int

  @property
  def stall_fraction(self) -> float:
    """The share of the consumer's time spent waiting for data, ``wait / (wait + busy)``."""
    total = self.wait_s + self.busy_s
    return self.wait_s / total if total > 0 else 0.0


class _LRU:
  """Clients' rows by client id, least recently used evicted first, at most ``capacity`` bytes.

  Safe for the reader's threads: a client that two cohorts read ahead at once is read from the
  store once; the second thread waits for the first thread's read (a hit, not a miss).
  """

  def __init__(self, capacity: int):
    self.capacity = int(capacity)
    self.bytes = 0
    self._items: collections.OrderedDict[int, tuple[np.ndarray, np.ndarray]] = collections.OrderedDict()
    self._reading: dict[int, concurrent.futures.Future] = {}
    self._lock = threading.Lock()
    self.hits = 0
    self.misses = 0

  def get_or_read(self, key: int, read: Callable[[int], tuple[np.ndarray, np.ndarray]]):
    """The rows of ``key``: from the cache, from another thread's read of it, or ``read(key)``."""
    with self._lock:
      rows = self._items.get(key)
      if rows is not None:
        self._items.move_to_end(key)
        self.hits += 1
        return rows
      pending = self._reading.get(key)
      if pending is not None:
        self.hits += 1
      else:
        self.misses += 1
        self._reading[key] = mine = concurrent.futures.Future()
    if pending is not None:
      return pending.result()
    try:
      rows = read(key)
    except BaseException as e:
      with self._lock:
        del self._reading[key]
      mine.set_exception(e)
      raise
    with self._lock:
      del self._reading[key]
      self._put(key, rows)
    mine.set_result(rows)
    return rows

  def _put(self, key: int, rows: tuple[np.ndarray, np.ndarray]) -> None:
    size = rows[0].nbytes + rows[1].nbytes
    if key in self._items or size > self.capacity:
      return
    self._items[key] = rows
    self.bytes += size
    while self.bytes > self.capacity:
      _, old = self._items.popitem(last=False)
      self.bytes -= old[0].nbytes + old[1].nbytes


def cohort_bytes(store: ClientStore, cohort_size: int, split: str = "train") -> int:
  """Bytes of the rows of the ``cohort_size`` largest clients of ``split``: the most one cohort holds."""
  counts = np.sort(store.counts(split))[::-1][: int(cohort_size)]
  return int(counts.sum()) * store.example_bytes()


class CohortReader:
  """Hands over the blocks of the cohorts to come, read ahead in the background.

  Args:
    store: the population.
    cohorts: the client ids of every round's cohort (``int[K]`` each), a sequence indexed by round:
      a list, or any object with ``__len__`` and ``__getitem__`` (drawn when asked for).
    split: the split read.
    width: rows per client in a block (default: the split's widest client, the resident layout).
    depth: cohorts read ahead of the one handed over (0: each read when asked for).
    cache_bytes: an LRU cache of clients' rows by client id, at most this many bytes (0: none).
    start: the first round handed over (a resumed run's).
    transfer: applied to every block in the background after it is read (e.g. ``jax.device_put``:
      the next cohort then waits on the device).

  Raises:
    ValueError: ``depth < 0``, ``start`` outside the rounds, or a cache smaller than one cohort
      (:func:`cohort_bytes` of the first cohort's size), naming the bytes needed.

  Example:
    >>> import tempfile, numpy as np
    >>> from fedtree.datasets.synthetic import synthetic_alpha_beta
    >>> from fedtree.population.store import write_federated_data
    >>> data = synthetic_alpha_beta(num_clients=6, seed=0)
    >>> store = write_federated_data(tempfile.mkdtemp() + "/s", data, source={"name": "synthetic"})
    >>> with CohortReader(store, [np.array([0, 3]), np.array([5, 1])], depth=1) as reader:
    ...   blocks = list(reader)
    >>> [b.n.tolist() for b in blocks] == [data.n_train[[0, 3]].tolist(), data.n_train[[5, 1]].tolist()]
    True
  """

  def __init__(self, store: ClientStore, cohorts: Sequence[Any], *, split: str = "train",
               width: int | None = None, depth: int = 2, cache_bytes: int = 0, start: int = 0,
               transfer: Callable[[ClientBlock], Any] | None = None):
    import grain

    if int(depth) < 0:
      raise ValueError(f"depth={depth} must be >= 0 (0: read every cohort when it is asked for)")
    if not 0 <= int(start) <= len(cohorts):
      raise ValueError(f"start={start} is outside the {len(cohorts)} rounds of cohorts")
    self.store, self.split = store, split
    self.width = store.width(split) if width is None else int(width)
    self._cache = None
    if cache_bytes:
      k = len(np.asarray(cohorts[int(start)])) if int(start) < len(cohorts) else 0
      need = cohort_bytes(store, k, split)
      if int(cache_bytes) < need:
        raise ValueError(f"cache_bytes={cache_bytes} is smaller than one cohort: {k} clients hold up to "
                         f"{need} bytes of {split} rows (the {k} largest clients); set cache_bytes >= "
                         f"{need}, or 0 for no cache")
      self._cache = _LRU(int(cache_bytes))
    self._transfer = transfer
    ds = grain.MapDataset.source(cohorts)[int(start):].map(self._read)
    threads = min(int(depth), 4)
    options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=int(depth))
    self._iter = iter(ds.to_iter_dataset(options))
    self._handed, self._wait, self._busy, self._last = 0, 0.0, 0.0, None

  def _read(self, ids) -> Any:
    ids = self.store.check_clients(ids, self.split)
    if self._cache is None:
      block = self.store.read(ids, self.split, width=self.width)
    else:
      block = self._read_cached(ids)
    return block if self._transfer is None else self._transfer(block)

  def _read_cached(self, ids: np.ndarray) -> ClientBlock:
    counts = self.store.counts(self.split)[ids]
    over = np.flatnonzero(counts > self.width)
    if over.size:   # the store names the client and the width
      self.store.read(ids[over[:1]], self.split, width=self.width)
    feats = self.store.features
    x = np.zeros((len(ids), self.width) + feats["x"].shape, feats["x"].dtype)
    y = np.zeros((len(ids), self.width) + feats["y"].shape, feats["y"].dtype)
    for i, c in enumerate(ids):
      rows = self._cache.get_or_read(int(c), self._read_client)
      x[i, : len(rows[0])], y[i, : len(rows[1])] = rows
    return ClientBlock(x=x, y=y, n=counts.astype(np.int32))

  def _read_client(self, client: int) -> tuple[np.ndarray, np.ndarray]:
    flat = self.store.read_ragged([client], self.split)
    return flat.x, flat.y

  def __iter__(self) -> CohortReader:
    return self

  def __next__(self) -> Any:
    t0 = time.perf_counter()
    if self._last is not None:
      self._busy += t0 - self._last
    block = next(self._iter)
    self._last = time.perf_counter()
    self._wait += self._last - t0
    self._handed += 1
    return block

  @property
  def stats(self) -> ReaderStats:
    """The consumer's waits so far (:class:`ReaderStats`)."""
    hits = self._cache.hits if self._cache is not None else 0
    misses = self._cache.misses if self._cache is not None else 0
    return ReaderStats(cohorts=self._handed, wait_s=self._wait, busy_s=self._busy, cache_hits=hits,
                       cache_misses=misses)

  def close(self) -> None:
    """Stops the background reads."""
    close = getattr(self._iter, "close", None)
    if close is not None:
      close()

  def __enter__(self) -> CohortReader:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
