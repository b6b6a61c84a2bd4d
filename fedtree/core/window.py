"""A window of the population: the rows of the clients a round reads, in place of every client's.

A round reads its clients' data and per-client state by their row (:attr:`fedtree.core.sampling.Cohort.rows`)
and draws, keys and aggregates them by their index, so the same round over a window holding the rows
of the clients it reads (:attr:`fedtree.core.data.FederatedData.window`) computes bitwise what it computes
over the whole population. This module makes windows of resident arrays and of a state's per-client
leaves (those whose rows are clients, :data:`fedtree.core.algorithm.CLIENT_ROWS`), and writes a window's
rows back; :mod:`fedtree.population` fills them from disk.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.algorithm import CLIENT_ROWS, RowName, row_names_of
from fedtree.core.data import WINDOW_END, FederatedData

PyTree = Any


def client_leaves(state: PyTree) -> PyTree:
  """A pytree of bools shaped as ``state``: true at the leaves whose rows are clients (``[C, ...]``, as
  the state names them: :meth:`fedtree.core.algorithm.TreeState.row_names`)."""
  is_name = lambda x: isinstance(x, RowName)  # noqa: E731
  return jax.tree.map(
    lambda name, sub: jax.tree.map(lambda _: name == CLIENT_ROWS, sub),
    row_names_of(state),
    state,
    is_leaf=is_name,
  )


def window_state(state: PyTree, rows) -> PyTree:
  """``state`` with every per-client leaf cut to the rows ``rows`` (``int32[W]`` client indices): the
  state a round over a window holding those clients reads."""
  rows = jnp.asarray(rows, jnp.int32)
  return jax.tree.map(
    lambda a, is_client: jnp.take(a, rows, axis=0) if is_client else a, state, client_leaves(state)
  )


def unwindow_state(full: PyTree, windowed: PyTree, rows, valid=None) -> PyTree:
  """``full`` (every client's rows) with the per-client rows of ``windowed`` written back at the clients
  ``rows`` (``int32[W]``; ``valid``: ``bool[W]``, the rows that hold a client, default all) and every
  other leaf taken from ``windowed``."""
  rows = jnp.asarray(rows, jnp.int32)
  valid = jnp.ones(rows.shape, bool) if valid is None else jnp.asarray(valid)

  def put(f, w, is_client):
    if not is_client:
      return w
    return f.at[jnp.where(valid, rows, f.shape[0])].set(w, mode="drop")

  return jax.tree.map(put, full, windowed, client_leaves(full))


def window_of(
  clients, num_clients: int, size: int | None = None, *, bounds=None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``(rows, valid, window)`` for a window holding ``clients`` (repeats allowed): ``rows``
  (``int32[W]``) the distinct clients in the window's rows in ascending order, padded to ``size``
  rows with client 0 (never read, ``valid`` false there: never written back), and ``window``
  (``int32[W]``, :attr:`fedtree.core.data.FederatedData.window`) the same with
  :data:`~fedtree.core.data.WINDOW_END` at the padding rows. Nothing here grows with
  ``num_clients``.

  With ``bounds`` (``int[P + 1]`` ascending from 0 to ``num_clients``: the clients each of ``P``
  processes owns), the window is ``P`` segments of ``size`` rows, segment ``q`` holding the window's
  clients of ``bounds[q] .. bounds[q + 1] - 1`` padded with ``bounds[q + 1] - 1`` (``valid`` false):
  a run over several processes, each reading and paging its own clients' rows only
  (:mod:`fedtree.population.stream`).

  Raises:
    ValueError: a client outside ``0 .. num_clients - 1``, or more distinct clients than ``size`` (than
      ``size`` of one range, with ``bounds``).
  """
  clients = np.unique(np.asarray(clients, np.int64))
  if clients.size and (clients[0] < 0 or clients[-1] >= num_clients):
    bad = int(clients[0] if clients[0] < 0 else clients[-1])
    raise ValueError(f"client {bad} is outside the population (0..{num_clients - 1})")
  if bounds is not None:
    return _segments(clients, clients.size if size is None else int(size), np.asarray(bounds, np.int64))
  size = clients.size if size is None else int(size)
  if clients.size > size:
    raise ValueError(f"{clients.size} distinct clients do not fit a window of {size} rows")
  rows = np.zeros(size, np.int32)
  rows[: clients.size] = clients
  window = np.full(size, WINDOW_END, np.int32)
  window[: clients.size] = clients
  return rows, np.arange(size) < clients.size, window


def _segments(clients: np.ndarray, size: int, bounds: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """:func:`window_of` in segments of ``size`` rows, the ``q``-th holding the clients in
  ``bounds[q] .. bounds[q + 1] - 1`` and padded with ``bounds[q + 1] - 1``: still ascending, so every
  held client is found where it is (the first of equal ids), and each segment's rows belong to its range."""
  parts = np.searchsorted(clients, bounds)
  rows = np.repeat(np.maximum(bounds[1:] - 1, 0), size).astype(np.int32)
  valid = np.zeros(rows.size, bool)
  for q in range(bounds.size - 1):
    held = clients[parts[q]:parts[q + 1]]
    if held.size > size:
      raise ValueError(f"{held.size} distinct clients of {bounds[q]}..{bounds[q + 1] - 1} do not fit a "
                       f"segment of {size} rows")
    rows[q * size: q * size + held.size] = held
    valid[q * size: q * size + held.size] = True
  return rows, valid, rows.copy()


def window_data(data: FederatedData, rows, window) -> FederatedData:
  """``data`` (every client's padded rows) as a window holding the clients ``rows`` (:func:`window_of`):
  the rows of those clients, every client's counts, and the ``window`` map."""
  if data.ragged:
    raise ValueError(
      "a window holds padded rows: convert a ragged training split first "
      "(fedtree.core.ragged.to_padded_train)"
    )
  rows = np.asarray(rows, np.int64)

  def cut(a):
    return np.asarray(a)[rows] if isinstance(a, np.ndarray) else jnp.take(a, jnp.asarray(rows), axis=0)

  return data.replace(  # type: ignore[attr-defined]  # (flax struct dataclass)
    x_train=cut(data.x_train),
    y_train=cut(data.y_train),
    x_test=cut(data.x_test),
    y_test=cut(data.y_test),
    window=jnp.asarray(window, jnp.int32),
  )
