"""Per-client state paged by client id: ``[C, ...]`` leaves that never live on the device whole.

A :class:`PagedState` holds a pytree of per-client rows (a control variate, a personal model, an
error-feedback residual, a cursor) in a chunked array store, TensorStore's zarr v3 arrays, in host
memory (``directory=None``: the ``memory`` key-value store) or on disk (the ``file`` one). The round
gathers its cohort's rows (:meth:`PagedState.gather`) and scatters them back
(:meth:`PagedState.scatter`). A client never drawn costs nothing: its row is ``init(client id)``,
computed when it is gathered, and stored only once it is scattered (a chunk of the array exists
once one of its clients is written).

**Checkpoints.** Every leaf is stored twice, ``[2, C, ...]``: slot 0 and slot 1 of every client.
A commit (:meth:`PagedState.commit`) returns a :class:`PagedSnapshot`, ``uint8[C]`` saying which
slot holds each client's committed row, to be saved with the run's checkpoint; after a commit,
every write of a client goes to its other slot, so the rows a snapshot names are never written
again until the next commit. Restoring the snapshot of the checkpoint a run resumes from
(:meth:`PagedState.restore`) gives back exactly the rows of that round, whatever was written after
it and wherever a SIGKILL fell (TensorStore writes a chunk to a temporary file, syncs and renames
it). A snapshot older than the last commit after which something was written is refused: its rows
may have been overwritten (the ``written_after`` generation kept in ``paged.json``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

NEVER = np.uint8(255)
"""A client's slot before its first write: its row is ``init(client id)``."""


class PagedSnapshot(NamedTuple):
  """What a run's checkpoint keeps of a :class:`PagedState` (a pytree of two arrays).

  Attributes:
    slots: ``uint8[C]`` the slot of every client's committed row (255: never written).
    generation: ``int64[]`` commits made so far.
  """

  slots: np.ndarray
  generation: np.ndarray


def _spec(directory: str | None, name: str, shape, dtype, chunk) -> dict:
  kv = {"driver": "memory"} if directory is None else \
    {"driver": "file", "path": os.path.join(directory, name)}
  return {"driver": "zarr3", "kvstore": kv,
          "metadata": {"shape": list(shape), "data_type": np.dtype(dtype).name,
                       "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunk)}}}}


class PagedState:
  """A pytree of ``[C, ...]`` per-client leaves, gathered and scattered by client id.

  Args:
    init: ``init(client_ids int64[K]) -> pytree of [K, ...] arrays``: the rows of clients never
      written (a pure function of the id: the same id gives the same row).
    num_clients: ``C``.
    directory: a folder for the arrays on disk (a resumed run passes the same one), or ``None``
      for host memory (no checkpoint: :meth:`commit` refuses).
    chunk_bytes: about the bytes of one chunk of a leaf (``max(1, chunk_bytes // row bytes)``
      clients per chunk): what a write of one client rewrites and what a never-written region
      saves.

  Raises:
    ValueError: ``num_clients < 1``, ``init`` rows of another leading size than asked, or a
      ``directory`` holding a paged state of other leaves or clients.

  Example:
    >>> import numpy as np
    >>> state = PagedState(lambda ids: {"c": np.zeros((len(ids), 3), np.float32) + ids[:, None]}, 1000)
    >>> state.scatter(np.array([7, 2]), {"c": np.ones((2, 3), np.float32)})
    >>> state.gather(np.array([2, 5]))["c"][:, 0].tolist(), state.num_written
    ([1.0, 5.0], 2)
  """

  def __init__(self, init: Callable[[np.ndarray], Any], num_clients: int, *, directory: str | None = None,
               chunk_bytes: int = 1 << 20):
    import tensorstore as ts

    if int(num_clients) < 1:
      raise ValueError(f"num_clients={num_clients} must be >= 1")
    self._init = init
    self.num_clients = int(num_clients)
    probe = self._rows_of_init(np.arange(1))
    leaves, self._treedef = jax.tree.flatten(probe)
    self._shapes = [tuple(a.shape[1:]) for a in leaves]
    self._dtypes = [np.dtype(a.dtype) for a in leaves]
    row_bytes = sum(int(np.prod(s, dtype=np.int64)) * d.itemsize for s, d in zip(self._shapes, self._dtypes,
                                                                              strict=True))
    self.clients_per_chunk = int(max(1, min(self.num_clients, int(chunk_bytes) // max(1, row_bytes))))
    self.directory = None if directory is None else os.path.abspath(directory)
    meta = dict(num_clients=self.num_clients, clients_per_chunk=self.clients_per_chunk,
                leaves=[dict(shape=list(s), dtype=d.name)
                        for s, d in zip(self._shapes, self._dtypes, strict=True)])
    self._meta_path = None
    if self.directory is not None:
      os.makedirs(self.directory, exist_ok=True)
      self._meta_path = os.path.join(self.directory, "paged.json")
      if os.path.isfile(self._meta_path):
        with open(self._meta_path) as f:
          old = json.load(f)
        if {k: old.get(k) for k in meta} != meta:
          raise ValueError(f"{self.directory} holds a paged state of {old.get('num_clients')} clients with "
                           f"leaves {old.get('leaves')}, not {self.num_clients} clients with leaves "
                           f"{meta['leaves']}; "
                           "use another directory")
        self._written_after = int(old.get("written_after", -1))
      else:
        self._written_after = -1
        self._write_meta(meta | {"written_after": -1})
    self._meta = meta
    self._arrays = [
      ts.open(_spec(self.directory, f"leaf_{i}", (2, self.num_clients) + s, d,
                    (1, self.clients_per_chunk) + s), create=True, open=True).result()
      for i, (s, d) in enumerate(zip(self._shapes, self._dtypes, strict=True))]
    self._current = np.full(self.num_clients, NEVER, np.uint8)
    self._committed = np.full(self.num_clients, NEVER, np.uint8)
    self._generation = 0
    self._dirty = False    # written since the last commit (or restore)
    self._fresh = True     # neither written nor committed nor restored yet

  # -- bookkeeping
  def _write_meta(self, blob: dict) -> None:
    tmp = self._meta_path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(blob, f, sort_keys=True)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, self._meta_path)

  def _mark_written_after(self, generation: int) -> None:
    if self._meta_path is not None:
      self._write_meta(self._meta | {"written_after": int(generation)})
    self._written_after = int(generation)

  def _rows_of_init(self, ids: np.ndarray):
    rows = jax.tree.map(np.asarray, self._init(ids))
    for a in jax.tree.leaves(rows):
      if a.shape[:1] != (len(ids),):
        raise ValueError(f"init returned a leaf of shape {a.shape} for {len(ids)} client ids; each leaf "
                         f"must be [{len(ids)}, ...]")
    return rows

  def _check_ids(self, ids, what: str) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
      raise ValueError(f"{what}: client ids must be a 1-D integer array, got shape {ids.shape} dtype "
                       f"{ids.dtype}")
    ids = ids.astype(np.int64)
    bad = np.flatnonzero((ids < 0) | (ids >= self.num_clients))
    if bad.size:
      raise ValueError(f"{what}: client id {int(ids[bad[0]])} is outside the paged state's clients "
                       f"0..{self.num_clients - 1}")
    return ids

  @property
  def num_written(self) -> int:
    """Clients with a stored row (the others cost nothing: their row is ``init``'s)."""
    return int(np.count_nonzero(self._current != NEVER))

  @property
  def generation(self) -> int:
    return self._generation

  # -- rows
  def gather(self, ids) -> Any:
    """The rows of ``ids`` (``int[K]``, repeats allowed): a pytree of ``[K, ...]`` numpy arrays."""
    ids = self._check_ids(ids, "gather")
    leaves = [np.empty((len(ids),) + s, d) for s, d in zip(self._shapes, self._dtypes, strict=True)]
    slots = self._current[ids]
    never = np.flatnonzero(slots == NEVER)
    if never.size:
      for out, a in zip(leaves, jax.tree.leaves(self._rows_of_init(ids[never])), strict=True):
        out[never] = a
    reads = []
    for s in (0, 1):
      where = np.flatnonzero(slots == s)
      if where.size:
        reads += [(where, out, arr[s][ids[where]].read())
                  for out, arr in zip(leaves, self._arrays, strict=True)]
    for where, out, future in reads:
      out[where] = future.result()
    return jax.tree.unflatten(self._treedef, leaves)

  def scatter(self, ids, rows) -> None:
    """Stores ``rows`` (a pytree like :meth:`gather`'s, ``[K, ...]``) as the rows of ``ids``.

    Raises:
      ValueError: an id outside the clients, an id twice, rows of another structure or shape.
    """
    ids = self._check_ids(ids, "scatter")
    values, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
      dup = int(values[counts > 1][0])
      raise ValueError(f"scatter: client id {dup} appears more than once; scatter each client once (mask a "
                       "cohort's padding slots)")
    leaves, treedef = jax.tree.flatten(rows)
    if treedef != self._treedef:
      raise ValueError(f"scatter: rows have structure {treedef}, the paged state {self._treedef}")
    leaves = [np.asarray(a) for a in leaves]
    for a, s in zip(leaves, self._shapes, strict=True):
      if a.shape != (len(ids),) + s:
        raise ValueError(f"scatter: a leaf has shape {a.shape}; need {(len(ids),) + s} ({len(ids)} clients)")
    if ids.size == 0:
      return
    if self._fresh or not self._dirty:   # the rows of the last commit's slots are safe, older ones not
      self._mark_written_after(self._generation)
      self._dirty, self._fresh = True, False
    committed = self._committed[ids]
    target = np.where(committed == NEVER, 0, 1 - committed).astype(np.uint8)
    writes = []
    for s in (0, 1):
      where = np.flatnonzero(target == s)
      if where.size:
        writes += [arr[s][ids[where]].write(a[where].astype(d, copy=False))
                   for a, arr, d in zip(leaves, self._arrays, self._dtypes, strict=True)]
    for w in writes:
      w.result()
    self._current[ids] = target

  # -- checkpoints
  def snapshot_like(self) -> PagedSnapshot:
    """A snapshot of this state's shapes (for a checkpoint's ``like`` tree); commits nothing."""
    return PagedSnapshot(slots=self._committed.copy(), generation=np.asarray(self._generation, np.int64))

  def commit(self) -> PagedSnapshot:
    """Makes the rows written so far the committed ones; returns what the run's checkpoint keeps.

    Save the snapshot (synchronously) before the next :meth:`scatter`: the writes after a commit
    may overwrite the rows of the commit before it.

    Raises:
      ValueError: the state lives in host memory (``directory=None``), which a checkpoint does not keep.
    """
    if self.directory is None:
      raise ValueError("a PagedState in host memory (directory=None) is not checkpointed: give it a "
                       "directory, where its rows are kept on disk and a checkpoint keeps only which slot "
                       "holds each row")
    if self._fresh:
      self._mark_written_after(self._generation)
      self._fresh = False
    self._committed = self._current.copy()
    self._generation += 1
    self._dirty = False
    return PagedSnapshot(slots=self._committed.copy(), generation=np.asarray(self._generation, np.int64))

  def restore(self, snapshot: PagedSnapshot) -> None:
    """Returns to the rows of ``snapshot`` (a run resumed from the checkpoint that saved it).

    Raises:
      ValueError: the state lives in host memory, the snapshot has another number of clients, or
        rows it names were written over since (a snapshot older than the last commit followed by a
        write: ``paged.json``'s ``written_after``).
    """
    if self.directory is None:
      raise ValueError("a PagedState in host memory (directory=None) has no checkpoint to restore")
    slots = np.asarray(snapshot.slots, np.uint8)
    generation = int(np.asarray(snapshot.generation))
    if slots.shape != (self.num_clients,):
      raise ValueError(f"the snapshot holds {slots.shape} slots; this paged state has {self.num_clients} "
                       "clients")
    if generation < self._written_after:
      raise ValueError(f"the snapshot of commit {generation} can no longer be restored from "
                       f"{self.directory}: rows were written after commit {self._written_after}, over its "
                       "rows; "
                       f"resume from the checkpoint of commit {self._written_after} or later")
    self._committed = slots.copy()
    self._current = slots.copy()
    self._generation = generation
    self._dirty, self._fresh = False, False
