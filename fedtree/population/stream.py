"""A run over a population held on disk: every compiled call reads a window of the clients its rounds
read (:mod:`fedtree.core.window`), the next calls' windows are read while this one trains, and
per-client state lives in a :class:`~fedtree.population.paged.PagedState`, gathered for the window
before a call and scattered back after it.

The device then holds a window (the clients of ``rounds_per_call`` rounds) and never the population;
a population that fits gives bitwise the same run resident or streamed (tests/test_population_stream.py).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core import loop
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.data import WINDOW_END, FederatedData
from fedtree.core.window import client_leaves, window_of
from fedtree.population.paged import PagedState
from fedtree.population.reader import CohortReader
from fedtree.population.store import ClientStore

PyTree = Any


def skeleton(store: ClientStore, *, width: int | None = None) -> FederatedData:
  """What an algorithm's factory is built on for a population in ``store``: every client's counts and
  a one-row window of zeros in the store's layout (a round reads its clients through a window filled
  by :func:`run`).

  Raises:
    ValueError: a store without a test split (every run scores its clients' test rows).
  """
  feats = store.features
  w_train = store.width("train") if width is None else int(width)
  if "test" not in store.splits:
    raise ValueError(f"store {store.path} has no test split (its splits: {list(store.splits)})")
  w_test = store.width("test")

  def zeros(w, key):
    return np.zeros((1, w) + feats[key].shape, feats[key].dtype)

  return FederatedData(
    x_train=zeros(w_train, "x"),
    y_train=zeros(w_train, "y"),
    n_train=store.counts("train").astype(np.int32),
    x_test=zeros(w_test, "x"),
    y_test=zeros(w_test, "y"),
    n_test=store.counts("test").astype(np.int32),
    num_classes=store.num_classes,
    window=np.full(1, WINDOW_END, np.int32),
  )


class _Split(NamedTuple):
  """A state's leaves apart: its per-client leaves and the others (their places in ``treedef``)."""

  treedef: Any
  is_client: tuple[bool, ...]

  def parts(self, state) -> tuple[list, list]:
    leaves = jax.tree.leaves(state)
    return (
      [a for a, c in zip(leaves, self.is_client, strict=True) if c],
      [a for a, c in zip(leaves, self.is_client, strict=True) if not c],
    )

  def join(self, clients: Sequence, others: Sequence):
    it_c, it_o = iter(clients), iter(others)
    return jax.tree.unflatten(self.treedef, [next(it_c) if c else next(it_o) for c in self.is_client])


def _split_of(state) -> _Split:
  marks = client_leaves(state)
  return _Split(jax.tree.structure(state), tuple(bool(m) for m in jax.tree.leaves(marks)))


def paged_init(algorithm: FederatedAlgorithm, key: jax.Array, num_clients: int) -> tuple[Any, Callable]:
  """``(others, rows_of)``: the initial state's leaves that are not per-client (device arrays) and
  ``rows_of(ids) -> [rows]``, the initial per-client rows of clients ``ids`` for a
  :class:`~fedtree.population.paged.PagedState`, both without making the whole population's rows.

  Raises:
    ValueError: an algorithm whose clients start from different rows (they cannot be made lazily).
  """
  split = _split_of(jax.eval_shape(algorithm.init, key))

  def edges(k):
    clients, others = split.parts(algorithm.init(k))
    return [a[0] for a in clients], [a[-1] for a in clients], others

  first, last, others = jax.jit(edges)(key)
  for a, b in zip(first, last, strict=True):
    if not np.array_equal(np.asarray(a), np.asarray(b)):
      raise ValueError(
        f"{algorithm.name}: its clients start from different states, which a paged state "
        f"cannot make for a client only when it is first read; run it resident"
      )
  first = [np.asarray(a) for a in first]

  def rows_of(ids):
    return [np.broadcast_to(a, (len(ids),) + a.shape).copy() for a in first]

  return others, rows_of


class Layout(NamedTuple):
  """Where a window's rows live: on one device (``mesh`` ``None``), or over the client axis of
  ``mesh`` (:func:`fedtree.core.sharding.client_mesh`), where process ``q`` owns the clients
  ``bounds[q] .. bounds[q + 1] - 1`` and holds the window's segment of them
  (:func:`fedtree.core.window.window_of` with ``bounds``): it reads their rows from the store, pages
  their state and scores them, and no other process touches them.

  Attributes:
    mesh: the devices the window's rows are spread over, or ``None``.
    bounds: ``int64[P + 1]`` the clients each process owns (``None`` without a mesh).
    segment: rows of each process's segment (of the whole window without a mesh).
    process: this process's index.
  """

  mesh: Any
  bounds: np.ndarray | None
  segment: int
  process: int = 0

  @property
  def size(self) -> int:
    """Rows of the whole window (every process's segment)."""
    return self.segment * (1 if self.bounds is None else len(self.bounds) - 1)

  def window(self, clients, num_clients: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`fedtree.core.window.window_of` for this layout: ``(rows, valid, window)`` of every process."""
    return window_of(clients, num_clients, self.segment, bounds=self.bounds)

  def chunks(self, clients) -> list[np.ndarray]:
    """``clients`` (distinct ids) cut into chunks that each hold at most :attr:`segment` of every
    process's clients, in ascending order: with every process's clients spread over the chunks, no
    process's segment is padding while another's is full (an evaluation over every client, whose ids
    come in ranges, would otherwise give each chunk to one process)."""
    from fedtree.population.evaluation import _in_chunks

    clients = np.sort(np.asarray(clients, np.int64))
    if self.bounds is None:
      return _in_chunks(clients, self.segment)
    own = np.split(clients, np.searchsorted(clients, self.bounds[1:-1]))
    count = max(-(-part.size // self.segment) for part in own)
    return [np.concatenate([part[j * self.segment: (j + 1) * self.segment] for part in own])
            for j in range(count)]

  def local(self, a: np.ndarray) -> np.ndarray:
    """This process's segment of ``a`` (a host array over the whole window)."""
    if self.bounds is None:
      return a
    return a[self.process * self.segment: (self.process + 1) * self.segment]

  def _over_clients(self):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from fedtree.core.sharding import CLIENT_AXIS

    return NamedSharding(self.mesh, P(CLIENT_AXIS))

  def place(self, rows: np.ndarray) -> jax.Array:
    """This process's rows (``[segment, ...]``) as the window's array: on the device, or over the mesh's
    client axis with every process's segment (a collective-free construction: each process gives its own)."""
    if self.mesh is None:
      return jax.device_put(rows)
    rows = np.asarray(rows)
    return jax.make_array_from_process_local_data(self._over_clients(), rows, (self.size,) + rows.shape[1:])

  def fetch(self, a) -> np.ndarray:
    """This process's segment of ``a`` (an array over the window, as :meth:`place` made it or a round
    returned it) as numpy, read from this process's devices only."""
    if self.mesh is None or a.is_fully_addressable:
      return self.local(np.asarray(a))
    want = self._over_clients()
    if not a.sharding.is_equivalent_to(want, a.ndim):
      a = jax.jit(lambda v: v, out_shardings=want)(a)
    shards = {s.index[0].start or 0: s.data for s in a.addressable_shards}
    local = np.concatenate([np.asarray(shards[k]) for k in sorted(shards)])
    if local.shape[0] != self.segment:
      raise AssertionError(f"process {self.process} holds {local.shape[0]} rows of the window, not its "
                           f"segment of {self.segment}")
    return local


def owned_rows(mesh, num_clients: int) -> int:
  """Rows of a ``[C, ...]`` array over ``mesh``'s client axis on one process's devices: ``k *
  ceil(C / (P k))``, ``k`` devices a process (the clients a process owns in a :func:`layout`)."""
  devices = np.asarray(mesh.devices).reshape(-1)
  processes = len({int(d.process_index) for d in devices})
  return devices.size // processes * -(-int(num_clients) // devices.size)


def layout(mesh, num_clients: int, size: int) -> Layout:
  """The :class:`Layout` of a window of ``size`` distinct clients over ``mesh`` (``None``: one device).

  Each process's segment holds ``size`` rows (every client of a call may be one process's), rounded up
  to a multiple of its devices; process ``q`` owns the clients whose rows the checkpoint's per-client
  arrays keep on its devices (``bounds[q] = q * k * ceil(C / (P k))``, ``k`` devices a process).

  Raises:
    ValueError: a mesh whose processes hold different numbers of its devices, or are not in order
      along it (process 0's devices first).
  """
  if mesh is None:
    return Layout(None, None, int(size))
  owners = [int(d.process_index) for d in np.asarray(mesh.devices).reshape(-1)]
  procs = sorted(set(owners))
  k = owners.count(procs[0])
  if owners != sorted(owners) or any(owners.count(q) != k for q in procs) or procs != list(range(len(procs))):
    raise ValueError(
      f"a streamed run spreads each process's clients over its own devices of the mesh; this mesh's "
      f"devices belong to processes {owners}: give every process the same number of devices, in process "
      f"order (config.mesh_shape=-1 over every device does)")
  span = owned_rows(mesh, num_clients)
  bounds = np.minimum(np.arange(len(procs) + 1, dtype=np.int64) * span, int(num_clients))
  return Layout(mesh, bounds, -(-int(size) // k) * k, jax.process_index())


@dataclasses.dataclass
class _Calls:
  """The window rows of every call (a sequence indexed by call, computed when asked for)."""

  starts: list[int]  # each call's first round done (the state's round before it)
  lengths: list[int]  # its rounds
  reads: Callable  # reads(state, rounds) -> int32[len(rounds), D]
  layout: Layout  # where the window's rows live
  num_clients: int
  state: Any = None  # the state the reads are computed from (any state of the run, or the current)
  memo: dict = dataclasses.field(default_factory=dict)   # call -> its window (made once, by either thread)
  lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

  def __len__(self) -> int:
    return len(self.starts)

  def window(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    with self.lock:
      if i in self.memo:
        return self.memo[i]
    first = self.starts[i]
    read = np.asarray(self.reads(self.state, np.arange(first, first + self.lengths[i], dtype=np.int32)))
    made = self.layout.window(read.reshape(-1), self.num_clients)
    with self.lock:
      self.memo[i] = made
      for old in [k for k in self.memo if k < i - 8]:   # the reader runs at most a few calls ahead
        del self.memo[old]
    return made

  def __getitem__(self, i: int) -> np.ndarray:
    return self.layout.local(self.window(i)[0])   # (the rows this process reads)


@functools.partial(jax.jit, static_argnums=0)
def _call_reads(clients: Callable, state, rounds, *, key):
  """``int32[R, D]``: the clients every round of ``rounds`` reads (``clients(state, fold_in(key, r))``),
  a call's rounds in one compiled call (one dispatch, not one a round; compiled once per algorithm)."""
  return jax.vmap(lambda r: clients(state, jax.random.fold_in(key, r)))(rounds)


class StreamStats(NamedTuple):
  """Where a streamed run's time went.

  Attributes:
    calls: compiled calls run.
    wait_s: seconds the loop waited for a window's rows (reads not done ahead).
    gather_s: seconds gathering and scattering per-client state.
    run_s: seconds in the compiled calls.
  """

  calls: int
  wait_s: float
  gather_s: float
  run_s: float

  @property
  def stall_fraction(self) -> float:
    """The share of the run spent waiting for data."""
    total = self.wait_s + self.gather_s + self.run_s
    return self.wait_s / total if total > 0 else 0.0


def run(
  algorithm: FederatedAlgorithm,
  data: FederatedData,
  store: ClientStore,
  *,
  num_rounds: int,
  key: jax.Array,
  paged: PagedState | None,
  others=None,
  rounds_per_call: int = 1,
  depth: int = 2,
  cache_bytes: int = 0,
  eval_every: int | None = None,
  on_rounds: Callable[[int, dict[str, np.ndarray]], None] | None = None,
  on_metrics: Callable[[int, dict[str, float]], None] | None = None,
  on_call: Callable[[Any, int], None] | None = None,
  on_eval: Callable[[Any, int], dict[str, float] | None] | None = None,
  should_stop: Callable[[], bool] | None = None,
  check_finite: bool = True,
  max_abs: float | None = loop.DIVERGENCE_BOUND,
  cache: loop.CompileCache | None = loop.COMPILED,
  mesh=None,
) -> tuple[Any, StreamStats]:
  """Runs ``algorithm`` over the population of ``store`` until round ``num_rounds``, as
  :func:`fedtree.core.loop.run` does over a resident one.

  Args:
    algorithm: what to run; it must say which clients a round reads (``algorithm.reads``).
    data: :func:`skeleton` of ``store`` (the data the algorithm was built on).
    store: the population's rows.
    num_rounds: the round to stop at.
    key: the run's root key (round ``r`` uses ``fold_in(key, r)``, as the resident loop).
    paged: the per-client state (its ``init`` from :func:`paged_init`); ``None`` for an algorithm
      that keeps none.
    others: the state's other leaves to start from (default: :func:`paged_init`'s; a resumed run's).
    rounds_per_call: rounds fused into one compiled call; the window holds the clients of all of them.
    depth: calls whose windows are read ahead (0: each read when it is needed); an algorithm whose
      round's clients depend on the state before it (``reads.needs_state``) reads synchronously.
    cache_bytes: an LRU cache of clients' rows (0: none).
    eval_every, on_rounds, on_metrics, on_call, on_eval, should_stop, check_finite, max_abs, cache: as
      :func:`fedtree.core.loop.run`'s (a stop ends a call after the round in progress); hooks receive
      the state over the call's window.
    mesh: the client axis over several devices, of one process or several (``jax.distributed``;
      call under ``jax.set_mesh(mesh)``): each process reads, pages and holds the rows of the clients
      it owns only (:func:`layout`); ``paged`` is then this process's, written for its clients only.

  Returns:
    ``(state, stats)``: the state over the last call's window (the per-client rows are ``paged``'s) and
    the :class:`StreamStats`.

  Raises:
    ValueError: an algorithm that does not say which clients a round reads.
  """
  if algorithm.reads is None:
    raise ValueError(
      f"{algorithm.name} reads clients beyond its cohort (every client, or other clients' "
      f"state), so its population cannot stream; run it resident"
    )
  shapes = jax.eval_shape(algorithm.init, loop.init_key(key))
  split = _split_of(shapes)
  if others is None:
    others, _ = paged_init(algorithm, loop.init_key(key), data.num_clients)
  if any(split.is_client) and paged is None:
    raise ValueError(f"{algorithm.name} keeps per-client state: give a PagedState (paged=)")
  # the reads of a round need the state's other leaves (a strategy reads no client's row): one-row
  # placeholders stand for the per-client leaves
  probe = split.join([jnp.zeros((1,) + a.shape[1:], a.dtype) for a in split.parts(shapes)[0]], others)
  fuse = 1 if algorithm.reads.needs_state else int(rounds_per_call)
  starts, lengths = [], []
  r = int(probe.round)
  while r < num_rounds:
    n = loop._call_lengths(r, num_rounds, fuse, eval_every)
    starts.append(r)
    lengths.append(n)
    r += n
  reads_fn = functools.partial(_call_reads, algorithm.reads.clients, key=key)
  per_round = int(jax.eval_shape(reads_fn, probe, np.zeros(1, np.int32)).shape[1])
  where = layout(mesh, data.num_clients, fuse * per_round)
  calls = _Calls(starts, lengths, reads_fn, where, data.num_clients, state=probe)
  width = int(data.x_train.shape[1])
  reader = CohortReader(
    store,
    calls,
    width=width,  # type: ignore[arg-type]  # (a lazy sequence)
    depth=0 if algorithm.reads.needs_state else int(depth),
    cache_bytes=int(cache_bytes),
    transfer=lambda block: (where.place(block.x), where.place(block.y)),   # (on the devices ahead)
  )
  # every client's counts moved to the device once (as numpy they would be copied in every call)
  on_device = lambda a: jnp.asarray(a) if isinstance(a, np.ndarray) else a  # noqa: E731  # (over a mesh: placed)
  data = data.replace(n_train=on_device(data.n_train), n_test=on_device(data.n_test))  # type: ignore[attr-defined]
  test_x = where.place(np.zeros((where.segment,) + tuple(data.x_test.shape[1:]), data.x_test.dtype))
  test_y = where.place(np.zeros((where.segment,) + tuple(data.y_test.shape[1:]), data.y_test.dtype))
  wait = gather = running = 0.0
  state = None
  with reader:
    for i, n in enumerate(lengths):
      if algorithm.reads.needs_state and state is not None:
        calls.state = state
      rows, valid, window = calls.window(i)
      t0 = time.perf_counter()
      x_train, y_train = next(reader)
      t1 = time.perf_counter()
      wait += t1 - t0
      wdata = data.replace(  # type: ignore[attr-defined]
        x_train=x_train, y_train=y_train, x_test=test_x, y_test=test_y, window=jnp.asarray(window)
      )
      mine = where.local(rows)
      rows_now = [] if paged is None else [where.place(a) for a in paged.gather(mine)]
      state = split.join(rows_now, others)
      t2 = time.perf_counter()
      gather += t2 - t1
      step = loop.compile_rounds(algorithm, n, check_state=check_finite, cache=cache, max_abs=max_abs,
                                 should_stop=should_stop)
      state, metrics = step(state, wdata, key)
      jax.block_until_ready(state)
      n, metrics = loop.rounds_run(metrics, int(state.round) - starts[i])   # (fewer where a stop ended it)
      t3 = time.perf_counter()
      running += t3 - t2
      new_rows, others = split.parts(state)
      if paged is not None:
        keep = np.flatnonzero(where.local(valid))
        paged.scatter(mine[keep], [where.fetch(a)[keep] for a in new_rows])
      gather += time.perf_counter() - t3
      done = starts[i] + n
      if check_finite:
        paths = [(p, name) for p, name, _ in loop._float_leaves(state)]
        loop.check_metrics(metrics, done, algorithm.name, paths, None, max_abs)
      loop.after_call(state, metrics, done, n, num_rounds, eval_every, on_rounds=on_rounds,
                      on_metrics=on_metrics, on_eval=on_eval, on_call=on_call)
      if should_stop is not None and should_stop():
        break
  return state, StreamStats(len(lengths), wait, gather, running)

