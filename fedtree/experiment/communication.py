"""Bytes sent between the clients and their parents, for every algorithm, from its round metrics.

Every round, each client that trained (``clients_trained``) received its parent's model and sent
its update. A client's message is ``uplink_bytes`` when its update path compresses it
(:func:`fedtree.core.compression.uplink` reports it), else the model at its dtype's size; what it
receives is ``down_bytes`` when the parents' downlink compresses it
(:func:`fedtree.core.compression.downlink`), else the model. :class:`Traffic` adds to a round's
metrics, on the host:

* ``uplink_bytes`` / ``downlink_bytes``: per client;
* ``round_uplink_MB`` / ``round_downlink_MB``: the round's total over the clients that trained;
* ``uplink_MB`` / ``downlink_MB``: cumulative since round 0.

The round loop reports the last round of every compiled call; the rounds before it in the same
call are counted as sending what it sent (exact when every round sends the same, as with the
static cohorts of every algorithm here; a run resumed from a checkpoint counts its earlier
rounds the same way). Edges between server levels are counted only where a compressor sits on
them (``level{l}_uplink_bytes`` / ``level{l}_down_bytes``, per child node).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

MB = 1e6


def model_bytes(params_shape: Any) -> int:
  """The size of one model (a params pytree or its ``ShapeDtypeStruct``s) at its dtypes."""
  return int(sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(params_shape)))


class Traffic:
  """Counts a run's communication from its round metrics (see the module docstring).

  Args:
    model_bytes: one uncompressed model's size in bytes.
  """

  def __init__(self, model_bytes: int):
    self.model_bytes = int(model_bytes)
    self.uplink_total = 0.0     # bytes: sums of dyadic rationals, exact in float64 (so the
    self.downlink_total = 0.0   # totals do not depend on how rounds were split into calls)
    self._round = 0

  def __call__(self, round_: int, metrics: dict[str, float]) -> dict[str, float]:
    """The byte metrics of the call that ended at ``round_`` with last-round ``metrics``
    (``{}`` for an algorithm that reports no ``clients_trained``)."""
    if "clients_trained" not in metrics:
      return {}
    n = float(metrics["clients_trained"])
    up = float(metrics.get("uplink_bytes", self.model_bytes))
    down = float(metrics.get("down_bytes", self.model_bytes))
    rounds = max(0, int(round_) - self._round)
    self._round = int(round_)
    self.uplink_total += rounds * up * n
    self.downlink_total += rounds * down * n
    return {"uplink_bytes": up, "downlink_bytes": down, "round_uplink_MB": up * n / MB,
            "round_downlink_MB": down * n / MB, **self.summary()}

  def summary(self) -> dict[str, float]:
    """The run's cumulative ``uplink_MB`` and ``downlink_MB`` (what the final table shows)."""
    return {"uplink_MB": self.uplink_total / MB, "downlink_MB": self.downlink_total / MB}
