"""The server levels above the clients' parents, as every host of the family runs them: each level
aggregates its children every ``periods[l]`` rounds through its update path, then sends its model down
its subtree."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from fedtree.core.membership import ancestor_through
from fedtree.core.personal import Shares, fill, keep_where, merge, personal_part, shared_part
from fedtree.core.rng import stream
from fedtree.core.server import select_nodes, update_nodes
from fedtree.core.tier import edge_metrics
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath, aggregate_children, path_stats, send_down
from fedtree.toolbox.traffic import model_bytes

PyTree = Any


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
  family shares (:func:`~fedtree.algorithms.host.hierfavg.hierfavg`,
  :func:`~fedtree.algorithms.asynchronous.fedbuff.fedbuff`): level ``l`` aggregates its children's
  models every ``periods[l]`` rounds through its update path (:meth:`aggregate`, bottom-up), then
  sends its model down its whole subtree (:meth:`send_down`, top-down), leaves personal to the levels
  below excepted (``share``)."""

  topology: Topology
  periods: tuple[int, ...]
  server_optimizers: tuple
  paths: tuple
  top_level: int = 0
  share: Shares | None = None

  def _share(self) -> Shares:
    return Shares(None, self.topology.depth) if self.share is None else self.share

  def aggregate(self, params: list, opt_state: list, update_state: list, w_client, r, key, *,
                leaf_parent=None):
    """Levels ``depth-2 .. top_level``, bottom-up, in the rounds their period says. Returns the
    updated ``(params, opt_state, update_state)`` lists, ``active`` (per level: a traced bool, or
    ``None`` for the clients' parents and the levels above ``top_level``) and the metrics.
    ``leaf_parent``: every client's parent this round (``int32[C]``, a moving membership: a node
    weighs the clients under it this round), or ``None``: the tree's."""
    topo, share = self.topology, self._share()
    depth = topo.depth
    active: list = [None] * depth
    metrics = {}
    for lv in range(depth - 2, self.top_level - 1, -1):
      if not jax.tree.leaves(share.sent(params[lv], lv)):   # every leaf personal below it: nothing to do
        continue
      active[lv] = (r % self.periods[lv]) == 0
      n = topo.num_nodes(lv + 1)
      w_child = jax.ops.segment_sum(w_client, jnp.asarray(ancestor_through(topo, lv + 1, leaf_parent)),
                                    num_segments=n)
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

  def send_down(self, params: list, active: list, key, *, live=None):
    """Top-down: a level that aggregated sends its model to its whole subtree (``live``: ``bool[P]``
    the clients' parents up this round; a down one receives nothing and keeps its model). Returns the
    params, ``{level: its downlink transform's stats}`` of the levels that may send, and the metrics."""
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
      on = jnp.broadcast_to(active[lv], (topo.num_nodes(lv + 1),))
      if live is not None and lv + 1 == topo.depth - 1:
        on = on & live
      params[lv + 1] = select_nodes(on, down, params[lv + 1])
    return params, down_stats, metrics
