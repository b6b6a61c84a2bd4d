"""Bytes sent along every edge of the tree, counted on the host from what each round reports.

Every round reports, in its metrics and in ``jit``, each edge's messages and the size of one
(:func:`fedtree.core.tier.edge_metrics`); the host multiplies the two (exact small integers times
a size that is a multiple of 1/8 byte, in float64) and adds the rounds up. What an algorithm's
round reports is what is counted (nothing is assumed about rounds not seen):

* ``<edge>_uplink_messages`` / ``<edge>_downlink_messages``: the messages sent up and down an edge
  this round, the edge ``clients`` (the clients that took part and their parents) or
  ``level{l}`` (server level ``l`` and its child nodes);
* one message's bytes: ``uplink_bytes`` / ``downlink_bytes`` on the clients' edge,
  ``level{l}_uplink_bytes`` / ``level{l}_downlink_bytes`` on a server edge, where the round
  reports them (an update path that compresses,
  :func:`fedtree.toolbox.compression.uplink` / :func:`~fedtree.toolbox.compression.downlink`; a server
  rule's extras; several models a message), else one model at its dtypes' size (the
  :class:`Traffic`'s ``model_bytes``, known exactly on the host: a round's metrics carry no
  64-bit integer).

:class:`Traffic` turns every round into byte metrics (:meth:`Traffic.add_rounds` takes every
round of a compiled call, :func:`fedtree.core.loop.run`'s ``on_rounds`` hook, so fused rounds are
counted one by one):

* ``uplink_bytes`` / ``downlink_bytes``: one client's message in the latest round;
* ``round_uplink_MB`` / ``round_downlink_MB``: the latest round's total over every edge;
* ``uplink_MB`` / ``downlink_MB``: cumulative since round 0, over every edge;
* under a moving membership (a round reporting ``edge_clients_max``, the most clients one edge took in):
  ``edge_peak_uplink_MB``, what the busiest edge of every round took in from its clients, summed over
  the rounds (what an edge server must be provisioned for, beside the mean ``clients_uplink_MB / E``);
* with server-to-server edges, per edge: ``clients_uplink_MB`` / ``clients_downlink_MB`` (the
  clients' edge) and ``level{l}_uplink_MB`` / ``level{l}_downlink_MB`` (level ``l`` and its child
  nodes), cumulative, and ``level{l}_round_uplink_MB`` / ``level{l}_round_downlink_MB``.

Who reports what: every algorithm built on :func:`fedtree.core.tier.train_cohort` the clients'
edge, each client that took part (``clients_trained``, plus ``clients_skipped`` when non-finite
updates are skipped and ``clients_discarded``, FedBuff's and FedAsync's stale reports: they
received the model and sent an update the parent discarded) one message each way; HierFAVG (and
FedAvg/FedOpt and every objective under it, GroupPerFL's stages) a server edge for each level that
aggregates (``level{l}_children_sent`` child nodes each way, 0 in a round where level ``l`` does
not aggregate); pFedMT its teams' exchange with the global server (``level0``, its clients' edge
the round trips over the team iterations); B-HFL the nodes that aggregated and sent up, the models
its down-merges delivered (``clients_received``, ``level{l}_children_received``) and its residual
links; IFCA every cluster's model to each client (a downlink message of ``k`` models). Not
counted: MCFL's feature means (a few floats a client) and anything an algorithm exchanges outside
these metrics. The experiment runner counts every run
(:func:`fedtree.experiment.run_loop.run_algorithm`, resuming from the metrics row of its checkpoint's
round), a sweep's experiments each their own (its rows and its setting's line of the sweep
table: ``uplink_MB``, ``downlink_MB``).

GroupPerFL's per-client cost table (:mod:`fedtree.algorithms.hierarchical.grouppfl.costs`) counts a client's
round trip as :data:`ROUND_TRIP_MODELS` models, the same rule in model units.

Example:
  Two rounds of a 3-level tree (4 clients, 2 edge servers, a root aggregating every 2 rounds) of
  a 100-byte model, nothing compressed:

  >>> from fedtree.core.tier import edge_metrics
  >>> def round_(sent):   # the metrics its rounds report, as host numbers
  ...   m = {**edge_metrics("clients", 4), **edge_metrics("level0", sent)}
  ...   return {k: v.item() for k, v in m.items()}
  >>> t = Traffic(100)
  >>> t.add(round_(0))
  >>> t.add(round_(2))
  >>> t.summary()["uplink_MB"] * 1e6, t.summary()["level0_downlink_MB"] * 1e6
  (1000.0, 200.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

MB = 1e6

ROUND_TRIP_MODELS = 2.0
"""Models a client moves in a round it trains, uncompressed: its parent's model down, its update up."""


def model_bytes(params_shape: Any, *, stacked: bool = False) -> int:
  """The size of one model (a params pytree or its ``ShapeDtypeStruct``s) at its dtypes; with
  ``stacked``, of one row of stacked ``[N, ...]`` params (a node's or a client's model). The one
  size every byte count uses (the bytes on the edges, the systems clock)."""
  leaves = jax.tree.leaves(params_shape)
  if stacked:
    return int(sum(np.prod(a.shape[1:], dtype=np.int64) * np.dtype(a.dtype).itemsize for a in leaves))
  return int(sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in leaves))


Edge = tuple[float, float, float, float]
"""(uplink bytes, downlink bytes, one uplink message, one downlink message) of an edge in a round."""

_MESSAGES = "_uplink_messages"


def _edge(key: str, suffix: str = _MESSAGES) -> tuple[tuple[int, int], str] | None:
  """``((0, 0), "clients")`` for ``clients<suffix>``, ``((1, l), "level{l}")`` for
  ``level{l}<suffix>`` (in order: the clients' edge first, then the levels from the root down),
  ``None`` for any other name."""
  edge = key[: -len(suffix)]
  if not key.endswith(suffix):
    return None
  if edge == "clients":
    return (0, 0), edge
  level = edge[len("level"):]
  return ((1, int(level)), edge) if edge.startswith("level") and level.isdigit() else None


class Traffic:
  """A run's communication, counted round by round (see the module docstring).

  Totals are sums of bytes that are multiples of 1/8 (bits), exact in float64, so they do not
  depend on how rounds were fused into calls.

  Args:
    model_bytes: one uncompressed model's size in bytes: one message where a round reports no
      size for it.
  """

  def __init__(self, model_bytes: int):
    self.model_bytes = int(model_bytes)
    self.totals: dict[str, list[float]] = {}   # edge -> [uplink, downlink] bytes since round 0
    self.last: dict[str, Edge] = {}
    self.updates = 0   # the clients' uplink messages since round 0: client updates trained and sent
    self.peak: float | None = None   # the busiest edge's uplink bytes of every round, summed

  def add(self, metrics: Mapping[str, Any]) -> None:
    """Counts one round from its metrics (host numbers)."""
    edges = self._edges(metrics)
    self.updates += int(metrics.get("clients_uplink_messages", 0))
    if "edge_clients_max" in metrics and "clients" in edges:
      self.peak = (self.peak or 0.0) + float(metrics["edge_clients_max"]) * edges["clients"][2]
    for e, (up, down, _, _) in edges.items():
      t = self.totals.setdefault(e, [0.0, 0.0])
      t[0] += up
      t[1] += down
    if edges:
      self.last = edges

  def _edges(self, metrics: Mapping[str, Any]) -> dict[str, Edge]:
    """``{edge: (uplink bytes, downlink bytes, one uplink message, one downlink message)}`` of one
    round's ``metrics``: every edge it reports (:func:`fedtree.core.tier.edge_metrics`, found by
    its ``<edge>_uplink_messages``), its messages times one message's bytes (one model where the
    round reports no size); ``{}`` for a round that reports no edge."""
    out = {}
    for _, e in sorted(filter(None, map(_edge, metrics))):
      size = "" if e == "clients" else f"{e}_"
      up = float(metrics.get(f"{size}uplink_bytes", self.model_bytes))
      down = float(metrics.get(f"{size}downlink_bytes", self.model_bytes))
      out[e] = (float(metrics[f"{e}_uplink_messages"]) * up, float(metrics[f"{e}_downlink_messages"]) * down,
                up, down)
    return out

  def add_rounds(self, first_round: int, metrics: Mapping[str, Any]) -> None:
    """Counts every round of a compiled call: ``metrics`` stacked ``[rounds of the call]``
    (the signature of :func:`fedtree.core.loop.run`'s ``on_rounds``; ``first_round`` unused)."""
    arrays = {k: np.asarray(v) for k, v in metrics.items()}
    n = len(next(iter(arrays.values()))) if arrays else 0
    for i in range(n):
      self.add({k: v[i].item() for k, v in arrays.items() if v.ndim == 1})

  @property
  def counted(self) -> bool:
    """Whether any round reported what it sent."""
    return bool(self.totals)

  def row(self) -> dict[str, float]:
    """The byte metrics of the latest round counted and the cumulative totals (``{}`` when
    nothing was counted)."""
    if not self.last:
      return dict(self.summary())
    up, down, one_up, one_down = self.last["clients"]
    out = {"uplink_bytes": one_up, "downlink_bytes": one_down,
           "round_uplink_MB": sum(e[0] for e in self.last.values()) / MB,
           "round_downlink_MB": sum(e[1] for e in self.last.values()) / MB}
    if len(self.totals) > 1:
      for e, (eu, ed, _, _) in self.last.items():
        if e != "clients":
          out[f"{e}_round_uplink_MB"], out[f"{e}_round_downlink_MB"] = eu / MB, ed / MB
    return {**out, **self.summary()}

  def summary(self) -> dict[str, float]:
    """Cumulative ``uplink_MB`` and ``downlink_MB`` over every edge (what the final table shows)
    and, with server-to-server edges, per edge."""
    if not self.totals:
      return {}
    out = {"uplink_MB": sum(t[0] for t in self.totals.values()) / MB,
           "downlink_MB": sum(t[1] for t in self.totals.values()) / MB}
    if self.peak is not None:
      out["edge_peak_uplink_MB"] = self.peak / MB
    if len(self.totals) > 1:
      for e, (up, down) in self.totals.items():
        out[f"{e}_uplink_MB"], out[f"{e}_downlink_MB"] = up / MB, down / MB
    return out

  def restore(self, row: Mapping[str, Any]) -> None:
    """Continues from the cumulative totals of a logged row (a resumed run: the row of the round
    its checkpoint holds). Bytes are recovered to the nearest bit (exact below ~10^14 bytes)."""
    back = lambda mb: round(float(mb) * MB * 8) / 8   # noqa: E731
    self.updates = int(row.get("client_updates", 0))   # (a sweep's rows and summaries carry it)
    if "edge_peak_uplink_MB" in row:
      self.peak = back(row["edge_peak_uplink_MB"])
    per_edge = [e for _, e in sorted(filter(None, (_edge(k, "_uplink_MB") for k in row)))]
    if per_edge:
      self.totals = {e: [back(row[f"{e}_uplink_MB"]), back(row[f"{e}_downlink_MB"])] for e in per_edge}
    elif "uplink_MB" in row:
      self.totals = {"clients": [back(row["uplink_MB"]), back(row["downlink_MB"])]}
