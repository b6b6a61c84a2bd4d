"""What a server keeps beyond its model and optax state, sends its children beside the model, and
updates from what they send back: the seam of SCAFFOLD's control variate, FedDyn's ``h``, FedNova's
normalisation and Mime's momentum.

A :class:`ServerRule` is a pair of pure functions in the optax style, stacked over the nodes of
the server level that runs it (the clients' parents, ``[N, ...]``):

* ``init(params, num_nodes) -> state [N, ...]`` (``params``: one model, the template);
* ``send(state) -> broadcast [N, ...]``: what every child receives beside its parent's model, as
  :attr:`fedtree.core.local.ClientRound.broadcast` (``None``: the state itself);
* ``receive(inbox, state) -> (pseudo_gradient, state, stats)``: from the round's :class:`Inbox`
  (the mean pseudo-gradient of the reporting children after the update path, the sums of the
  messages they sent beside it, how many were sampled, reported and exist), the pseudo-gradient
  the node's optax server optimizer then applies, the new state and ``{name: [N]}`` statistics;
* optionally ``gather`` and ``prepare``: a pass over the round's cohort *before* training (Mime's
  full-batch gradients at the received model, from which the server forms the control variate
  every client then uses): ``gather`` is a :class:`~fedtree.core.local.ClientUpdate` that
  ``takes_round`` and keeps no state, run on every taking-part client from its parent's model
  (its model output is ignored), whose messages, summed per parent in an :class:`Inbox`
  (``pseudo_gradient`` ``()``), reach ``prepare(inbox, state) -> state`` before ``send``. It costs
  one more vmapped pass over the cohort, and its messages count in the uplink bytes.

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
  """

  pseudo_gradient: PyTree
  weight_sum: jax.Array
  messages: PyTree
  reported: jax.Array
  sampled: jax.Array
  population: jax.Array
  params: PyTree
  population_weight: jax.Array | None = None


class ServerRule(NamedTuple):
  """See the module docstring.

  Attributes:
    init: ``init(params, num_nodes) -> state [N, ...]``.
    receive: ``receive(inbox, state) -> (pseudo_gradient [N, ...], state [N, ...], stats {name: [N]})``.
    send: ``send(state) -> [N, ...]`` what the children receive beside the model (``None``: the state).
    name: names the rule in errors and refusals.
    gather: a client pass before training (see the module docstring; ``None``: none).
    prepare: ``prepare(inbox, state) -> state`` from the gathered messages (with ``gather``).
  """

  init: Callable[[PyTree, int], PyTree]
  receive: Callable[[Inbox, PyTree], tuple[PyTree, PyTree, Stats]]
  send: Callable[[PyTree], PyTree] | None = None
  name: str = "server_rule"
  gather: ClientUpdate | None = None
  prepare: Callable[[Inbox, PyTree], PyTree] | None = None


def broadcast_of(rule: ServerRule | None, state: PyTree) -> PyTree:
  """What the children receive beside the model: ``rule.send(state)``, the state itself, or ``()``."""
  if rule is None:
    return ()
  return state if rule.send is None else rule.send(state)


def receive(rule: ServerRule, inbox: Inbox, state: PyTree) -> tuple[PyTree, PyTree, Stats]:
  """``rule.receive`` on every node; nodes none of whose children reported keep their state."""
  pseudo_gradient, new_state, stats = rule.receive(inbox, state)
  return pseudo_gradient, select_nodes(inbox.reported > 0, new_state, state), stats


def prepare(rule: ServerRule, inbox: Inbox, state: PyTree) -> PyTree:
  """``rule.prepare`` on every node; nodes none of whose children took part keep their state."""
  assert rule.prepare is not None
  return select_nodes(inbox.reported > 0, rule.prepare(inbox, state), state)


def check_rule(rule: ServerRule | None, algorithm: str) -> ServerRule | None:
  """``rule`` if its ``gather`` pass is well formed (a stateless update that ``takes_round``,
  with a ``prepare``), else a ``ValueError`` naming the algorithm and the rule."""
  if rule is None or (rule.gather is None and rule.prepare is None):
    return rule
  if rule.gather is None or rule.prepare is None:
    raise ValueError(f"{algorithm}: server rule {rule.name!r} gives only one of gather and prepare; a pass "
                     f"before training needs both (the clients' messages and what the server makes of them)")
  if not rule.gather.takes_round or rule.gather.init_state is not None:
    raise ValueError(f"{algorithm}: server rule {rule.name!r}'s gather pass must take the round "
                     f"(takes_round=True, to send its message) and keep no client state")
  return rule


def init_rule_state(rule: ServerRule | None, params: PyTree, num_nodes: int) -> PyTree:
  """``rule.init(params, num_nodes)``, or ``()`` without a rule."""
  return () if rule is None else rule.init(params, num_nodes)


def per_node(factor: jax.Array, tree: PyTree) -> PyTree:
  """Every node's row of ``tree`` (``[N, ...]`` leaves) times its ``factor[N]``."""
  return jax.tree.map(lambda a: a * factor.reshape((-1,) + (1,) * (a.ndim - 1)).astype(a.dtype), tree)


def zeros_like_stacked(params: PyTree, num_nodes: int) -> PyTree:
  """Zeros shaped as ``params`` for every one of ``num_nodes`` nodes (a variate's start)."""
  return jax.tree.map(lambda p: jnp.zeros((num_nodes,) + jnp.shape(p), jnp.result_type(p)), params)
