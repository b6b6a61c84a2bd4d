"""A population read from a store (``config.data.name="store"``): resident when it fits, streamed when
it does not (``config.population``), and evaluated on a seeded sample of clients or every client in
streamed chunks."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np
from flax import struct

from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.data import FederatedData
from fedtree.experiment import memory
from fedtree.experiment.fields import POPULATION_FIELDS

MODES = ("auto", "resident", "streamed")
"""``config.population.mode``: decided by the memory limit (``"auto"``), or asked for."""


class Population(NamedTuple):
  """How a run reads a population from a store.

  Attributes:
    store: the :class:`~fedtree.population.store.ClientStore`.
    streamed: whether rounds read their clients' rows from it (``False``: resident).
    note: the one line that says which and why (with the numbers).
    cache_bytes: the reader's LRU cache of clients' rows.
    prefetch: calls read ahead.
    eval_clients: clients scored per evaluation (0: every client, in chunks of ``eval_chunk``).
    eval_chunk: clients scored at once.
    eval_seed: the evaluation sample's seed.
  """

  store: Any
  streamed: bool
  note: str
  cache_bytes: int = 0
  prefetch: int = 2
  eval_clients: int = 0
  eval_chunk: int = 1000
  eval_seed: int = 0
  eval_plan: Any = None
  paged: Any = None   # the run's PagedState (set by run_streamed): per-client sets are scored from it
  client_sets: tuple[str, ...] = ()   # the per-client sets scored from it (set by run_streamed)

  def with_groups(self, groups: np.ndarray) -> Population:
    """With the clients of every evaluation (:func:`eval_plan`) drawn over ``groups``."""
    return self._replace(eval_plan=eval_plan(self, groups))


def options(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """``config.population``'s fields (their declared defaults where absent), checked."""
  sec = config.get("population", None)
  out = {
    name: (default if sec is None else sec.get(name, default))
    for name, (_, default, _) in POPULATION_FIELDS.items()
  }
  if out["mode"] not in MODES:
    raise ValueError(f"config.population.mode={out['mode']!r}; choose one of {MODES}")
  for name in ("cache_bytes", "prefetch", "eval_clients", "eval_seed"):
    if int(out[name]) < 0:
      raise ValueError(f"config.population.{name}={out[name]} must be >= 0")
  if int(out["eval_chunk"]) < 1:
    raise ValueError(f"config.population.eval_chunk={out['eval_chunk']} must be >= 1")
  return out


def resident_bytes(store) -> int:
  """The bytes of every client's padded train and test rows held resident (the layout
  :meth:`~fedtree.population.store.ClientStore.to_federated_data` makes)."""
  feats = store.features
  per_row = sum(
    int(np.prod(feats[k].shape, dtype=np.int64)) * np.dtype(feats[k].dtype).itemsize for k in ("x", "y")
  )
  return int(store.num_clients * (store.width("train") + store.width("test")) * per_row)


READER_RESERVE = 64 * 2**20
"""Bytes a streamed run adds for its reader: the compiled read plan (measured at 41-60 MiB for FedAvg's
cohort draw, 10^4 to 10^6 clients) and the reader's thread and libraries."""

PER_CLIENT_STREAMED = 32
"""Bytes per client of the population a streamed run makes beside what is held when its estimate is
made: every client's counts moved to the device (8), the paged state's marks (2), the sampler's client
order and its sort (16), rounded up."""


def stream_bytes(algorithm: FederatedAlgorithm, data: FederatedData, population: Population,
                 rounds_per_call: int, key, mesh=None) -> tuple[int, int]:
  """``(device, process)``: the bytes a streamed run holds on the device beside its state (the rows of
  a call's window, the clients its rounds read, train and test at the store's widths, for the
  ``prefetch`` calls moved ahead and the one training; an evaluation chunk's test rows) and what its
  process holds besides at peak (those windows' host copies, the reader's cache,
  :data:`READER_RESERVE` and :data:`PER_CLIENT_STREAMED` per client). The store's pages a run
  touches are mapped from the page cache: counted in the resident set, reclaimed by the system when
  memory is short, and not counted here. Over a ``mesh`` a process holds a segment of every window as
  large as one device's window (:func:`fedtree.population.stream.layout`), spread over its devices: a
  device holds its share."""
  from fedtree.core import loop

  feats = population.store.features
  per_row = sum(int(np.prod(feats[k].shape, dtype=np.int64)) * np.dtype(feats[k].dtype).itemsize
                for k in ("x", "y"))
  reads = 0
  if algorithm.reads is not None:
    shapes = jax.eval_shape(algorithm.init, loop.init_key(key))
    reads = int(np.prod(jax.eval_shape(algorithm.reads.clients, shapes, key).shape))
  fuse = 1 if algorithm.reads is None or algorithm.reads.needs_state else int(rounds_per_call)
  width = int(data.x_train.shape[1]) + int(data.x_test.shape[1])
  windows = (int(population.prefetch) + 1) * fuse * reads * width * per_row
  per_process = 1 if mesh is None else int(np.asarray(mesh.devices).size) // jax.process_count()
  device = -(-(windows + int(population.eval_chunk) * int(data.x_test.shape[1]) * per_row) // per_process)
  process = (device * per_process + windows + int(population.cache_bytes) + READER_RESERVE
             + PER_CLIENT_STREAMED * int(data.num_clients))
  return device, process


def plan(
  config: ml_collections.ConfigDict, skeleton: FederatedData, store
) -> tuple[FederatedData, Population]:
  """The data a config's runs are built on, and how they read the population: resident (every row
  loaded now) when ``config.population.mode`` says so or, with ``"auto"``, when the population fits
  the memory limit (:func:`fedtree.experiment.memory.memory_limit`) as
  :func:`~fedtree.experiment.memory.check_data` counts it; streamed otherwise.

  Raises:
    ValueError: ``mode="resident"`` for a population that does not fit (naming the bytes); a streamed
      one over several processes with a mesh that leaves some of their devices out.
  """
  opts = options(config)
  size = resident_bytes(store)
  limit, source = memory.memory_limit(config)
  copies = 2 if jax.default_backend() == "cpu" else 1
  fits = limit is None or copies * size <= limit
  rest = dict(
    cache_bytes=int(opts["cache_bytes"]),
    prefetch=int(opts["prefetch"]),
    eval_clients=int(opts["eval_clients"]),
    eval_chunk=int(opts["eval_chunk"]),
    eval_seed=int(opts["eval_seed"]),
  )
  where = f"{store.num_clients:,} clients, {size:,} bytes of rows ({copies}x: {copies * size:,})"
  limit_s = "no limit" if limit is None else f"limit {limit:,} bytes ({source})"
  if opts["mode"] == "resident" or (opts["mode"] == "auto" and fits):
    data = store.to_federated_data()
    memory.check_data(data, config)
    return data, Population(store, False, f"population: resident, {where}; {limit_s}", **rest)
  why = "asked for" if opts["mode"] == "streamed" else "it does not fit"
  mesh = config.get("mesh_shape", None)
  procs = jax.process_count()
  if procs > 1 and mesh not in (None, -1, jax.device_count()):
    raise ValueError(
      f"the population of {store.path} streams ({why}: {where}; {limit_s}) over {procs} processes, each "
      f"reading its own clients onto its own devices: config.mesh_shape={mesh!r} leaves some processes' "
      f"devices out; use every device (config.mesh_shape=-1)"
    )
  holds = "the device holds" if not mesh and procs == 1 else (
    f"each of {procs} processes reads its own clients of" if procs > 1 else "the mesh's devices hold")
  note = (f"population: streamed from {store.path} ({why}: {where}; {limit_s}); {holds} each call's "
          f"window of clients")
  return skeleton, Population(store, True, note, **rest)


def eval_plan(population: Population, groups: np.ndarray):
  """The clients of every evaluation (:class:`fedtree.population.evaluation.EvalClients`): a seeded
  sample of ``eval_clients`` per evaluation (per group where there are several), or every client."""
  from fedtree.population.evaluation import every_client, sample_clients

  num = population.store.num_clients
  if population.eval_clients == 0:
    return every_client(num, chunk_size=population.eval_chunk)
  several = len(np.unique(groups)) > 1
  return sample_clients(
    size=population.eval_clients,
    num_clients=None if several else num,
    groups=groups if several else None,
    seed=population.eval_seed,
    chunk_size=population.eval_chunk,
  )


def node_models(models: dict[str, Any], num_clients: int) -> dict[str, Any]:
  """The model sets whose rows are server nodes (a global, a level's, a cluster's), which a streamed
  run scores on any client; the per-client sets (a row per client, kept in a paged state: over a
  window, ``model_of_client`` names the window's rows, not every client) and the sets scored with
  per-client inputs are left out."""
  out = {}
  for name, nm in models.items():
    leaves = jax.tree.leaves(nm.params)
    moc = np.asarray(nm.model_of_client)
    per_client = bool(leaves) and (moc.shape != (num_clients,) or np.array_equal(moc, np.arange(num_clients)))
    if getattr(nm, "client_params", None) is not None or (per_client and num_clients > 1):
      continue
    out[name] = nm
  return out


def scored_sets(algorithm: FederatedAlgorithm, state, num_clients: int
                ) -> tuple[dict[str, Any], list[str], list[str]]:
  """``(node, per_client, not_scored)`` of the model sets of ``algorithm.models(state)`` (a state over a
  window): those a streamed run scores on any client (:func:`node_models`, by name), the names of those
  it scores with each client's rows paged in (:class:`fedtree.core.algorithm.ClientModels`), and the
  names of those it cannot score."""
  cm = algorithm.client_sets()
  if cm is None:
    every = algorithm.models(state)
    node = node_models(every, num_clients)
    return node, [], [n for n in every if n not in node]
  from fedtree.population.stream import _split_of

  nodes = cm.nodes(state)
  node = node_models(nodes, num_clients)
  held = [a.shape[0] for a in _split_of(state).parts(state)[0]]   # (any clients of its rows: for the names)
  per_client = list(jax.eval_shape(cm.sets, state, jax.numpy.zeros(held[0] if held else 1, jax.numpy.int32)))
  return node, per_client, [n for n in nodes if n not in node]


def evaluate_streamed(
  algorithm: FederatedAlgorithm,
  state,
  population: Population,
  round_: int,
  *,
  model,
  evaluator,
  groups: np.ndarray,
  positive_classes=None,
  top_k: int | None = None,
  central=None,
  mesh=None,
) -> dict[str, dict[str, Any]]:
  """Every node-level model of ``state`` (:func:`node_models`) scored on the test rows of the clients of
  the evaluation after round ``round_`` (:func:`eval_plan`), read from the store chunk by chunk and
  summarized once over them (per client, per group, fairness), as the resident evaluation summarizes
  every client; the summaries name the clients scored (``eval_clients``). Over a ``mesh`` (of one
  process or several) each process reads the test rows of its own clients of a chunk
  (:func:`fedtree.population.stream.layout`) and every process gets every score."""
  import jax.numpy as jnp

  from fedtree.core.metrics import central_keys, summarize
  from fedtree.core.sharding import to_host
  from fedtree.evaluation import set_scorer
  from fedtree.population.stream import _split_of, layout

  store = population.store
  cm = algorithm.client_sets()
  node = node_models(algorithm.models(state) if cm is None else cm.nodes(state), store.num_clients)
  per_client = list(population.client_sets) if population.paged is not None and cm is not None else []
  split = _split_of(state)
  others = split.parts(state)[1]
  stats: dict[str, list] = {name: [] for name in [*node, *per_client]}
  ids = []
  chunks = population.eval_plan.chunks(int(round_))
  spread = None
  if mesh is not None:   # a chunk of eval_chunk clients, each process holding about its share of them
    spread = layout(mesh, store.num_clients, -(-int(population.eval_chunk) // jax.process_count()))
    chunks = spread.chunks(np.concatenate(list(chunks)) if chunks else np.zeros(0, np.int64))
  for chunk in chunks:
    rows, keep = np.asarray(chunk), slice(None)
    if spread is not None:   # each process's clients of the chunk, in its segment of the rows
      rows, keep, _ = spread.window(chunk, store.num_clients)
    mine = rows if spread is None else spread.local(rows)
    test = store.read(mine, "test")
    place = jnp.asarray if spread is None else spread.place
    x, y, n = place(test.x), place(test.y), place(test.n)
    sets = dict(node)
    if per_client:   # the chunk's clients' rows paged in: row k is client rows[k]'s
      over = split.join([place(a) for a in population.paged.gather(mine)], others)
      made = cm.sets(over, jnp.asarray(rows))   # (each set's model_of_client: a row per client of rows)
      sets |= {k: made[k] for k in per_client}
    for name, nm in sets.items():
      moc = jnp.asarray(np.asarray(nm.model_of_client)[rows] if name in node else nm.model_of_client)
      score = set_scorer(nm, evaluator, None, positive_classes is not None, top_k)
      stats[name].append(jax.tree.map(lambda a: a[keep], score(x, y, n, moc)))  # noqa: B023
    ids.append(rows[keep])
  ids_ = np.concatenate(ids) if ids else np.zeros(0, np.int64)
  perplexity = model.token_labels
  out = {}
  for name in stats:
    scores = jax.tree.map(lambda *a: np.concatenate(a), *stats[name])
    out[name] = summarize(
      scores, np.asarray(groups)[ids_], positive_classes=positive_classes, perplexity=perplexity, top_k=top_k
    )
    nm = node.get(name)   # (a node set: a global model is also scored on the central test set)
    rows = np.unique(np.asarray(nm.model_of_client)) if nm is not None else np.zeros(0)
    if central is not None and rows.size == 1 and getattr(nm, "model", None) is None:
      cx, cy, cn = central
      c = to_host(evaluator(nm.params, cx, cy, cn, jnp.full((cx.shape[0],), int(rows[0]), jnp.int32)))
      pooled = summarize(c, prefix="central_", perplexity=perplexity, top_k=top_k)
      out[name].update({k: v for k, v in pooled.items() if k in central_keys(top_k)})
    out[name]["eval_clients"] = population.eval_plan.name
  return out


@struct.dataclass
class StreamCheckpoint:
  """What a streamed run's checkpoint keeps: its state's leaves that are not per-client (the
  per-client rows are the paged state's, kept on disk) and the paged state's snapshot (which slot
  holds every client's committed row)."""

  round: jax.Array  # int32[] rounds done
  others: Any  # [leaf] the state's leaves that are not per-client (their rows: the paged state's)
  slots: Any  # uint8[C] the paged state's committed slots
  generation: Any  # int64[] its commit count


class _Slots:
  """A paged state's snapshot of slots as a checkpoint keeps it: as it is in one process; over several
  (each paging the clients it owns, :func:`fedtree.population.stream.layout`), one array over the mesh
  whose shards on a process's devices are that process's clients' slots, so each process saves and
  restores its own."""

  def __init__(self, mesh, num_clients: int):
    from fedtree.population.stream import layout, owned_rows

    self.num_clients = int(num_clients)
    self.layout = None
    if mesh is not None and jax.process_count() > 1:
      self.layout = layout(mesh, self.num_clients, 1)._replace(segment=owned_rows(mesh, self.num_clients))

  def out(self, slots: np.ndarray):
    if self.layout is None:
      return slots
    from fedtree.population.paged import NEVER

    mine = np.full(self.layout.segment, NEVER, np.uint8)
    lo, hi = (int(b) for b in self.layout.bounds[self.layout.process: self.layout.process + 2])
    mine[: hi - lo] = slots[lo:hi]
    return self.layout.place(mine)

  def back(self, saved) -> np.ndarray:
    if self.layout is None:
      return np.asarray(saved)
    from fedtree.population.paged import NEVER

    slots = np.full(self.num_clients, NEVER, np.uint8)
    lo, hi = (int(b) for b in self.layout.bounds[self.layout.process: self.layout.process + 2])
    slots[lo:hi] = self.layout.fetch(saved)[: hi - lo]
    return slots


def check_streamed(run, key, others=None) -> tuple[list[str], list[str]]:
  """``(per_client, not_scored)``: the names of the per-client model sets of ``run`` (a
  :class:`~fedtree.experiment.run.Run` over a streamed population) its evaluations score with each chunk's
  rows paged in, and of those they cannot score (per-client sets its algorithm does not make for a chunk
  of clients).

  ``others``: the initial state's leaves that are not per-client, where the caller has them
  (:func:`fedtree.population.stream.paged_init`).

  Raises:
    ValueError: an algorithm that reads clients beyond its cohort, one whose models are made from every
      client's rows (they fail over a window), or one none of whose sets a streamed run scores (its
      table would be empty), each naming the run.
  """
  from fedtree.core import loop
  from fedtree.population.stream import _split_of, paged_init

  algorithm, label = run.algorithm, run.label
  if algorithm.reads is None:
    raise ValueError(
      f"{label}: {algorithm.name} reads clients beyond its cohort (every client, or other "
      f"clients' state), so its population cannot stream; hold it resident "
      f"(config.population.mode='resident') or use a smaller population"
    )
  shapes = jax.eval_shape(algorithm.init, loop.init_key(key))
  split = _split_of(shapes)
  if others is None:
    others, _ = paged_init(algorithm, loop.init_key(key), run.context.data.num_clients)
  probe = split.join([np.zeros((1,) + a.shape[1:], a.dtype) for a in split.parts(shapes)[0]], others)
  try:
    node, per_client, not_scored = scored_sets(algorithm, probe, run.context.data.num_clients)
  except (TypeError, ValueError, IndexError) as err:   # its models need every client's rows
    raise ValueError(
      f"{label}: {algorithm.name}'s models are made from every client's rows, which a streamed run never "
      f"holds ({type(err).__name__}: {str(err)[:200]}); hold the population resident "
      f"(config.population.mode='resident')"
    ) from err
  if not node and not per_client:
    raise ValueError(
      f"{label}: a streamed run scores none of {algorithm.name}'s models "
      f"({', '.join(map(repr, not_scored))}: per-client sets it does not make for a chunk of clients); "
      f"hold the population resident "
      f"(config.population.mode='resident')"
    )
  return per_client, not_scored


def run_streamed(
  run,
  key,
  reporter,
  hooks,
  *,
  eval_every: int,
  rounds_per_call: int,
  checkpoint_dir: str | None,
  checkpoint_every: int,
  keep_checkpoints: int,
  should_stop,
  max_abs,
) -> tuple[Any, dict[str, dict[str, Any]]]:
  """:func:`fedtree.experiment.run_loop.run_algorithm` for a run over a streamed population
  (:func:`fedtree.population.stream.run`): its per-client state paged on disk under the checkpoint
  folder (in host memory without checkpoints), checkpoints that keep the paged state's snapshot, and
  evaluation on the clients of every evaluation read from the store."""
  import os

  from fedtree.core import loop
  from fedtree.experiment.results import RunStopped, kept_on_stop
  from fedtree.population.paged import PagedSnapshot, PagedState
  from fedtree.population.stream import _split_of, paged_init
  from fedtree.population.stream import run as stream_run

  algorithm, ctx, num_rounds, label = run.algorithm, run.context, run.rounds, run.label
  population: Population = ctx.population
  others, rows_of = paged_init(algorithm, loop.init_key(key), ctx.data.num_clients)
  per_client, not_scored = check_streamed(run, key, others)
  reporter.print(f"{label}: {population.note}")
  if not_scored:
    reporter.print(f"{label}: not scored in a streamed run: {', '.join(map(repr, not_scored))} (per-client "
                   f"sets {algorithm.name} does not make for a chunk of clients; hold the population "
                   f"resident to score them)")
  ckpt = None
  directory = None
  if checkpoint_dir and checkpoint_every:
    from fedtree.experiment.checkpoint import Checkpointer

    ckpt = Checkpointer(checkpoint_dir, every=checkpoint_every, keep=keep_checkpoints)
    directory = os.path.join(checkpoint_dir, "paged")
    if jax.process_count() > 1:   # each process pages the clients it owns (fedtree.population.stream.layout)
      directory = os.path.join(directory, f"process_{jax.process_index()}")
  paged = PagedState(rows_of, ctx.data.num_clients, directory=directory)
  # the evaluations score the per-client sets from the paged rows
  population = population._replace(paged=paged, client_sets=tuple(per_client))
  ctx = dataclasses.replace(ctx, population=population)
  run = dataclasses.replace(run, context=ctx)
  hooks.run = run
  slots = _Slots(ctx.mesh, ctx.data.num_clients)
  split = _split_of(jax.eval_shape(algorithm.init, loop.init_key(key)))
  start = 0
  if ckpt is not None:
    like = StreamCheckpoint(
      round=jax.numpy.zeros((), jax.numpy.int32),
      others=others,
      slots=slots.out(paged.snapshot_like().slots),
      generation=paged.snapshot_like().generation,
    )
    restored = ckpt.restore(like, warn=reporter.print)
    if restored is not None:
      others = list(restored.others)
      paged.restore(PagedSnapshot(slots=slots.back(restored.slots),
                                  generation=np.asarray(restored.generation)))
      start = int(restored.round)
      reporter.print(f"{label}: resumed from the checkpoint of round {start} in {checkpoint_dir}")
  reporter.start_run(label, num_rounds, from_round=start)
  if start:  # resumed: the bytes of the rounds before, and the rounds at the target
    shapes = split.parts(jax.eval_shape(algorithm.init, loop.init_key(key)))[0]
    hooks.resume(split.join([np.zeros((1,) + a.shape[1:], a.dtype) for a in shapes], others))

  def save(state, r):
    if ckpt is None or (r % ckpt.every and r != num_rounds):
      return
    snap = paged.commit()
    ckpt.maybe_save(
      StreamCheckpoint(
        round=state.round, others=split.parts(state)[1], slots=slots.out(snap.slots),
        generation=snap.generation,
      ),
      force=r == num_rounds,
    )

  try:
    state, stats = stream_run(
      algorithm,
      ctx.data,
      population.store,
      num_rounds=num_rounds,
      key=key,
      paged=paged,
      others=others,
      rounds_per_call=rounds_per_call,
      depth=population.prefetch,
      cache_bytes=population.cache_bytes,
      eval_every=eval_every,
      on_eval=hooks.evaluate,
      on_metrics=hooks.log,
      on_rounds=hooks.count,
      on_call=save,
      should_stop=should_stop,
      max_abs=max_abs,
      mesh=ctx.mesh,
    )
    if int(state.round) < num_rounds:
      raise RunStopped(
        f"run {label!r} stopped at round {int(state.round)} of {num_rounds}{kept_on_stop(ckpt, state)}"
      )
  finally:
    if ckpt is not None:
      ckpt.close()
    reporter.end_run(label)
  reporter.print(
    f"{label}: {stats.calls} calls; waited {stats.wait_s:.2f} s for data "
    f"({100 * stats.stall_fraction:.1f} % of the run), {stats.gather_s:.2f} s paging client "
    f"state"
  )
  return state, hooks.final(hooks.summaries, int(state.round))
