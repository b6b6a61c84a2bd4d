"""FedScale's device traces (Lai et al. 2022, "FedScale: benchmarking model and system performance
of federated learning at scale") as :mod:`fedtree.toolbox.systems` profiles.

FedScale ships two pickled dicts keyed by client id:

* the device-capacity trace (``client_device_capacity``): ``{id: {"computation": c,
  "communication": b}}`` with ``c`` milliseconds of compute per training sample and ``b`` the
  bandwidth in kbit/s; FedScale charges ``augmentation · batch_size · steps · c / 1000`` seconds
  of compute (``augmentation`` 3: a forward and a backward pass) and the same bandwidth up and
  down;
* the availability trace (``client_behave_trace``): ``{id: {"active": [t...], "inactive":
  [t...], "finish_time": T, ...}}``: the client is on line from ``active[i]`` to
  ``inactive[i]`` (seconds), and the trace repeats every ``finish_time`` seconds.

The readers take the ``ids`` of the clients to use (default: all, in sorted order), and
refuse a trace whose size does not match the number of clients.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedtree.toolbox.systems import Availability, DeviceProfile, make_availability, make_profile


def _load(trace: str | Mapping) -> Mapping:
  if isinstance(trace, Mapping):
    return trace
  with open(trace, "rb") as f:
    return pickle.load(f)


def _select(trace: Mapping, num_clients: int, ids: Sequence[Any] | None, what: str) -> list:
  keys = sorted(trace) if ids is None else list(ids)
  if len(keys) != num_clients:
    raise ValueError(f"the {what} trace has {len(keys)} clients{'' if ids is None else ' selected'} for "
                     f"{num_clients} clients; pass ids= to choose {num_clients} of them")
  missing = [k for k in keys if k not in trace]
  if missing:
    raise ValueError(f"ids {missing[:5]} are not in the {what} trace")
  return keys


def device_capacity_profile(
  trace: str | Mapping,
  num_clients: int,
  *,
  batch_size: int,
  ids: Sequence[Any] | None = None,
  augmentation: float = 3.0,
) -> DeviceProfile:
  """A :class:`~fedtree.toolbox.systems.DeviceProfile` from FedScale's device-capacity trace.

  Args:
    trace: the pickle's path, or the dict it holds.
    num_clients: ``C``, the clients of the data.
    batch_size: examples per local step.
    ids: the trace's client ids for clients ``0..C-1`` (default: all ids, sorted).
    augmentation: FedScale's compute factor per sample.

  Raises:
    ValueError: a trace (or ``ids``) of another size than ``num_clients``, or a value that is
      not positive (naming the client).
  """
  data = _load(trace)
  keys = _select(data, num_clients, ids, "device-capacity")
  ms = np.array([float(data[k]["computation"]) for k in keys])
  kbps = np.array([float(data[k]["communication"]) for k in keys])
  bad = np.flatnonzero(~(np.isfinite(ms) & (ms > 0)))
  if bad.size:
    raise ValueError(f"client {keys[bad[0]]!r}: computation={float(ms[bad[0]])!r} ms per sample must be > 0")
  speed = 1000.0 / (augmentation * int(batch_size) * ms)
  return make_profile(speed, kbps * 1000.0 / 8.0)


def availability_trace(trace: str | Mapping, num_clients: int, *, ids: Sequence[Any] | None = None
                       ) -> Availability:
  """An :class:`~fedtree.toolbox.systems.Availability` from FedScale's availability trace.

  Raises:
    ValueError: a trace (or ``ids``) of another size than ``num_clients``, or ``active`` and
      ``inactive`` lists of different lengths.
  """
  data = _load(trace)
  keys = _select(data, num_clients, ids, "availability")
  intervals, periods = [], []
  for k in keys:
    rec = data[k]
    active, inactive = list(rec["active"]), list(rec["inactive"])
    if len(active) != len(inactive):
      raise ValueError(f"client {k!r}: {len(active)} active and {len(inactive)} inactive times")
    period = float(rec["finish_time"])
    intervals.append([(min(float(a), period), min(float(b), period))
                      for a, b in zip(active, inactive, strict=True)])
    periods.append(period)
  return make_availability(intervals, np.asarray(periods))
