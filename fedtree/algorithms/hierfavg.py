"""HierFAVG (Liu et al. 2020, "Client-edge-cloud hierarchical federated learning") on trees
of any depth, with FedAvg and FedOpt (Reddi et al. 2021) as its one-tier case.

One round: the cohort of every leaf-parent node trains from that node's model; each
leaf-parent applies its server optimizer to the mean pseudo-gradient of its cohort. Every
``periods[l]`` rounds level ``l`` aggregates its children's models the same way (weighted by
the examples under each child, or uniformly) and sends its model down its whole subtree,
which adopts it. With ``sgd(1.0)`` at every level this is HierFAVG exactly: a client's
``κ1`` local steps are the local schedule, the edge period is one round and the cloud
period is ``κ2 = periods[0]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.core.algorithm import (
  FederatedAlgorithm,
  NodeModels,
  TreeState,
  broadcast_tree,
  check_weighting,
  client_weights,
  initial_params,
  local_training,
  per_level,
  personal_models,
)
from fedtree.core.data import FederatedData
from fedtree.core.local import ClientUpdate, LocalSchedule
from fedtree.core.model import Model
from fedtree.core.rng import stream
from fedtree.core.sampling import (
  check_sampling,
  cohort_sampler,
  overflow_probability,
  poisson_sampler,
  sampling_strategy,
)
from fedtree.core.server import init_nodes, select_nodes, update_nodes
from fedtree.core.systems import Systems, model_bytes, uplink_bytes
from fedtree.core.tier import train_cohort
from fedtree.core.topology import Topology
from fedtree.core.updates import (
  UpdatePath,
  aggregate_children,
  init_path_state,
  path_stats,
  per_level_paths,
  send_down,
)

PyTree = Any


def build_sampler(parent, *, sampling: str, cohort_size, poisson_q, chunk_size):
  """The clients' sampler: fixed-size cohorts (:func:`~fedtree.core.sampling.cohort_sampler`) or
  Poisson sampling with rate ``poisson_q`` (:func:`~fedtree.core.sampling.poisson_sampler`, whose
  slots per parent are ``cohort_size``, default from the overflow probability)."""
  if sampling != "poisson":
    check_sampling(sampling)
    if poisson_q is not None:
      raise ValueError(f"poisson_q={poisson_q!r} is only read with sampling='poisson' "
                       f"(got sampling={sampling!r})")
    return cohort_sampler(parent, cohort_size, chunk_size=chunk_size)
  if poisson_q is None:
    raise ValueError("sampling='poisson' needs poisson_q, every client's probability of taking part")
  every = cohort_size is None or (np.isscalar(cohort_size) and int(cohort_size) == -1)
  slots = None if every else cohort_size
  sampler = poisson_sampler(parent, poisson_q, max_slots=slots, chunk_size=chunk_size,
                            slots_name="cohort_size")
  if not every:
    check_poisson_slots(parent, poisson_q, sampler.sizes)
  return sampler


POISSON_OVERFLOW = 1e-6
"""The largest overflow probability per round and parent that a Poisson run's ``cohort_size`` (its
slots) may have: a draw over the slots stops the run (none is dropped)."""


def check_poisson_slots(parent, poisson_q: float, slots) -> None:
  """Refuses, before anything compiles, Poisson slots (``cohort_size``) that a round overflows with
  probability above :data:`POISSON_OVERFLOW` under some parent, naming the field and the smallest
  value that fits (the default slots, ``cohort_size=None``, overflow with probability 1e-12)."""
  counts = np.bincount(np.asarray(parent, np.int64))
  p = overflow_probability(counts, float(poisson_q), slots)
  g = int(np.argmax(p))
  if p[g] > POISSON_OVERFLOW:
    need = poisson_sampler(np.zeros(int(counts[g]), np.int64), poisson_q).sizes[0]
    raise ValueError(
      f"cohort_size={int(np.asarray(slots)[g])} with sampling='poisson', poisson_q={poisson_q!r}: parent "
      f"{g}'s {int(counts[g])} clients overflow its {int(np.asarray(slots)[g])} slots with probability "
      f"{p[g]:.3g} per round (the run stops at the first such draw); set cohort_size >= {need} (overflow "
      f"<= 1e-12 per round), or leave cohort_size unset (None) for slots sized from poisson_q")


def check_periods(periods, depth: int) -> tuple[int, ...]:
  """Validates aggregation periods of server levels ``0 .. depth-2`` (leaf parents: every round)."""
  if periods is None:
    periods = (1,) * (depth - 1)
  if not isinstance(periods, (list, tuple)):
    periods = [periods] * (depth - 1)
  periods = tuple(int(p) for p in periods)
  if len(periods) != depth - 1:
    raise ValueError(
      f"periods={periods} needs {depth - 1} entries (levels 0..{depth - 2}; the leaf parents "
      f"at level {depth - 1} aggregate every round)"
    )
  full = periods + (1,)
  for lv, p in enumerate(periods):
    if p < 1:
      raise ValueError(f"periods[{lv}]={p} must be >= 1")
    if p % full[lv + 1]:
      raise ValueError(
        f"periods[{lv}]={p} is not a multiple of periods[{lv + 1}]={full[lv + 1]}: a level can "
        f"only aggregate in rounds where its children do"
      )
  return periods


def _uplink(path, stacked):
  """What a child sends up through ``path`` (:func:`fedtree.core.systems.uplink_bytes` on one
  row of the ``[N, ...]`` params), ``None`` when the model travels as it is."""
  return uplink_bytes(path, jax.tree.map(lambda a: a[0], stacked))


def hierfavg(
  *,
  model: Model,
  topology: Topology,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule,
  server_optimizers: optax.GradientTransformation | Sequence[optax.GradientTransformation] = None,
  periods: int | Sequence[int] | None = None,
  cohort_size: int | Sequence[int] | None = None,
  sampling: str = "uniform",
  poisson_q: float | None = None,
  chunk_size: int | str | None = "auto",
  weighting: str = "examples",
  compute_dtype: str | None = None,
  client_update: ClientUpdate | None = None,
  init_params: PyTree | None = None,
  skip_nonfinite: bool = False,
  top_level: int = 0,
  update_paths: UpdatePath | Mapping[int, UpdatePath | None] | Sequence[UpdatePath | None] | None = None,
  systems: Systems | None = None,
  candidates: int | None = None,
  name: str = "hierfavg",
) -> FederatedAlgorithm:
  """HierFAVG / hierarchical FedOpt on ``topology``.

  Args:
    model: the model every node holds.
    topology: the tree; clients are its leaves, rows of ``data``.
    data: the federated data (for static shapes and validation).
    local_optimizer: the clients' optax optimizer.
    schedule: local epochs or steps, batch size and batch order (``"shuffled"``, the
      default; ``"fixed"``; ``"cyclic"``, a per-client cursor kept in ``TreeState.cursor``:
      see :mod:`fedtree.core.local`).
    server_optimizers: one optax optimizer for every server level, or one per level
      ``0 .. depth-1`` (default FedAvg, ``sgd(1.0)``).
    periods: rounds between aggregations of levels ``0 .. depth-2``.
    cohort_size: clients sampled per leaf-parent node each round (``None``: all); with Poisson
      sampling, the slots per leaf parent (the most clients it may draw; ``None``: the smallest
      count whose overflow probability per round is at most 1e-12).
    sampling: how a leaf parent's cohort is drawn (:mod:`fedtree.core.sampling`): ``"uniform"``
      (``cohort_size`` clients per leaf parent, without replacement); ``"poisson"`` (every client
      independently with probability ``poisson_q``, in static shapes: padded slots masked; a draw
      that exceeds a parent's slots is an error at run time naming ``q`` and the slot count,
      raised from a host callback inside the jitted round); ``"data_size"`` (successive sampling
      proportional to the clients' examples); ``"available"`` (uniform among the clients on line
      at the round's start: needs ``systems`` with ``availability``); ``"power_of_choice"`` (Cho et
      al. 2022: ``candidates`` clients per leaf parent drawn proportionally to their examples, the
      ``cohort_size`` of highest loss under their parent's model kept; padded or ragged data,
      scored ``chunk_size`` candidates at a time on ragged data).
    poisson_q: ``q`` in (0, 1], with ``sampling="poisson"``.
    chunk_size: clients trained at once (memory bound): an int, ``None`` (the whole cohort)
      or ``"auto"`` (the per-backend default, :mod:`fedtree.core.tuning`).
    weighting: ``"examples"`` or ``"uniform"`` aggregation weights.
    compute_dtype: mixed-precision default local training (``None``: the params' dtype).
    client_update: the local objective (default plain SGD by ``local_optimizer``; see
      :mod:`fedtree.objectives`); its persistent per-client state (``init_state``) lives in
      ``TreeState.client_state``, only the clients that trained update it, and its
      ``personal_models`` are scored as ``personal``.
    init_params: the model to start every node from (default ``model.init(key)``).
    skip_nonfinite: leave out clients whose update is not finite (weight 0) instead of
      letting them poison the mean; their count is the ``clients_skipped`` metric (see
      :func:`fedtree.core.tier.train_cohort`). A skipped client drops out of its parent's
      mean only: at the levels above, the parent's weight still counts the client's examples
      (as it counts those of an unsampled client).
    top_level: the highest level that aggregates (``0``: the root, HierFAVG). The levels above
      it never do, so every subtree of level ``top_level`` learns on its own from the start
      model: ``top_level=1`` on root -> groups -> clients is FedOpt in every group at once
      (GroupPerFL's group stage, :func:`fedtree.algorithms.grouppfl.group_fedopt`). The
      models of the levels above (the start model) are not in ``models()``, and their
      ``periods`` entries are not used.
    update_paths: what the updates go through between a child's training and its parent's
      server optimizer (:mod:`fedtree.core.updates`: client transforms such as clipping or
      compression, a robust aggregator, a node transform such as central noise, a downlink
      transform): one :class:`~fedtree.core.updates.UpdatePath` for the clients' tier, or one
      per server level (``{level: path}``; level ``l``'s path is how it aggregates its children
      and what it sends them). ``None``: the weighted mean, as in the paper.
    systems: devices, availability and a round policy (:mod:`fedtree.core.systems`): sampled
      clients that are off line, fail, miss the deadline or are over-selected do not report, and
      partial work lowers their step counts; the state's ``clock`` advances by each round's
      simulated duration, reported as ``round_seconds`` and ``sim_seconds`` (with
      ``clients_unavailable``, ``clients_dropped``, ``clients_partial``). Over-selection samples
      ``ceil(factor · cohort_size)`` clients of every leaf parent (at most its group). ``None``:
      every sampled client finishes, no clock.
    candidates: power-of-choice candidates per leaf parent (default twice the cohort, at most
      the group).
    name: label for reports.

  Example:
    A root over the 2 groups (edge servers) of 3 and 2 clients, one round:

    >>> import jax, optax
    >>> from fedtree.core import loop
    >>> from fedtree.core.local import LocalSchedule
    >>> from fedtree.datasets.synthetic import grouped_synthetic
    >>> from fedtree.models import build_model
    >>> data, groups = grouped_synthetic(group_sizes=(3, 2), dim=8, num_classes=3)
    >>> model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=1))
    >>> from fedtree.core.topology import Topology
    >>> alg = hierfavg(topology=Topology.from_labels(groups), local_optimizer=optax.sgd(0.1), **common)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['global', 'level1']
  """
  data.validate(topology)
  depth = topology.depth
  server_optimizers = per_level(
    optax.sgd(1.0) if server_optimizers is None else server_optimizers, depth, "server_optimizers"
  )
  periods = check_periods(periods, depth)
  if not 0 <= int(top_level) <= depth - 1:
    raise ValueError(f"top_level={top_level} must be a server level, 0..{depth - 1}")
  top_level = int(top_level)
  check_weighting(weighting)
  paths = per_level_paths(update_paths, depth, algorithm=name,
                          supported_levels=range(top_level, depth))
  keep = links = None   # over-selection: sample more, keep the first cohort_size to finish
  if systems is not None:
    if sampling == "poisson":
      raise ValueError("sampling='poisson' cannot run with systems=: a round policy changes who takes "
                       "part, which Poisson sampling's accounting does not model; use sampling='uniform'")
    keep, cohort_size = systems.cohort_sizes(topology.parent(depth), cohort_size, depth)
    links = systems.server_links([topology.num_nodes(lv) for lv in range(depth)])
  sampler = build_sampler(topology.parent(depth), sampling=sampling, cohort_size=cohort_size,
                          poisson_q=poisson_q, chunk_size=chunk_size)
  draw = sampling_strategy(sampler, sampling, data=data, model=model, candidates=candidates,
                           online=None if systems is None else systems.online)
  client_update = local_training(client_update, model, local_optimizer, schedule, data,
                                 compute_dtype=compute_dtype)
  parents = [None] + [jnp.asarray(topology.parent(lv)) for lv in range(1, depth + 1)]
  ancestors = [jnp.asarray(topology.ancestor(lv)) for lv in range(depth)]

  def init(key):
    p0 = initial_params(model, key, init_params)
    params = broadcast_tree(p0, topology)
    client_state = ()
    if client_update.init_state is not None:
      client_state = client_update.init_state(p0, topology.num_clients)
    return TreeState(
      round=jnp.zeros((), jnp.int32), params=params,
      opt_state=tuple(init_nodes(opt, p) for opt, p in zip(server_optimizers, params, strict=True)),
      client_state=client_state,
      cursor=schedule.init_cursor(topology.num_clients),
      update_state=tuple(init_path_state(paths[lv], p0, topology.num_nodes(lv + 1), topology.num_nodes(lv))
                         for lv in range(depth)),
      clock=() if systems is None else jnp.zeros((), jnp.float32),
    )

  def round_fn(state: TreeState, data: FederatedData, key):
    r = state.round + 1
    params, opt_state = list(state.params), list(state.opt_state)
    w_client = client_weights(data.n_train, weighting)
    update_state = list(state.update_state)
    cohort = draw(stream(key, "cohort"), params[depth - 1], state.clock)
    num_steps = schedule.num_steps(data.n_train)
    sent, down_stats = send_down(paths[depth - 1], params[depth - 1], stream(key, "down"))
    if systems is not None:   # who takes part, how much they do, how long it takes (compressed bytes)
      down_b = down_stats.get("bytes")
      outcome = systems.round(
        cohort, num_steps, time=state.clock, model_bytes=model_bytes(params[depth - 1]),
        key=stream(key, "systems"), keep=keep, up_bytes=_uplink(paths[depth - 1], params[depth - 1]),
        down_bytes=None if down_b is None else jnp.take(down_b, cohort.parent))
      cohort, num_steps = cohort._replace(valid=outcome.valid), outcome.num_steps
    res = train_cohort(
      client_update, sent, cohort, data,
      num_steps=num_steps, weights=w_client,
      key=stream(key, "train"), chunk_size=sampler.chunk_size, client_state=state.client_state,
      parent_aligned=sampler.parent_aligned, batch_order=schedule.batch_order,
      batch_size=schedule.batch_size, cursor=state.cursor, skip_nonfinite=skip_nonfinite,
      path=paths[depth - 1], path_state=update_state[depth - 1], block_size=max(sampler.sizes),
    )
    update_state[depth - 1] = res.path_state
    metrics = {**res.metrics(skip_nonfinite), **path_stats(down_stats, "down_")}
    params[depth - 1], opt_state[depth - 1] = update_nodes(
      server_optimizers[depth - 1], params[depth - 1], opt_state[depth - 1],
      res.pseudo_gradient(), res.weight_sum > 0,
    )
    # Upper levels, bottom-up, in the rounds their period says.
    active = [None] * depth
    for lv in range(depth - 2, top_level - 1, -1):
      active[lv] = (r % periods[lv]) == 0
      n = topology.num_nodes(lv + 1)
      w_child = jax.ops.segment_sum(w_client, ancestors[lv + 1], num_segments=n)
      delta, total, new_path, stats = aggregate_children(
        paths[lv], update_state[lv], params[lv], params[lv + 1], w_child, parents[lv + 1],
        jax.random.fold_in(stream(key, "update"), lv))
      new_p, new_s = update_nodes(server_optimizers[lv], params[lv], opt_state[lv], delta, total > 0)
      params[lv] = select_nodes(jnp.broadcast_to(active[lv], total.shape), new_p, params[lv])
      opt_state[lv] = select_nodes(jnp.broadcast_to(active[lv], total.shape), new_s, opt_state[lv])
      update_state[lv] = jax.tree.map(lambda a, b, on=active[lv]: jnp.where(on, a, b), new_path,
                                      update_state[lv])
      metrics.update({f"level{lv}_{k}": jnp.where(active[lv], v, 0) for k, v in stats.items()})
      # every child node sends its model up and gets the level's back (bytes: core.traffic)
      metrics[f"level{lv}_children_sent"] = jnp.where(active[lv], n, 0).astype(jnp.int32)
    # Top-down: a level that aggregated sends its model to its whole subtree.
    level_secs = []
    for lv in range(depth - 1):
      if active[lv] is None:
        continue
      sent, down_stats = send_down(paths[lv], params[lv], jax.random.fold_in(stream(key, "down"), lv))
      if systems is not None:   # its children send up and receive back, each over its own link
        mb = model_bytes(params[lv])
        up_b, down_b = _uplink(paths[lv], params[lv]), down_stats.get("bytes")
        level_secs.append(jnp.where(active[lv], systems.aggregation_seconds(
          lv, links, mb if up_b is None else up_b,
          mb if down_b is None else jnp.take(down_b, parents[lv + 1])), 0.0))
      metrics.update({f"level{lv}_{k}": jnp.where(active[lv], v, 0)
                      for k, v in path_stats(down_stats, "down_").items()})
      down = jax.tree.map(lambda p, idx=parents[lv + 1]: p[idx], sent)
      params[lv + 1] = select_nodes(
        jnp.broadcast_to(active[lv], (topology.num_nodes(lv + 1),)), down, params[lv + 1]
      )
    clock = state.clock
    if systems is not None:   # the leaf parents' rounds run side by side; a level aggregating adds its own
      seconds = outcome.seconds + sum(level_secs, jnp.zeros((), jnp.float32))
      clock = state.clock + seconds
      metrics.update({**outcome.stats, "round_seconds": seconds, "sim_seconds": clock})
    new_state = state.replace(
      round=r, params=tuple(params), opt_state=tuple(opt_state), client_state=res.client_state,
      cursor=res.cursor, update_state=tuple(update_state), clock=clock,
    )
    return new_state, metrics

  def models(state: TreeState):
    out = {}
    if top_level == 0:
      out["global"] = NodeModels(state.params[0], np.zeros(topology.num_clients, np.int32))
    for lv in range(max(top_level, 1), depth):
      out[f"level{lv}"] = NodeModels(state.params[lv], topology.ancestor(lv))
    return {**out, **personal_models(client_update, state.client_state)}

  return FederatedAlgorithm(init=init, round=round_fn, models=models, name=name)


def fedavg(
  *,
  model: Model,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule,
  server_optimizer: optax.GradientTransformation | None = None,
  cohort_size: int | None = None,
  sampling: str = "uniform",
  poisson_q: float | None = None,
  chunk_size: int | str | None = "auto",
  weighting: str = "examples",
  compute_dtype: str | None = None,
  client_update: ClientUpdate | None = None,
  init_params: PyTree | None = None,
  skip_nonfinite: bool = False,
  update_paths: UpdatePath | Mapping[int, UpdatePath | None] | Sequence[UpdatePath | None] | None = None,
  systems: Systems | None = None,
  candidates: int | None = None,
  name: str = "fedavg",
) -> FederatedAlgorithm:
  """FedAvg (McMahan et al. 2017), or FedOpt with ``server_optimizer``: one server, one tier
  (the arguments as :func:`hierfavg`'s).

  Example:
    One round of FedAvg over 5 clients:

    >>> import jax, optax
    >>> from fedtree.core import loop
    >>> from fedtree.core.local import LocalSchedule
    >>> from fedtree.datasets.synthetic import grouped_synthetic
    >>> from fedtree.models import build_model
    >>> data, groups = grouped_synthetic(group_sizes=(3, 2), dim=8, num_classes=3)
    >>> model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=1))
    >>> alg = fedavg(local_optimizer=optax.sgd(0.1), **common)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['global']
  """
  return hierfavg(
    model=model, topology=Topology.flat(data.num_clients), data=data,
    local_optimizer=local_optimizer, schedule=schedule,
    server_optimizers=server_optimizer, cohort_size=cohort_size, sampling=sampling, poisson_q=poisson_q,
    chunk_size=chunk_size,
    weighting=weighting, compute_dtype=compute_dtype, client_update=client_update,
    init_params=init_params, skip_nonfinite=skip_nonfinite, update_paths=update_paths,
    systems=systems, candidates=candidates, name=name,
  )


def with_objective(
  objective: Callable[..., ClientUpdate] | None,
  *,
  model: Model,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation | None,
  schedule: LocalSchedule,
  topology: Topology | None = None,
  **kwargs,
) -> FederatedAlgorithm:
  """:func:`hierfavg` on ``topology`` (``None``: one server over all clients) whose clients run
  the objective ``objective(batch_size=..., max_steps=...)``, sized by ``schedule`` on ``data``.

  The shared body of the methods that are a local objective under HierFAVG (FedProx, Ditto,
  pFedMe, Per-FedAvg, FedMMD, FedKWS-UI): each binds its hyperparameters into ``objective`` (e.g.
  ``functools.partial(fedprox_update, model, local_optimizer, mu=mu)``) and forwards
  :func:`hierfavg`'s other arguments as ``kwargs``. ``objective=None`` is the default local
  training (a method whose objective is switched off, e.g. FedKWS-UI with ``alo=False``).
  """
  topology = Topology.flat(data.num_clients) if topology is None else topology
  update = None
  if objective is not None:
    update = objective(batch_size=schedule.batch_size, max_steps=schedule.max_steps(data.max_train))
  return hierfavg(model=model, topology=topology, data=data, local_optimizer=local_optimizer,
                  schedule=schedule, client_update=update, **kwargs)
