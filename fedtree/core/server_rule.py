"""What a server keeps beyond its model and optax state, sends its children beside the model, and
updates from what they send back: the seam of SCAFFOLD's control variate, FedDyn's ``h``, FedNova's
normalisation, Mime's momentum and AFL's mixture weights.

A :class:`ServerRule` is a pair of pure functions in the optax style, stacked over the nodes of
the server level that runs it (the clients' parents, ``[N, ...]``), and two typed records of what
travels each way beside the model:

* ``init(params, num_nodes) -> state [N, ...]`` (``params``: one model, the template);
* ``receive(inbox, state) -> (pseudo_gradient, state, stats)``: from the round's :class:`Inbox`
  (the mean pseudo-gradient of the reporting children after the update path, the sums of the
  messages they sent beside it, how many were sampled, reported and exist), the pseudo-gradient
  the node's optax server optimizer then applies, the new state and ``{name: [N]}`` statistics;
* ``down`` (:class:`Downlink`), what goes down: ``broadcast(state) -> [N, ...]``, what every child
  receives beside its parent's model (:attr:`fedtree.core.local.ClientRound.broadcast`; ``None``:
  the state itself); every sampled child's own ``parcels`` (below); and ``gather`` / ``prepare``, a
  pass over the round's cohort *before* training (Mime's full-batch gradients at the received
  model, from which the server forms the control variate every client then uses): ``gather`` is a
  :class:`~fedtree.core.local.ClientUpdate` that ``takes_round`` and keeps no state, run on every
  taking-part client from its parent's model (its model output is ignored), whose messages,
  summed per parent in an :class:`Inbox` (``pseudo_gradient`` ``()``), reach ``prepare(inbox,
  state) -> state`` before ``broadcast``. It costs one more vmapped pass over the cohort, and its
  messages count in the uplink bytes.
* ``up`` (:class:`Uplink`), what comes up beyond the mean: ``weights(host_weights [C], state) ->
  [C]``, the aggregation weight of every client in this round's mean, from the rule's state (AFL's
  mixture weights ``λ``; ``None``: the host's ``weighting``; the levels above keep the host's
  weights), and ``slots``, every slot's own exchange (below).

**Each child its own parcel.** Where a server sends every sampled child something of its own rather
than one model to all (FedAMP's per-client cloud model, FedFomo's candidate models, pFedHN's
generated weights), ``down.parcels(outbox) -> Parcels`` makes every cohort slot's parcel before the
round's training, as one array program over the cohort (:class:`Outbox`: the rule's state, the
nodes' models, the clients' persistent state at the round's start and each slot's client, parent
and position among its parent's slots). A parcel's ``start`` (``[K, ...]``) is the model the slot
receives *instead of* its parent's: it starts from it, and its update is taken against it; its
``extra`` reaches the client's update as :attr:`~fedtree.core.local.ClientRound.extra`. A rule with
``up.slots=True`` receives every slot's sent model in :attr:`Inbox.slots` (pFedHN's hypernetwork
needs each client's own update, not their mean). ``down.bytes`` / ``up.bytes`` (``model_bytes ->
bytes``) state one sampled client's bytes each way where they are not the host's count (a model
each way, plus the broadcast, the parcel's extra and the message): FedFomo's clients receive ``M``
models and no parent's model.

Only nodes whose children reported change their state (the engine keeps the others'). A client
that sends something up beside its model returns it as its update's ``message``
(:class:`~fedtree.core.local.ClientUpdate` with ``takes_round``); messages are summed unweighted
over each parent's reporting children (a client that wants a weighted sum multiplies by its
:attr:`~fedtree.core.local.ClientRound.weight`). They never pass through the update path: its
transforms (clipping, noise, compression, robust aggregation) act on the model delta only.

Example:
  A rule that counts, per node, the clients that reported so far, and broadcasts the count:

  >>> import jax.numpy as jnp
  >>> def init(params, num_nodes):
  ...   return jnp.zeros((num_nodes,))
  >>> def receive(inbox, state):
  ...   return inbox.pseudo_gradient, state + inbox.reported, {}
  >>> rule = ServerRule(init=init, receive=receive, name="count")
  >>> rule.init({}, 2).shape
  (2,)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedtree.core.local import ClientUpdate
from fedtree.core.server import select_nodes

PyTree = Any
Stats = dict[str, jax.Array]


class Inbox(NamedTuple):
  """What the nodes of a server level receive in a round (every field stacked over the nodes).

  Attributes:
    pseudo_gradient: ``[N, ...]`` ``Σ_i w_i Δ_i / Σ_i w_i`` over each node's reporting children
      (``Δ_i = Θ - θ_i`` after the update path; 0 where none reported).
    weight_sum: ``[N]`` ``Σ_i w_i`` over them.
    messages: ``[N, ...]`` the sum of their messages (``()`` when clients send none).
    reported: ``[N]`` how many children reported.
    sampled: ``[N]`` how many were sampled (reported or not).
    population: ``[N]`` how many children each node has.
    params: ``[N, ...]`` the nodes' models before this round's step.
    population_weight: ``[N]`` the aggregation weights of all of each node's children summed
      (``population`` under uniform weights, their examples under ``weighting="examples"``), so
      that ``pseudo_gradient * weight_sum / population_weight`` is the reporting children's share
      of a mean over every child (FedDyn's ``(1/m) Σ_{i∈P} Δ_i``); ``None`` where not given.
    slots: every cohort slot's exchange (:class:`Slots`) for a rule with ``up.slots``, else
      ``None``.
  """

  pseudo_gradient: PyTree
  weight_sum: jax.Array
  messages: PyTree
  reported: jax.Array
  sampled: jax.Array
  population: jax.Array
  params: PyTree
  population_weight: jax.Array | None = None
  slots: Slots | None = None


class Slots(NamedTuple):
  """Every cohort slot's exchange this round (:attr:`Inbox.slots`, for a rule with ``up.slots``), in
  the cohort's slot order.

  Attributes:
    clients: ``int32[K]`` each slot's client.
    parent: ``int32[K]`` its parent.
    reported: ``bool[K]`` the slots whose update was aggregated (valid, trained, not skipped).
    position: ``int32[K]`` its position among its parent's valid slots (``0 .. block_size - 1``;
      ``N``, out of range, for invalid slots).
    start: ``[K, ...]`` what each slot started from and its update was taken against (its parcel's
      ``start``, else its parent's model).
    sent: ``[K, ...]`` what each slot sent: ``start`` less its update after the update path.
    block_size: the largest cohort of a parent (static).
  """

  clients: jax.Array
  parent: jax.Array
  reported: jax.Array
  position: jax.Array
  start: PyTree
  sent: PyTree
  block_size: int = 1


class Outbox(NamedTuple):
  """What a server level holds when it makes every sampled child its own parcel (``down.parcels``),
  before the round's training. Cohort fields are ``[K]`` in the cohort's slot order.

  Attributes:
    state: ``[N, ...]`` the rule's state.
    params: ``[N, ...]`` the nodes' models as they send them (after the downlink transform).
    client_state: ``[C, ...]`` the clients' persistent state at the round's start (where a method
      keeps the server's copy of what each client last sent: its model).
    clients: ``int32[K]`` each slot's client.
    parent: ``int32[K]`` its parent.
    valid: ``bool[K]`` the slots that take part (padding and clients the systems model drops are
      not).
    position: ``int32[K]`` each valid slot's position among its parent's valid slots (``0 ..
      block_size - 1``), ``N`` for the others: ``[N, block_size, ...]`` blocks of a parent's cohort
      are ``.at[parent, position].set(...)`` with ``mode="drop"``.
    block_size: the largest cohort of a parent (static).
    round: ``int32[]`` the round being played (1 for the first).
    key: this round's randomness for the rule.
  """

  state: PyTree
  params: PyTree
  client_state: PyTree
  clients: jax.Array
  parent: jax.Array
  valid: jax.Array
  position: jax.Array
  block_size: int
  round: jax.Array
  key: jax.Array


class Parcels(NamedTuple):
  """Every cohort slot's parcel (``down.parcels``' result), ``[K, ...]`` in the cohort's slot order.

  Attributes:
    start: the model each slot receives instead of its parent's (it starts from it and its update
      is taken against it); ``None``: its parent's.
    extra: what each slot's update receives beside it, as
      :attr:`~fedtree.core.local.ClientRound.extra` (``()``: nothing).
    stats: ``{name: []}`` round statistics (e.g. a mean attention weight), reported as metrics.
  """

  start: PyTree = None
  extra: PyTree = ()
  stats: Stats = {}


class Downlink(NamedTuple):
  """What a server rule sends its children beyond (or instead of) its model; every entry optional.

  Attributes:
    broadcast: ``broadcast(state) -> [N, ...]``: what every child receives beside its parent's model,
      as :attr:`fedtree.core.local.ClientRound.broadcast` (``None``: the state itself).
    parcels: ``parcels(outbox) -> Parcels``: every sampled child's own parcel, made before the
      round's training (see the module docstring; ``None``: every child receives its parent's model
      and broadcast alone).
    gather: a client pass before training (see the module docstring; ``None``: none), whose messages
      reach ``prepare``.
    prepare: ``prepare(inbox, state) -> state`` from the messages of the ``gather`` pass.
    bytes: ``bytes(model_bytes) -> int``: one sampled client's bytes down per round, given the bytes
      of one model's shared leaves, where the host's count (a model, the broadcast and the parcel's
      extra) is not what travels (``None``: the host's).
  """

  broadcast: Callable[[PyTree], PyTree] | None = None
  parcels: Callable[[Outbox], Parcels] | None = None
  gather: ClientUpdate | None = None
  prepare: Callable[[Inbox, PyTree], PyTree] | None = None
  bytes: Callable[[int], int] | None = None


class Uplink(NamedTuple):
  """What a server rule takes in from its children beyond their mean update; every entry optional.

  Attributes:
    slots: the rule receives every slot's exchange in :attr:`Inbox.slots` (``[K, ...]`` models held
      at once; ``False``: ``None`` there).
    weights: ``weights(host_weights [C], state) -> [C]``: the clients' aggregation weights this round
      (``None``: the host's).
    bytes: ``bytes(model_bytes) -> int``: one sampled client's bytes up per round, where the host's
      count (a model and the message) is not what travels (``None``: the host's).
    robust: the clients' messages go through the clients' tier's blockwise aggregator as their
      updates do (:attr:`fedtree.core.tier.Tier.robust_messages`): under a robust aggregator
      :attr:`Inbox.messages` is its estimate times the reporting children (the sum's scale), so one
      rule covers what travels beside the update (SCAFFOLD's variates, Mime's gradients). ``False``:
      the plain sum, and a method declares the blockwise composition it cannot run.
    with_update: the clients' messages travel the update path with their updates, as one message
      (:attr:`fedtree.core.tier.Tier.messages_with_update`) wherever the path has a client or node
      stage: one clip over both, noise on both, both compressed, one aggregator over both, the node
      stage on both sums (SCAFFOLD's ``(Δy_i, Δc_i)`` under DP: its variates are privatized with the
      model). :attr:`Inbox.messages` is then the aggregate's estimate times the reporting children.
  """

  slots: bool = False
  weights: Callable[[jax.Array, PyTree], jax.Array] | None = None
  bytes: Callable[[int], int] | None = None
  robust: bool = False
  with_update: bool = False


class ServerRule(NamedTuple):
  """See the module docstring.

  Attributes:
    init: ``init(params, num_nodes) -> state [N, ...]``.
    receive: ``receive(inbox, state) -> (pseudo_gradient [N, ...], state [N, ...], stats {name: [N]})``.
    name: names the rule in errors and refusals.
    down: what the rule sends its children beyond its model (:class:`Downlink`).
    up: what it takes in from them beyond their mean update (:class:`Uplink`).
    init_key: ``init`` takes a third argument, a PRNG key from the run's (a random start: pFedHN's
      hypernetwork and client embeddings).
    moves: the rule runs under a moving membership (:mod:`fedtree.core.membership`): what it keeps
      stays with its node and holds for whichever clients it takes in this round (FedEx's
      categorical, q-FFL's and the sub-model methods' means of their round's cohort). ``False`` (the
      default): its state or messages are defined over a node's fixed clients (SCAFFOLD's and
      FedDyn's sums over the population, FedFomo's and FedAMP's per-client models at the parent, a
      client's domain under AFL), and the host refuses it under one, by name.
  """

  init: Callable[[PyTree, int], PyTree]
  receive: Callable[[Inbox, PyTree], tuple[PyTree, PyTree, Stats]]
  name: str = "server_rule"
  down: Downlink = Downlink()
  up: Uplink = Uplink()
  init_key: bool = False
  moves: bool = False


def broadcast_of(rule: ServerRule | None, state: PyTree) -> PyTree:
  """What the children receive beside the model: ``rule.down.broadcast(state)``, the state itself,
  or ``()``."""
  if rule is None:
    return ()
  return state if rule.down.broadcast is None else rule.down.broadcast(state)


def receive(rule: ServerRule, inbox: Inbox, state: PyTree) -> tuple[PyTree, PyTree, Stats]:
  """``rule.receive`` on every node; nodes none of whose children reported keep their state."""
  pseudo_gradient, new_state, stats = rule.receive(inbox, state)
  return pseudo_gradient, select_nodes(inbox.reported > 0, new_state, state), stats


def prepare(rule: ServerRule, inbox: Inbox, state: PyTree) -> PyTree:
  """``rule.down.prepare`` on every node; nodes none of whose children took part keep their state."""
  assert rule.down.prepare is not None
  return select_nodes(inbox.reported > 0, rule.down.prepare(inbox, state), state)


def check_rule(rule: ServerRule | None, algorithm: str) -> ServerRule | None:
  """``rule`` if its pass before training is well formed (a stateless update that ``takes_round``,
  with a ``prepare``), else a ``ValueError`` naming the algorithm and the rule."""
  if rule is None or (rule.down.gather is None and rule.down.prepare is None):
    return rule
  if rule.down.gather is None or rule.down.prepare is None:
    raise ValueError(f"{algorithm}: server rule {rule.name!r} gives only one of gather and prepare; a pass "
                     f"before training needs both (the clients' messages and what the server makes of them)")
  if not rule.down.gather.takes_round or rule.down.gather.init_state is not None:
    raise ValueError(f"{algorithm}: server rule {rule.name!r}'s gather pass must take the round "
                     f"(takes_round=True, to send its message) and keep no client state")
  return rule


def init_rule_state(rule: ServerRule | None, params: PyTree, num_nodes: int,
                    key: jax.Array | None = None) -> PyTree:
  """``rule.init(params, num_nodes)`` (``rule.init(params, num_nodes, key)`` for a rule whose
  ``init_key``; ``key`` default ``jax.random.key(0)``), or ``()`` without a rule."""
  if rule is None:
    return ()
  if rule.init_key:
    return rule.init(params, num_nodes, jax.random.key(0) if key is None else key)  # type: ignore[call-arg]
  return rule.init(params, num_nodes)


def per_node(factor: jax.Array, tree: PyTree) -> PyTree:
  """Every node's row of ``tree`` (``[N, ...]`` leaves) times its ``factor[N]``."""
  return jax.tree.map(lambda a: a * factor.reshape((-1,) + (1,) * (a.ndim - 1)).astype(a.dtype), tree)


def zeros_like_stacked(params: PyTree, num_nodes: int) -> PyTree:
  """Zeros shaped as ``params`` for every one of ``num_nodes`` nodes (a variate's start)."""
  return jax.tree.map(lambda p: jnp.zeros((num_nodes,) + jnp.shape(p), jnp.result_type(p)), params)


def cohort_blocks(tree: PyTree, outbox: Outbox | Slots, num_parents: int, block_size: int) -> PyTree:
  """Every parent's cohort as a block: ``[K, ...]`` slot rows into ``[N, block_size, ...]`` (slot
  ``s`` at ``[parent[s], position[s]]``; invalid slots, whose position is out of range, nowhere;
  the rows of a block its parent does not fill are zeros)."""
  def one(a):
    a = jnp.asarray(a)
    zeros = jnp.zeros((num_parents, block_size) + a.shape[1:], a.dtype)
    return zeros.at[outbox.parent, outbox.position].set(a, mode="drop")

  return jax.tree.map(one, tree)


def slot_rows(blocks: PyTree, outbox: Outbox | Slots) -> PyTree:
  """The inverse of :func:`cohort_blocks`: every slot's row of ``[N, block_size, ...]`` blocks
  (``[K, ...]``; an invalid slot reads an arbitrary row, to be masked by its caller)."""
  def one(a):
    n, b = a.shape[0], a.shape[1]
    return a[jnp.clip(outbox.parent, 0, n - 1), jnp.clip(outbox.position, 0, b - 1)]

  return jax.tree.map(one, blocks)
