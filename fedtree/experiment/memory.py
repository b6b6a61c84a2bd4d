"""Memory stated before a run compiles: the bytes of the (stacked) state and of a chunk's
working set, against the device's limit, so that a run that cannot fit fails early with the
numbers and the largest chunk that would fit (issue 15 item 8).

The state is measured without allocating (``jax.eval_shape`` of ``init``); a chunk's working
set is the clients trained at once times the bytes one client's local step touches
(:func:`fedtree.core.tuning.client_step_bytes`, one small compile). The limit is
``config.memory_limit_bytes`` when set (tests force a small one), else the accelerator's
``bytes_limit``, else the host's physical memory on CPU.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import ml_collections
import numpy as np

from fedtree.core import tuning


def tree_bytes(tree) -> int:
  """Bytes of every array (or ``ShapeDtypeStruct``) leaf of ``tree``."""
  return int(sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)
                 if hasattr(x, "shape") and hasattr(x, "dtype") and not jax.dtypes.issubdtype(
                   x.dtype, jax.dtypes.prng_key)))


def memory_limit(config: ml_collections.ConfigDict) -> tuple[int | None, str]:
  """``(bytes, where from)``: ``config.memory_limit_bytes`` when set, else the device's
  ``bytes_limit`` (accelerators), else the host's physical memory (CPU), else ``None``."""
  value = config.get("memory_limit_bytes", None)
  if value is not None:
    return int(value), "config.memory_limit_bytes"
  device = tuning.device_memory_bytes()
  if device is not None:
    return device, f"{jax.devices()[0].platform} device bytes_limit"
  if jax.default_backend() == "cpu":
    try:
      return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "host memory"
    except (ValueError, OSError, AttributeError):
      pass
  return None, "unknown"


def _gib(n: int) -> str:
  return f"{n / 2**30:.3g} GiB" if n >= 2**28 else f"{n / 2**20:.3g} MiB"


def block_bytes(param_bytes: int, rows: int, block_size: int, *, pairwise: bool) -> int:
  """Bytes a blockwise aggregator (:mod:`fedtree.core.robust`) holds at once: the ``rows = P x K``
  slots of every parent's cohort of deltas, twice (the block and its sorted or rewritten
  copy), and for the distance-based ones (Krum, Bulyan, min-max / min-sum) ``K x K`` float32
  distances per parent, twice (the matrix and its sort), at most ``rows x K``."""
  return 2 * rows * param_bytes + (2 * 4 * rows * block_size if pairwise else 0)


@dataclasses.dataclass(frozen=True)
class Needs:
  """What a method holds beyond one model's client step and a state the estimate sees only as
  bytes, declared by its spec (:attr:`fedtree.experiment.spec.AlgorithmSpec.memory`).

  Attributes:
    step_models: models one client trains at once (FedEM: its ``K`` components): the chunk's
      working set is this many client steps per client.
    parts: ``(what, bytes)`` of the parts of the state worth naming (kNN-Per's memory, FedEM's
      components at every node): already in the state's bytes, named in the estimate and in a
      refusal.
  """

  step_models: int = 1
  parts: tuple[tuple[str, int], ...] = ()

  def describe(self) -> str:
    """``" (of which ...)"`` naming the parts, or ``""``."""
    if not self.parts:
      return ""
    return " (of which " + ", ".join(f"{what} {n} bytes" for what, n in self.parts) + ")"


def check_memory(label: str, *, state_bytes: int, step_bytes: int, chunk: int, limit: int | None,
                 source: str, experiments: int = 1, chunk_name: str = "chunk_size",
                 block: tuple[int, int, int, bool] | None = None, needs: Needs | None = None) -> str:
  """The one-line estimate printed before a run compiles; a ``ValueError`` with the numbers and
  the largest chunk that fits when it cannot fit in ``limit``.

  Args:
    label: the run.
    state_bytes: bytes of one experiment's state (``jax.eval_shape`` of ``init``).
    step_bytes: bytes one client's local step touches
      (:func:`fedtree.core.tuning.client_step_bytes`).
    chunk: clients trained at once (``chunk_size``); for a sweep, experiments at once.
    limit: the memory available, or ``None`` (nothing checked).
    source: where ``limit`` comes from.
    experiments: experiments stacked in one program (a sweep's chunk); each holds a state and
      trains ``chunk`` clients at once.
    chunk_name: the field to lower, named in the error.
    block: ``(param_bytes, rows, block_size, pairwise)`` of a blockwise aggregator's cohort
      blocks (:func:`block_bytes`), or ``None``; added to the state.
    needs: the method's :class:`Needs` (models per client step, named parts of the state), or
      ``None``.

  Returns:
    The line (the caller prints it).
  """
  needs = Needs() if needs is None else needs
  models = max(1, int(needs.step_models))
  step_bytes = step_bytes * models   # a client trains ``models`` models at once
  blocks = 0 if block is None else block_bytes(block[0], block[1], block[2], pairwise=block[3]) * experiments
  state = state_bytes * experiments + blocks
  work = step_bytes * chunk * experiments
  parts = ("" if not needs.parts else
           " (of which " + ", ".join(f"{what} {_gib(n)}" for what, n in needs.parts) + ")")
  line = (f"{label}: memory estimate {_gib(state + work)}: state {_gib(state_bytes)}{parts}"
          f"{f' x {experiments} experiments' if experiments > 1 else ''}"
          f"{f' + cohort blocks {_gib(blocks)}' if block is not None else ''} + chunk working set "
          f"{chunk} x {_gib(step_bytes)} per client step{f' ({models} models)' if models > 1 else ''}"
          f"{f' x {experiments}' if experiments > 1 else ''}")
  if limit is None:
    return line + " (no memory limit known)"
  line += f", limit {_gib(limit)} ({source})"
  if state + work <= limit:
    return line
  if block is not None and state > limit:   # the cohort blocks alone do not fit: a smaller cohort
    param_bytes, rows, size, pairwise = block
    avail = limit - state_bytes * experiments - step_bytes * experiments
    lo, hi = 0, rows   # the largest cohort (slots in all, a parent's at most as many) that fits
    while lo < hi:
      mid = (lo + hi + 1) // 2
      if block_bytes(param_bytes, mid, min(mid, size), pairwise=pairwise) * experiments <= avail:
        lo = mid
      else:
        hi = mid - 1
    fits_rows = lo
    raise ValueError(
      f"run {label!r} does not fit in memory: its blockwise aggregator holds every parent's cohort "
      f"({rows} slots of {param_bytes} bytes{', with pairwise distances' if pairwise else ''}): "
      f"{blocks} bytes + state {state_bytes * experiments} bytes > limit {limit} bytes ({source}); "
      f"sample at most {max(int(fits_rows), 0)} clients per round in all (cohort_size) or use the mean")
  if experiments > 1:  # a sweep: fewer experiments at once
    fits = limit // max(1, state_bytes + step_bytes * chunk)
  else:
    fits = (limit - state) // max(1, step_bytes)
  advice = (f"set {chunk_name} <= {int(fits)}" if fits >= 1 else
            "even the smallest chunk does not fit: use a smaller model or cohort, or more devices")
  at_once = f", {experiments} experiments at once" if experiments > 1 else ""
  per = f", {models} models per client step" if models > 1 else ""
  raise ValueError(
    f"run {label!r} does not fit in memory: state {state} bytes{needs.describe()} + chunk working set "
    f"{work} bytes (chunk_size={chunk}{at_once}{per}) = {state + work} bytes > limit {limit} bytes "
    f"({source}); {advice}"
  )


def estimate_chunk(value, num_clients: int) -> int:
  """Clients trained at once for a ``chunk_size`` value: an int, ``None`` (the whole cohort, at
  most every client) or an ``"auto"`` policy (:func:`fedtree.core.tuning.chunk_policy`)."""
  if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
    return max(1, min(int(value), num_clients))
  if callable(value):
    return max(1, min(int(value(num_clients, max(1, jax.device_count()))), num_clients))
  return num_clients


@dataclasses.dataclass
class Budget:
  """The memory check of every run of a config: its limit, and the bytes of a client step
  (measured once, on first use)."""

  limit: int | None
  source: str
  num_clients: int
  step: Any  # () -> bytes of one client's local step
  _step_bytes: int | None = None

  @classmethod
  def of(cls, ctx) -> Budget:
    limit, source = memory_limit(ctx.config)

    def step():
      try:
        return tuning.client_step_bytes(ctx.model, ctx.local_optimizer, ctx.data.example_shape,
                                        ctx.schedule.batch_size)
      except Exception:  # noqa: BLE001  (a model the estimate cannot compile alone: state only)
        return 0

    return cls(limit=limit, source=source, num_clients=int(ctx.data.num_clients), step=step)

  def step_bytes(self) -> int:
    if self._step_bytes is None:
      self._step_bytes = int(self.step())
    return self._step_bytes

  def check(self, label: str, state_shapes, chunk_size, *, experiments: int = 1,
            chunk_name: str = "chunk_size", block: tuple[int, int, int, bool] | None = None,
            needs: Needs | None = None) -> str:
    """:func:`check_memory` of run ``label`` with state ``state_shapes`` (one experiment's)."""
    return check_memory(label, state_bytes=tree_bytes(state_shapes), step_bytes=self.step_bytes(),
                        chunk=estimate_chunk(chunk_size, self.num_clients), limit=self.limit,
                        source=self.source, experiments=experiments, chunk_name=chunk_name, block=block,
                        needs=needs)
