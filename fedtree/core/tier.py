"""Training a whole tier of clients in one program, chunk by chunk.

:func:`train_cohort` broadcasts every parent's model to its sampled children
(``take(parent_params, parent_index)``), runs the :class:`~fedtree.core.local.ClientUpdate` of all
of them with ``vmap``, and sums their weighted pseudo-gradients into their parents with
``segment_sum``. The cohort is processed in chunks by a ``lax.scan`` that accumulates those
sums, so memory grows with the chunk, not the cohort; per-client persistent state is
gathered and scattered back by client index (clients outside the cohort are untouched).

Each client's randomness is ``fold_in(key, client_index)``, so results do not depend on the
chunk size nor on where a client sits in the cohort.

With the client axis sharded over ``D`` devices (:mod:`fedtree.core.sharding`), every device adds
its slice of each chunk into its own row of ``[D, P, ...]`` partial sums, and the rows are
summed once, after the last chunk: one cross-device reduction per tier and round instead of
one per chunk (which would cost a tree with many parents more than a flat round).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from fedtree.core.aggregation import divide_by_weight
from fedtree.core.data import FederatedData
from fedtree.core.local import (
  ClientData,
  ClientRound,
  ClientUpdate,
  advance_cursor,
  check_batch_order,
  run_update,
)
from fedtree.core.personal import fill, merge, personal_part, shared_part
from fedtree.core.rng import stream
from fedtree.core.sampling import Cohort
from fedtree.core.sharding import CLIENT_AXIS, constrain_clients, mesh_size
from fedtree.core.updates import (
  Aggregator,
  Chunk,
  ClientContext,
  Stats,
  UpdatePath,
  UpdateState,
  accumulator,
  block_positions,
  finish,
  node_state_of,
  path_metrics,
  transform_chunk,
)

PyTree = Any


class Tier(NamedTuple):
  """How a tier of clients trains: fixed for a run (static under ``jit``).

  Attributes:
    update: the client update, vmapped over each chunk.
    path: the update path between a client's training and its parent's aggregate
      (:mod:`fedtree.core.updates`): a client transform on every delta (after the non-finite
      check, before weighting), the aggregator (the streamed weighted mean, or a blockwise one
      given every parent's cohort as a ``[P, block_size, ...]`` block) and the node transform on
      every parent's ``(delta_sum, weight_sum)``. ``None``: the weighted mean. With
      ``keep_client_params``, the kept models are what the clients sent: ``anchor - transformed
      delta``. The path's ``down`` transform is the caller's to apply to the parents' models
      (:func:`fedtree.core.updates.send_down`).
    chunk_size: clients trained at once; ``None`` trains the whole cohort in one ``vmap``.
    parent_aligned: every chunk holds children of one parent only (see
      ``CohortSampler.parent_aligned``): each chunk then broadcasts that parent's model instead
      of gathering one copy per client, which XLA fuses into its consumers.
    batch_order: the order of local minibatches (``LocalSchedule.batch_order``): ``"shuffled"``,
      ``"fixed"`` or ``"cyclic"``.
    batch_size: the local batch size; needed by ``"cyclic"`` to wrap the cursors.
    skip_nonfinite: a client whose update (model delta or loss) is not finite is left out
      instead of poisoning its parent's mean, as production FL systems do: weight 0, its
      persistent state unchanged, its loss not averaged, counted in ``num_skipped``. Off by
      default, so that divergence stops a run (``fedtree.core.loop``) rather than hiding.
    block_size: the largest cohort of a parent (``max(CohortSampler.sizes)``), needed by a
      blockwise aggregator.
    learning_rate: the local learning rate an update that ``takes_round`` is told (or ``None``).
    personal: a pytree of bools shaped as the model, true at the leaves personal to each client
      (:mod:`fedtree.core.personal`): a client starts from its own personal leaves there and from
      its parent's model elsewhere, keeps what it trained there, and sends (and its parent
      aggregates) the shared leaves only; the pseudo-gradient is 0 at the personal leaves.
      ``None``: every leaf shared.
    keep_client_params: also return every slot's trained model ``[K, ...]`` (a skipped slot's:
      the model it started from, so that the rows stay finite).
    robust_messages: the clients' messages (what the update sends beside its delta) go through the
      path's blockwise aggregator as the deltas do, with unit weights: every parent's
      :attr:`TierResult.message_sum` is then the aggregator's estimate times its reporting children
      (the sum's scale; the plain sum under the mean). A server rule asks for it
      (:attr:`fedtree.core.server_rule.Uplink.robust`); without a blockwise aggregator it changes
      nothing.
    messages_with_update: where the path has a client or a node stage (:attr:`joint`), every client's
      message travels the path with its delta as one pytree ``(delta, message)``: one client stage
      over both (a clip bounds their joint norm; noise and compression cover both), one aggregator
      over both with the deltas' weights, the node stage on both sums. :attr:`TierResult.message_sum`
      is then the aggregate's message estimate times the reporting children (their sum under
      uniform weights). A server rule asks for it (:attr:`fedtree.core.server_rule.Uplink.with_update`).
    uniform_steps: every client of the tier takes the same number of local steps (a fixed
      ``LocalSchedule.steps``, no systems model that cuts them short): each chunk's local loop then
      runs that count, one count for the chunk, instead of a ``while_loop`` vmapped over the slots'
      own counts, whose every step selects, per slot, between the new parameters and the old (a
      client done keeps its own): the step updates its parameters in place with nothing else to
      read. A padding slot then trains too, and what it trained is dropped: its model is the one it
      started from, its message zero, its loss and state (as any untrained slot's) left out. A
      chunk whose valid slots' counts differ would be trained wrong: set it only where the counts are
      equal by construction.
  """

  update: ClientUpdate
  path: UpdatePath | None = None
  chunk_size: int | None = None
  parent_aligned: bool = False
  batch_order: str = "shuffled"
  batch_size: int | None = None
  skip_nonfinite: bool = False
  block_size: int | None = None
  learning_rate: Any = None
  personal: PyTree | None = None
  keep_client_params: bool = False
  robust_messages: bool = False
  messages_with_update: bool = False
  uniform_steps: bool = False

  @property
  def cyclic(self) -> bool:
    return self.batch_order == "cyclic"

  @property
  def has_personal(self) -> bool:
    return self.personal is not None and any(jax.tree.leaves(self.personal))

  @property
  def active_path(self) -> UpdatePath | None:
    """The update path, ``None`` where it is the plain weighted mean."""
    return None if self.path is None or self.path.is_default else self.path

  @property
  def joint(self) -> bool:
    """The messages travel the path with the deltas (:attr:`messages_with_update` and a client or a
    node stage)."""
    path = self.active_path
    return self.messages_with_update and path is not None and (path.client is not None
                                                                or path.node is not None)


class Down(NamedTuple):
  """What the parents send their sampled children in a round (every field traced).

  Attributes:
    params: ``[P, ...]`` the parents' models.
    broadcast: ``[P, ...]`` what every parent sends beside its model (a server rule's, see
      :mod:`fedtree.core.server_rule`), an update that ``takes_round`` reads as
      :attr:`~fedtree.core.local.ClientRound.broadcast` (``()``: nothing).
    anchor: ``[P, ...]`` the models the pseudo-gradient is taken against, where they differ from
      ``params`` (``None``: ``params``).
    start: ``[K, ...]`` the model every cohort slot starts from and takes its update against, in
      place of its parent's (a server rule's parcels,
      :attr:`~fedtree.core.server_rule.Downlink.parcels`); ``None``: its parent's.
    extra: ``[K, ...]`` what every slot's update receives as
      :attr:`~fedtree.core.local.ClientRound.extra` (``()``: nothing).
    population: ``[P]`` the clients under every parent, for the round's sampled fraction
      (:attr:`~fedtree.core.local.ClientRound.fraction`; ``None``: the sampled ones, fraction 1).
  """

  params: PyTree
  broadcast: PyTree = ()
  anchor: PyTree | None = None
  start: PyTree = None
  extra: PyTree = ()
  population: jax.Array | None = None


class Clients(NamedTuple):
  """The clients' side of a round (every field traced; ``C`` the population).

  Attributes:
    num_steps: ``int32[C]`` local steps of every client.
    weights: ``[C]`` aggregation weight of every client (examples or ones).
    state: ``[C, ...]`` persistent per-client state of the update, or ``()``.
    cursor: ``int32[C]`` every client's batch cursor (``"cyclic"`` only: from
      ``LocalSchedule.init_cursor``, then the previous ``TierResult.cursor``); each trained
      client's cursor advances by its ``num_steps``. ``()`` for the other orders.
    personal: ``[C, ...]`` every client's personal leaves (``None`` at the shared ones).
    update_state: the update path's state (:func:`fedtree.core.updates.init_update_state`).
  """

  num_steps: jax.Array
  weights: jax.Array
  state: PyTree = ()
  cursor: jax.Array | tuple = ()
  personal: PyTree = None
  update_state: UpdateState | None = None


class TierResult(NamedTuple):
  """What a tier sends up.

  Attributes:
    delta_sum: ``[P, ...]`` ``Σ_i w_i (Θ_parent(i) - θ_i)`` over the cohort of each parent.
    weight_sum: ``[P]`` ``Σ_i w_i``; 0 for a parent none of whose children reported.
    client_state: ``[C, ...]`` persistent client state, updated where clients trained.
    client_params: ``[K, ...]`` the trained model of every cohort slot (only with
      ``keep_client_params=True``, else ``None``).
    loss_sum: ``[]`` sum over the cohort of each client's mean local loss.
    num_trained: ``[]`` number of clients that trained (skipped ones excluded).
    cursor: ``int32[C]`` the ``"cyclic"`` batch cursors, advanced where clients trained
      (``()`` for the other batch orders).
    num_skipped: ``[]`` clients left out for a non-finite update (``skip_nonfinite``).
    first_nonfinite: ``int32[]`` the lowest id of a cohort client whose update (model delta or
      loss) is not finite and was aggregated, -1 if none (or all were skipped,
      ``skip_nonfinite``): the round loop names it when a run diverges.
    reported: ``bool[C]`` the clients whose update was aggregated: the sampled ones, less those
      skipped (``skip_nonfinite``); an algorithm that aggregates anything else of its clients
      (their models, their assignments) masks it with this.
    update_state: the :class:`~fedtree.core.updates.UpdateState` of the update path, updated.
    update_stats: the round metrics of the update path's stages
      (:func:`fedtree.core.updates.path_metrics`; ``{}`` without a path).
    message_sum: ``[P, ...]`` the sum of the reporting clients' messages per parent (``()`` when
      the update sends none; :class:`~fedtree.core.local.ClientUpdate` ``takes_round``).
    sampled: ``[P]`` the clients sampled under every parent (valid slots).
    personal_params: ``[C, ...]`` the clients' personal parameters (``None`` at the shared
      leaves), updated where clients trained; ``None`` without personal parameters.
  """

  delta_sum: PyTree
  weight_sum: jax.Array
  client_state: PyTree
  client_params: PyTree | None
  loss_sum: jax.Array
  num_trained: jax.Array
  cursor: jax.Array | tuple = ()
  num_skipped: jax.Array | int = 0
  first_nonfinite: jax.Array | int = -1
  reported: jax.Array | None = None
  update_state: UpdateState = UpdateState()
  update_stats: dict[str, jax.Array] = {}
  message_sum: PyTree = ()
  sampled: jax.Array | None = None
  personal_params: PyTree = None

  def pseudo_gradient(self) -> PyTree:
    """The mean pseudo-gradient ``Θ - Σ p_i θ_i`` of every parent (0 where none reported)."""
    return divide_by_weight(self.delta_sum, self.weight_sum)

  def mean_loss(self) -> jax.Array:
    """``[]`` the mean local loss of the clients that trained (0 when none did)."""
    return self.loss_sum / jnp.maximum(self.num_trained, 1).astype(self.loss_sum.dtype)

  def messages(self) -> jax.Array:
    """``int32[]`` the clients that got their parent's model and sent their update back: those
    that trained and those skipped for a non-finite update (the clients' edge of
    :func:`edge_metrics`)."""
    return (jnp.asarray(self.num_trained) + jnp.asarray(self.num_skipped)).astype(jnp.int32)

  def metrics(self, skip_nonfinite: bool = False) -> dict[str, jax.Array]:
    """A round's metrics of this tier: ``train_loss`` (:meth:`mean_loss`), ``clients_trained``,
    ``nonfinite_client`` (the lowest id of a client whose update was not finite, else -1; the
    round loop names it when it stops), when clients are skipped (``skip_nonfinite``),
    ``clients_skipped``, and the clients' edge (:func:`edge_metrics`: each client that trained
    or was skipped got its parent's model and sent one message back; an algorithm whose clients
    exchange otherwise sets its own)."""
    out = {"train_loss": self.mean_loss(), "clients_trained": self.num_trained,
           "nonfinite_client": jnp.asarray(self.first_nonfinite, jnp.int32),
           **edge_metrics("clients", self.messages())}
    if skip_nonfinite:
      out["clients_skipped"] = jnp.asarray(self.num_skipped)
    for k, v in self.update_stats.items():
      if k in out:
        raise ValueError(f"update path statistic {k!r} collides with the tier's own metric")
      out[k] = v
    return out


def edge_metrics(edge: str, uplink_messages, downlink_messages=None, *, uplink_bytes=None,
                 downlink_bytes=None) -> dict[str, jax.Array]:
  """One edge's traffic in a round, the metrics :class:`fedtree.toolbox.traffic.Traffic` counts.

  ``<edge>_uplink_messages`` / ``<edge>_downlink_messages`` (``int32``) messages went up and down
  the edge (``downlink_messages`` default: as many as went up), each of one message's bytes: the
  edge's ``uplink_bytes`` / ``downlink_bytes`` metrics where the round reports them (a
  compressing update path, a server rule's extras, several models a message), else one model at
  its dtypes (the host knows its size exactly: a round's metrics carry no 64-bit integer). Those
  metrics are ``uplink_bytes`` / ``downlink_bytes`` for the clients' edge (``edge="clients"``:
  each of the clients that took part and their parents) and ``level<l>_uplink_bytes`` /
  ``level<l>_downlink_bytes`` for the edge between server level ``l`` and its child nodes
  (``edge="level<l>"``); given here, they are set.

  Args:
    edge: ``"clients"`` or ``"level<l>"``.
    uplink_messages: messages sent up (a traced or static count).
    downlink_messages: messages sent down; default ``uplink_messages``.
    uplink_bytes: one uplink message's bytes, when the round knows it differs from one model.
    downlink_bytes: one downlink message's bytes, likewise.

  Example:
    >>> sorted(edge_metrics("level0", 2, uplink_bytes=70))
    ['level0_downlink_messages', 'level0_uplink_bytes', 'level0_uplink_messages']
  """
  if edge != "clients" and not (edge.startswith("level") and edge[len("level"):].isdigit()):
    raise ValueError(f"edge={edge!r} must be 'clients' or 'level<l>' (l a server level, e.g. 'level0')")
  up = jnp.asarray(uplink_messages).astype(jnp.int32)
  out = {f"{edge}_uplink_messages": up,
         f"{edge}_downlink_messages": up if downlink_messages is None else jnp.asarray(
           downlink_messages).astype(jnp.int32)}
  size = "" if edge == "clients" else f"{edge}_"
  for way, b in (("uplink", uplink_bytes), ("downlink", downlink_bytes)):
    if b is not None:
      out[f"{size}{way}_bytes"] = jnp.asarray(b)
  return out


class _Carry(NamedTuple):
  """What :func:`train_cohort`'s scan over chunks accumulates."""

  acc: PyTree               # the aggregator's accumulator state (fedtree.core.updates.accumulator)
  client_state: PyTree      # [C, ...] the objective's persistent state
  loss_sum: jax.Array       # [] over the clients that trained
  trained: jax.Array        # int32[] clients that trained
  skipped: jax.Array        # int32[] clients skipped for a non-finite update
  first_bad: jax.Array      # int32[] lowest id of a non-finite aggregated client (C if none)
  reported: jax.Array       # bool[C] clients whose update was aggregated
  path_client: PyTree       # [C, ...] the client transform's state
  stat_sums: Stats          # {name: [P]} client statistics summed per parent
  message_sum: PyTree       # [P, ...] the reporting clients' messages summed per parent, else ()
  personal: PyTree          # [C, ...] personal parameters (None at shared leaves), else None


def _rows(mask: jax.Array, tree: PyTree) -> PyTree:
  """``mask[K]`` broadcast against every ``[K, ...]`` leaf, for per-slot ``where``."""
  return jax.tree.map(lambda a: mask.reshape((mask.shape[0],) + (1,) * (a.ndim - 1)), tree)


def nonfinite_slots(delta: PyTree, loss: jax.Array) -> jax.Array:
  """``bool[K]``: the slots whose loss and every entry of whose update (any pytree of ``[K, ...]``
  leaves) are finite."""
  ok = jnp.isfinite(loss)
  for d in jax.tree.leaves(delta):
    ok = ok & jnp.isfinite(d).reshape(loss.shape[0], -1).all(axis=1)
  return ok


def _take(tree: PyTree, idx: jax.Array) -> PyTree:
  return jax.tree.map(lambda a: jnp.take(a, idx, axis=0), tree)


def _row(tree: PyTree) -> PyTree:
  """One row of stacked ``[N, ...]`` leaves, abstract."""
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), tree)


def message_shape(update: ClientUpdate, parent_params, client_state, data: FederatedData, broadcast,
                   learning_rate, key, own: PyTree = ()) -> PyTree:
  """The abstract shape of what one client sends beside its model (``()`` for none), from an
  abstract trace of one slot (``own``: every slot's parcel extra, ``[K, ...]``, or ``()``)."""
  if not update.takes_round:
    return ()
  scalar: Any = jax.ShapeDtypeStruct((), jnp.int32)   # abstract values stand in for the arrays
  x: Any = data.x_train if data.ragged else _row(data.x_train)
  y: Any = data.y_train if data.ragged else _row(data.y_train)
  cd = ClientData(x=x, y=y, n=scalar, cursor=scalar, offset=scalar if data.ragged else None)
  fdtype = jnp.result_type(jnp.float32, *jax.tree.leaves(parent_params))
  real: Any = jax.ShapeDtypeStruct((), fdtype)
  rnd = ClientRound(client=scalar, parent=scalar, broadcast=_row(broadcast), fraction=real, weight=real,
                    extra=_row(own))
  out = jax.eval_shape(lambda a, st, d, n, k, r: run_update(update, a, st, d, n, k, r._replace(
    learning_rate=learning_rate)), _row(parent_params), _row(client_state), cd, scalar, key, rnd)
  return out[3]


def _sorted_chunks(cohort: Cohort, num_steps: jax.Array, chunk: int, num_parents: int):
  """The cohort's slots sorted by (parent, step count), as ``[K / chunk, chunk]`` chunks with their
  step counts and their positions among their parent's slots: a chunk loops to its largest step
  count (:func:`fedtree.core.local.run_local_steps`), so clients with similar counts share chunks;
  padding slots take no step; parent groups, and hence parent-aligned chunks, are kept. Returns
  ``(order, (chunks, steps, positions))``."""
  k = cohort.clients.shape[0]
  slot_steps = jnp.where(cohort.valid, jnp.take(num_steps, cohort.clients), 0)
  order = jnp.lexsort((slot_steps, cohort.parent))
  cohort = jax.tree.map(lambda a: jnp.take(a, order, axis=0), cohort)
  positions = block_positions(cohort.parent, cohort.valid, num_parents)
  return order, jax.tree.map(lambda a: a.reshape((k // chunk, chunk) + a.shape[1:]),
                             (cohort, jnp.take(slot_steps, order), positions))


def _rows_of(tree: PyTree, ch: Cohort, parent_aligned: bool) -> PyTree:
  """Every slot's row of a parents' ``[P, ...]`` tree (a broadcast of the one parent's row when
  the chunk is parent-aligned, which XLA fuses into its consumers instead of writing ``[chunk,
  ...]`` copies)."""
  if parent_aligned:
    chunk = ch.parent.shape[0]
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (chunk,) + a.shape[1:]), _take(tree, ch.parent[:1]))
  return _take(tree, ch.parent)


def _chunk_data(data: FederatedData, ch: Cohort, cursor, *, cyclic: bool, batch_order: str):
  """The chunk's clients' training data as a :class:`~fedtree.core.local.ClientData` of ``[chunk]``
  rows, and its vmap axes (ragged data: every client reads the shared flat rows from its offset)."""
  chunk = ch.clients.shape[0]
  per_client = constrain_clients(dict(
    n=jnp.take(data.n_train, ch.clients, axis=0),
    cursor=jnp.take(cursor, ch.row) if cyclic else jnp.zeros((chunk,), jnp.int32),
    shuffle=jnp.full((chunk,), batch_order == "shuffled"),
  ))
  if data.ragged:
    flat: Any = data   # (ragged: flat rows and offsets)
    axes: Any = ClientData(x=None, y=None, n=0, cursor=0, shuffle=0, offset=0)   # type: ignore[arg-type]  # vmap axes
    return (ClientData(x=flat.x_train, y=flat.y_train, offset=jnp.take(flat.train_offset, ch.row),
                       **per_client), axes)
  return ClientData(x=constrain_clients(jnp.take(data.x_train, ch.row, axis=0)),
                    y=constrain_clients(jnp.take(data.y_train, ch.row, axis=0)), **per_client), 0


def _on_devices(tree: PyTree) -> PyTree:
  """Keeps ``[D, ...]`` per-device partial sums on their devices (row d on device d)."""
  return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, P(CLIENT_AXIS)), tree)


_ROUND_AXES = ClientRound(client=0, parent=0, broadcast=0, fraction=0, weight=0,  # type: ignore[arg-type]
                          learning_rate=None, extra=0)   # vmap's axes of a ClientRound


def _train_chunk(tier: Tier, down: Down, data, clients: Clients, ch: Cohort, ch_steps, client_state,
                 personal_params, parcel, *, key, fdtype, fraction):
  """One chunk of clients: broadcast down (each client's own personal leaves where it has them),
  local training vmapped over the chunk. ``parcel``: the chunk's ``(start, extra)`` rows of the
  slots' parcels (``start`` ``None``: the parents' models). Returns ``(start, anchor, params,
  state, loss, message, weight)`` per slot. Under a ``jax.set_mesh`` with a ``clients`` axis, each
  device trains its slice of the chunk (identity otherwise; see :mod:`fedtree.core.sharding`)."""
  slot_start, own_rows = parcel
  if slot_start is None:
    start = constrain_clients(_rows_of(down.params, ch, tier.parent_aligned))
  else:   # every slot's own model, in place of its parent's
    start = constrain_clients(slot_start)
  if tier.has_personal:   # every client's own personal leaves, the parent's model elsewhere
    own = _take(personal_params, ch.row)
    start = constrain_clients(merge(shared_part(start, tier.personal), own, tier.personal))
  cdata, data_axes = _chunk_data(data, ch, clients.cursor, cyclic=tier.cyclic, batch_order=tier.batch_order)
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, ch.clients)
  w = jnp.where(ch.valid, jnp.take(clients.weights, ch.clients).astype(fdtype), 0.0)
  rnd = ClientRound(client=ch.clients, parent=ch.parent, broadcast=_take(down.broadcast, ch.parent),
                    fraction=jnp.take(fraction, ch.parent), weight=w, learning_rate=tier.learning_rate,
                    extra=own_rows)
  steps, steps_axis = (jnp.max(ch_steps), None) if tier.uniform_steps else (ch_steps, 0)
  params, new_state, loss, message = jax.vmap(
    lambda *a: run_update(tier.update, *a), in_axes=(0, 0, data_axes, steps_axis, 0, _ROUND_AXES))(
    start, constrain_clients(_take(client_state, ch.row)), cdata, steps, keys, rnd)
  if tier.uniform_steps:   # (padding slots trained too: they send nothing, as if they had not)
    params = jax.tree.map(lambda p, s, m: jnp.where(m, p, s), params, start, _rows(ch.valid, params))
    message = jax.tree.map(lambda a: jnp.where(_rows(ch.valid, a), a, 0), message)   # (no NaN to weigh by 0)
  anchor = start if (down.anchor is None or slot_start is not None) else _rows_of(
    down.anchor, ch, tier.parent_aligned)
  return start, anchor, constrain_clients(params), new_state, loss, message, w


def _stat_names(path: UpdatePath | None, update_state: UpdateState, template, fdtype) -> tuple[str, ...]:
  """The names of the client transform's statistics, from an abstract trace of one slot."""
  if path is None or path.client is None:
    return ()
  one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), template)
  ctx = ClientContext(client=jnp.zeros((), jnp.int32), parent=jnp.zeros((), jnp.int32),
                      weight=jnp.zeros((), fdtype),
                      node_state=jax.tree.map(lambda a: a[0], update_state.node))
  row = jax.tree.map(lambda a: a[0], update_state.client)
  _, _, stats = jax.eval_shape(path.client.apply, one, row, jax.random.key(0), ctx)
  return tuple(stats)


class _Scan(NamedTuple):
  """What every chunk of one :func:`train_cohort` call shares (its static plan and this round's values)."""

  tier: Tier
  train: Callable            # _train_chunk with this call's records bound
  acc: Any                   # the aggregator's accumulator (fedtree.core.updates.accumulator)
  update_state: UpdateState  # the path's state at the round's start
  update_key: jax.Array
  num_parents: int
  num_clients: int
  messages: Any = None       # the messages' block accumulator (Tier.robust_messages), else None


def _shared(tier: Tier, tree: PyTree) -> PyTree:
  """What a child sends up of ``tree``: its shared leaves."""
  return shared_part(tree, tier.personal) if tier.has_personal else tree


def _chunk_step(scan: _Scan, carry: _Carry, xs):
  """One chunk of the cohort: train it, check it, send it through the client stage and add it up."""
  tier, path = scan.tier, scan.tier.active_path
  (ch, ch_steps, ch_pos), parcel = xs
  start, anchor, params, new_state, loss, message, w = scan.train(ch, ch_steps, carry.client_state,
                                                                  carry.personal, parcel)
  delta = _shared(tier, jax.tree.map(jnp.subtract, anchor, params))   # what the client sends up
  ok = nonfinite_slots((delta, message), loss)
  trained, skipped, first_bad = ch.valid, carry.skipped, carry.first_bad
  if tier.joint:   # the message travels the path with the delta
    delta = (delta, message)
  if tier.skip_nonfinite:   # left out: weight 0, state unchanged, loss not averaged
    delta = jax.tree.map(lambda d, m: jnp.where(m, d, 0), delta, _rows(ok, delta))
    loss, w, trained = jnp.where(ok, loss, 0.0), jnp.where(ok, w, 0.0), ch.valid & ok
    skipped = skipped + jnp.sum((ch.valid & ~ok).astype(jnp.int32))
    if tier.keep_client_params:
      params = jax.tree.map(lambda p, s, m: jnp.where(m, p, s), params, start, _rows(ok, params))
  else:
    first_bad = jnp.minimum(first_bad, jnp.min(jnp.where(ch.valid & ~ok, ch.clients, scan.num_clients)))
  path_client, stat_sums = carry.path_client, carry.stat_sums
  if path is not None:   # the update path's client stage, on every slot's delta
    raw = delta
    delta, path_client, sums = transform_chunk(path, path_client, delta, ch.clients, ch.parent, w, trained,
                                               scan.update_state.node, scan.update_key, scan.num_parents,
                                               rows=ch.row)
    stat_sums = {n: stat_sums[n] + v for n, v in sums.items()}
    if tier.keep_client_params and path.client is not None:   # what each client sent (its own, bitwise,
      # where unchanged)
      assert not tier.has_personal   # (refused by the hosts that keep client models)
      sent, before = (delta[0], raw[0]) if tier.joint else (delta, raw)
      params = jax.tree.map(lambda p, a, d, r: jnp.where(d == r, p, a - d), params, anchor, sent, before)
  fdtype = carry.loss_sum.dtype
  new = carry._replace(
    acc=scan.acc.add(carry.acc, Chunk(delta, w, ch.parent, ch_pos, ch.clients, trained)),
    client_state=ch.scatter(carry.client_state, new_state, trained),  # padding/skipped: nowhere
    loss_sum=carry.loss_sum + jnp.sum(jnp.where(trained, loss, 0.0)).astype(fdtype),
    trained=carry.trained + jnp.sum(trained, dtype=jnp.int32), skipped=skipped, first_bad=first_bad,
    reported=carry.reported.at[jnp.where(trained, ch.clients, scan.num_clients)].set(True, mode="drop"),
    path_client=path_client, stat_sums=stat_sums,
    message_sum=(carry.message_sum if tier.joint else   # (joint: in the deltas' aggregate)
                 scan.messages.add(carry.message_sum, Chunk(message, trained.astype(fdtype), ch.parent,
                                                            ch_pos, ch.clients, trained))
                 if scan.messages is not None else jax.tree.map(
      lambda a, m, t: a + jax.ops.segment_sum(jnp.where(t, m, 0), ch.parent, num_segments=scan.num_parents),
      carry.message_sum, message, _rows(trained, message))),
    personal=(ch.scatter(carry.personal, personal_part(params, tier.personal), trained) if tier.has_personal
              else None),
  )
  return new, (params if tier.keep_client_params else None)


def _init_carry(scan: _Scan, down: Down, clients: Clients, data: FederatedData, key, fdtype) -> _Carry:
  """The scan's start: empty sums, the clients' state as it is."""
  tier = scan.tier
  template = _shared(tier, down.params)   # what a child sends up: the shared leaves
  one_message = message_shape(tier.update, down.params, clients.state, data, down.broadcast,
                              tier.learning_rate, key, down.extra)
  n = scan.num_parents
  if tier.joint:   # (delta, message) through the path as one
    template = (template, jax.tree.map(lambda m: jax.ShapeDtypeStruct((n,) + m.shape, m.dtype), one_message))
  return _Carry(
    acc=scan.acc.init(template, n, fdtype), client_state=clients.state, loss_sum=jnp.zeros((), fdtype),
    trained=jnp.zeros((), jnp.int32), skipped=jnp.zeros((), jnp.int32),
    first_bad=jnp.full((), scan.num_clients, jnp.int32), reported=jnp.zeros((scan.num_clients,), bool),
    path_client=scan.update_state.client,
    stat_sums={s: jnp.zeros((n,), fdtype)
               for s in _stat_names(tier.active_path, scan.update_state, template, fdtype)},
    message_sum=_message_carry(scan, one_message, fdtype),
    personal=clients.personal if tier.has_personal else None,
  )


def _message_carry(scan: _Scan, one: PyTree, fdtype) -> PyTree:
  """The messages' sums ``[P, ...]`` (zeros), or their blocks (:attr:`Tier.robust_messages`), from one
  message's shapes ``one``."""
  n = scan.num_parents
  stacked = jax.tree.map(lambda m: jnp.zeros((n,) + m.shape, m.dtype), one)
  return stacked if scan.messages is None else scan.messages.init(stacked, n, fdtype)


def _robust_messages(tier: Tier, path: UpdatePath | None) -> Any:
  """The block accumulator of the clients' messages under :attr:`Tier.robust_messages`, else None (also
  where they travel the path with the deltas, :attr:`Tier.joint`: the deltas' blocks hold them)."""
  if not tier.robust_messages or tier.joint or path is None or not path.aggregator.blockwise:
    return None
  return accumulator(path.aggregator, block_size=tier.block_size)


def _check_tier(tier: Tier, clients: Clients, k: int) -> int:
  """The chunk size of a cohort of ``k`` slots, after checking the batch order and the chunking."""
  check_batch_order(tier.batch_order)
  if tier.cyclic and (tier.batch_size is None or isinstance(clients.cursor, tuple)):
    raise ValueError(
      "batch_order='cyclic' needs Tier(batch_size=) and Clients(cursor=) (int32[C], "
      f"LocalSchedule.init_cursor); got batch_size={tier.batch_size!r}, cursor={clients.cursor!r}")
  chunk = k if tier.chunk_size is None else min(int(tier.chunk_size), k)
  if k % chunk:
    raise ValueError(f"cohort of {k} slots is not a multiple of chunk_size={chunk}")
  return chunk


def train_cohort(tier: Tier, down: Down, cohort: Cohort, data: FederatedData, clients: Clients,
                 key: jax.Array) -> TierResult:
  """Trains every client of ``cohort`` from what its parent sends and aggregates per parent.

  Args:
    tier: how the tier trains, fixed for a run (:class:`Tier`: the client update, the update path,
      the chunking, the batch order, what is personal).
    down: what the parents send this round (:class:`Down`: their models, their broadcast, every
      slot's parcel).
    cohort: sampled slots (length a multiple of ``tier.chunk_size``).
    data: the federated data (training split is used).
    clients: the clients' side of the round (:class:`Clients`: step counts, aggregation weights,
      persistent state, cursors, personal parameters, the path's state).
    key: randomness of this tier's round; client ``c`` uses ``fold_in(key, c)``, so results do not
      depend on the chunk size nor on where a client sits in the cohort.

  Returns:
    The :class:`TierResult`: every parent's summed pseudo-gradient and weight, and the clients'
    new state.

  Example:
    Root -> 2 edges -> 5 clients; every client trains 2 steps of SGD from its edge's model
    and each edge receives the weighted sum of its children's pseudo-gradients:

    >>> from fedtree.core.algorithm import stack
    >>> from fedtree.core.local import sgd_client_update
    >>> from fedtree.core.sampling import cohort_sampler
    >>> edges = stack(model.init(jax.random.key(0)), 2)                # [2, ...]
    >>> cohort = cohort_sampler(Topology.from_labels(groups).parent(2), None)(jax.random.key(1))
    >>> update = sgd_client_update(model, optax.sgd(0.1), batch_size=8, max_steps=2)
    >>> clients = Clients(num_steps=jnp.full(5, 2), weights=data.n_train.astype(jnp.float32))
    >>> out = train_cohort(Tier(update), Down(edges), cohort, data, clients, jax.random.key(2))
    >>> out.weight_sum.shape, int(out.num_trained)
    ((2,), 5)
  """
  k = cohort.clients.shape[0]
  chunk = _check_tier(tier, clients, k)
  if data.window is not None:   # every slot's row in the window the round holds
    cohort = cohort._replace(rows=data.rows_of(cohort.clients))
  num_parents = jax.tree.leaves(down.params)[0].shape[0]
  # Weights and loss sums in the parameters' float dtype (float64 state keeps float64 sums).
  fdtype = jnp.result_type(jnp.float32, *jax.tree.leaves(down.params))
  update_state = UpdateState() if clients.update_state is None else clients.update_state
  order, chunks = _sorted_chunks(cohort, clients.num_steps, chunk, num_parents)
  parcels = jax.tree.map(lambda a: jnp.take(a, order, axis=0).reshape((k // chunk, chunk) + a.shape[1:]),
                         (down.start, down.extra))
  devices = mesh_size()   # per-device partial sums, row d owned by device d (1 unsharded)
  devices = devices if devices > 1 and chunk % devices == 0 else 1
  path = tier.active_path
  acc = accumulator(Aggregator() if path is None else path.aggregator, block_size=tier.block_size,
                    devices=devices, constrain=_on_devices)
  sampled = jax.ops.segment_sum(cohort.valid.astype(fdtype), cohort.parent, num_segments=num_parents)
  population = sampled if down.population is None else jnp.asarray(down.population, fdtype)
  fraction = jnp.where(sampled > 0, sampled / population, 0.0)
  train = functools.partial(_train_chunk, tier, down, data, clients, key=key, fdtype=fdtype,
                            fraction=fraction)
  scan = _Scan(tier, train, acc, update_state, stream(key, "update"), num_parents, data.num_clients,
               _robust_messages(tier, path))
  out, per_chunk = jax.lax.scan(functools.partial(_chunk_step, scan),
                                _init_carry(scan, down, clients, data, key, fdtype), (chunks, parcels))
  return _tier_result(scan, out, per_chunk, cohort, clients, data, order, sampled, down, key)


def _tier_result(scan: _Scan, out: _Carry, per_chunk, cohort: Cohort, clients: Clients, data: FederatedData,
                 order, sampled, down: Down, key) -> TierResult:
  """The scan's sums finished: the aggregator's and the path's node stage, the slots' models back in
  the cohort's order, the cursors advanced, the personal leaves' pseudo-gradient filled."""
  tier, path, update_state, num_parents = (scan.tier, scan.tier.active_path, scan.update_state,
                                          scan.num_parents)

  fdtype = out.loss_sum.dtype
  delta_sum, weight_sum, agg_stats = scan.acc.finish(
    out.acc, stream(key, "aggregate"), {} if path is None else node_state_of(path, update_state))
  update_stats: dict[str, jax.Array] = {}
  new_update_state = update_state._replace(client=out.path_client)
  reported = jax.ops.segment_sum(jnp.take(out.reported, cohort.clients).astype(fdtype) * cohort.valid,
                                 cohort.parent, num_segments=num_parents)   # [P] children that reported

  def at_sum_scale(total, weight):   # an aggregate's estimate times the reporting children
    return jax.tree.map(lambda e: e * reported.reshape((-1,) + (1,) * (e.ndim - 1)).astype(e.dtype),
                        divide_by_weight(total, weight))

  if path is not None:
    stat_sums = dict(out.stat_sums)
    stat_sums["reported"] = reported
    delta_sum, weight_sum, new_update_state, node_stats = finish(
      path, new_update_state, delta_sum, weight_sum, stat_sums, stream(key, "node"))
    update_stats = path_metrics(stat_sums, out.trained, node_stats, agg_stats)
  client_params = None
  if tier.keep_client_params:   # back in the cohort's slot order
    k = cohort.clients.shape[0]
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(k, dtype=order.dtype))
    client_params = jax.tree.map(lambda a: jnp.take(a.reshape((k,) + a.shape[2:]), inverse, axis=0),
                                 per_chunk)
  cursor = clients.cursor
  if tier.cyclic:  # each trained client read ``num_steps`` more batches of its stream
    assert tier.batch_size is not None and not isinstance(cursor, tuple)  # checked on entry
    moved = advance_cursor(jnp.take(cursor, cohort.row), jnp.take(clients.num_steps, cohort.clients),
                           jnp.take(data.n_train, cohort.clients), tier.batch_size)
    cursor = cohort.scatter(cursor, moved)
  first_bad = jnp.where(out.first_bad < scan.num_clients, out.first_bad, -1).astype(jnp.int32)
  message_sum = out.message_sum
  if tier.joint:   # the aggregate's estimate of the messages, at the sum's scale
    delta_sum, m_sum = delta_sum
    message_sum = at_sum_scale(m_sum, weight_sum)
  if tier.has_personal:   # no pseudo-gradient at the personal leaves
    delta_sum = fill(delta_sum, tier.personal, down.params)
  if scan.messages is not None:   # the aggregator's estimate of the messages, at the sum's scale
    m_sum, m_weight, _ = scan.messages.finish(message_sum, stream(key, "messages"), {})
    message_sum = at_sum_scale(m_sum, m_weight)
  return TierResult(delta_sum, weight_sum, out.client_state, client_params, out.loss_sum, out.trained,
                    cursor, out.skipped, first_bad, out.reported, new_update_state, update_stats,
                    message_sum, sampled, out.personal if tier.has_personal else None)
