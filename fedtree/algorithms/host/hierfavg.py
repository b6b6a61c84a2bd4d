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

import dataclasses
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.core.algorithm import (
  FederatedAlgorithm,
  NodeModels,
  ObjectiveFactory,
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
from fedtree.core.personal import Personal, Shares, fill, keep_where, merge, personal_part, shared_part
from fedtree.core.rng import stream
from fedtree.core.sampling import (
  check_sampling,
  cohort_sampler,
  overflow_probability,
  poisson_sampler,
  sampling_strategy,
)
from fedtree.core.server import init_nodes, select_nodes, update_nodes
from fedtree.core.server_rule import (
  Inbox,
  Outbox,
  Parcels,
  ServerRule,
  Slots,
  broadcast_of,
  check_rule,
  init_rule_state,
  prepare,
  receive,
)
from fedtree.core.tier import edge_metrics, message_shape, train_cohort
from fedtree.core.topology import Topology
from fedtree.core.updates import (
  UpdatePath,
  aggregate_children,
  block_positions,
  init_update_state,
  path_stats,
  per_level_paths,
  send_down,
)
from fedtree.toolbox.privacy import private_stages
from fedtree.toolbox.systems import Systems, uplink_bytes
from fedtree.toolbox.traffic import model_bytes

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
  """What a child sends up through ``path`` (:func:`fedtree.toolbox.systems.uplink_bytes` on one
  row of the ``[N, ...]`` params), ``None`` when the model travels as it is."""
  return uplink_bytes(path, jax.tree.map(lambda a: a[0], stacked))


def send_shared(share: Shares, path: UpdatePath | None, params: PyTree, level: int,
                key) -> tuple[PyTree, dict]:
  """What level ``level``'s nodes send their children (:func:`~fedtree.core.updates.send_down`):
  the leaves it aggregates go through ``path``'s downlink transform; the others (personal to the
  levels below) are not sent (the receivers keep theirs) and stay as they are."""
  mask = share.mask(level)
  if mask is None:
    return send_down(path, params, key)
  sent, stats = send_down(path, shared_part(params, mask), key)
  return merge(sent, personal_part(params, mask), mask), stats


@dataclasses.dataclass(frozen=True)
class UpperLevels:
  """HierFAVG's server levels above the clients' parents, as one schedule every host of the
  family shares (:func:`hierfavg`, :func:`~fedtree.algorithms.asynchronous.fedbuff.fedbuff`): level ``l``
  aggregates its children's models every ``periods[l]`` rounds through its update path
  (:func:`aggregate`, bottom-up), then sends its model down its whole subtree (:func:`send_down`,
  top-down), leaves personal to the levels below excepted (``share``)."""

  topology: Topology
  periods: tuple[int, ...]
  server_optimizers: tuple
  paths: tuple
  top_level: int = 0
  share: Shares | None = None

  def _share(self) -> Shares:
    return Shares(None, self.topology.depth) if self.share is None else self.share

  def aggregate(self, params: list, opt_state: list, update_state: list, w_client, r, key):
    """Levels ``depth-2 .. top_level``, bottom-up, in the rounds their period says. Returns the
    updated ``(params, opt_state, update_state)`` lists, ``active`` (per level: a traced bool, or
    ``None`` for the clients' parents and the levels above ``top_level``) and the metrics."""
    topo, share = self.topology, self._share()
    depth = topo.depth
    active: list = [None] * depth
    metrics = {}
    for lv in range(depth - 2, self.top_level - 1, -1):
      if not jax.tree.leaves(share.sent(params[lv], lv)):   # every leaf personal below it: nothing to do
        continue
      active[lv] = (r % self.periods[lv]) == 0
      n = topo.num_nodes(lv + 1)
      w_child = jax.ops.segment_sum(w_client, jnp.asarray(topo.ancestor(lv + 1)), num_segments=n)
      delta, total, new_path, stats = aggregate_children(
        self.paths[lv], update_state[lv], share.sent(params[lv], lv), share.sent(params[lv + 1], lv), w_child,
        topo.parent(lv + 1), jax.random.fold_in(stream(key, "update"), lv))   # (static: numpy)
      mask = share.mask(lv)
      if mask is not None:   # no pseudo-gradient at the leaves this level does not aggregate
        delta = fill(delta, mask, params[lv])
      new_p, new_s = update_nodes(self.server_optimizers[lv], params[lv], opt_state[lv], delta, total > 0)
      on = jnp.broadcast_to(active[lv], total.shape)
      params[lv], opt_state[lv] = select_nodes(on, new_p, params[lv]), select_nodes(on, new_s, opt_state[lv])
      update_state[lv] = jax.tree.map(lambda a, b, on=active[lv]: jnp.where(on, a, b), new_path,
                                      update_state[lv])
      metrics.update({f"level{lv}_{k}": jnp.where(active[lv], v, 0) for k, v in stats.items()})
      # every child node sends its model up and gets the level's back (bytes: toolbox.traffic)
      metrics[f"level{lv}_children_sent"] = jnp.where(active[lv], n, 0).astype(jnp.int32)
      metrics.update(edge_metrics(f"level{lv}", metrics[f"level{lv}_children_sent"]))
      if mask is not None:   # what travels is the shared part
        size = model_bytes(share.sent(params[lv], lv), stacked=True)
        for k in (f"level{lv}_uplink_bytes", f"level{lv}_downlink_bytes"):
          metrics.setdefault(k, jnp.where(active[lv], size, 0))
    return params, opt_state, update_state, active, metrics

  def send_down(self, params: list, active: list, key):
    """Top-down: a level that aggregated sends its model to its whole subtree. Returns the params,
    ``{level: its downlink transform's stats}`` of the levels that may send, and the metrics."""
    topo, share = self.topology, self._share()
    down_stats, metrics = {}, {}
    for lv in range(topo.depth - 1):
      if active[lv] is None:
        continue
      sent, stats = send_shared(share, self.paths[lv], params[lv], lv,
                                jax.random.fold_in(stream(key, "down"), lv))
      down_stats[lv] = stats
      metrics.update({f"level{lv}_{k}": jnp.where(active[lv], v, 0)
                      for k, v in path_stats(stats, "downlink_").items()})
      idx = jnp.asarray(topo.parent(lv + 1))
      down = jax.tree.map(lambda p, idx=idx: p[idx], sent)
      mask = share.mask(lv)
      if mask is not None:   # the children keep what this level does not aggregate
        down = keep_where(mask, params[lv + 1], down)
      params[lv + 1] = select_nodes(jnp.broadcast_to(active[lv], (topo.num_nodes(lv + 1),)), down,
                                    params[lv + 1])
    return params, down_stats, metrics


def _stacked(template, n: int):
  """Abstract ``[n, ...]`` rows of one (possibly abstract) model."""
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct((n,) + tuple(np.shape(a)), a.dtype), template)


def parcel_shape(rule: ServerRule | None, update: ClientUpdate, template, topology: Topology) -> PyTree:
  """The abstract ``[1, ...]`` extra of one slot's parcel (:attr:`ServerRule.send_each`), from an
  abstract trace of a one-slot cohort; ``()`` when the rule sends every child the same."""
  if rule is None or rule.send_each is None:
    return ()
  n, c = topology.num_nodes(topology.depth - 1), topology.num_clients
  state = jax.eval_shape(lambda p: init_rule_state(rule, p, n), template)
  client_state = () if update.init_state is None else jax.eval_shape(lambda p: update.init_state(p, c),
                                                                      template)
  slot = jax.ShapeDtypeStruct((1,), jnp.int32)

  def one(state, params, client_state, clients, parent, valid, position, rnd, key):
    return rule.send_each(Outbox(state, params, client_state, clients, parent, valid, position, 1, rnd,
                                 key)).extra

  return jax.eval_shape(one, state, _stacked(template, n), client_state, slot, slot,
                        jax.ShapeDtypeStruct((1,), jnp.bool_), slot, jax.ShapeDtypeStruct((), jnp.int32),
                        jax.random.key(0))


@dataclasses.dataclass(frozen=True)
class Extras:
  """What the clients' tier sends beside (or instead of) the whole model, in bytes per message:
  the shared leaves (:mod:`fedtree.core.personal`), a client's message to its parent's server rule,
  the rule's broadcast and the extra of each client's own parcel (``send_each``), or what the rule
  says travels (``wire``). ``active``: any of them differs from sending the whole model."""

  model_bytes: int        # the shared leaves of one model
  message_bytes: int      # a client's message beside its update
  broadcast_bytes: int    # what a parent sends beside its model (and the parcel's extra)
  active: bool
  wire: tuple[int, int] | None = None   # (down, up) as the server rule states them

  @classmethod
  def of(cls, update: ClientUpdate, rule: ServerRule | None, template, topology: Topology, data,
         share: Shares,
         learning_rate) -> Extras:
    leaf = topology.depth - 1
    shared = model_bytes(_stacked(share.sent(template, leaf), 1), stacked=True)
    bcast = () if rule is None else jax.eval_shape(lambda p: broadcast_of(rule, init_rule_state(rule, p, 1)),
                                                   template)
    own = parcel_shape(rule, update, template, topology)
    params = _stacked(template, 1)
    messages = []
    if update.takes_round and update.message_bytes is None:
      messages.append(message_shape(update, params, () if update.init_state is None else jax.eval_shape(
        lambda p: update.init_state(p, 1), template), data, bcast, learning_rate, jax.random.key(0), own))
    if rule is not None and rule.gather is not None:   # what a client sends before training
      messages.append(message_shape(rule.gather, params, (), data, bcast, learning_rate, jax.random.key(0)))
    msg = model_bytes(_stacked(tuple(messages), 1), stacked=True)
    if update.message_bytes is not None:   # what the message costs on the wire (ClientUpdate.message_bytes)
      msg += int(update.message_bytes)
    bc = model_bytes(bcast, stacked=True) + model_bytes(own, stacked=True)
    wire = None if rule is None or rule.wire is None else tuple(int(b) for b in rule.wire(shared))
    return cls(shared, msg, bc, share.client_mask is not None or msg > 0 or bc > 0 or wire is not None,
               wire)  # type: ignore[arg-type]

  def up(self, compressed):
    """A client's uplink bytes for the systems clock (``compressed``: the path's size, or ``None``)."""
    if self.wire is not None:
      return self.wire[1]
    if not self.active:
      return compressed
    return (self.model_bytes if compressed is None else compressed) + self.message_bytes

  def down(self, compressed):
    """A client's downlink bytes for the systems clock (``compressed``: per slot, or ``None``)."""
    if self.wire is not None:
      return self.wire[0]
    if not self.active:
      return compressed
    return (self.model_bytes if compressed is None else compressed) + self.broadcast_bytes

  def byte_metrics(self, metrics: dict) -> dict:
    """``uplink_bytes`` / ``downlink_bytes`` of one client's messages this round (the update path's
    compressed sizes where it reports them), when they differ from one whole model."""
    if self.wire is not None:
      return {"uplink_bytes": jnp.asarray(self.wire[1], jnp.int32),
              "downlink_bytes": jnp.asarray(self.wire[0], jnp.int32)}
    if not self.active:
      return {}
    return {"uplink_bytes": metrics.get("uplink_bytes", self.model_bytes) + self.message_bytes,
            "downlink_bytes": metrics.get("downlink_bytes", self.model_bytes) + self.broadcast_bytes}


def slot_positions(cohort, num_parents: int) -> jax.Array:
  """Each valid slot's position among its parent's valid slots (``num_parents`` for the others),
  whatever the order of the cohort's slots."""
  order = jnp.argsort(cohort.parent, stable=True)
  pos = block_positions(jnp.take(cohort.parent, order), jnp.take(cohort.valid, order), num_parents)
  return jnp.zeros_like(pos).at[order].set(pos)


def hierfavg(
  *,
  model: Model,
  topology: Topology,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation | None = None,
  schedule: LocalSchedule,
  server_optimizers: optax.GradientTransformation | Sequence[optax.GradientTransformation] = None,
  periods: int | Sequence[int] | None = None,
  cohort_size: int | Sequence[int] | None = None,
  sampling: str = "uniform",
  poisson_q: float | None = None,
  chunk_size: int | str | None = "auto",
  weighting: str = "examples",
  compute_dtype: str | None = None,
  client_update: ClientUpdate | ObjectiveFactory | None = None,
  server_rule: ServerRule | None = None,
  personal: Personal | None = None,
  local_learning_rate: float | None = None,
  init_params: PyTree | None = None,
  skip_nonfinite: bool = False,
  top_level: int = 0,
  update_paths: UpdatePath | Mapping[int, UpdatePath | None] | Sequence[UpdatePath | None] | None = None,
  systems: Systems | None = None,
  candidates: int | None = None,
  name: str = "hierfavg",
) -> FederatedAlgorithm:
  """HierFAVG / hierarchical FedOpt on ``topology``: the host every method of this family is a
  composition over (see :func:`on_host`).

  Args:
    model: the model every node holds.
    topology: the tree; clients are its leaves, rows of ``data``.
    data: the federated data (for static shapes and validation).
    local_optimizer: the clients' optax optimizer (needed by the default local training; an
      objective may ignore it).
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
    compute_dtype: mixed-precision local training (``None``: the params' dtype): of the default
      local training, or of an objective given as a factory.
    client_update: the local objective: a :class:`~fedtree.core.local.ClientUpdate`, or a factory
      ``f(LocalSetup) -> ClientUpdate`` built here from the model, ``local_optimizer``, the
      schedule and ``compute_dtype`` (:func:`fedtree.core.algorithm.local_training`; default
      plain SGD by ``local_optimizer``; see :mod:`fedtree.objectives`). Its persistent per-client
      state (``init_state``) lives in ``TreeState.client_state``, only the clients that trained
      update it, and its ``personal_models`` are scored as ``personal``. An update that
      ``takes_round`` is told its index, its parent's broadcast, the sampled fraction, its weight
      and ``local_learning_rate``, and may send a message beside its model to ``server_rule``.
    server_rule: what the clients' parents keep beyond their optax state, broadcast beside their
      model and update from their clients' messages (:mod:`fedtree.core.server_rule`: SCAFFOLD's
      control variate, FedDyn's ``h``, Mime's optimizer state; with a ``gather`` pass, from
      messages the clients send before training, Mime's control variate), in
      ``TreeState.server_state``; the levels above aggregate models as HierFAVG. A rule may send
      every sampled child a parcel of its own before the round's training (``send_each``: FedAMP's
      cloud models, FedFomo's candidates, pFedHN's generated weights) and receive every child's
      sent model (``slots``). ``None``: nothing more than the model.
    personal: parameters that stay with each client, or are shared only within the subtrees of a
      level (:mod:`fedtree.core.personal`, path patterns): never broadcast over nor aggregated
      above their level, not counted in bytes, kept in ``TreeState.personal``; each client is
      scored with its own combination (``personal``), and the levels that do not aggregate every
      parameter are not reported as models. ``None``: every parameter shared.
    local_learning_rate: the local learning rate an update that ``takes_round`` is told
      (:attr:`~fedtree.core.local.ClientRound.learning_rate`; the experiment layer passes
      ``config.local.learning_rate``).
    init_params: the model to start every node from (default ``model.init(key)``).
    skip_nonfinite: leave out clients whose update is not finite (weight 0) instead of
      letting them poison the mean; their count is the ``clients_skipped`` metric (see
      :func:`fedtree.core.tier.train_cohort`). A skipped client drops out of its parent's
      mean only: at the levels above, the parent's weight still counts the client's examples
      (as it counts those of an unsampled client).
    top_level: the highest level that aggregates (``0``: the root, HierFAVG). The levels above
      it never do, so every subtree of level ``top_level`` learns on its own from the start
      model: ``top_level=1`` on root -> groups -> clients is FedOpt in every group at once
      (GroupPerFL's group stage, :func:`fedtree.algorithms.hierarchical.grouppfl.group_fedopt`). The
      models of the levels above (the start model) are not in ``models()``, and their
      ``periods`` entries are not used.
    update_paths: what the updates go through between a child's training and its parent's
      server optimizer (:mod:`fedtree.core.updates`: client transforms such as clipping or
      compression, a robust aggregator, a node transform such as central noise, a downlink
      transform): one :class:`~fedtree.core.updates.UpdatePath` for the clients' tier, or one
      per server level (``{level: path}``; level ``l``'s path is how it aggregates its children
      and what it sends them). ``None``: the weighted mean, as in the paper. Paths act on the
      shared parameters' delta only; messages beside it reach the server rule as they are.
    systems: devices, availability and a round policy (:mod:`fedtree.toolbox.systems`): sampled
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
  leaf = depth - 1
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
                                 compute_dtype=compute_dtype, name=name)
  server_rule = check_rule(server_rule, name)
  if server_rule is not None:   # noise above the parents is bounded for a plain mean below it only
    for lv in range(leaf):
      for stage in private_stages(paths[lv]):
        raise ValueError(f"{name}: differential privacy ({stage!r}) at level {lv}, above the clients' "
                         f"parents, with the server rule {server_rule.name!r} at the parents: what it keeps "
                         f"carries one client's update into later rounds, so the noise above them has no "
                         f"bounded sensitivity; add the noise at the clients' parents (noise_level=-1)")
  template = jax.eval_shape(model.init, jax.random.key(0)) if init_params is None else init_params
  share = Shares.of(personal, template, depth, name)
  parents = [None] + [jnp.asarray(topology.parent(lv)) for lv in range(1, depth + 1)]
  ancestors = [jnp.asarray(topology.ancestor(lv)) for lv in range(depth)]
  population = np.bincount(topology.parent(depth), minlength=topology.num_nodes(leaf)).astype(np.float32)
  extra = Extras.of(client_update, server_rule, template, topology, data, share, local_learning_rate)
  upper = UpperLevels(topology=topology, periods=periods, server_optimizers=server_optimizers, paths=paths,
                      top_level=top_level, share=share)
  if share.has_client_personal and client_update.personal_models is not None:
    raise ValueError(f"{name}: the local objective keeps personal models of its own, and personal "
                     f"parameters would be scored under the same name ('personal'); use one or the other")

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
      update_state=tuple(init_update_state(paths[lv], share.sent(p0, lv), topology.num_nodes(lv + 1),
                                         topology.num_nodes(lv)) for lv in range(depth)),
      clock=() if systems is None else jnp.zeros((), jnp.float32),
      server_state=init_rule_state(server_rule, p0, topology.num_nodes(leaf), stream(key, "server_rule")),
      personal=share.init_clients(p0, topology.num_clients),
    )

  def round_fn(state: TreeState, data: FederatedData, key):
    r = state.round + 1
    params, opt_state = list(state.params), list(state.opt_state)
    w_client = client_weights(data.n_train, weighting)
    update_state = list(state.update_state)
    cohort = draw(stream(key, "cohort"), params[leaf], state.clock)
    num_steps = schedule.num_steps(data.n_train)
    sent, down_stats = send_shared(share, paths[leaf], params[leaf], leaf, stream(key, "down"))
    if systems is not None:   # who takes part, how much they do, how long it takes (compressed bytes)
      down_b = down_stats.get("bytes")
      up_b = _uplink(paths[leaf], share.sent(params[leaf], leaf))
      outcome = systems.round(
        cohort, num_steps, time=state.clock, model_bytes=extra.model_bytes, key=stream(key, "systems"),
        keep=keep, uplink_bytes=extra.up(up_b),
        downlink_bytes=extra.down(None if down_b is None else jnp.take(down_b, cohort.parent)))
      cohort, num_steps = cohort._replace(valid=outcome.valid), outcome.num_steps
    w_tier = w_client   # the clients' weights in their parents' mean: the rule's, where it sets them (AFL)
    if server_rule is not None and server_rule.weights is not None:
      w_tier = server_rule.weights(w_client, state.server_state)
    population_weight = jax.ops.segment_sum(w_tier, parents[depth], num_segments=topology.num_nodes(leaf))

    def inbox_of(res, pseudo_gradient, slots=None):   # what the clients' parents receive from a pass
      reported = jax.ops.segment_sum((jnp.take(res.reported, cohort.clients) & cohort.valid).astype(
        res.weight_sum.dtype), cohort.parent, num_segments=topology.num_nodes(leaf))
      return Inbox(pseudo_gradient=pseudo_gradient, weight_sum=res.weight_sum, messages=res.message_sum,
                   reported=reported, sampled=res.sampled, population=jnp.asarray(population),
                   params=params[leaf], population_weight=population_weight.astype(res.weight_sum.dtype),
                   slots=slots)

    tier = dict(num_steps=num_steps, weights=w_tier, chunk_size=sampler.chunk_size,
                parent_aligned=sampler.parent_aligned, batch_order=schedule.batch_order,
                batch_size=schedule.batch_size, cursor=state.cursor, population=population,
                learning_rate=local_learning_rate, personal=share.client_mask,
                personal_params=share.unpack(state.personal))
    server_state = state.server_state
    if server_rule is not None and server_rule.gather is not None:   # a pass before training (Mime's c)
      asked = train_cohort(server_rule.gather, sent, cohort, data, key=stream(key, "gather"),
                           broadcast=broadcast_of(server_rule, server_state), **tier)
      server_state = prepare(server_rule, inbox_of(asked, ()), server_state)
    parcels, position = Parcels(), None
    if server_rule is not None and (server_rule.send_each is not None or server_rule.slots):
      position = slot_positions(cohort, topology.num_nodes(leaf))
    if server_rule is not None and server_rule.send_each is not None:   # every child its own parcel
      parcels = server_rule.send_each(Outbox(
        state=server_state, params=sent, client_state=state.client_state, clients=cohort.clients,
        parent=cohort.parent, valid=cohort.valid, position=position, block_size=max(sampler.sizes), round=r,
        key=stream(key, "parcels")))
    res = train_cohort(
      client_update, sent, cohort, data, key=stream(key, "train"), client_state=state.client_state,
      skip_nonfinite=skip_nonfinite, path=paths[leaf], update_state=update_state[leaf],
      block_size=max(sampler.sizes), broadcast=broadcast_of(server_rule, server_state),
      slot_start=parcels.start, slot_extra=parcels.extra,
      keep_client_params=server_rule is not None and server_rule.slots, **tier,
    )
    update_state[leaf] = res.update_state
    metrics = {**res.metrics(skip_nonfinite), **path_stats(down_stats, "downlink_"), **parcels.stats}
    metrics.update(extra.byte_metrics(metrics))
    pseudo_gradient = res.pseudo_gradient()
    if server_rule is not None:   # what the parents keep beyond the model, from what the clients sent
      slots = None
      if server_rule.slots:   # every slot's own exchange
        start = parcels.start if parcels.start is not None else jax.tree.map(
          lambda a: jnp.take(a, cohort.parent, axis=0), sent)
        slots = Slots(clients=cohort.clients, parent=cohort.parent,
                      reported=jnp.take(res.reported, cohort.clients) & cohort.valid, position=position,
                      start=start, sent=res.client_params, block_size=max(sampler.sizes))
      pseudo_gradient, server_state, rule_stats = receive(server_rule, inbox_of(res, pseudo_gradient, slots),
                                                          server_state)
      metrics.update(path_stats(rule_stats))
    params[leaf], opt_state[leaf] = update_nodes(
      server_optimizers[leaf], params[leaf], opt_state[leaf], pseudo_gradient, res.weight_sum > 0,
    )
    params, opt_state, update_state, active, up_metrics = upper.aggregate(
      params, opt_state, update_state, w_client, r, key)
    params, down_level_stats, up_level_metrics = upper.send_down(params, active, key)
    metrics.update({**up_metrics, **up_level_metrics})
    clock = state.clock
    if systems is not None:   # the leaf parents' rounds run side by side; a level aggregating adds its own
      level_secs = []
      for lv, st in down_level_stats.items():
        mb = model_bytes(params[lv], stacked=True)
        up_b, down_b = _uplink(paths[lv], params[lv]), st.get("bytes")
        level_secs.append(jnp.where(active[lv], systems.aggregation_seconds(
          lv, links, mb if up_b is None else up_b,
          mb if down_b is None else jnp.take(down_b, parents[lv + 1])), 0.0))
      seconds = outcome.seconds + sum(level_secs, jnp.zeros((), jnp.float32))
      clock = state.clock + seconds
      metrics.update({**outcome.stats, "round_seconds": seconds, "sim_seconds": clock})
    new_state = state.replace(
      round=r, params=tuple(params), opt_state=tuple(opt_state), client_state=res.client_state,
      cursor=res.cursor, update_state=tuple(update_state), clock=clock, server_state=server_state,
      personal=share.pack(res.personal_params),
    )
    return new_state, metrics

  def models(state: TreeState):
    out = {}
    if top_level == 0 and share.reported(0):
      out["global"] = NodeModels(state.params[0], np.zeros(topology.num_clients, np.int32))
    for lv in range(max(top_level, 1), depth):
      if share.reported(lv):
        out[f"level{lv}"] = NodeModels(state.params[lv], topology.ancestor(lv))
    if share.has_client_personal:   # each client: its parent's shared leaves and its own personal ones
      parent = jax.tree.map(lambda a: jnp.take(a, ancestors[leaf], axis=0), state.params[leaf])
      own = merge(shared_part(parent, share.client_mask),
                  share.unpack(state.personal), share.client_mask)
      out["personal"] = NodeModels(own, np.arange(topology.num_clients, dtype=np.int32))
    return {**out, **personal_models(client_update, state.client_state)}

  return FederatedAlgorithm(init=init, round=round_fn, models=models, name=name)


# ------------------------------------------------------------------------ methods over the host
BOUND = ("client_update",)
"""The host's parameters a method fills itself (its local objective)."""


def method_over(host_factory: Callable, *, drops: Sequence[str] = (),
                bound: Sequence[str] = BOUND) -> Callable:
  """Declares ``method(*, <its own parameters>, **host)`` a thin spec over ``host_factory``
  (:func:`hierfavg`, or another host such as :func:`~fedtree.algorithms.asynchronous.fedbuff.fedbuff`).

  The method takes its own hyperparameters and passes every other argument on, so every option of
  the host works with it. Its signature, which the registry reads as a run's schema and ``help()``
  shows, is its own keyword-only parameters followed by every parameter of the host it neither
  declares nor binds (``bound``, ``drops``), with ``topology`` optional (``None``: one server over
  all clients); their annotations resolved.
  """

  def wrap(method: Callable) -> Callable:
    own = {n: p for n, p in inspect.signature(method).parameters.items()
           if p.kind is not inspect.Parameter.VAR_KEYWORD}
    host = inspect.signature(host_factory).parameters
    skip = set(own) | set(bound) | set(drops)
    params = list(own.values())
    for n, p in host.items():
      if n in skip:
        continue
      params.append(p.replace(default=None) if n == "topology" else p)
    required = [p for p in params if p.default is inspect.Parameter.empty]
    optional = [p for p in params if p.default is not inspect.Parameter.empty]
    hints = {n: h for n, h in typing.get_type_hints(host_factory).items() if n in host and n not in skip}
    hints.update(typing.get_type_hints(method))
    if "topology" in hints:
      hints["topology"] = hints["topology"] | None
    method.__signature__ = inspect.Signature(required + optional,   # type: ignore[attr-defined]
                                             return_annotation=FederatedAlgorithm)
    method.__annotations__ = hints
    method.host_parameters = tuple(n for n in host if n not in skip)   # type: ignore[attr-defined]
    method.host = host_factory   # type: ignore[attr-defined]
    return method

  return wrap


def hierfavg_method(*, drops: Sequence[str] = ()) -> Callable:
  """Declares ``method(*, <its own parameters>, **host)`` a thin spec over :func:`hierfavg`
  (:func:`method_over`): see :func:`on_host`."""
  return method_over(hierfavg, drops=drops)


def over_host(factory: Callable) -> bool:
  """Whether ``factory`` is :func:`hierfavg` or a method over it (:func:`hierfavg_method`): its
  upper levels are HierFAVG's (a server rule at the clients' parents, SCAFFOLD's or FedDyn's, is
  refused by :func:`hierfavg` under differential privacy noise above them)."""
  return factory is hierfavg or getattr(factory, "host", None) is hierfavg


def on_host(host: Mapping[str, Any], **fixed) -> FederatedAlgorithm:
  """:func:`hierfavg` on ``host``'s arguments and the method's ``fixed`` ones (its objective,
  name, ...); ``topology=None`` or absent is one server over all clients.

  Raises:
    ValueError: a host argument the caller gave that the method sets itself (its server rule, its
      objective, its personal parameters, ...), which would otherwise be dropped without a word.
  """
  name = fixed.get("name", host.get("name", "this method"))
  for key in sorted(k for k in fixed if host.get(k) is not None and host[k] is not fixed[k]):
    given = host[key]
    shown = repr(getattr(given, "name", given)) if key == "server_rule" else type(given).__name__
    raise ValueError(f"{name}: {key}={shown}; {name} keeps its own "
                     f"{key.replace('_', ' ')}: leave {key}= out")
  kw = {**host, **fixed}
  if kw.get("topology") is None:
    kw["topology"] = Topology.flat(kw["data"].num_clients)
  return hierfavg(**kw)
