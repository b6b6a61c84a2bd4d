"""Which clients an evaluation scores when the population is too large to score whole.

Two plans, each with the name a summary prints: :func:`sample_clients`, a seeded sample drawn
afresh at every evaluation (uniform without replacement, of the population or of every group of a
tree's level), and :func:`every_client`, the whole population in chunks of a fixed size read one
after the other. (A run's central test set is the third way, unchanged.) The draws are numpy's,
from ``np.random.default_rng([seed, evaluation])``: the same seed and evaluation give the same
clients on any machine, and a resumed run scores the clients the uninterrupted one did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np


class EvalClients(NamedTuple):
  """The clients of every evaluation.

  Attributes:
    name: what the summary prints (e.g. ``"a seeded sample of 100 of 342,477 clients per
      evaluation (seed 0)"``).
    chunks: ``chunks(evaluation) -> [int64[k], ...]``: the client ids scored at evaluation number
      ``evaluation`` (0, 1, ...), in chunks of at most ``chunk_size`` (sorted within a group).
    num_scored: clients scored per evaluation.
  """

  name: str
  chunks: Callable[[int], list[np.ndarray]]
  num_scored: int


def _in_chunks(ids: np.ndarray, chunk_size: int | None) -> list[np.ndarray]:
  if chunk_size is None or ids.size <= chunk_size:
    return [ids]
  return [ids[i:i + chunk_size] for i in range(0, ids.size, chunk_size)]


def _check_chunk(chunk_size: int | None) -> int | None:
  if chunk_size is not None and int(chunk_size) < 1:
    raise ValueError(f"chunk_size={chunk_size} must be >= 1 (or None: one chunk)")
  return None if chunk_size is None else int(chunk_size)


def sample_clients(*, size: int, num_clients: int | None = None, groups=None, seed: int = 0,
                   chunk_size: int | None = None) -> EvalClients:
  """A seeded sample of ``size`` clients per evaluation, or of ``size`` clients per group.

  Args:
    size: clients drawn per evaluation (with ``groups``: per group; a smaller group is scored whole).
    num_clients: the population (without ``groups``).
    groups: ``int[C]`` the group of every client (a tree level's parent of each client): the
      sample is drawn in every group apart.
    seed: the draws' seed (evaluation ``e`` draws from ``default_rng([seed, e])``).
    chunk_size: clients per chunk (``None``: one chunk).

  Returns:
    The :class:`EvalClients`.

  Raises:
    ValueError: ``size < 1``, neither or both of ``num_clients`` and ``groups``, ``size`` above
      the population, a bad ``chunk_size``.

  Example:
    >>> plan = sample_clients(size=3, num_clients=10, seed=0)
    >>> plan.name, len(plan.chunks(0)[0]), bool((plan.chunks(4)[0] == plan.chunks(4)[0]).all())
    ('a seeded sample of 3 of 10 clients per evaluation (seed 0)', 3, True)
  """
  if int(size) < 1:
    raise ValueError(f"size={size} must be >= 1")
  if (num_clients is None) == (groups is None):
    raise ValueError("give num_clients (a sample of the population) or groups (a sample of every group), one")
  chunk = _check_chunk(chunk_size)
  size = int(size)
  if groups is None:
    c = int(num_clients)
    if size > c:
      raise ValueError(f"size={size} exceeds the {c} clients; score every client (every_client) instead")

    def flat(evaluation: int) -> list[np.ndarray]:
      rng = np.random.default_rng([int(seed), int(evaluation)])
      return _in_chunks(np.sort(rng.choice(c, size, replace=False)).astype(np.int64), chunk)

    return EvalClients(name=f"a seeded sample of {size:,} of {c:,} clients per evaluation (seed {seed})",
                       chunks=flat, num_scored=size)
  labels = np.asarray(groups)
  if labels.ndim != 1 or labels.size == 0 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"groups must be a non-empty 1-D integer array (the group of every client), got shape "
                     f"{labels.shape} dtype {labels.dtype}")
  order = np.argsort(labels, kind="stable")
  names, starts = np.unique(labels[order], return_index=True)
  bounds = np.append(starts, labels.size)
  taken = np.minimum(np.diff(bounds), size)

  def per_group(evaluation: int) -> list[np.ndarray]:
    rng = np.random.default_rng([int(seed), int(evaluation)])
    parts = []
    for g in range(len(names)):
      members = order[bounds[g]:bounds[g + 1]]
      parts.append(np.sort(members[rng.choice(members.size, int(taken[g]), replace=False)]))
    return _in_chunks(np.concatenate(parts).astype(np.int64), chunk)

  name = (f"a seeded sample of {size:,} clients per group of {len(names):,} groups per evaluation "
          f"(seed {seed}; {int(taken.sum()):,} clients)")
  return EvalClients(name=name, chunks=per_group,
                     num_scored=int(taken.sum()))


def every_client(num_clients: int, *, chunk_size: int) -> EvalClients:
  """Every client at every evaluation, ``chunk_size`` at a time (streamed from the store).

  Raises:
    ValueError: ``num_clients < 1`` or ``chunk_size < 1``.

  Example:
    >>> plan = every_client(5, chunk_size=2)
    >>> plan.name, [c.tolist() for c in plan.chunks(0)]
    ('every client (5) in chunks of 2', [[0, 1], [2, 3], [4]])
  """
  if int(num_clients) < 1:
    raise ValueError(f"num_clients={num_clients} must be >= 1")
  if chunk_size is None:
    raise ValueError("chunk_size=None: every client is scored in chunks of a fixed size; give one")
  chunk = int(_check_chunk(chunk_size))
  ids = np.arange(int(num_clients), dtype=np.int64)
  return EvalClients(name=f"every client ({int(num_clients):,}) in chunks of {chunk:,}",
                     chunks=lambda evaluation: _in_chunks(ids, chunk), num_scored=int(num_clients))
