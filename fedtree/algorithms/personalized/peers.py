"""What the methods whose clients learn from each other's models share (FedAMP, FedFomo, pFedHN,
FedProto): the host options they refuse, a parent's smallest cohort, the children of every parent
and the personal models as the only model set a run reports.

How they pair clients on a tree: :doc:`the peers page <algorithms/peers.md#on-a-tree>`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.algorithms.host import Refusal, cannot
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.server_rule import Slots
from fedtree.core.topology import Topology
from fedtree.core.updates import per_level_paths

PyTree = Any


def topology_of(host: Mapping[str, Any]) -> Topology:
  """The run's tree (``None`` or absent: one server over every client)."""
  topology = host.get("topology")
  return Topology.flat(host["data"].num_clients) if topology is None else topology


def sends_whole(what: str, *, personal: bool = True) -> tuple[Refusal, ...]:
  """The refusals of a method whose clients send ``what`` rather than a model delta: any update path
  (privacy, robust aggregation, compression transform a delta), server optimizers (no shared model to
  step), a model with state (BatchNorm statistics) and, where asked, personal parameters."""
  out = (cannot("update_paths", f"{what}; run it without update_paths"),)
  if personal:
    out += (cannot("personal", what),)
  return out + (cannot("server_optimizers", f"{what}; leave it unset"),
                cannot("model_state", "the method does not train it; use a model without BatchNorm (e.g. "
                                      "GroupNorm)"))


def uses_each(what: str, *, personal: bool = True) -> tuple[Refusal, ...]:
  """The refusals of a method whose server uses each client's update on its own (``what`` says how),
  never their sum: the update path's client stage (clipping and noise, compression, attacks) acts on
  every update as it leaves its client, but a stage on the parents' sum (central DP's noise, SecAgg's
  unmasking), a robust rule replacing the mean and a downlink transform of the parents' models (each
  client receives a parcel of its own) are refused, as are :func:`sends_whole`'s server optimizers, a
  model with state and, where asked, personal parameters."""
  out = (cannot("node_transform", f"{what}, never their sum, so a stage on the sum (central DP's noise, "
                                  f"SecAgg's unmasking) would not reach what it uses; for privacy, clip and "
                                  f"noise at the clients (privacy mechanism='local')"),
         cannot("blockwise", f"{what}, so there is no mean for a robust rule to replace"),
         cannot("down_transform", "every client receives what its parent makes for it alone (a parcel), "
                                  "not the parent's model, which is what a downlink transform compresses; "
                                  "leave compression.downlink unset"))
  return out + sends_whole(what, personal=personal)[1:]


def smallest_cohort(host: Mapping[str, Any]) -> int:
  """The fewest clients a parent of the clients samples a round: its ``cohort_size`` (one or per
  parent), at most its children, or all its children; Poisson sampling: its slots."""
  topology = topology_of(host)
  counts = np.bincount(topology.parent(topology.depth), minlength=topology.num_nodes(topology.depth - 1))
  cohort = host.get("cohort_size")
  if cohort is None or (np.isscalar(cohort) and int(cohort) == -1):
    return int(counts.min())
  sizes = np.broadcast_to(np.asarray(cohort, np.int64), counts.shape)
  return int(np.minimum(sizes, counts).min())


def children(topology: Topology) -> tuple[np.ndarray, np.ndarray]:
  """``(table, rank)``: ``table[N, B]`` every parent's children in index order (padded with
  ``C``, out of range) and ``rank[C]`` each client's position among its parent's children."""
  parent = np.asarray(topology.parent(topology.depth))
  n, c = topology.num_nodes(topology.depth - 1), topology.num_clients
  counts = np.bincount(parent, minlength=n)
  table = np.full((n, max(int(counts.max()), 1)), c, np.int32)
  rank = np.zeros(c, np.int32)
  seen = np.zeros(n, np.int64)
  for i, p in enumerate(parent):
    table[p, seen[p]] = i
    rank[i] = seen[p]
    seen[p] += 1
  return table, rank


def client_stage(host: Mapping[str, Any]) -> bool:
  """The clients' update path has a client stage (privacy, compression, an attack): what a client
  sends is then not its model as it is, and its parent must keep the copy it received."""
  topology = topology_of(host)
  path = per_level_paths(host.get("update_paths"), topology.depth, algorithm="the method")[-1]
  return path is not None and path.client is not None


def held_start(params: PyTree, table: np.ndarray) -> PyTree:
  """``[N, B, ...]``: every parent's copy of its ``B`` children's models (in their index order,
  :func:`children`) before any has sent one: the run's start model (every client's first)."""
  n, b = table.shape
  return jax.tree.map(lambda p: jnp.broadcast_to(p, (n, b) + jnp.shape(p)), params)


def held_rows(held: PyTree, parent: jax.Array, clients: jax.Array, rank: np.ndarray) -> PyTree:
  """``[K, ...]`` what each slot's parent holds of the client ``clients[k]`` (a child of ``parent[k]``)."""
  n = jax.tree.leaves(held)[0].shape[0]
  row = jnp.take(jnp.asarray(rank), clients)
  return jax.tree.map(lambda a: a[jnp.clip(parent, 0, n - 1), row], held)


def held_receive(held: PyTree, slots: Slots, rank: np.ndarray) -> PyTree:
  """``held`` with every reporting slot's row replaced by what it sent (``slots.sent``: its update
  after the update path's client stage, taken from what it started from); the others keep theirs."""
  n = jax.tree.leaves(held)[0].shape[0]
  parent = jnp.where(slots.reported, slots.parent, n)   # not reported: out of range, dropped
  row = jnp.take(jnp.asarray(rank), slots.clients)
  return jax.tree.map(lambda h, s: h.at[parent, row].set(s.astype(h.dtype), mode="drop"), held, slots.sent)


def personal_only(alg: FederatedAlgorithm) -> FederatedAlgorithm:
  """``alg`` reporting its ``personal`` models alone (the clients' parents hold no model of the
  method's: their rows are never trained and would be scored as if they were)."""
  models = alg.models

  def only(state):
    return {k: v for k, v in models(state).items() if k == "personal"}

  return alg._replace(models=only)


def tree_size(tree: PyTree) -> int:
  """The number of entries of one (unstacked, possibly abstract) model."""
  return int(sum(np.prod(np.shape(a), dtype=np.int64) for a in jax.tree.leaves(tree)))
