"""Bytes sent along every edge of the tree, counted on the host from each round's metrics.

What an algorithm's round reports is what is counted (nothing is assumed about rounds not seen):

* the clients' edge: each client that took part (``clients_trained``, plus ``clients_skipped``
  when non-finite updates are skipped and ``clients_discarded``, FedBuff's and FedAsync's stale
  reports: they received the model and sent an update the parent discarded) sent its update and
  received its parent's model (``clients_received`` clients when an algorithm reports it: B-HFL's
  clients receive only when their edge server got a model from above; ``clients_received_models``
  models each, default 1: IFCA sends every cluster's model).
  A message is ``uplink_bytes`` / ``downlink_bytes`` when the update path compresses it
  (:func:`fedtree.toolbox.compression.uplink` / :func:`~fedtree.toolbox.compression.downlink` report
  them), else one model at its dtypes' size;
* an edge between server levels: ``level{l}_children_sent`` child nodes (0 in a round where level
  ``l`` does not aggregate) each sent their model or update to level ``l``
  (``level{l}_uplink_bytes`` when compressed, else a model) and ``level{l}_children_received``
  (default: as many) received level ``l``'s model (``level{l}_downlink_bytes``, else a model).

:class:`Traffic` turns every round into byte metrics (:meth:`Traffic.add_rounds` takes every
round of a compiled call, :func:`fedtree.core.loop.run`'s ``on_rounds`` hook, so fused rounds are
counted one by one):

* ``uplink_bytes`` / ``downlink_bytes``: one client's message in the latest round;
* ``round_uplink_MB`` / ``round_downlink_MB``: the latest round's total over every edge;
* ``uplink_MB`` / ``downlink_MB``: cumulative since round 0, over every edge;
* with server-to-server edges, per edge: ``clients_uplink_MB`` / ``clients_downlink_MB`` (the
  clients' edge) and ``level{l}_uplink_MB`` / ``level{l}_downlink_MB`` (level ``l`` and its child
  nodes), cumulative, and ``level{l}_round_uplink_MB`` / ``level{l}_round_downlink_MB``.

Who reports what: every algorithm built on :func:`fedtree.core.tier.train_cohort` reports
``clients_trained``; HierFAVG (and FedAvg/FedOpt and every objective under it, GroupPerFL's
stages) ``level{l}_children_sent`` for each level that aggregates; pFedMT its teams' exchange
with the global server (``level0_children_sent``, its ``clients_trained`` the round trips over
the team iterations); B-HFL the nodes that aggregated and sent up, the models its down-merges
delivered (``clients_received``, ``level{l}_children_received``) and its residual links; IFCA
``clients_received_models`` (``k``). Not counted: MCFL's feature means (a few floats a client)
and anything an algorithm exchanges outside these keys. The experiment runner counts every run
(:func:`fedtree.experiment.run_loop.run_algorithm`, resuming from the metrics row of its checkpoint's
round), a sweep's experiments each their own (its rows and its setting's line of the sweep
table: ``uplink_MB``, ``downlink_MB``).

GroupPerFL's per-client cost table (:mod:`fedtree.algorithms.grouppfl.costs`) counts a client's
round trip as :data:`ROUND_TRIP_MODELS` models, the same rule in model units.

Example:
  Two rounds of a 3-level tree (4 clients, 2 edge servers, a root aggregating every 2 rounds) of
  a 100-byte model, nothing compressed:

  >>> t = Traffic(100)
  >>> t.add({"clients_trained": 4, "level0_children_sent": 0})
  >>> t.add({"clients_trained": 4, "level0_children_sent": 2})
  >>> t.summary()["uplink_MB"] * 1e6, t.summary()["level0_downlink_MB"] * 1e6
  (1000.0, 200.0)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

MB = 1e6

ROUND_TRIP_MODELS = 2.0
"""Models a client moves in a round it trains, uncompressed: its parent's model down, its update up."""

_LEVEL = re.compile(r"^level(\d+)_children_(?:sent|received)$")


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


def round_edges(metrics: Mapping[str, Any], model_bytes: float) -> dict[str, Edge]:
  """``{edge: (uplink bytes, downlink bytes, one uplink message, one downlink message)}`` of one
  round's ``metrics`` (host numbers); edges ``"clients"`` and ``"level{l}"`` (see the module
  docstring); ``{}`` for an algorithm that reports no ``clients_trained``."""
  if "clients_trained" not in metrics:
    return {}
  n = (float(metrics["clients_trained"]) + float(metrics.get("clients_skipped", 0))
       + float(metrics.get("clients_discarded", 0)))
  received = float(metrics.get("clients_received", n))
  up = float(metrics.get("uplink_bytes", model_bytes))
  down = float(metrics.get("downlink_bytes", model_bytes)) * float(metrics.get("clients_received_models", 1))
  out = {"clients": (n * up, received * down, up, down)}
  levels = sorted({int(m.group(1)) for m in map(_LEVEL.match, metrics) if m is not None})
  for lv in levels:
    sent = float(metrics.get(f"level{lv}_children_sent", 0))
    received = float(metrics.get(f"level{lv}_children_received", sent))
    up = float(metrics.get(f"level{lv}_uplink_bytes", model_bytes)) if sent else 0.0
    down = float(metrics.get(f"level{lv}_downlink_bytes", model_bytes)) if received else 0.0
    out[f"level{lv}"] = (sent * up, received * down, up, down)
  return out


class Traffic:
  """A run's communication, counted round by round (see the module docstring).

  Totals are sums of bytes that are multiples of 1/8 (bits), exact in float64, so they do not
  depend on how rounds were fused into calls.

  Args:
    model_bytes: one uncompressed model's size in bytes.
  """

  def __init__(self, model_bytes: int):
    self.model_bytes = int(model_bytes)
    self.totals: dict[str, list[float]] = {}   # edge -> [uplink, downlink] bytes since round 0
    self.last: dict[str, Edge] = {}

  def add(self, metrics: Mapping[str, Any]) -> None:
    """Counts one round from its metrics (host numbers)."""
    edges = round_edges(metrics, self.model_bytes)
    for e, (up, down, _, _) in edges.items():
      t = self.totals.setdefault(e, [0.0, 0.0])
      t[0] += up
      t[1] += down
    if edges:
      self.last = edges

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
    if len(self.totals) > 1:
      for e, (up, down) in self.totals.items():
        out[f"{e}_uplink_MB"], out[f"{e}_downlink_MB"] = up / MB, down / MB
    return out

  def restore(self, row: Mapping[str, Any]) -> None:
    """Continues from the cumulative totals of a logged row (a resumed run: the row of the round
    its checkpoint holds). Bytes are recovered to the nearest bit (exact below ~10^14 bytes)."""
    back = lambda mb: round(float(mb) * MB * 8) / 8   # noqa: E731
    per_edge = {k[: -len("_uplink_MB")] for k in row if re.match(r"^(clients|level\d+)_uplink_MB$", k)}
    if per_edge:
      self.totals = {e: [back(row[f"{e}_uplink_MB"]), back(row[f"{e}_downlink_MB"])] for e in per_edge}
    elif "uplink_MB" in row:
      self.totals = {"clients": [back(row["uplink_MB"]), back(row["downlink_MB"])]}
