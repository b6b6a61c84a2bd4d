"""Memory stated before a run compiles: the bytes of the clients' data, of the (stacked) state
and of a chunk's working set, against the device's limit, so that a run that cannot fit fails
early with the numbers and the largest chunk (or about the largest population) that would fit
(issue 15 item 8, issue 43 item 3).

The clients' data lives on the device for the whole run (every client's padded train and test
split: :func:`data_bytes`), so it is what grows with the population; the state is measured
without allocating (``jax.eval_shape`` of ``init``); a chunk's working set is the clients trained
at once times the bytes one client's local step touches (:func:`fedtree.core.tuning.client_step_bytes`,
one small compile). The limit is ``config.memory_limit_bytes`` when set (tests force a small
one), else the accelerator's ``bytes_limit``, else on CPU the memory available to the process
(:func:`available_memory`: its cgroup's limit and the machine's ``MemAvailable``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np

from fedtree.core import tuning
from fedtree.experiment.fields import field


def tree_bytes(tree) -> int:
  """Bytes of every array (or ``ShapeDtypeStruct``) leaf of ``tree``."""
  return int(sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)
                 if hasattr(x, "shape") and hasattr(x, "dtype") and not jax.dtypes.issubdtype(
                   x.dtype, jax.dtypes.prng_key)))


def memory_limit(config: ml_collections.ConfigDict) -> tuple[int | None, str]:
  """``(bytes, where from)``: ``config.memory_limit_bytes`` when set, else the device's
  ``bytes_limit`` (accelerators), else on CPU the memory available to this process
  (:func:`available_memory`: what it holds now plus what its cgroup and the machine still have free),
  else ``None``."""
  value = field(config, "memory_limit_bytes")
  if value is not None:
    return int(value), "config.memory_limit_bytes"
  device = tuning.device_memory_bytes()
  if device is not None:
    return device, f"{jax.devices()[0].platform} device bytes_limit"
  if jax.default_backend() == "cpu":
    return available_memory()
  return None, "unknown"


def _read(path: str) -> str | None:
  """The text of ``path``, or ``None`` where it cannot be read (the one reader :func:`available_memory`
  uses, replaced in tests)."""
  try:
    with open(path) as f:
      return f.read()
  except OSError:
    return None


_UNLIMITED = 2**60   # a cgroup v1 limit this large (9223372036854771712 when unset) means none


def _stat(text: str | None, key: str) -> int:
  """The value of ``key`` in a ``memory.stat`` or ``/proc/meminfo`` text (0 where absent; meminfo's kB
  as bytes)."""
  for line in (text or "").splitlines():
    parts = line.replace(":", " ").split()
    if len(parts) >= 2 and parts[0] == key and parts[1].isdigit():
      return int(parts[1]) * (1024 if len(parts) > 2 and parts[2] == "kB" else 1)
  return 0


def _cgroup_free() -> tuple[int, str] | None:
  """``(bytes, what)`` this process's memory cgroup has left below its limit (the limit less the
  usage that cannot be reclaimed: less its inactive file cache), or ``None`` without a limit. cgroup v2
  (``memory.max``, ``memory.current``) and v1 (``memory.limit_in_bytes``, ``memory.usage_in_bytes``),
  in the process's own cgroup (``/proc/self/cgroup``) or the namespace's root."""
  paths = {"v2": "", "v1": ""}
  for line in (_read("/proc/self/cgroup") or "").splitlines():
    _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
    if controllers == "":
      paths["v2"] = path.strip()
    elif "memory" in controllers.split(","):
      paths["v1"] = path.strip()
  layouts = (("v2", "/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"),
             ("v1", "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
              "total_inactive_file"))
  for version, root, limit_name, usage_name, inactive in layouts:
    for folder in dict.fromkeys((root + paths[version].rstrip("/"), root)):
      text = _read(f"{folder}/{limit_name}")
      if text is None:
        continue
      text = text.strip()
      if not text.isdigit() or int(text) >= _UNLIMITED:
        break   # "max" (v2) or the v1 sentinel: no limit here
      usage = int((_read(f"{folder}/{usage_name}") or "0").strip() or 0)
      used = max(0, usage - _stat(_read(f"{folder}/memory.stat"), inactive))
      what = f"cgroup {version} {limit_name} {_gib(int(text))} less {_gib(used)} used"
      return max(0, int(text) - used), what
  return None


def _rss() -> int:
  """Bytes this process holds now (its resident set, ``/proc/self/statm``), 0 where unknown."""
  try:
    return int((_read("/proc/self/statm") or "0 0").split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, IndexError, OSError):
    return 0


def available_memory() -> tuple[int | None, str]:
  """``(bytes, where from)``: the memory this process may hold in all: what it holds now (its RSS)
  plus the least of what the machine has available (``MemAvailable`` of ``/proc/meminfo``) and what
  its cgroup has left below ``memory.max`` / ``memory.limit_in_bytes``; the host's physical memory
  where neither is known (not Linux); ``None`` where nothing is."""
  free = []
  available = _stat(_read("/proc/meminfo"), "MemAvailable")
  if available:
    free.append((available, f"MemAvailable {_gib(available)}"))
  cgroup = _cgroup_free()
  if cgroup is not None:
    free.append(cgroup)
  if free:
    n, what = min(free)
    own = _rss()
    return own + n, f"available: {what} + this process's {_gib(own)}"
  try:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "host physical memory"
  except (ValueError, OSError, AttributeError):
    return None, "unknown"


def _gib(n: int) -> str:
  return f"{n / 2**30:.3g} GiB" if n >= 2**28 else f"{n / 2**20:.3g} MiB"


def block_bytes(param_bytes: int, rows: int, block_size: int, *, pairwise: bool) -> int:
  """Bytes a blockwise aggregator (:mod:`fedtree.toolbox.robust`) holds at once: the ``rows = P x K``
  slots of every parent's cohort of deltas, twice (the block and its sorted or rewritten
  copy), and for the distance-based ones (Krum, Bulyan, min-max / min-sum) ``K x K`` float32
  distances per parent, twice (the matrix and its sort), at most ``rows x K``."""
  return 2 * rows * param_bytes + (2 * 4 * rows * block_size if pairwise else 0)


def data_bytes(ctx) -> int:
  """Bytes of the clients' data a run keeps on the device: every array of ``ctx.data`` (train
  and test splits of every client, padded or ragged) and, with a mesh, the copy sharded over it
  (this device's share on an accelerator; all of it on CPU, whose devices share the host's
  memory)."""
  total = tree_bytes(ctx.data)
  sharded = getattr(ctx, "sharded_data", None)
  if sharded is not None:
    copy = tree_bytes(sharded)
    total += copy if jax.default_backend() == "cpu" else -(-copy // max(1, jax.device_count()))
  return total


def check_data(data, config: ml_collections.ConfigDict) -> None:
  """Refuses, before it is copied to the device, a population whose data cannot fit there: the
  clients' data (:func:`tree_bytes` of the host ``data``) once on an accelerator, twice on CPU
  (the host arrays and the device's copy of them are both in host memory while it is made).

  Raises:
    ValueError: with the bytes, the clients, the limit and about how many clients fit.
  """
  limit, source = memory_limit(config)
  size = tree_bytes(data)
  copies = 2 if jax.default_backend() == "cpu" else 1
  if limit is None or copies * size <= limit:
    return
  clients = int(data.num_clients)
  per = size / max(1, clients)
  how = ("twice: the host arrays and the device's copy, both in host memory while it is made"
         if copies == 2 else "once, on the device, for the whole run")
  raise ValueError(
    f"the clients' data does not fit in memory: {size} bytes ({clients} clients x {per:.0f} bytes) held "
    f"{how}: {copies * size} bytes > limit {limit} bytes ({source}); about {int(limit // (copies * per))} "
    f"clients fit with nothing else; use fewer clients, the ragged layout (config.data.layout='ragged': "
    f"no padding rows), a device with more memory, or config.memory_limit_bytes if the limit is wrong")


def check_planned(config: ml_collections.ConfigDict, data_config=None) -> None:
  """Refuses, before any array is generated, a generated population (``config.data``, or
  ``data_config``) whose data cannot fit (:func:`fedtree.experiment.data.planned_size`: a lower bound
  from the config's fields), by :func:`check_data`'s rule: what the generation would spend (seconds to
  minutes and the memory) is not spent on a run that is refused once it is done.

  Raises:
    ValueError: with the bytes, how they are counted, the limit and about how many clients fit.
  """
  from fedtree.experiment.data import planned_size

  try:
    planned = planned_size(config.data if data_config is None else data_config)
  except (ValueError, TypeError, ArithmeticError):   # a bad field: the generator's own error names it
    return
  if planned is None:
    return
  limit, source = memory_limit(config)
  copies = 2 if jax.default_backend() == "cpu" else 1
  if limit is None or copies * planned.bytes <= limit:
    return
  per = planned.bytes / max(1, planned.clients)
  how = ("twice: the host arrays and the device's copy, both in host memory while it is made"
         if copies == 2 else "once, on the device, for the whole run")
  raise ValueError(
    f"the clients' data would not fit in memory (refused before generating it): at least {planned.bytes} "
    f"bytes ({planned.how}) held {how}: {copies * planned.bytes} bytes > limit {limit} bytes ({source}); "
    f"about {int(limit // (copies * per))} clients fit with nothing else; use fewer clients or examples, the "
    f"ragged layout (config.data.layout='ragged': no padding rows), a device with more memory, or "
    f"config.memory_limit_bytes if the limit is wrong")


def copied_bytes(tree, original) -> int:
  """Bytes of the leaves of ``tree`` that are not those of ``original`` (same structure): what a
  modified copy holds besides it (a data attack's poisoned training split)."""
  if tree is original:
    return 0
  return sum(tree_bytes(a) for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(original), strict=True)
             if a is not b)


def eval_bytes(model, data, chunk_size, rows: int | None = None) -> int:
  """Scratch XLA allocates to evaluate one model on every client's test split
  (``Compiled.memory_analysis()`` of the evaluator at the data's shapes; nothing allocated):
  ``chunk_size`` clients at once (``config.eval_chunk_size``), every client with ``None``, so
  it grows with the population. ``rows``: the clients scored in one call instead of every client
  (a streamed run's evaluation chunk, read from its store: ``config.population.eval_chunk``).
  0 where it cannot be measured."""
  import jax.numpy as jnp

  from fedtree.core.metrics import make_evaluator

  try:
    params = jax.eval_shape(lambda: jax.tree.map(lambda a: a[None], model.init(jax.random.key(0))))
    shape = jax.ShapeDtypeStruct
    c = int(data.num_clients) if rows is None else int(rows)
    x, y = (shape((c,) + tuple(a.shape[1:]), a.dtype) for a in (data.x_test, data.y_test))
    args = (x, y, shape((c,), jnp.int32), shape((c,), jnp.int32))
    analysis = make_evaluator(model, chunk_size).lower(params, *args).compile().memory_analysis()
  except Exception:  # noqa: BLE001  (a model the estimate cannot compile alone: not counted)
    return 0
  return 0 if analysis is None else int(analysis.temp_size_in_bytes + analysis.output_size_in_bytes)


@dataclasses.dataclass(frozen=True)
class Needs:
  """What a method holds beyond one model's client step and evaluation, and the parts of its state
  worth naming, declared by its spec (:attr:`fedtree.experiment.spec.AlgorithmSpec.memory`).

  Attributes:
    step_models: models one client trains at once (FedEM: its ``K`` components): the chunk's
      working set is this many client steps per client.
    parts: ``(what, bytes)`` of the parts of the state worth naming (kNN-Per's memory, FedEM's
      components at every node): already in the state's bytes, named in the estimate and in a
      refusal.
    eval_models: models evaluated per client (FedEM's mixture: ``K``): the evaluator's scratch is
      this many times one model's.
    eval_client_bytes: scratch an evaluated client needs beside the model's (kNN-Per's distances
      from its test examples to its memory).
    cohort: ``(what, bytes)`` a round holds at once for its whole cohort beside the state and the
      chunk (FedAMP's cohort blocks and pairwise attention, FedFomo's candidate models, pFedHN's
      generated and sent models): added to the estimate, and a run they do not fit is refused
      naming them and the cohort to lower.
  """

  step_models: int = 1
  parts: tuple[tuple[str, int], ...] = ()
  eval_models: int = 1
  eval_client_bytes: int = 0
  cohort: tuple[tuple[str, int], ...] = ()

  def describe(self) -> str:
    """``" (of which ...)"`` naming the parts, or ``""``."""
    if not self.parts:
      return ""
    return " (of which " + ", ".join(f"{what} {n} bytes" for what, n in self.parts) + ")"


def check_memory(label: str, *, state_bytes: int, step_bytes: int, chunk: int, limit: int | None,
                 source: str, experiments: int = 1, chunk_name: str = "chunk_size",
                 block: tuple[int, int, int, bool] | None = None, data_bytes: int = 0,
                 clients: int = 0, evaluation_bytes: int = 0, eval_chunk: int | None = None,
                 needs: Needs | None = None, process_bytes: int = 0,
                 streamed_bytes: tuple[int, int] = (0, 0), reserve: int | None = None) -> str:
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
    data_bytes: bytes of the clients' data on the device (:func:`data_bytes`; shared by the
      experiments of a sweep).
    clients: the clients that data holds (to say how many would fit).
    evaluation_bytes: the evaluator's scratch (:func:`eval_bytes`), checked beside the data and
      the state (evaluation runs between rounds, not during one).
    eval_chunk: ``config.eval_chunk_size`` (``None``: every client at once), named in the error.
    needs: the method's :class:`Needs` (models per client step and per evaluation, named parts of
      the state), or ``None``.
    process_bytes: on CPU, this process's resident bytes now (the runtime and the clients' data as
      held, host and device copies alike): the line adds what the process holds at peak, this plus
      ``reserve``, the state and the larger working set (the rounds' or the evaluation's), and with
      the default limit (the memory available) refuses a run it exceeds; 0: not counted
      (accelerators, whose arrays are the device's).
    streamed_bytes: ``(device, process)``, what a streamed run reads as it runs
      (:func:`fedtree.experiment.population.stream_bytes`): on the device beside the data, and in
      the process's peak.
    reserve: what compiling and running the rounds adds to the process (:func:`runtime_reserve` of
      the model's step; ``None``: :data:`RUNTIME_RESERVE`).

  Returns:
    The line (the caller prints it).
  """
  reserve = RUNTIME_RESERVE if reserve is None else int(reserve)
  needs = Needs() if needs is None else needs
  models = max(1, int(needs.step_models))
  step_bytes = step_bytes * models   # a client trains ``models`` models at once
  if evaluation_bytes:
    at_a_time = max(1, clients if eval_chunk is None else min(int(eval_chunk), clients))
    evaluation_bytes = evaluation_bytes * max(1, int(needs.eval_models)) + needs.eval_client_bytes * at_a_time
  blocks = 0 if block is None else block_bytes(block[0], block[1], block[2], pairwise=block[3]) * experiments
  held = sum(int(n) for _, n in needs.cohort) * experiments   # the round's buffers over its cohort
  state = state_bytes * experiments + blocks + held
  e = _Estimate(label=label, limit=limit, source=source, data=data_bytes, clients=clients, state=state,
                state_bytes=state_bytes, step=step_bytes, work=step_bytes * chunk * experiments,
                evaluation=evaluation_bytes, eval_chunk=eval_chunk, experiments=experiments, chunk=chunk,
                chunk_name=chunk_name, models=models, blocks=blocks, held=held, block=block, needs=needs)
  on_device, in_process = (int(n) for n in streamed_bytes)
  total = data_bytes + on_device + state + e.work
  line = _line(e, total)
  if on_device:
    line += f" + streamed windows {_gib(on_device)}"
  at_once = "every client" if eval_chunk is None else f"{eval_chunk} clients"
  evaluation = f"; evaluation {_gib(evaluation_bytes)} ({at_once} at once)" if evaluation_bytes else ""
  if limit is None:
    return line + evaluation + " (no memory limit known)"
  peak = (process_bytes + reserve + in_process + state + max(e.work, evaluation_bytes)
          if process_bytes else 0)
  if peak:
    evaluation += (f"; this process at peak {_gib(peak)} (now {_gib(process_bytes)}: the runtime and the "
                   f"clients' data as held, + {_gib(reserve)} compiling and running + "
                   f"{'the streamed windows and reader + ' if in_process else ''}state + the "
                   f"larger of the chunk's and the evaluation's working sets)")
  line += f"{evaluation}, limit {_gib(limit)} ({source})"
  if total <= limit:
    if data_bytes + state + evaluation_bytes > limit:   # evaluating every client at once does not fit
      raise _evaluation_refusal(e)
    if peak > limit and source.startswith("available"):   # what the process would hold: more than is free
      message = (f"run {label!r} does not fit in the memory available: {line}; free memory, or use fewer "
                 f"clients or a smaller chunk_size / config.eval_chunk_size")
      if evaluation_bytes > e.work:   # the evaluation is the larger: a smaller chunk of it may fit
        room = limit - peak + evaluation_bytes   # beside the runtime, the data and the state
        at_a_time = max(1, clients if eval_chunk is None else min(int(eval_chunk), clients))
        raise EvaluationDoesNotFit(message, max(0, int(room // (evaluation_bytes / at_a_time))))
      raise ValueError(message)
    return line
  if needs.cohort and data_bytes + state > limit:   # the method's work over the cohort does not fit
    raise _cohort_refusal(e)
  if block is not None and data_bytes + state > limit:   # the cohort blocks do not fit: a smaller cohort
    raise _block_refusal(e)
  raise _chunk_refusal(e, total)


RUNTIME_RESERVE = 320 * 2**20
"""What compiling and running a run's rounds adds where the model's program was not measured
(:func:`runtime_reserve` of a step of the quickstart's MLP, rounded up)."""

RESERVE_BASE = 160 * 2**20
RESERVE_PER_LINE = 270 * 2**10
"""Bytes a CPU process gains, beyond the arrays the estimate counts, compiling and running a run's
rounds and evaluator (XLA's compiler and its heap, the executables, the host's copies of the
metrics): ``RESERVE_BASE + RESERVE_PER_LINE x`` the lines of the model's optimized client step
(:func:`runtime_reserve`). Measured from the RSS at a run's start to its peak less the working sets
(``tests/test_memory_peak.py``, with the heap released between runs, :func:`release_heap`): 187-253
MiB for the quickstart's MLP (a 484-line step; 10^3 to 10^5 clients, padded and ragged) and 494 MiB for
AFO's StackOverflow LSTM (1,448 lines); what compiling costs grows with the program XLA compiles."""


def runtime_reserve(step_lines: int) -> int:
  """What compiling and running the rounds of a model whose client step compiles to ``step_lines``
  lines of HLO adds to the process (:data:`RESERVE_PER_LINE`); :data:`RUNTIME_RESERVE` where the step
  was not measured (0 lines)."""
  if step_lines <= 0:
    return RUNTIME_RESERVE
  return RESERVE_BASE + RESERVE_PER_LINE * int(step_lines)


def release_heap() -> None:
  """Returns the memory the process has freed to the system (``gc.collect()``, then glibc's
  ``malloc_trim(0)`` where the C library has it): XLA's compiler frees most of what it used, but the
  allocator keeps it, so a config's later runs would start from the earlier runs' high-water mark.
  The runner calls it between runs; a no-op where there is no glibc."""
  import ctypes
  import gc

  gc.collect()
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):   # not glibc (macOS, musl): the allocator keeps its own policy
    pass


class _Estimate(NamedTuple):
  """The figures of one run's memory estimate (bytes) and what its refusals name
  (:func:`check_memory`'s arguments, the client step's times the models it trains)."""

  label: str
  limit: int | None
  source: str
  data: int                  # the clients' data on the device
  clients: int
  state: int                 # every experiment's state, the cohort blocks and buffers
  state_bytes: int           # one experiment's state
  step: int                  # one client's step, its models included
  work: int                  # the chunk's working set, every experiment's
  evaluation: int            # the evaluator's working set
  eval_chunk: int | None
  experiments: int
  chunk: int
  chunk_name: str
  models: int                # models a client step trains
  blocks: int                # a blockwise aggregator's cohort blocks
  held: int                  # the method's buffers over the round's cohort
  block: tuple[int, int, int, bool] | None
  needs: Needs


def _line(e: _Estimate, total: int) -> str:
  """The estimate's line, before its evaluation and limit."""
  parts = ("" if not e.needs.parts else
           " (of which " + ", ".join(f"{what} {_gib(n)}" for what, n in e.needs.parts) + ")")
  cohort = ", ".join(f"{what} {_gib(n)}" for what, n in e.needs.cohort)
  return (f"{e.label}: memory estimate {_gib(total)}: "
          f"{f'clients data {_gib(e.data)} ({e.clients} clients) + ' if e.data else ''}"
          f"state {_gib(e.state_bytes)}{parts}"
          f"{f' x {e.experiments} experiments' if e.experiments > 1 else ''}"
          f"{f' + cohort blocks {_gib(e.blocks)}' if e.block is not None else ''}"
          f"{' + ' + cohort if e.needs.cohort else ''}"
          f" + chunk working set "
          f"{e.chunk} x {_gib(e.step)} per client step{f' ({e.models} models)' if e.models > 1 else ''}"
          f"{f' x {e.experiments}' if e.experiments > 1 else ''}")


class EvaluationDoesNotFit(ValueError):
  """Evaluating ``config.eval_chunk_size`` clients at once (every client: ``None``) does not fit;
  ``fits``: the largest number of clients at once that would (0: not even one)."""

  def __init__(self, message: str, fits: int):
    super().__init__(message)
    self.fits = fits


def _evaluation_refusal(e: _Estimate) -> EvaluationDoesNotFit:
  """Evaluating every client at once does not fit: the largest ``eval_chunk_size`` that does."""
  room = e.limit - e.data - e.state
  at_a_time = e.clients if e.eval_chunk is None else min(int(e.eval_chunk), e.clients)
  per = e.evaluation / max(1, at_a_time)
  fits = int(room // per) if room > 0 else 0
  advice = (f"set config.eval_chunk_size <= {fits}" if fits >= 1 else
            "even one client's evaluation does not fit: use a smaller model or population")
  at_once = "every client" if e.eval_chunk is None else f"{e.eval_chunk} clients"
  return EvaluationDoesNotFit(
    f"run {e.label!r} does not fit in memory when it evaluates: state {e.state} bytes{e.needs.describe()} "
    f"+ evaluation "
    f"working set {e.evaluation} bytes (config.eval_chunk_size={e.eval_chunk}: {at_once} at once) + "
    f"clients data {e.data} bytes = {e.data + e.state + e.evaluation} bytes > limit {e.limit} "
    f"bytes ({e.source}); {advice}", fits)


def _cohort_refusal(e: _Estimate) -> ValueError:
  """The method's buffers over every parent's cohort do not fit: a smaller cohort."""
  what = ", ".join(f"{w} {n} bytes" for w, n in e.needs.cohort)
  return ValueError(
    f"run {e.label!r} does not fit in memory: its work over every parent's cohort holds {what}"
    f"{f' x {e.experiments} experiments' if e.experiments > 1 else ''} + state {e.state - e.held} bytes"
    f"{f' + clients data {e.data} bytes' if e.data else ''} = {e.data + e.state} bytes > limit "
    f"{e.limit} bytes ({e.source}); sample fewer clients per parent a round (cohort_size)")


def _block_refusal(e: _Estimate) -> ValueError:
  """A blockwise aggregator's cohort blocks do not fit: the largest cohort whose blocks do."""
  param_bytes, rows, size, pairwise = e.block
  avail = e.limit - e.data - e.state_bytes * e.experiments - e.step * e.experiments
  lo, hi = 0, rows   # the largest cohort (slots in all, a parent's at most as many) that fits
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if block_bytes(param_bytes, mid, min(mid, size), pairwise=pairwise) * e.experiments <= avail:
      lo = mid
    else:
      hi = mid - 1
  return ValueError(
    f"run {e.label!r} does not fit in memory: its blockwise aggregator holds every parent's cohort "
    f"({rows} slots of {param_bytes} bytes{', with pairwise distances' if pairwise else ''}): "
    f"{e.blocks} bytes + state {e.state_bytes * e.experiments} bytes"
    f"{f' + clients data {e.data} bytes' if e.data else ''} > limit {e.limit} bytes ({e.source}); "
    f"sample at most {max(int(lo), 0)} clients per round in all (cohort_size) or use the mean")


def _chunk_refusal(e: _Estimate, total: int) -> ValueError:
  """A chunk's working set does not fit: the largest chunk (a sweep: experiments at once) that
  does, or, when none does, about the clients that fit beside the state."""
  if e.experiments > 1:  # a sweep: fewer experiments at once (they share the clients' data)
    fits = (e.limit - e.data) // max(1, e.state_bytes + e.step * e.chunk)
  else:
    fits = (e.limit - e.data - e.state) // max(1, e.step)
  room = e.limit - e.state - e.step * e.experiments   # beside one client's step: for the clients' data
  if fits >= 1:
    advice = f"set {e.chunk_name} <= {int(fits)}"
  elif e.data and e.clients and 0 < room < e.data:   # the population does not fit
    per = e.data / e.clients
    advice = (f"even the smallest chunk does not fit: the clients' data alone is {e.data} bytes "
              f"({e.clients} clients x {per:.0f} bytes, kept on the device for the run), and about "
              f"{int(room // per)} clients fit beside the state and one client's step; use fewer "
              f"clients, the ragged layout (config.data.layout='ragged': no padding rows), more devices "
              f"(config.mesh_shape) or a device with more memory")
  else:
    advice = "even the smallest chunk does not fit: use a smaller model or cohort, or more devices"
  at_once = f", {e.experiments} experiments at once" if e.experiments > 1 else ""
  per_step = f", {e.models} models per client step" if e.models > 1 else ""
  data = f" + clients data {e.data} bytes ({e.clients} clients)" if e.data else ""
  return ValueError(
    f"run {e.label!r} does not fit in memory: state {e.state} bytes{e.needs.describe()} + chunk working set "
    f"{e.work} bytes (chunk_size={e.chunk}{at_once}{per_step}){data} = {total} bytes > limit {e.limit} bytes "
    f"({e.source}); {advice}"
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
  (measured once, on first use). When evaluating every client at once (``config.eval_chunk_size``
  unset) does not fit beside a run, the check picks the largest chunk that does (:attr:`eval_chunk`,
  said in :attr:`eval_note`) rather than let the run fail at its first evaluation."""

  limit: int | None
  source: str
  num_clients: int
  step: Any  # () -> one client's local step, measured (tuning.StepProgram)
  _step: tuning.StepProgram | None = None
  data_bytes: int = 0   # the clients' data on the device (data_bytes)
  evaluation: Any = None   # (eval chunk) -> the evaluator's scratch (eval_bytes)
  eval_chunk: int | None = None   # config.eval_chunk_size, or the chunk the check chose
  _eval_bytes: int | None = None
  chosen_eval_chunk: int | None = None   # the chunk the check chose (None: config.eval_chunk_size's)
  eval_note: str = ""   # what it chose and why, added to every line
  _every_eval_bytes: int = 0
  process: int = 0   # on CPU, this process's resident bytes at the last check (_rss; 0: not counted)

  @classmethod
  def of(cls, ctx) -> Budget:
    limit, source = memory_limit(ctx.config)

    def step():
      try:
        return tuning.client_step_program(ctx.model, ctx.local_optimizer, ctx.data.example_shape,
                                          ctx.schedule.batch_size)
      except Exception:  # noqa: BLE001  (a model the estimate cannot compile alone: state only)
        return tuning.StepProgram(0, 0)

    eval_chunk = field(ctx.config, "eval_chunk_size")
    eval_chunk = int(eval_chunk) if isinstance(eval_chunk, (int, np.integer)) else None
    # a streamed run scores its evaluation clients a chunk of the population at a time, read from the store
    rows = None
    if getattr(ctx, "streamed", False):
      population = ctx.population
      rows = int(population.eval_chunk)
      if population.eval_clients:   # a sample per evaluation: never more at once than it scores
        rows = min(rows, int(population.eval_clients))
    return cls(limit=limit, source=source, num_clients=int(ctx.data.num_clients), step=step,
               data_bytes=data_bytes(ctx),
               evaluation=lambda chunk: eval_bytes(ctx.model, ctx.data, chunk, rows),
               eval_chunk=eval_chunk, process=_rss() if jax.default_backend() == "cpu" else 0)

  def step_bytes(self) -> int:
    return self._program().bytes

  def reserve(self) -> int:
    """What compiling and running this model's rounds adds to the process (:func:`runtime_reserve`)."""
    return runtime_reserve(self._program().lines)

  def _program(self) -> tuning.StepProgram:
    if self._step is None:
      self._step = self.step()
    return self._step

  def eval_bytes(self) -> int:
    if self._eval_bytes is None:
      self._eval_bytes = int(self.evaluation(self.eval_chunk)) if self.evaluation is not None else 0
    return self._eval_bytes

  def check(self, label: str, state_shapes, chunk_size, *, experiments: int = 1,
            chunk_name: str = "chunk_size", block: tuple[int, int, int, bool] | None = None,
            extra_data_bytes: int = 0, needs: Needs | None = None,
            streamed_bytes: tuple[int, int] = (0, 0)) -> str:
    """:func:`check_memory` of run ``label`` with state ``state_shapes`` (one experiment's);
    ``extra_data_bytes``: a copy of the data the run keeps besides (a data attack's poisoned
    copy); ``needs``: the method's (:class:`Needs`); ``streamed_bytes``: a streamed run's windows
    (:func:`fedtree.experiment.population.stream_bytes`). Where evaluating every client at once does not
    fit (and ``config.eval_chunk_size`` is unset), the largest chunk that fits is chosen
    (:attr:`chosen_eval_chunk`: the runner plans the runs again with it) and the line says so."""
    step_bytes = self.step_bytes()
    self.eval_bytes()   # (both compiled first: their compiles are in what the process holds)
    if self.process:   # what the process holds now, the estimate's own compiles and earlier runs' included
      self.process = _rss() or self.process
    while True:
      try:
        line = check_memory(label, state_bytes=tree_bytes(state_shapes), step_bytes=step_bytes,
                            chunk=estimate_chunk(chunk_size, self.num_clients), limit=self.limit,
                            source=self.source, experiments=experiments, chunk_name=chunk_name, block=block,
                            data_bytes=self.data_bytes + int(extra_data_bytes), clients=self.num_clients,
                            evaluation_bytes=self.eval_bytes(), eval_chunk=self.eval_chunk, needs=needs,
                            process_bytes=self.process, streamed_bytes=streamed_bytes,
                            reserve=self.reserve())
        return line + self.eval_note
      except EvaluationDoesNotFit as e:
        if self.eval_chunk is not None and self.chosen_eval_chunk is None:
          raise   # the config's own chunk: its refusal names the one that fits
        current = self.num_clients if self.eval_chunk is None else self.eval_chunk
        fits = min(e.fits, current - 1)   # smaller every time: the scratch is not quite linear in the chunk
        if fits < 1:
          raise
        if self.chosen_eval_chunk is None:
          self._every_eval_bytes = self.eval_bytes()
        self.chosen_eval_chunk = self.eval_chunk = fits
        self._eval_bytes = None
        self.eval_note = (f"; evaluating every client at once ({_gib(self._every_eval_bytes)}) does not fit: "
                          f"{fits} clients at a time (config.eval_chunk_size chosen)")
