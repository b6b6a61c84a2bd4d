"""The phases of the host's round, each a pure function of the plan (:class:`HostPlan`) and the round's
values: draw, downlink, exchange (a server rule's pass before training and its parcels), train,
receive, server step, upper levels, clock. :func:`~fedtree.algorithms.host.hierfavg.hierfavg`'s round
is their composition; other hosts reuse them."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.algorithms.host.plan import HostPlan
from fedtree.algorithms.host.upper import send_shared
from fedtree.algorithms.host.wire import uplink
from fedtree.core.algorithm import NodeModels, TreeState, broadcast_tree, client_weights, initial_params
from fedtree.core.algorithm import personal_models as objective_models
from fedtree.core.data import FederatedData
from fedtree.core.membership import clients_node, clients_parent_rows
from fedtree.core.personal import merge, shared_part
from fedtree.core.rng import stream
from fedtree.core.sampling import Cohort
from fedtree.core.server import init_nodes, update_nodes
from fedtree.core.server_rule import (
  Inbox,
  Outbox,
  Parcels,
  Slots,
  broadcast_of,
  init_rule_state,
  prepare,
  receive,
)
from fedtree.core.tier import Clients, Down, TierResult, train_cohort
from fedtree.core.updates import block_positions, init_update_state, path_stats
from fedtree.toolbox.systems import RoundOutcome, client_ops
from fedtree.toolbox.traffic import model_bytes

PyTree = Any


class Drawn(NamedTuple):
  """The round's cohort and what its clients do."""

  cohort: Cohort                   # [K] slots (valid: those that take part)
  num_steps: jax.Array             # int32[C] every client's local steps
  outcome: RoundOutcome | None     # the systems model's decision (None without one)
  member: jax.Array | None = None  # int32[C] every client's edge this round (a moving membership)
  live: jax.Array | None = None    # bool[E] the edges up this round (a moving membership)


def leaf_parent(plan: HostPlan, drawn: Drawn | None = None) -> jax.Array:
  """``int32[C]`` every client's parent this round: the round's membership, or the tree's."""
  if drawn is not None and drawn.member is not None:
    return drawn.member
  return jnp.asarray(plan.topology.parent(plan.depth))


def population(plan: HostPlan, drawn: Drawn | None = None) -> jax.Array:
  """``[P]`` the clients under every leaf parent this round (float: the sampled fraction's base)."""
  if drawn is None or drawn.member is None:
    return jnp.asarray(plan.population)
  return jax.ops.segment_sum(jnp.ones(drawn.member.shape, jnp.asarray(plan.population).dtype), drawn.member,
                             num_segments=plan.num_parents)


class Weights(NamedTuple):
  """The clients' aggregation weights this round."""

  client: jax.Array                # [C] the host's (examples or ones): the levels above use them
  tier: jax.Array                  # [C] in the parents' mean: the rule's, where it sets them (AFL)
  population: jax.Array            # [N] every parent's children's ``tier`` weights summed
  slots: jax.Array                 # [C] ``tier`` as the cohort reads it: the counts themselves for
  # example weights (cast once its rows are read: no float copy of every client's is made a call)


def init(plan: HostPlan, key) -> TreeState:
  """Every node starts from the same model; optimizer, rule and path states at their start."""
  topo, share, leaf = plan.topology, plan.share, plan.leaf
  p0 = initial_params(plan.model, key, plan.init_params)
  params = broadcast_tree(p0, topo)
  update = plan.tier.update
  return TreeState(
    round=jnp.zeros((), jnp.int32), params=params,
    opt_state=tuple(init_nodes(opt, p) for opt, p in zip(plan.server_optimizers, params, strict=True)),
    client_state=() if update.init_state is None else update.init_state(p0, topo.num_clients),
    cursor=plan.schedule.init_cursor(topo.num_clients),
    update_state=tuple(init_update_state(plan.paths[lv], _sent(plan, p0, lv), topo.num_nodes(lv + 1),
                                         topo.num_nodes(lv)) for lv in range(plan.depth)),
    clock=() if plan.systems is None else jnp.zeros((), jnp.result_type(float)),
    server_state=init_rule_state(plan.rule, p0, topo.num_nodes(leaf), stream(key, "server_rule")),
    personal=share.init_clients(p0, topo.num_clients),
  )


def _sent(plan: HostPlan, p0: PyTree, lv: int) -> PyTree:
  """What a child of level ``lv`` sends through its path, one unstacked model's worth: the shared leaves
  (and, at the clients' parents, the message where it travels with them: ``Extras.joint``)."""
  shared = plan.share.sent(p0, lv)
  return plan.wire.sent(shared, stacked=False) if lv == plan.leaf else shared


def downlink(plan: HostPlan, state: TreeState, key) -> tuple[PyTree, dict]:
  """What the clients' parents send (their shared leaves, through the downlink transform)."""
  leaf = plan.leaf
  return send_shared(plan.share, plan.paths[leaf], state.params[leaf], leaf, stream(key, "down"))


def draw(plan: HostPlan, state: TreeState, data: FederatedData, down_stats: dict, key) -> Drawn:
  """The cohort of every leaf parent, and (with a systems model) who takes part, how much each does
  and how long it takes (the compressed bytes each way)."""
  leaf, wire = plan.leaf, plan.wire
  num_steps = plan.schedule.num_steps(data.n_train)
  if plan.membership is not None:   # every edge's cohort among its members of the round
    member, live = plan.membership.of_round(state.round + 1)
    return Drawn(plan.sampler(stream(key, "cohort"), member, live), num_steps, None, member, live)
  assert plan.strategy is not None
  cohort = plan.strategy.draw(stream(key, "cohort"), state.params[leaf], state.clock, data)
  if plan.systems is None:
    return Drawn(cohort, num_steps, None)
  down_b = down_stats.get("bytes")
  sent = plan.wire.sent(plan.share.sent(state.params[leaf], leaf))
  up_b = uplink(plan.paths[leaf], sent)
  outcome = plan.systems.round(
    cohort, num_steps, time=state.clock, model_bytes=wire.model_bytes, key=stream(key, "systems"),
    keep=plan.keep, uplink_bytes=wire.up(up_b),
    downlink_bytes=wire.down(None if down_b is None else jnp.take(down_b, cohort.parent)),
    field_ops=client_ops(plan.paths[leaf], jax.tree.map(lambda a: a[0], sent), cohort.parent))
  return Drawn(cohort._replace(valid=outcome.valid), outcome.num_steps, outcome)


def weights(plan: HostPlan, state: TreeState, data: FederatedData, drawn: Drawn | None = None) -> Weights:
  w_client = client_weights(data.n_train, plan.weighting)
  w_tier = w_client
  if plan.rule is not None and plan.rule.up.weights is not None:
    w_tier = plan.rule.up.weights(w_client, state.server_state)
  total = jax.ops.segment_sum(w_tier, leaf_parent(plan, drawn), num_segments=plan.num_parents)
  slots = data.n_train if w_tier is w_client and plan.weighting == "examples" else w_tier
  return Weights(w_client, w_tier, total, slots)


def inbox(plan: HostPlan, state: TreeState, drawn: Drawn, w: Weights, res: TierResult, pseudo_gradient,
          slots: Slots | None = None) -> Inbox:
  """What the clients' parents receive from a pass over the cohort."""
  cohort = drawn.cohort
  reported = jax.ops.segment_sum((jnp.take(res.reported, cohort.clients) & cohort.valid).astype(
    res.weight_sum.dtype), cohort.parent, num_segments=plan.num_parents)
  dtype = res.weight_sum.dtype
  return Inbox(pseudo_gradient=pseudo_gradient, weight_sum=res.weight_sum, messages=res.message_sum,
               reported=reported, sampled=res.sampled, population=population(plan, drawn).astype(dtype),
               params=state.params[plan.leaf], population_weight=w.population.astype(dtype),
               slots=slots)


def slot_positions(cohort: Cohort, num_parents: int) -> jax.Array:
  """Each valid slot's position among its parent's valid slots (``num_parents`` for the others),
  whatever the order of the cohort's slots."""
  order = jnp.argsort(cohort.parent, stable=True)
  pos = block_positions(jnp.take(cohort.parent, order), jnp.take(cohort.valid, order), num_parents)
  return jnp.zeros_like(pos).at[order].set(pos)


def _clients(plan: HostPlan, state: TreeState, drawn: Drawn, w: Weights, *, own_state: bool) -> Clients:
  return Clients(drawn.num_steps, w.slots, state=state.client_state if own_state else (), cursor=state.cursor,
                 personal=plan.share.unpack(state.personal),
                 update_state=state.update_state[plan.leaf] if own_state else None)


def exchange(plan: HostPlan, state: TreeState, drawn: Drawn, w: Weights, sent, data: FederatedData,
             key) -> tuple[Down, PyTree, Parcels, jax.Array | None]:
  """What the parents send each child before it trains: the server rule's pass over the cohort
  before training (``gather``: Mime's full-batch gradients), its broadcast, and every slot's own
  parcel (``parcels``). Returns the :class:`~fedtree.core.tier.Down` of the round, the rule's state
  after the pass, the parcels and every slot's position among its parent's (``None`` where unused)."""
  rule, server_state = plan.rule, state.server_state
  clients = population(plan, drawn)
  if rule is not None and rule.down.gather is not None:   # a pass before training (Mime's c)
    t = plan.tier
    gather = t._replace(update=rule.down.gather, path=None, skip_nonfinite=False, block_size=None,
                        keep_client_params=False)
    asked = train_cohort(gather, Down(sent, broadcast_of(rule, server_state), population=clients),
                         drawn.cohort, data, _clients(plan, state, drawn, w, own_state=False),
                         stream(key, "gather"))
    server_state = prepare(rule, inbox(plan, state, drawn, w, asked, ()), server_state)
  parcels, position = Parcels(), None
  if rule is not None and (rule.down.parcels is not None or rule.up.slots):
    position = slot_positions(drawn.cohort, plan.num_parents)
  if rule is not None and rule.down.parcels is not None:   # every child its own parcel
    c = drawn.cohort
    parcels = rule.down.parcels(Outbox(
      state=server_state, params=sent, client_state=state.client_state, clients=c.clients, parent=c.parent,
      valid=c.valid, position=position, block_size=max(plan.sampler.sizes), round=state.round + 1,
      key=stream(key, "parcels")))
  down = Down(sent, broadcast_of(rule, server_state), start=parcels.start, extra=parcels.extra,
              population=clients)
  return down, server_state, parcels, position


def train(plan: HostPlan, state: TreeState, drawn: Drawn, w: Weights, down: Down, data: FederatedData,
          key) -> TierResult:
  """The cohort trains from what its parents sent and sends its updates through the clients' path."""
  return train_cohort(plan.tier, down, drawn.cohort, data, _clients(plan, state, drawn, w, own_state=True),
                      stream(key, "train"))


def take_in(plan: HostPlan, state: TreeState, drawn: Drawn, w: Weights, res: TierResult, down: Down,
            position, server_state) -> tuple[PyTree, PyTree, dict]:
  """What the clients' parents make of what their children sent: the pseudo-gradient their server
  optimizers apply and the server rule's new state (``(pseudo_gradient, server_state, metrics)``)."""
  rule, cohort = plan.rule, drawn.cohort
  pseudo_gradient = res.pseudo_gradient()
  if rule is None:
    return pseudo_gradient, server_state, {}
  slots = None
  if rule.up.slots:   # every slot's own exchange
    start = down.start if down.start is not None else jax.tree.map(
      lambda a: jnp.take(a, cohort.parent, axis=0), down.params)
    slots = Slots(clients=cohort.clients, parent=cohort.parent,
                  reported=jnp.take(res.reported, cohort.clients) & cohort.valid, position=position,
                  start=start, sent=res.client_params, block_size=max(plan.sampler.sizes))
  got = inbox(plan, state, drawn, w, res, pseudo_gradient, slots)
  pseudo_gradient, server_state, stats = receive(rule, got, server_state)
  return pseudo_gradient, server_state, path_stats(stats)


def server_step(plan: HostPlan, state: TreeState, pseudo_gradient, res: TierResult) -> tuple[list, list]:
  """The clients' parents' optax step on their pseudo-gradients (nodes none of whose children
  reported keep theirs); the levels above as they were."""
  params, opt_state = list(state.params), list(state.opt_state)
  leaf = plan.leaf
  params[leaf], opt_state[leaf] = update_nodes(plan.server_optimizers[leaf], params[leaf], opt_state[leaf],
                                               pseudo_gradient, res.weight_sum > 0)
  return params, opt_state


def upper_levels(plan: HostPlan, params: list, opt_state: list, update_state: list, w: Weights, r, key,
                 drawn: Drawn | None = None):
  """The levels above the clients' parents aggregate in their rounds, then send down their subtrees
  (under a moving membership, each edge weighs its clients of the round; a down edge weighs nothing
  above and receives nothing). Returns ``(params, opt_state, update_state, active, level_stats,
  metrics)``."""
  member = live = None
  w_client = w.client
  if drawn is not None and drawn.member is not None:
    member, live = drawn.member, drawn.live
    w_client = w_client * jnp.take(live, member).astype(w_client.dtype)
  params, opt_state, update_state, active, metrics = plan.upper.aggregate(
    params, opt_state, update_state, w_client, r, key, leaf_parent=member)
  params, level_stats, down_metrics = plan.upper.send_down(params, active, key, live=live)
  return params, opt_state, update_state, active, level_stats, {**metrics, **down_metrics}


def clock(plan: HostPlan, state: TreeState, drawn: Drawn, params: list, active: list,
          level_stats: dict) -> tuple[Any, dict]:
  """The simulated clock: the leaf parents' rounds run side by side; a level aggregating adds its
  own transfers. Returns ``(clock, metrics)`` (``((), {})`` without a systems model)."""
  if plan.systems is None:
    return state.clock, {}
  assert drawn.outcome is not None
  level_secs = []
  for lv, st in level_stats.items():
    mb = model_bytes(params[lv], stacked=True)
    up_b, down_b = uplink(plan.paths[lv], params[lv]), st.get("bytes")
    level_secs.append(jnp.where(active[lv], plan.systems.aggregation_seconds(
      lv, plan.links, mb if up_b is None else up_b,
      mb if down_b is None else jnp.take(down_b, jnp.asarray(plan.topology.parent(lv + 1)))), 0.0))
  seconds = drawn.outcome.seconds + sum(level_secs, jnp.zeros((), jnp.result_type(float)))
  new = state.clock + seconds
  return new, {**drawn.outcome.stats, "round_seconds": seconds, "sim_seconds": new}


def models(plan: HostPlan, state: TreeState) -> dict[str, NodeModels]:
  """Every level that aggregates every leaf, and each client's own combination where some leaves are
  personal."""
  return {**node_models(plan, state), **client_models(plan, state, None)}


def node_models(plan: HostPlan, state: TreeState) -> dict[str, NodeModels]:
  """The sets of :func:`models` whose rows are server nodes: every level that aggregates every leaf."""
  topo, share = plan.topology, plan.share
  out = {}
  if plan.top_level == 0 and share.reported(0):
    out["global"] = NodeModels(state.params[0], np.zeros(topo.num_clients, np.int32))
  for lv in range(max(plan.top_level, 1), plan.depth):
    if share.reported(lv):
      out[f"level{lv}"] = NodeModels(state.params[lv], clients_node(topo, lv, plan.membership, state.round))
  return out


def client_models(plan: HostPlan, state: TreeState, clients) -> dict[str, NodeModels]:
  """The per-client sets of :func:`models` (each client: its parent's shared leaves and its own personal
  ones; an objective's personal models), over every client (``clients`` ``None``) or over a state whose
  per-client leaves hold the rows of ``clients`` (``int32[K]``), row ``k`` being client ``clients[k]``'s
  (:class:`fedtree.core.algorithm.ClientModels`)."""
  share, leaf = plan.share, plan.leaf
  out = {}
  if share.has_client_personal:
    parent = clients_parent_rows(plan.topology, leaf, plan.membership, state.round, state.params[leaf],
                                 clients)
    own = merge(shared_part(parent, share.client_mask), share.unpack(state.personal), share.client_mask)
    out["personal"] = NodeModels(own, np.arange(jax.tree.leaves(parent)[0].shape[0], dtype=np.int32))
  return {**out, **objective_models(plan.tier.update, state.client_state)}


def membership_metrics(plan: HostPlan, drawn: Drawn, r) -> dict[str, jax.Array]:
  """A moving membership's round: ``handovers`` (clients on another edge than the round before),
  ``edges_down`` and ``edge_clients_max`` (the most clients of the cohort an edge took in)."""
  assert plan.membership is not None and drawn.live is not None
  took = jax.ops.segment_sum(drawn.cohort.valid.astype(jnp.int32), drawn.cohort.parent,
                             num_segments=plan.num_parents)
  return {"handovers": plan.membership.moved(r), "edges_down": jnp.sum(~drawn.live).astype(jnp.int32),
          "edge_clients_max": jnp.max(took).astype(jnp.int32)}


def reads(plan: HostPlan, state: TreeState, key) -> jax.Array:
  """``int32[D]`` every client whose data and per-client state the round of ``key`` reads."""
  if plan.membership is not None:
    return plan.sampler(stream(key, "cohort"), *plan.membership.of_round(state.round + 1)).clients
  assert plan.strategy is not None
  return plan.strategy.reads(stream(key, "cohort"), state.params[plan.leaf], state.clock)
