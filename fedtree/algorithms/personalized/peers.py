"""What the methods whose clients learn from each other's models share (FedAMP, FedFomo, pFedHN,
FedProto): the host options they cannot take, refused by name before anything compiles; a
parent's smallest cohort (for the refusals of a pairing larger than it); the children of every
parent (static tables: who a client's peers are, and where it sits among them); and the
personal models as the only model set a run reports.

**On a tree** every one of them pairs a client only with the other children of its parent (the
clients' parents are the servers that hold their models): a parent's cohort is one block of the
blocked array programs (:func:`fedtree.core.server_rule.cohort_blocks`), so the pairwise work and
its memory grow with the largest cohort of a parent, not with the population. No peer simulator
offers that restriction; on one server it is the papers' pairing over all (sampled) clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath

PyTree = Any


def topology_of(host: Mapping[str, Any]) -> Topology:
  """The run's tree (``None`` or absent: one server over every client)."""
  topology = host.get("topology")
  return Topology.flat(host["data"].num_clients) if topology is None else topology


def refuse(host: Mapping[str, Any], name: str, *, what: str, personal: bool = True,
           server_optimizers: bool = True, model_state: bool = True) -> None:
  """``ValueError`` naming ``name`` and the host option it cannot take: any update path (privacy,
  robust aggregation, compression: ``what`` travels, not a model delta the path transforms), and
  where asked personal parameters, server optimizers (no shared model to step) and a model with
  state (BatchNorm statistics)."""
  paths = host.get("update_paths")
  if isinstance(paths, Mapping):
    items = list(paths.values())
  else:
    items = list(paths) if isinstance(paths, (list, tuple)) and not isinstance(paths, UpdatePath) else [paths]
  if any(p is not None and not p.is_default for p in items):
    raise ValueError(f"{name}: update paths (privacy, robust aggregation, compression) act on a model delta, "
                     f"but {what}; run it without update_paths")
  if personal and host.get("personal") is not None:
    raise ValueError(f"{name}: personal parameters are not supported ({what})")
  if server_optimizers and host.get("server_optimizers") is not None:
    raise ValueError(f"{name}: server_optimizers has no shared model to step ({what}); leave it unset")
  model = host.get("model")
  if model_state and model is not None and model.state:
    raise ValueError(f"{name}: the model keeps state {list(model.state)} (BatchNorm statistics), which "
                     f"{name} does not train; use a model without BatchNorm (e.g. GroupNorm)")


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
