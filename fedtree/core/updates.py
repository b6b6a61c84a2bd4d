"""The update path: everything a child's update goes through between its training and its parent's
server optimizer, at any node of the tree.

One aggregation (children -> their parents, e.g. the clients of a tier -> their edge servers, or
the edge servers -> the root) passes through three stages, each optional:

1. a **client transform** (:class:`ClientTransform`, optax-like ``init`` / ``apply``), vmapped
   over the children: ``apply(delta, state, key, context) -> (delta, state, stats)`` on each
   child's pseudo-gradient ``Θ_parent - θ_child`` before it is weighted (clipping, local noise,
   compression with error feedback, an attacker replacing its update). Its per-child persistent
   state is stacked ``[C, ...]`` like a personal model and only the children that reported
   update it. Transforms compose with :func:`chain`;
2. an **aggregator** (:class:`Aggregator`): ``None`` is the weighted mean that the tier streams
   chunk by chunk into ``segment_sum`` (today's engine, unchanged); an aggregator with an
   ``aggregate`` function needs a parent's whole cohort at once (coordinate median, Krum), so the
   tier keeps every slot's update in a fixed-size block ``[P, K, ...]`` (``K`` the largest cohort
   of a parent; empty slots have weight 0 and ``valid`` false) and hands the blocks over;
3. a **node transform** (:class:`NodeTransform`) on every parent's aggregated ``(delta_sum,
   weight_sum)`` before the server optimizer (central noise, a fixed denominator), with its own
   per-node state ``[P, ...]`` and key. Its state is also what the client transforms read as
   their parent's (:attr:`ClientContext.node_state`, e.g. an adaptive clip norm).

Each stage returns statistics (a dict of scalars per child, or ``[P]`` per node), which land in
the round's metrics (:func:`path_metrics`): a child statistic as its mean over the children that
reported, a node statistic as its mean over the parents. Hyperparameters captured by the
factories may be traced values, so they can be sweep axes.

A path's ``down`` transform acts on the models a parent sends to its children (``[P, ...] ->
[P, ...]``, e.g. compression on the downlink): see :func:`send_down`.

**One argument order.** A seam's function takes what flows through it first (the update, the
block, the aggregate, the model, the inbox), then the persistent state of the child or node it
runs at, then its PRNG key, then read-only context, as optax's ``update(updates, state, params)``;
``init(params, num) -> state [num, ...]`` builds the stacked state. So
``ClientTransform.apply(delta, state, key, context)``, ``Aggregator.aggregate(block, node_state,
key)``, ``NodeTransform.apply(delta_sum, weight_sum, client_stats, state, key)``,
``DownTransform.apply(params, key)``, and a server rule's ``receive(inbox, state)`` and
``weights(host_weights, state)`` (:class:`~fedtree.core.server_rule.ServerRule`). One seam
differs: :class:`~fedtree.core.local.ClientUpdate`'s ``apply(anchor, state, data, num_steps, key
[, round])`` takes the client's data after its state. (An algorithm's ``round(state, data, key)``
is the loop's step, not a seam: state first, as a training step's.)

**One door for every level.** The clients' tier (:func:`fedtree.core.tier.train_cohort`, chunk by
chunk) and a server level aggregating the nodes below it (:func:`aggregate_children`, the whole
level as one chunk) run the same code: :func:`transform_chunk` (the client stage) on a
:class:`Chunk`, an :class:`Accumulator` (``init`` / ``add`` a chunk / ``finish``:
:func:`accumulator`; the weighted mean streams sums, a blockwise aggregator keeps its
:class:`Block`), then :func:`finish` (the node stage).

:class:`UpdatePath` bundles the stages for one aggregation; :class:`UpdateState` holds its state.
``None`` everywhere is the engine as it was: an algorithm given no path (or the default
:class:`UpdatePath`) computes bitwise what it computed before the seam existed.

Example:
  Clip every client's update to norm 1 before FedAvg averages it (a plain transform written
  here; :mod:`fedtree.toolbox.privacy` ships the real ones):

  >>> from fedtree.algorithms import fedavg
  >>> def clip(delta, state, key, ctx):
  ...   norm = jnp.sqrt(sum(jnp.sum(d ** 2) for d in jax.tree.leaves(delta)))
  ...   scale = jnp.minimum(1.0, 1.0 / jnp.maximum(norm, 1e-12))
  ...   return jax.tree.map(lambda d: d * scale, delta), state, {"clipped": (norm > 1.0) * 1.0}
  >>> alg = fedavg(model=model, data=data, local_optimizer=optax.sgd(0.1),
  ...              schedule=LocalSchedule(batch_size=8, steps=1),
  ...              update_paths=UpdatePath(client=ClientTransform(clip, name="clip")))
  >>> state, metrics = jax.jit(alg.round)(alg.init(jax.random.key(0)), data, jax.random.key(1))
  >>> print(*sorted(metrics))
  clients_downlink_messages clients_trained clients_uplink_messages clipped nonfinite_client train_loss
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.aggregation import divide_by_weight, weighted_mean, weighted_segment_sum

PyTree = Any
Stats = dict[str, jax.Array]


class ClientContext(NamedTuple):
  """What a client transform knows about the child whose update it transforms (one child: the
  transform is vmapped over the chunk).

  Attributes:
    client: ``int32[]`` the child's index (a client, or a node of the level below).
    parent: ``int32[]`` its parent's index.
    weight: ``[]`` its aggregation weight (0 for an empty slot).
    node_state: its parent's row of the path's node state (``{transform name: state}``; ``{}``
      without a node transform).
  """

  client: jax.Array
  parent: jax.Array
  weight: jax.Array
  node_state: PyTree


class ClientTransform(NamedTuple):
  """A transform of every child's update, vmapped: ``apply(delta, state, key, context) ->
  (delta, state, stats)``.

  Attributes:
    apply: ``delta`` the child's pseudo-gradient (a params pytree), ``state`` its row of the
      persistent state (``()`` when stateless), ``key`` its own key for this round,
      ``context`` a :class:`ClientContext`; returns the transformed delta, the new state and
      ``{name: scalar}`` statistics.
    init: ``init(params, num_children) -> state [C, ...]`` (``None``: stateless, ``()``).
    name: names the transform in errors and in :func:`chain`'s state.
    replaces: statistics it reports in place of the same-named ones of the transforms before it in a
      :func:`chain` (what travels after it: a secure sum's field vector replaces a compressor's
      ``uplink_bytes``); any other name reported twice is refused.
  """

  apply: Callable[[PyTree, PyTree, jax.Array, ClientContext], tuple[PyTree, PyTree, Stats]]
  init: Callable[[PyTree, int], PyTree] | None = None
  name: str = "transform"
  replaces: tuple[str, ...] = ()


class Block(NamedTuple):
  """Every parent's cohort as one fixed-size block (what a blockwise :class:`Aggregator` gets).

  Attributes:
    deltas: ``[P, K, ...]`` the (transformed) updates; empty slots hold zeros.
    weights: ``[P, K]`` their aggregation weights (0 in empty slots).
    valid: ``bool[P, K]`` the slots that hold a reported update.
    clients: ``int32[P, K]`` the child each slot holds (``-1`` in empty slots).
  """

  deltas: PyTree
  weights: jax.Array
  valid: jax.Array
  clients: jax.Array


class Aggregator(NamedTuple):
  """How a parent combines its children's (transformed) updates.

  Attributes:
    aggregate: ``None``: the weighted mean, streamed chunk by chunk (the default). Otherwise
      ``aggregate(block, node_state, key) -> (delta_sum [P, ...], weight_sum [P], stats {name:
      [P]})`` with ``delta_sum / weight_sum`` the parent's pseudo-gradient (``weight_sum`` 0
      where nothing is aggregated): it sees every parent's whole cohort as one fixed-size
      :class:`Block`, empty slots with weight 0 and ``valid`` false.
    name: names the aggregator in errors and refusals.
    pairwise: whether it keeps every parent's ``K x K`` distances between updates (Krum, Bulyan,
      min-max / min-sum attacks): what its memory estimate counts.
    for_attack: the omniscient attack it exists for, where no blockwise aggregator was chosen (the
      attack rewrites every parent's whole cohort in front of the blockwise mean,
      :func:`fedtree.toolbox.attacks.omniscient`); ``None`` otherwise. Refusals name the attack.
    accumulate: a streamed aggregator of its own (with ``aggregate`` ``None``): ``accumulate(devices,
      constrain) -> Accumulator`` (as :func:`mean_accumulator`'s arguments), chunk by chunk like the
      mean, e.g. a sum in a finite field (:func:`fedtree.toolbox.secagg.secure_sum`) whose
      ``finish`` decodes it. ``None``: the weighted mean.
  """

  aggregate: Callable[..., tuple[PyTree, jax.Array, Stats]] | None = None
  name: str = "mean"
  pairwise: bool = False
  for_attack: str | None = None
  accumulate: Callable[..., Accumulator] | None = None

  @property
  def blockwise(self) -> bool:
    """Whether this aggregator needs the parents' whole cohorts (:attr:`aggregate` is set)."""
    return self.aggregate is not None

  @property
  def is_mean(self) -> bool:
    """Whether this is the engine's streamed weighted mean (no ``aggregate``, no ``accumulate``)."""
    return self.aggregate is None and self.accumulate is None


class NodeTransform(NamedTuple):
  """A step on every parent's aggregate before its server optimizer.

  Attributes:
    apply: ``apply(delta_sum [P, ...], weight_sum [P], client_stats {name: [P]}, state [P, ...],
      key) -> (delta_sum, weight_sum, state, stats {name: [P]})``; ``client_stats`` are the sums
      over each parent's reporting children of the client transforms' statistics (e.g. how many
      were not clipped, for adaptive clipping), with ``"reported"`` their number.
    init: ``init(params, num_nodes) -> state [P, ...]`` (``None``: stateless).
    name: the key of its state in the path's node state ``{name: state}`` (what client transforms
      read as :attr:`ClientContext.node_state`).
    keyed: its ``init`` / ``apply`` already hold the ``{name: state}`` dict of several
      transforms (:func:`chain_nodes`).
  """

  apply: Callable[..., tuple[PyTree, jax.Array, PyTree, Stats]]
  init: Callable[[PyTree, int], PyTree] | None = None
  name: str = "node"
  keyed: bool = False


class DownTransform(NamedTuple):
  """What the children receive of their parents' models: ``apply(params [P, ...], key) ->
  (params [P, ...], stats {name: [P]})`` (e.g. quantized on the downlink)."""

  apply: Callable[[PyTree, jax.Array], tuple[PyTree, Stats]]
  name: str = "down"


class UpdatePath(NamedTuple):
  """The stages of one aggregation (children -> parents); every field optional.

  Attributes:
    client: the children's transform (:func:`chain` several).
    aggregator: how a parent combines them (default: the streaming weighted mean).
    node: the parents' step on the aggregate (:func:`chain_nodes` several).
    down: what the children receive of their parents' models.
  """

  client: ClientTransform | None = None
  aggregator: Aggregator = Aggregator()
  node: NodeTransform | None = None
  down: DownTransform | None = None

  @property
  def sums_by_mean(self) -> bool:
    """The parents take the streamed weighted mean with no node stage (a client or downlink stage
    aside): what a host that aggregates slots itself (:func:`aggregate_slots`) can do without the path."""
    return self.aggregator.is_mean and self.node is None

  @property
  def is_default(self) -> bool:
    """No stage set: the engine's own weighted mean, unchanged."""
    return (self.client is None and self.aggregator.is_mean and self.node is None
            and self.down is None)


class UpdateState(NamedTuple):
  """State of an :class:`UpdatePath`.

  Attributes:
    client: ``[C, ...]`` the client transform's per-child state (``()`` when stateless).
    node: ``{name: [P, ...]}`` the node transform's per-parent state (``{}`` when none).
  """

  client: PyTree = ()
  node: PyTree = {}


# ------------------------------------------------------------------------ combinators
def identity() -> ClientTransform:
  """The transform that changes nothing (and reports nothing)."""
  return ClientTransform(lambda delta, state, key, ctx: (delta, state, {}), name="identity")


def _merge_stats(parts: Sequence[Stats], names: Sequence[str],
                 replaces: Sequence[tuple[str, ...]] | None = None) -> Stats:
  out: Stats = {}
  replaces = [()] * len(parts) if replaces is None else replaces
  for stats, name, own in zip(parts, names, replaces, strict=True):
    for k, v in stats.items():
      if k in out and k not in own:
        raise ValueError(f"statistic {k!r} of transform {name!r} is already reported by another "
                         f"transform of the chain; give it another name")
      out[k] = v
  return out


def _unique(names: Sequence[str], what: str) -> None:
  seen = set()
  for n in names:
    if n in seen:
      raise ValueError(f"{what}: two transforms are named {n!r}; names must be unique {list(names)}")
    seen.add(n)


def _links(transforms: tuple, what: str) -> tuple:
  """The transforms of a chain, ``None`` entries skipped; two sharing a name refused."""
  ts = tuple(t for t in transforms if t is not None)
  _unique([t.name for t in ts], what)
  return ts


def chain(*transforms: ClientTransform | None) -> ClientTransform | None:
  """The client transforms applied in order (each to the previous one's output); their states
  are a tuple in the same order. ``None`` entries are skipped; no transform at all is ``None``.

  Raises:
    ValueError: two transforms share a name or a statistic's name.
  """
  ts = _links(transforms, "chain")
  if len(ts) < 2:
    return ts[0] if ts else None

  def init(params, num):
    return tuple(() if t.init is None else t.init(params, num) for t in ts)

  stateful = any(t.init is not None for t in ts)

  def apply(delta, state, key, ctx):
    new_states, stats = [], []
    for i, t in enumerate(ts):   # a chain of stateless transforms has state () (no per-transform rows)
      delta, s, st = t.apply(delta, state[i] if stateful else (), jax.random.fold_in(key, i), ctx)
      new_states.append(s)
      stats.append(st)
    return delta, tuple(new_states) if stateful else (), _merge_stats(stats, [t.name for t in ts],
                                                                       [t.replaces for t in ts])

  replaces = tuple(dict.fromkeys(r for t in ts for r in t.replaces))
  return ClientTransform(apply, init if stateful else None, name="+".join(t.name for t in ts),
                         replaces=replaces)


def chain_nodes(*transforms: NodeTransform | None) -> NodeTransform | None:
  """Node transforms applied in order; the state is ``{name: state}`` of every transform."""
  ts = _links(transforms, "chain_nodes")
  if len(ts) < 2:
    return ts[0] if ts else None

  def init(params, num):
    return {t.name: (() if t.init is None else t.init(params, num)) for t in ts}

  def apply(delta_sum, weight_sum, client_stats, state, key):
    new, stats = {}, []
    for i, t in enumerate(ts):
      delta_sum, weight_sum, new[t.name], st = t.apply(
        delta_sum, weight_sum, client_stats, state[t.name], jax.random.fold_in(key, i))
      stats.append(st)
    return delta_sum, weight_sum, new, _merge_stats(stats, [t.name for t in ts])

  return NodeTransform(apply, init, name="+".join(t.name for t in ts), keyed=True)


# ------------------------------------------------------------------------ state
def init_update_state(
  path: UpdatePath | None, params: PyTree, num_children: int, num_parents: int,
) -> UpdateState:
  """The initial :class:`UpdateState` of ``path`` for ``num_children`` children under
  ``num_parents`` parents (``params``: one unstacked model, the template)."""
  if path is None:
    return UpdateState()
  client = () if path.client is None or path.client.init is None else path.client.init(params, num_children)
  return UpdateState(client=client, node=_init_node(path.node, params, num_parents))


def _init_node(node: NodeTransform | None, params, num_parents: int) -> dict:
  if node is None:
    return {}
  if node.keyed:
    assert node.init is not None
    return node.init(params, num_parents)
  return {node.name: () if node.init is None else node.init(params, num_parents)}


def node_state_of(path: UpdatePath, state: UpdateState) -> PyTree:
  """What :meth:`NodeTransform.apply` receives as its state: the ``{name: state}`` dict of a
  chain, or the one transform's entry."""
  if path.node is None:
    return {}
  return state.node if path.node.keyed else state.node[path.node.name]


def _wrap_node(path: UpdatePath, new) -> dict:
  assert path.node is not None
  return new if path.node.keyed else {path.node.name: new}


def parents_node_state(state: UpdateState, parent: jax.Array) -> PyTree:
  """Every child's parent's row of the node state (for :attr:`ClientContext.node_state`)."""
  return jax.tree.map(lambda a: jnp.take(a, parent, axis=0), state.node)


# ------------------------------------------------------------------------ stages
def apply_client(
  transform: ClientTransform, delta: PyTree, state: PyTree, keys: jax.Array, ctx: ClientContext,
) -> tuple[PyTree, PyTree, Stats]:
  """The client transform vmapped over a batch of children (``delta [K, ...]``, ``state [K, ...]``,
  ``keys [K]``, ``ctx`` with ``[K]`` fields); statistics come back ``[K]``."""
  return jax.vmap(transform.apply)(delta, state, keys, ctx)


def check_stats(stats: Stats, where: str) -> Stats:
  """``stats`` if every name is a string and every value one scalar per child (``[K]`` after
  the vmap), else a ``ValueError`` naming the transform."""
  for k, v in stats.items():
    if not isinstance(k, str) or jnp.ndim(v) != 1:
      raise ValueError(f"{where}: statistic {k!r} must be one scalar per child (got shape "
                       f"{jnp.shape(v)} after the vmap)")
  return stats


def finish(
  path: UpdatePath,
  state: UpdateState,
  delta_sum: PyTree,
  weight_sum: jax.Array,
  client_stat_sums: Stats,
  key: jax.Array,
) -> tuple[PyTree, jax.Array, UpdateState, Stats]:
  """The node stage on the aggregate: ``(delta_sum, weight_sum, state, node stats [P])``."""
  if path.node is None:
    return delta_sum, weight_sum, state, {}
  delta_sum, weight_sum, new, stats = path.node.apply(
    delta_sum, weight_sum, client_stat_sums, node_state_of(path, state), key)
  return delta_sum, weight_sum, state._replace(node=_wrap_node(path, new)), stats


def path_metrics(client_sums: Stats, num_reported: jax.Array, node_stats: Stats,
                 aggregator_stats: Stats, prefix: str = "") -> dict[str, jax.Array]:
  """The round metrics of one aggregation's statistics: a child statistic is its mean over the
  children that reported (``client_sums`` are ``[P]`` sums), a node or aggregator statistic its
  mean over the parents; ``prefix`` names the level (``""`` for the clients' tier)."""
  out = {}
  n = jnp.maximum(num_reported, 1)
  for k, v in client_sums.items():
    if k == "reported":
      continue
    out[prefix + k] = jnp.sum(v) / n.astype(v.dtype)
  per_node = path_stats({**aggregator_stats, **node_stats}, prefix)
  for k in per_node:
    if k in out:
      raise ValueError(f"statistic {k!r} is reported by two stages of the update path")
  return {**out, **per_node}


def path_stats(stats: Stats, prefix: str = "") -> dict[str, jax.Array]:
  """Per-node statistics ``{name: [P]}`` as round metrics: their mean over the nodes, named
  ``prefix + name``."""
  dtype = jnp.result_type(float)   # (float64 under --config.dtype=float64)
  return {prefix + k: jnp.mean(jnp.asarray(v, dtype)) if jnp.ndim(v) else v for k, v in stats.items()}


def send_down(path: UpdatePath | None, params: PyTree, key: jax.Array) -> tuple[PyTree, Stats]:
  """What the children receive of the parents' models ``params [P, ...]``: ``path.down``'s output,
  or ``params`` unchanged."""
  if path is None or path.down is None:
    return params, {}
  return path.down.apply(params, key)


def block_positions(parent: jax.Array, valid: jax.Array, num_parents: int) -> jax.Array:
  """Each slot's position among its parent's valid slots, for slots grouped by parent (a sorted
  cohort); ``num_parents`` (an out-of-range row, dropped by scatters) for invalid slots."""
  v = valid.astype(jnp.int32)
  before = jnp.cumsum(v) - v
  first = jax.ops.segment_min(jnp.where(valid, before, jnp.iinfo(jnp.int32).max), parent,
                              num_segments=num_parents)
  pos = before - jnp.take(first, parent)
  return jnp.where(valid, pos, num_parents)


# ------------------------------------------------------------------------ one door: chunks in, aggregates out
class Chunk(NamedTuple):
  """Children's updates on their way into their parents' aggregates: a chunk of the clients' tier,
  or every node of a server level at once.

  Attributes:
    deltas: ``[K, ...]`` the (transformed) updates.
    weights: ``[K]`` their aggregation weights (0 where not reported).
    parent: ``int32[K]`` each one's parent.
    slot: ``int32[K]`` its position among its parent's children (:func:`slot_positions`; read by a
      blockwise aggregator only).
    clients: ``int32[K]`` the child's index.
    kept: ``bool[K]`` the children that report (the others write nowhere).
  """

  deltas: PyTree
  weights: jax.Array
  parent: jax.Array
  slot: jax.Array
  clients: jax.Array
  kept: jax.Array


class Accumulator(NamedTuple):
  """How the parents' aggregates are built chunk by chunk, the same way at every level of the tree
  (:func:`accumulator`): ``init(template, num_parents, dtype) -> state`` (``template``: the stacked
  ``[P, ...]`` shape of what a child sends), ``add(state, chunk) -> state``, ``finish(state, key,
  node_state) -> (delta_sum [P, ...], weight_sum [P], stats {name: [P]})``."""

  init: Callable[[PyTree, int, Any], PyTree]
  add: Callable[[PyTree, Chunk], PyTree]
  finish: Callable[[PyTree, jax.Array, PyTree], tuple[PyTree, jax.Array, Stats]]


def mean_accumulator(devices: int = 1, constrain: Callable[[PyTree], PyTree] | None = None) -> Accumulator:
  """The streamed weighted mean: ``Σ w_i Δ_i`` and ``Σ w_i`` per parent. With ``devices = D > 1``
  (a chunk's slots sharded over ``D`` devices, ``constrain`` keeping the rows on them) every device
  adds its slice of each chunk into its own row of ``[D, P, ...]`` partial sums, and the rows are
  summed once, in ``finish``: one cross-device reduction per aggregation instead of one per chunk."""
  keep = (lambda t: t) if constrain is None or devices == 1 else constrain
  segment_sums = jax.vmap(weighted_segment_sum, in_axes=(0, 0, 0, None))

  def rows(a):   # [K, ...] -> [D, K / D, ...]: device d's slice in row d
    return a.reshape((devices, a.shape[0] // devices) + a.shape[1:])

  def init(template, num_parents, dtype):
    return keep((jax.tree.map(lambda p: jnp.zeros((devices,) + p.shape, p.dtype), template),
                 jnp.zeros((devices, num_parents), dtype)))

  def add(state, ch: Chunk):
    delta_sum, weight_sum = state
    num_parents = weight_sum.shape[1]
    parent, w = rows(ch.parent), rows(ch.weights.astype(weight_sum.dtype))
    delta_sum = jax.tree.map(jnp.add, delta_sum,
                             segment_sums(jax.tree.map(rows, ch.deltas), w, parent, num_parents))
    weight_sum = weight_sum + jax.vmap(
      lambda v, i: jax.ops.segment_sum(v, i, num_segments=num_parents))(w, parent)
    return keep((delta_sum, weight_sum))

  def finish(state, key, node_state):
    delta_sum, weight_sum = state
    return jax.tree.map(lambda a: jnp.sum(a, axis=0), delta_sum), jnp.sum(weight_sum, axis=0), {}

  return Accumulator(init, add, finish)


def block_accumulator(aggregator: Aggregator, block_size: int) -> Accumulator:
  """A blockwise aggregator's: every reported update written into its parent's row of a fixed-size
  :class:`Block` ``[P, block_size, ...]`` at its slot, handed to ``aggregator.aggregate`` whole."""
  assert aggregator.aggregate is not None

  def init(template, num_parents, dtype):
    return Block(jax.tree.map(lambda p: jnp.zeros((num_parents, block_size) + p.shape[1:], p.dtype),
                              template),
                 jnp.zeros((num_parents, block_size), dtype), jnp.zeros((num_parents, block_size), bool),
                 jnp.full((num_parents, block_size), -1, jnp.int32))

  def add(block: Block, ch: Chunk):
    rows = jnp.where(ch.kept, ch.parent, block.weights.shape[0])   # unreported slots write nowhere
    return Block(
      jax.tree.map(lambda b, d: b.at[rows, ch.slot].set(d.astype(b.dtype), mode="drop"), block.deltas,
                   ch.deltas),
      block.weights.at[rows, ch.slot].set(ch.weights.astype(block.weights.dtype), mode="drop"),
      block.valid.at[rows, ch.slot].set(True, mode="drop"),
      block.clients.at[rows, ch.slot].set(ch.clients, mode="drop"))

  def finish(block: Block, key, node_state):
    assert aggregator.aggregate is not None
    delta_sum, weight_sum, stats = aggregator.aggregate(block, node_state, key)
    return delta_sum, jnp.asarray(weight_sum, block.weights.dtype), stats

  return Accumulator(init, add, finish)


def accumulator(aggregator: Aggregator, *, block_size: int | None = None, devices: int = 1,
                constrain: Callable[[PyTree], PyTree] | None = None) -> Accumulator:
  """The :class:`Accumulator` of ``aggregator``: the streamed weighted mean (:func:`mean_accumulator`)
  or its blocks (:func:`block_accumulator`, ``block_size`` the largest cohort of a parent).

  An aggregator with its own streamed accumulator (:attr:`Aggregator.accumulate`) gets it.

  Raises:
    ValueError: a blockwise aggregator without ``block_size``, or one that is both blockwise and
      streamed.
  """
  if aggregator.accumulate is not None:
    if aggregator.blockwise:
      raise ValueError(f"aggregator {aggregator.name!r} sets both aggregate (blockwise) and accumulate "
                       f"(streamed); it aggregates one way")
    return aggregator.accumulate(devices, constrain)
  if not aggregator.blockwise:
    return mean_accumulator(devices, constrain)
  if block_size is None:
    raise ValueError(f"aggregator {aggregator.name!r} needs every parent's whole cohort: pass "
                     f"block_size= (the largest cohort of a parent, max(CohortSampler.sizes))")
  return block_accumulator(aggregator, int(block_size))


def slot_positions(parent: jax.Array, valid: jax.Array, num_parents: int) -> jax.Array:
  """Each entry's position among its parent's valid entries, in order (``num_parents``, an
  out-of-range row that scatters drop, for invalid ones); :func:`block_positions` for entries in
  any order."""
  order = jnp.argsort(parent, stable=True)
  pos = block_positions(jnp.take(parent, order), jnp.take(valid, order), num_parents)
  return jnp.zeros_like(pos).at[order].set(pos)


def transform_chunk(
  path: UpdatePath, client_state: PyTree, deltas: PyTree, ids: jax.Array, parent: jax.Array,
  weights: jax.Array, kept: jax.Array, node_state: PyTree, key: jax.Array, num_parents: int,
  rows: jax.Array | None = None,
) -> tuple[PyTree, PyTree, Stats]:
  """The client stage of ``path`` on a chunk of children (``deltas [K, ...]``; child ``ids[k]``'s key
  is ``fold_in(key, ids[k])``, its state row ``client_state[ids[k]]``, its parent's node state row
  ``node_state[parent[k]]``): the transformed deltas, ``client_state [C, ...]`` with the rows of the
  children in ``kept`` updated, and the statistics summed per parent over them (``{name: [P]}``).
  ``rows``: every child's row of ``client_state`` where it holds a window of the children
  (:attr:`fedtree.core.sampling.Cohort.rows`; default ``ids``)."""
  if path.client is None:
    return deltas, client_state, {}
  rows = ids if rows is None else rows
  ctx = ClientContext(client=ids, parent=parent, weight=weights,
                      node_state=jax.tree.map(lambda a: jnp.take(a, parent, axis=0), node_state))
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, ids)
  own = jax.tree.map(lambda a: jnp.take(a, rows, axis=0), client_state)
  deltas, new_rows, stats = apply_client(path.client, deltas, own, keys, ctx)
  leaves = jax.tree.leaves(client_state)
  if leaves:
    idx = jnp.where(kept, rows, leaves[0].shape[0])
    client_state = jax.tree.map(lambda b, v: b.at[idx].set(v, mode="drop"), client_state, new_rows)
  sums = {n: jax.ops.segment_sum(jnp.where(kept, jnp.asarray(v, weights.dtype), 0.0), parent,
                                 num_segments=num_parents)
          for n, v in check_stats(stats, path.client.name).items()}
  return deltas, client_state, sums


# ------------------------------------------------------------------------ a whole level
def transform_children(
  path: UpdatePath,
  state: UpdateState,
  deltas: PyTree,
  parent: jax.Array,
  weights: jax.Array,
  mask: jax.Array,
  num_parents: int,
  key: jax.Array,
) -> tuple[PyTree, UpdateState, Stats]:
  """The client stage on every row of ``deltas [N, ...]`` (every child of a level at once; child
  ``i``'s key is ``fold_in(key, i)``): :func:`transform_chunk` with the level as the chunk. Only the
  rows of ``mask`` (the children that report) update their state and count in the statistics,
  returned as ``{name: [P]}`` sums per parent with ``"reported"`` their number. Rows outside ``mask``
  are transformed too (their output is the caller's to ignore)."""
  ids = jnp.arange(weights.shape[0], dtype=jnp.int32)
  deltas, client, sums = transform_chunk(path, state.client, deltas, ids, parent.astype(jnp.int32), weights,
                                         mask, state.node, key, num_parents)
  sums["reported"] = jax.ops.segment_sum(mask.astype(weights.dtype), parent, num_segments=num_parents)
  return deltas, state._replace(client=client), sums


def aggregate_slots(
  path: UpdatePath,
  state: UpdateState,
  template: PyTree,
  deltas: PyTree,
  weights: jax.Array,
  parent: jax.Array,
  valid: jax.Array,
  clients: jax.Array,
  block_size: int,
  key: jax.Array,
) -> tuple[PyTree, jax.Array, UpdateState, Stats]:
  """Slots whose parents are known only after training (a cluster, an edge's buffer, a parent's
  buffer of stale reports) aggregated through ``path``'s aggregator and node stage, their client
  stage already run: ``deltas [K, ...]`` (already transformed) weighted ``weights [K]`` into
  ``parent [K]`` of the ``[P, ...]`` rows of ``template``, the ``valid`` ones only, every parent's
  block ``block_size`` slots. Returns ``(delta_sum [P, ...], weight_sum [P], state, statistics
  {name: [P]})``, the node stage told each parent's ``"reported"`` slots."""
  num = jax.tree.leaves(template)[0].shape[0]
  acc = accumulator(path.aggregator, block_size=int(block_size))
  summed = acc.add(acc.init(template, num, weights.dtype),
                   Chunk(deltas, weights, parent, slot_positions(parent, valid, num), clients, valid))
  delta_sum, total, agg_stats = acc.finish(summed, jax.random.fold_in(key, 0), node_state_of(path, state))
  reported = {"reported": jax.ops.segment_sum(valid.astype(weights.dtype), parent, num_segments=num)}
  delta_sum, total, state, node_stats = finish(path, state, delta_sum, total, reported,
                                               jax.random.fold_in(key, 1))
  return delta_sum, total, state, {**agg_stats, **node_stats}


def aggregate_children(
  path: UpdatePath | None,
  state: UpdateState,
  parent_params: PyTree,
  child_params: PyTree,
  weights: jax.Array,
  parent_of_child: np.ndarray | jax.Array,
  key: jax.Array,
) -> tuple[PyTree, jax.Array, UpdateState, dict[str, jax.Array]]:
  """``Δ_n = Θ_n - Σ_i p_i θ_i`` for every parent, every child of the level taking part (a server
  level aggregating the nodes below it), through ``path``: its client stage
  (:func:`transform_chunk`), its aggregator (:func:`accumulator`, the one chunk being the whole
  level) and its node stage, as the clients' tier runs them.

  Without a path this is :func:`fedtree.core.aggregation.pseudo_gradient_from_children`
  (bitwise). Returns ``(Δ [N, ...], total weight [N], new path state, statistics)``.
  """
  num = jax.tree.leaves(parent_params)[0].shape[0]
  idx = jnp.asarray(parent_of_child)
  anchor = jax.tree.map(lambda p: p[idx], parent_params)
  diffs = jax.tree.map(jnp.subtract, anchor, child_params)
  if path is None or (path.client is None and path.node is None and path.aggregator.is_mean):
    mean, total = weighted_mean(diffs, weights, idx, num)
    return mean, total, state, {}
  num_children = weights.shape[0]
  ids = jnp.arange(num_children, dtype=jnp.int32)
  every = jnp.ones(num_children, bool)
  diffs, state, stats_sums = transform_children(path, state, diffs, idx, weights, every, num,
                                                jax.random.fold_in(key, 0))
  size = None
  if path.aggregator.blockwise:   # the largest group of children (a static tree)
    size = int(np.bincount(np.asarray(parent_of_child), minlength=num).max())
  acc = accumulator(path.aggregator, block_size=size)
  summed = acc.add(acc.init(parent_params, num, weights.dtype),
                   Chunk(diffs, weights, idx, slot_positions(idx, every, num), ids, every))
  delta_sum, total, agg_stats = acc.finish(summed, jax.random.fold_in(key, 1), node_state_of(path, state))
  delta_sum, total, state, node_stats = finish(path, state, delta_sum, total, stats_sums,
                                               jax.random.fold_in(key, 2))
  metrics = path_metrics(stats_sums, jnp.asarray(num_children), node_stats, agg_stats)
  return divide_by_weight(delta_sum, total), total, state, metrics


def per_level_paths(
  paths: UpdatePath | Mapping[int, UpdatePath | None] | Sequence[UpdatePath | None] | None,
  depth: int,
  *,
  algorithm: str,
  supported_levels: Sequence[int] | None = None,
  blockwise: bool = True,
  node: bool = True,
  down: bool = True,
) -> tuple[UpdatePath | None, ...]:
  """The update path of every server level ``0 .. depth-1`` (level ``l``'s path is how it
  aggregates its children; the last level's children are the clients).

  ``paths``: ``None`` (none anywhere), one :class:`UpdatePath` (the clients' tier, level
  ``depth-1``), a sequence of ``depth`` entries, or ``{level: path}`` (negative levels count
  from the clients' parents: ``-1`` is level ``depth-1``).

  ``algorithm`` names the caller in refusals: a path at a level not in ``supported_levels``
  (default: all), or a stage the algorithm cannot run (``blockwise``: aggregators other than the
  streamed weighted mean, blockwise or streamed; ``node``
  transforms, ``down`` transforms), is a ``ValueError`` that says which.
  """
  if paths is None:
    out: list[UpdatePath | None] = [None] * depth
  elif isinstance(paths, UpdatePath):
    out = [None] * (depth - 1) + [paths]
  elif isinstance(paths, Mapping):
    out = [None] * depth
    for lv, p in paths.items():
      level = int(lv) + depth if int(lv) < 0 else int(lv)
      if not 0 <= level < depth:
        raise ValueError(f"{algorithm}: an update path for level {lv}, but the tree's server levels "
                         f"are 0..{depth - 1} (or -1..-{depth} from the clients' parents)")
      out[level] = p
  else:
    out = list(paths)  # type: ignore[arg-type]  # a sequence (UpdatePath, a NamedTuple, is handled above)
    if len(out) != depth:
      raise ValueError(f"{algorithm}: {len(out)} update paths for {depth} server levels (0..{depth - 1})")
  for lv, p in enumerate(out):
    if p is None or p.is_default:
      out[lv] = None
      continue
    if supported_levels is not None and lv not in supported_levels:
      raise ValueError(f"{algorithm} runs an update path only at server level(s) {list(supported_levels)} "
                       f"(got one at level {lv})")
    if not p.aggregator.is_mean and not blockwise:
      if p.aggregator.for_attack is not None:
        raise ValueError(f"{algorithm} does not support the omniscient attack {p.aggregator.for_attack!r}: "
                         f"the attack rewrites every parent's whole cohort in front of a blockwise mean, and "
                         f"{algorithm} aggregates its clients by their streamed weighted mean only")
      raise ValueError(f"{algorithm} cannot use aggregator {p.aggregator.name!r}: it aggregates its "
                       f"clients by their weighted mean only")
    if p.node is not None and not node:
      raise ValueError(f"{algorithm} cannot run node transform {p.node.name!r} on its aggregates")
    if p.down is not None and not down:
      raise ValueError(f"{algorithm} cannot run downlink transform {p.down.name!r}")
  return tuple(out)
