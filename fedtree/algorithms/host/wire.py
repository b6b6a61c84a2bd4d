"""What travels on the clients' edge beside (or instead of) one whole model, in bytes: the one place a
host sizes its messages for the byte columns and the systems clock."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.local import ClientUpdate
from fedtree.core.personal import Shares
from fedtree.core.server_rule import Outbox, ServerRule, broadcast_of, init_rule_state
from fedtree.core.tier import message_shape
from fedtree.core.topology import Topology
from fedtree.toolbox.systems import uplink_bytes
from fedtree.toolbox.traffic import model_bytes

PyTree = Any


def uplink(path, stacked):
  """What a child sends up through ``path`` (:func:`fedtree.toolbox.systems.uplink_bytes` on one
  row of the ``[N, ...]`` params), ``None`` when the model travels as it is."""
  return uplink_bytes(path, jax.tree.map(lambda a: a[0], stacked))


def _stacked(template, n: int):
  """Abstract ``[n, ...]`` rows of one (possibly abstract) model."""
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct((n,) + tuple(np.shape(a)), a.dtype), template)


def parcel_shape(rule: ServerRule | None, update: ClientUpdate, template, topology: Topology) -> PyTree:
  """The abstract ``[1, ...]`` extra of one slot's parcel
  (:attr:`~fedtree.core.server_rule.Downlink.parcels`), from an abstract trace of a one-slot cohort;
  ``()`` when the rule sends every child the same."""
  if rule is None or rule.down.parcels is None:
    return ()
  parcels = rule.down.parcels
  n, c = topology.num_nodes(topology.depth - 1), topology.num_clients
  state = jax.eval_shape(lambda p: init_rule_state(rule, p, n), template)
  client_state = () if update.init_state is None else jax.eval_shape(lambda p: update.init_state(p, c),
                                                                      template)
  slot = jax.ShapeDtypeStruct((1,), jnp.int32)

  def one(state, params, client_state, clients, parent, valid, position, rnd, key):
    return parcels(Outbox(state, params, client_state, clients, parent, valid, position, 1, rnd, key)).extra

  return jax.eval_shape(one, state, _stacked(template, n), client_state, slot, slot,
                        jax.ShapeDtypeStruct((1,), jnp.bool_), slot, jax.ShapeDtypeStruct((), jnp.int32),
                        jax.random.key(0))


@dataclasses.dataclass(frozen=True)
class Extras:
  """What the clients' tier sends beside (or instead of) the whole model, in bytes per message:
  the shared leaves (:mod:`fedtree.core.personal`), a client's message to its parent's server rule,
  the rule's broadcast and the extra of each client's own parcel (``down.parcels``), or what the
  rule says travels (``down.bytes``, ``up.bytes``). ``active``: any of them differs from sending the
  whole model."""

  model_bytes: int             # the shared leaves of one model
  message_bytes: int           # a client's message beside its update
  broadcast_bytes: int         # what a parent sends beside its model (and the parcel's extra)
  active: bool
  down_bytes: int | None = None   # one client's bytes down as the server rule states them
  up_bytes: int | None = None     # ... and up
  message: PyTree = ()            # the abstract message of one client's update (unstacked)
  joint: bool = False             # it travels the update path with the update (Tier.joint): the
  # path's compressed size then counts both

  @classmethod
  def of(cls, update: ClientUpdate, rule: ServerRule | None, template, topology: Topology, data,
         share: Shares, learning_rate, joint: bool = False) -> Extras:
    leaf = topology.depth - 1
    shared = model_bytes(_stacked(share.sent(template, leaf), 1), stacked=True)
    bcast = () if rule is None else jax.eval_shape(lambda p: broadcast_of(rule, init_rule_state(rule, p, 1)),
                                                   template)
    own = parcel_shape(rule, update, template, topology)
    params = _stacked(template, 1)
    messages = []
    sent_message: PyTree = ()
    if update.takes_round and update.message_bytes is None:
      sent_message = message_shape(update, params, () if update.init_state is None else jax.eval_shape(
        lambda p: update.init_state(p, 1), template), data, bcast, learning_rate, jax.random.key(0), own)
      messages.append(sent_message)
    if rule is not None and rule.down.gather is not None:   # what a client sends before training
      messages.append(message_shape(rule.down.gather, params, (), data, bcast, learning_rate,
                                    jax.random.key(0)))
    msg = model_bytes(_stacked(tuple(messages), 1), stacked=True)
    if update.message_bytes is not None:   # what the message costs on the wire (ClientUpdate.message_bytes)
      msg += int(update.message_bytes)
    bc = model_bytes(bcast, stacked=True) + model_bytes(own, stacked=True)
    down = None if rule is None or rule.down.bytes is None else int(rule.down.bytes(shared))
    up = None if rule is None or rule.up.bytes is None else int(rule.up.bytes(shared))
    active = share.client_mask is not None or msg > 0 or bc > 0 or down is not None or up is not None
    return cls(shared, msg, bc, active, down, up, sent_message, joint)

  def sent(self, shared: PyTree, *, stacked: bool = True) -> PyTree:
    """What a child sends up through the update path: its shared leaves (``[N, ...]``; one model's
    without ``stacked``), with its message (zeros, shaped alike) where that travels the path too
    (:attr:`joint`)."""
    if not self.joint:
      return shared
    lead = (jax.tree.leaves(shared)[0].shape[0],) if stacked else ()
    return shared, jax.tree.map(lambda m: jnp.zeros(lead + tuple(m.shape), m.dtype), self.message)

  def up(self, compressed):
    """A client's uplink bytes for the systems clock (``compressed``: the path's size, or ``None``)."""
    if self.up_bytes is not None:
      return self.up_bytes
    if not self.active:
      return compressed
    if self.joint and compressed is not None:   # the path's size counts the message too
      return compressed
    return (self.model_bytes if compressed is None else compressed) + self.message_bytes

  def down(self, compressed):
    """A client's downlink bytes for the systems clock (``compressed``: per slot, or ``None``)."""
    if self.down_bytes is not None:
      return self.down_bytes
    if not self.active:
      return compressed
    return (self.model_bytes if compressed is None else compressed) + self.broadcast_bytes

  def byte_metrics(self, metrics: dict) -> dict:
    """``uplink_bytes`` / ``downlink_bytes`` of one client's messages this round (the update path's
    compressed sizes where it reports them), when they differ from one whole model."""
    if not self.active:
      return {}
    if self.joint and "uplink_bytes" in metrics:   # the path's size counts the message too
      up = metrics["uplink_bytes"]
    else:
      up = metrics.get("uplink_bytes", self.model_bytes) + self.message_bytes
    down = metrics.get("downlink_bytes", self.model_bytes) + self.broadcast_bytes
    return {"uplink_bytes": up if self.up_bytes is None else jnp.asarray(self.up_bytes, jnp.int32),
            "downlink_bytes": down if self.down_bytes is None else jnp.asarray(self.down_bytes, jnp.int32)}
