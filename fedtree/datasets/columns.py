"""Per-example columns (writer, region, ...) to per-client labels: the rows of a tree.

A dataset often names, for every example, its client (a writer, a speaker) and coarser units
above it (a region, a country). :func:`client_label_columns` turns such columns into one dense
``int32[C]`` label column per level, coarsest first, the input of
:meth:`fedtree.core.topology.Topology.from_label_columns`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def dense_codes(values) -> tuple[np.ndarray, tuple[str, ...]]:
  """``(codes int32[N] in 0..G-1, the name of every code)`` of any values (ints, strings),
  the codes in sorted order of the distinct values."""
  values = np.asarray(values)
  if values.ndim != 1:
    raise ValueError(f"a label column must be 1-D, got shape {values.shape}")
  uniq, codes = np.unique(values, return_inverse=True)
  return codes.astype(np.int32), tuple(str(u) for u in uniq)


def client_label_columns(columns: Sequence, client_of_example: np.ndarray, *,
                         names: Sequence[str] | None = None
                         ) -> tuple[list[np.ndarray], list[tuple[str, ...]]]:
  """Per-client label columns from per-example ones, coarsest first.

  Every column must hold one value per client (all of a client's examples agree). A level's
  group is the path of values from the coarsest column down to it, so two regions may each
  have an edge named ``"e1"``: they are two groups, and finer groups always nest in coarser
  ones.

  Args:
    columns: ``L`` per-example columns ``[N]``, coarsest first.
    client_of_example: ``int[N]`` client ``0..C-1`` of every example.
    names: the column names, for messages.

  Returns:
    ``(L columns int32[C] of labels 0..G_l-1, L tuples of group names)``; a group's name is
    its value in that column.

  Raises:
    ValueError: naming the client and the two values when a client's examples disagree.
  """
  client = np.asarray(client_of_example)
  num_clients = int(client.max()) + 1 if client.size else 0
  first = np.full(num_clients, -1, np.int64)
  first[client[::-1]] = np.arange(client.size)[::-1]  # the first example of every client
  out, out_names = [], []
  path = np.zeros(num_clients, np.int64)
  for k, col in enumerate(columns):
    name = names[k] if names is not None else f"columns[{k}]"
    col = np.asarray(col)
    if col.shape != client.shape:
      raise ValueError(f"column {name!r} has {col.shape[0] if col.ndim else 0} values, not one per "
                       f"example ({client.size})")
    per_client = col[first]
    differ = np.flatnonzero(col != per_client[client])
    if differ.size:
      i = int(differ[0])
      raise ValueError(f"column {name!r} must be constant within a client: client {int(client[i])} has "
                       f"examples with {per_client[client[i]]!r} and {col[i]!r}")
    value_codes, value_names = dense_codes(per_client)
    pairs = np.stack([path, value_codes.astype(np.int64)], axis=1)
    uniq, codes = np.unique(pairs, axis=0, return_inverse=True)
    codes = codes.reshape(-1)
    out.append(codes.astype(np.int32))
    out_names.append(tuple(value_names[int(v)] for v in uniq[:, 1]))
    path = codes.astype(np.int64)
  return out, out_names
