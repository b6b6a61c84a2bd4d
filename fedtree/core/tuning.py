"""Choosing the chunk size: how many clients one ``vmap`` trains at once (see fedtree.core.tier).

The chunk decides peak memory (it grows with the chunk, not the cohort) and, on CPU, speed
as well: a chunk that is too large spills the per-client models out of cache, one that is
too small pays per-chunk overhead. :func:`default_chunk_size` is a per-backend default found
by measurement (benchmarks/README.md); :func:`autotune_chunk_size` times a few candidates
on the actual round at start-up and keeps the fastest. Both return a chunk that splits the
cohort into near-equal chunks (little padding) and is a multiple of the number of devices
of the client mesh, so every device gets the same share.

On CPU the best chunk also depends on the model: a client whose local step touches more
than the cache holds gains nothing from sharing a ``vmap`` with others and loses locality.
On a GPU the largest chunk wins (measured on an H100: benchmarks/README.md, "On a GPU"), up
to what device memory holds. :func:`chunk_policy` sizes ``"auto"`` chunks from what one
client's compiled step touches (:func:`client_step_bytes`) on every backend; the experiment
runner uses it for every algorithm.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import jax

if TYPE_CHECKING:
  from fedtree.core.algorithm import FederatedAlgorithm

# Clients per chunk, per backend (measured: benchmarks/README.md). On CPU the per-client
# models of a chunk must stay in cache: for the MLP of workload (a) (210 KB of params per
# client) 1-4 clients per chunk ran at ~2,100 client-updates/s, 32 at ~1,800, 128 at ~1,100
# and 250 at ~550; vmap buys nothing there. Accelerators want large chunks to fill the device:
# workload (a) at 10,000 clients on an H100 (jax 0.11.2) ran at ~222k client-updates/s with
# chunks of 256, ~287k with 1,000, ~305k with 2,500, ~321k with 5,000 and ~326k with the
# whole cohort in one chunk, so on GPUs a chunk is the cohort up to 16,384 clients (and what
# ACCEL_CHUNK_BUDGET_BYTES allows). TPUs: not measured.
DEFAULT_CHUNK = {"cpu": 4, "gpu": 16384, "cuda": 16384, "rocm": 16384, "tpu": 2048}
# With the clients sharded over several CPU devices (one per core, XLA_FLAGS=
# --xla_force_host_platform_device_count=N), every chunk pays a cross-device step, so larger
# chunks win: workload (a) at 1,000 clients on 2 devices ran at ~1,060 client-updates/s with 1
# client per device per chunk, ~2,500 with 4, ~3,000 with 8, ~3,400 with 32, ~2,800 with 64
# (measured on a quiet 2-core machine; ~2,000-2,200 on one device whatever the chunk).
SHARDED_CPU_CHUNK = 32
# On CPU a device's chunk should touch at most about this many bytes per local step: the
# MLP of workload (a) touches ~0.5 MB per client (32 per device), the CNN of workload (b)
# ~37 MB (im2col columns, activations, 1.6 M params), for which 1 client per device ran
# 1.4x faster than 25 (benchmarks/README.md).
CPU_CHUNK_BUDGET_BYTES = 16 * 2**20
# On an accelerator a device's chunk may touch at most this many bytes per local step (a
# share of device memory that leaves room for the data, the server state and XLA's
# buffers on a 16 GB card). Measured on an H100 (Compiled.memory_analysis() of one step):
# 0.8 MB per client for the MLP of workload (a) (5,320 clients: a 10,000-client cohort
# trains in 2 chunks of 5,000, as fast as 1 of 10,000 within the run-to-run spread), 25 MB
# for the CNN of workload (b) (172 clients). Beyond it a chunk gains little and risks running
# out of memory.
ACCEL_CHUNK_BUDGET_BYTES = 4 * 2**30
# And never more than this fraction of a device that reports its memory (the rest holds the
# data, the models of every node and XLA's buffers). Paper 000's LSTM (2x512, 20K words,
# 15.6M params) touches ~185 MB per client step at B = 16, T = 20: 1,024 clients per chunk
# would need ~185 GB; the budget gives 23.
ACCELERATOR_CHUNK_MEMORY_FRACTION = 0.5


def balanced_chunk(cohort_size: int, target: int, multiple_of: int = 1) -> int:
  """The smallest chunk, a multiple of ``multiple_of``, splitting ``cohort_size`` slots into
  ``ceil(cohort_size / target)`` chunks (so padding is under one chunk's ``num_chunks``)."""
  if cohort_size < 1 or target < 1 or multiple_of < 1:
    raise ValueError(
      f"balanced_chunk(cohort_size={cohort_size}, target={target}, multiple_of={multiple_of}): "
      "all must be >= 1"
    )
  target = min(target, cohort_size)
  num_chunks = math.ceil(cohort_size / target)
  chunk = math.ceil(cohort_size / num_chunks)
  return math.ceil(chunk / multiple_of) * multiple_of


def default_chunk_size(
  cohort_size: int, *, backend: str | None = None, num_devices: int = 1,
  client_bytes: int | None = None, group_sizes: Sequence[int] | None = None,
  device_bytes: int | None = None,
) -> int:
  """The per-backend default chunk for a cohort of ``cohort_size`` slots.

  With ``num_devices`` devices on the client mesh each device gets ``DEFAULT_CHUNK`` clients
  (``SHARDED_CPU_CHUNK`` on CPU devices). ``client_bytes`` (what one client's local step
  touches, :func:`client_step_bytes`) caps a device's share of a chunk at
  ``CPU_CHUNK_BUDGET_BYTES`` on CPU (cache) and ``ACCEL_CHUNK_BUDGET_BYTES`` elsewhere
  (device memory; and at most ``ACCELERATOR_CHUNK_MEMORY_FRACTION`` of ``device_bytes``
  where the device reports it), at least one client. With ``group_sizes`` (the cohort of
  every parent), a chunk down to half that size that divides every parent's cohort is
  preferred: no slot is padding, and chunks hold one parent each
  (``CohortSampler.parent_aligned``), so they train from a broadcast of its model instead of
  per-client copies.
  """
  backend = backend or jax.default_backend()
  per_device = DEFAULT_CHUNK.get(backend, DEFAULT_CHUNK["gpu"])
  if backend == "cpu" and num_devices > 1:
    per_device = SHARDED_CPU_CHUNK
  if client_bytes:
    budget = CPU_CHUNK_BUDGET_BYTES if backend == "cpu" else ACCEL_CHUNK_BUDGET_BYTES
    if backend != "cpu" and device_bytes:
      budget = min(budget, int(ACCELERATOR_CHUNK_MEMORY_FRACTION * int(device_bytes)))
    per_device = max(1, min(per_device, budget // int(client_bytes)))
  chunk = balanced_chunk(cohort_size, per_device * num_devices, num_devices)
  if group_sizes is not None:
    for c in range(chunk, max(1, chunk // 2) - 1, -1):
      if c % num_devices == 0 and all(int(g) % c == 0 for g in group_sizes):
        return c
  return chunk


class StepProgram(NamedTuple):
  """One client's compiled local step, measured (:func:`client_step_program`).

  Attributes:
    bytes: the scratch XLA allocates for it plus the params and optimizer state it writes
      (``Compiled.memory_analysis()``); 0 on a backend without memory analysis.
    lines: the lines of its optimized HLO (``Compiled.as_text()``): how large a program the
      model makes, which is what compiling a run's rounds costs in host memory
      (:func:`fedtree.experiment.memory.runtime_reserve`).
  """

  bytes: int
  lines: int


def client_step_program(model, optimizer, example_shape: Sequence[int], batch_size: int) -> StepProgram:
  """One compiled SGD step of ``model`` with ``optimizer`` on a batch, measured: its bytes and the
  size of its program (:class:`StepProgram`)."""
  import jax.numpy as jnp

  from fedtree.core.local import Batch, SGDCarry, make_sgd_step

  params = jax.eval_shape(model.init, jax.random.key(0))
  carry = jax.eval_shape(
    lambda p: SGDCarry(params=p, opt_state=optimizer.init(p), anchor=p), params
  )
  batch = Batch(  # abstract values (ShapeDtypeStruct) for lowering, in the batch's structure
    x=jax.ShapeDtypeStruct((batch_size,) + tuple(example_shape),  # type: ignore[arg-type]
                           getattr(model, "input_dtype", "float32")),
    y=jax.ShapeDtypeStruct((batch_size,) + tuple(getattr(model, "label_shape", ())),  # type: ignore[arg-type]
                           jnp.int32),
    mask=jax.ShapeDtypeStruct((batch_size,), jnp.bool_),  # type: ignore[arg-type]
  )
  key = jax.eval_shape(lambda: jax.random.key(0))
  compiled = jax.jit(make_sgd_step(model, optimizer)).lower(carry, batch, key).compile()
  try:
    lines = (compiled.as_text() or "").count("\n")
  except Exception:  # noqa: BLE001  (a backend that cannot print its program)
    lines = 0
  analysis = compiled.memory_analysis()
  if analysis is None:  # a backend without memory analysis: assume it is small
    return StepProgram(0, lines)
  return StepProgram(int(analysis.temp_size_in_bytes + analysis.output_size_in_bytes), lines)


def client_step_bytes(model, optimizer, example_shape: Sequence[int], batch_size: int) -> int:
  """Bytes one client's local step touches: the scratch XLA allocates for one compiled SGD
  step of ``model`` with ``optimizer`` on a batch, plus the params and optimizer state it
  writes (``Compiled.memory_analysis()``; :func:`client_step_program`)."""
  return client_step_program(model, optimizer, example_shape, batch_size).bytes


def device_memory_bytes(device=None) -> int | None:
  """The memory limit of ``device`` (the first device by default) in bytes, or ``None`` where
  the backend does not report it (CPU)."""
  try:
    stats = (device or jax.devices()[0]).memory_stats()
  except Exception:  # backends without memory statistics raise or return None
    return None
  return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


ChunkPolicy = Callable[..., int]


def chunk_policy(model, optimizer, example_shape: Sequence[int], batch_size: int) -> ChunkPolicy:
  """``"auto"`` for this model: ``policy(cohort_slots, num_devices, group_sizes=None) -> chunk``.

  :func:`default_chunk_size`, with ``client_bytes`` measured (once, on first use: one small
  compile) and, on accelerators that report it, the device's memory
  (:func:`device_memory_bytes`); algorithms accept the policy wherever they accept
  ``chunk_size``.
  """
  measured: list[int] = []

  def policy(cohort_slots: int, num_devices: int, group_sizes: Sequence[int] | None = None) -> int:
    device_bytes = None if jax.default_backend() == "cpu" else device_memory_bytes()
    if not measured:
      measured.append(client_step_bytes(model, optimizer, example_shape, batch_size))
    client_bytes = measured[0]
    return default_chunk_size(cohort_slots, num_devices=num_devices, client_bytes=client_bytes,
                              group_sizes=group_sizes, device_bytes=device_bytes)

  return policy


def candidate_chunks(cohort_size: int, *, num_devices: int = 1,
                     targets: Sequence[int] = (16, 32, 64, 128, 256)) -> list[int]:
  """Distinct balanced chunks for ``targets`` (per device), for :func:`autotune_chunk_size`."""
  out = {balanced_chunk(cohort_size, t * num_devices, num_devices) for t in targets}
  return sorted(out)


def autotune_chunk_size(
  time_round: Callable[[int], float], candidates: Sequence[int], *, repeats: int = 2,
  log: Callable[[str], None] | None = None,
) -> tuple[int, dict[int, float]]:
  """Times ``time_round(chunk) -> seconds`` for every candidate; returns (fastest, timings).

  ``time_round`` should build and compile the round for that chunk, then return the wall time
  of a compiled call (see :func:`round_timer`). Each candidate is timed ``repeats`` times
  and its best time kept (the machine may be busy).
  """
  if not candidates:
    raise ValueError("autotune_chunk_size needs at least one candidate chunk")
  timings = {}
  for c in candidates:
    timings[int(c)] = min(time_round(int(c)) for _ in range(max(1, repeats)))
    if log:
      log(f"chunk_size={c}: {timings[int(c)] * 1e3:.1f} ms per round")
  best = min(timings, key=timings.__getitem__)
  return best, timings


def round_timer(
  build_algorithm: Callable[[int], FederatedAlgorithm], data, key: jax.Array
) -> Callable[[int], float]:
  """A ``time_round`` for :func:`autotune_chunk_size` from ``build_algorithm(chunk)``.

  Compiles one round per chunk (cached across repeats) and returns the time of a compiled
  call from the initial state; the first (compiling) call is not timed.
  """
  from fedtree.core.loop import compile_rounds

  cache: dict[int, tuple] = {}

  def time_round(chunk: int) -> float:
    if chunk not in cache:
      alg = build_algorithm(chunk)
      step = compile_rounds(alg, 1, donate=False)
      state = alg.init(key)
      jax.block_until_ready(step(state, data, key))
      cache[chunk] = (step, state)
    step, state = cache[chunk]
    t = time.perf_counter()
    jax.block_until_ready(step(state, data, key))
    return time.perf_counter() - t

  return time_round
