"""Systems heterogeneity with static shapes: device speeds, bandwidths, availability, round
policies (deadlines, over-selection, dropout) and a simulated clock.

Real deployments never see the whole cohort finish (Bonawitz et al. 2019, "Towards federated
learning at scale"; Lai et al. 2022, FedScale): devices come and go with the time of day, some
are ten times slower than others, rounds have deadlines and servers over-select. Here every
such effect is an array over the clients, so a round keeps its shapes:

* a :class:`DeviceProfile` gives every client a compute speed (local steps per second) and
  up / down bandwidths (bytes per second), drawn from a :class:`Distribution` by a key
  (:func:`device_profile`) or built from measured arrays (:func:`make_profile`; FedScale's
  device-capacity file: :func:`fedtree.datasets.device_traces.read_device_capacity`);
* an :class:`Availability` is every client's on-line intervals within its own period (a day
  for :func:`diurnal_availability`; FedScale's behaviour trace:
  :func:`fedtree.datasets.device_traces.read_availability_trace`);
* a :class:`RoundPolicy` says which sampled clients a round keeps and how long it lasts
  (:func:`wait_for_all`, :func:`deadline`, :func:`over_selection`, each with a random
  ``dropout``); a dropped client is a cohort slot whose ``valid`` is false, partial work is a
  smaller per-client step count (FedProx's systems heterogeneity, Li et al. 2020), so
  :func:`fedtree.core.tier.train_cohort` runs them unchanged.

A client's time in a round is ``downlink_bytes / down + steps / speed + uplink_bytes / up``; the
clients' tier lasts as long as its slowest kept client (the deadline when a client was cut by
it). The bytes are the model at its dtype's size, or what the update path reports where it
compresses (:func:`uplink_bytes` of the path's client transform, the ``bytes`` statistic of its
downlink transform), unless ``uplink_bytes`` / ``downlink_bytes`` are given. On a tree, a server level
that aggregates adds the time its children take to send their models up and receive its model
back, each over its own link (``server_up`` / ``server_down``, bytes per second of every
non-root server node), the slowest child deciding (:meth:`Systems.aggregation_seconds`), plus
a fixed ``level_seconds``. The clock (simulated seconds since the start) is part of an
algorithm's state and decides which clients are on line at the start of a round.

Example:
  Ten clients with heavy-tailed speeds under a 30-second deadline with partial work:

  >>> from fedtree.core.sampling import Cohort
  >>> profile = device_profile(jax.random.key(0), 10, speed=lognormal(2.0, 1.0))
  >>> systems = Systems(profile=profile, policy=deadline(30.0, partial=True))
  >>> cohort = Cohort(jnp.arange(10, dtype=jnp.int32), jnp.zeros(10, jnp.int32), jnp.ones(10, bool))
  >>> out = systems.round(cohort, jnp.full(10, 50, jnp.int32), time=jnp.zeros(()), model_bytes=4e4,
  ...                     key=jax.random.key(1))
  >>> float(out.seconds) <= 30.0, bool((out.num_steps <= 50).all())
  (True, True)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.sampling import Cohort
from fedtree.core.updates import ClientContext, UpdatePath, init_update_state, parents_node_state

PyTree = Any

POLICIES = ("wait_for_all", "deadline", "over_selection")
SECONDS_PER_HOUR = 3600.0


def _float():
  """The simulated clock's, latencies' and bandwidths' dtype: the default float dtype (float32, float64
  under ``--config.dtype=float64``)."""
  return jnp.result_type(float)


# ------------------------------------------------------------------------ distributions


class Distribution(NamedTuple):
  """A positive random quantity: ``sample(key, shape) -> float[shape]``; ``name`` for reports."""

  sample: Callable[[jax.Array, tuple[int, ...]], jax.Array]
  name: str


def _positive(name: str, value) -> float:
  value = float(value)
  if not value > 0 or not math.isfinite(value):
    raise ValueError(f"{name}={value!r} must be a finite number > 0")
  return value


def constant(value: float) -> Distribution:
  """Every client the same ``value`` (> 0)."""
  value = _positive("value", value)
  return Distribution(lambda key, shape: jnp.full(shape, value, _float()), f"constant({value})")


def lognormal(median: float, sigma: float) -> Distribution:
  """``median · exp(sigma · N(0, 1))``: the heavy right tail of measured device speeds (FedScale's
  compute and bandwidth traces are close to lognormal); ``sigma=0`` is :func:`constant`."""
  median = _positive("median", median)
  if not float(sigma) >= 0:
    raise ValueError(f"sigma={sigma!r} must be >= 0")
  sigma = float(sigma)
  return Distribution(
    lambda key, shape: median * jnp.exp(sigma * jax.random.normal(key, shape, _float())),
    f"lognormal({median}, {sigma})")


def pareto(minimum: float, shape_param: float) -> Distribution:
  """Pareto with scale ``minimum`` and tail index ``shape_param`` (> 0; heavier tail as it falls)."""
  minimum = _positive("minimum", minimum)
  alpha = _positive("shape_param", shape_param)
  return Distribution(
    lambda key, shape: minimum * jax.random.pareto(key, alpha, shape, _float()),
    f"pareto({minimum}, {alpha})")


def uniform(low: float, high: float) -> Distribution:
  """Uniform on ``[low, high]`` with ``0 < low <= high``."""
  low = _positive("low", low)
  if not float(high) >= low:
    raise ValueError(f"high={high!r} must be >= low={low}")
  high = float(high)
  return Distribution(
    lambda key, shape: jax.random.uniform(key, shape, _float(), low, high), f"uniform({low}, {high})")


# ------------------------------------------------------------------------ device profiles


class DeviceProfile(NamedTuple):
  """What every client's device can do.

  Attributes:
    speed: ``float[C]`` local steps per second.
    up: ``float[C]`` upload bandwidth, bytes per second.
    down: ``float[C]`` download bandwidth, bytes per second.
  """

  speed: jax.Array
  up: jax.Array
  down: jax.Array

  @property
  def num_clients(self) -> int:
    return int(self.speed.shape[0])


def _check_rates(name: str, values, num_clients: int | None) -> np.ndarray:
  arr = np.asarray(values, np.float64)
  if arr.ndim != 1:
    raise ValueError(f"{name} must be one value per client (a 1-d array), got shape {arr.shape}")
  if num_clients is not None and arr.shape[0] != num_clients:
    raise ValueError(f"{name} has {arr.shape[0]} entries for {num_clients} clients")
  bad = np.flatnonzero(~(np.isfinite(arr) & (arr > 0)))
  if bad.size:
    i = int(bad[0])
    raise ValueError(f"{name}[{i}]={float(arr[i])!r} must be a finite number > 0 (steps or bytes per second)")
  return arr


def make_profile(speed, up, down=None) -> DeviceProfile:
  """A :class:`DeviceProfile` from per-client arrays (host values, checked: finite and > 0).

  Args:
    speed: local steps per second of every client.
    up: upload bytes per second of every client.
    down: download bytes per second (default ``up``).

  Raises:
    ValueError: a rate that is not finite and positive (naming the client), or lengths that differ.
  """
  speed = _check_rates("speed", speed, None)
  up = _check_rates("up", up, speed.shape[0])
  down = up if down is None else _check_rates("down", down, speed.shape[0])
  return DeviceProfile(*(jnp.asarray(a, _float()) for a in (speed, up, down)))


def device_profile(
  key: jax.Array,
  num_clients: int,
  *,
  speed: Distribution | float = 1.0,
  up: Distribution | float = 1e6,
  down: Distribution | float | None = None,
) -> DeviceProfile:
  """Draws every client's speed and bandwidths from distributions (a float: :func:`constant`).

  Args:
    key: the profile's randomness.
    num_clients: ``C``.
    speed: local steps per second.
    up: upload bytes per second.
    down: download bytes per second (default: ``up``'s distribution, drawn independently).
  """
  if int(num_clients) < 1:
    raise ValueError(f"num_clients={num_clients!r} must be >= 1")
  as_dist = lambda d: d if isinstance(d, Distribution) else constant(d)  # noqa: E731
  speed, up = as_dist(speed), as_dist(up)
  down = up if down is None else as_dist(down)
  ks, ku, kd = jax.random.split(key, 3)
  shape = (int(num_clients),)
  return make_profile(np.asarray(speed.sample(ks, shape)), np.asarray(up.sample(ku, shape)),
                      np.asarray(down.sample(kd, shape)))


# ------------------------------------------------------------------------ availability


class Availability(NamedTuple):
  """Every client's on-line intervals, repeating with its own period.

  Client ``c`` is on line at time ``t`` when ``start[c, i] <= t mod period[c] < end[c, i]``
  for some ``i``; unused intervals are empty (``start == end``).

  Attributes:
    start: ``float[C, I]`` interval starts, seconds into the period.
    end: ``float[C, I]`` interval ends.
    period: ``float[C]`` seconds after which the schedule repeats.
  """

  start: jax.Array
  end: jax.Array
  period: jax.Array

  @property
  def num_clients(self) -> int:
    return int(self.period.shape[0])

  def at(self, time: jax.Array) -> jax.Array:
    """``bool[C]``: who is on line at simulated second ``time``."""
    t = jnp.mod(jnp.asarray(time, _float()), self.period)[:, None]
    return jnp.any((self.start <= t) & (t < self.end), axis=1)

  def fraction(self) -> np.ndarray:
    """``float[C]`` the share of its period each client is on line (host)."""
    length = np.clip(np.asarray(self.end) - np.asarray(self.start), 0, None).sum(axis=1)
    return length / np.asarray(self.period)


def make_availability(intervals: Sequence[Sequence[tuple[float, float]]], period) -> Availability:
  """An :class:`Availability` from every client's ``[(start, end), ...]`` within ``period``
  (seconds; one value, or one per client), padded with empty intervals.

  Raises:
    ValueError: a non-positive period, or an interval that is reversed or outside the period.
  """
  num = len(intervals)
  if num < 1:
    raise ValueError("availability needs at least one client")
  period = np.broadcast_to(np.asarray(period, np.float64), (num,)).copy()
  bad = np.flatnonzero(~(np.isfinite(period) & (period > 0)))
  if bad.size:
    i = int(bad[0])
    raise ValueError(f"period[{i}]={float(period[i])!r} must be a finite number of seconds > 0")
  width = max(1, max(len(iv) for iv in intervals))
  start = np.zeros((num, width), np.float64)
  end = np.zeros((num, width), np.float64)
  for c, iv in enumerate(intervals):
    for i, (s, e) in enumerate(iv):
      if not 0 <= s <= e <= period[c]:
        raise ValueError(f"client {c}'s interval ({s!r}, {e!r}) must satisfy 0 <= start <= end <= "
                         f"period={period[c]}")
      start[c, i], end[c, i] = s, e
  return Availability(jnp.asarray(start, _float()), jnp.asarray(end, _float()),
                      jnp.asarray(period, _float()))


def always_available(num_clients: int) -> Availability:
  """Every client on line all the time."""
  return make_availability([[(0.0, 1.0)]] * int(num_clients), 1.0)


def diurnal_availability(
  key: jax.Array,
  num_clients: int,
  *,
  online_hours: Distribution | float = 8.0,
  peak_hour: float = 22.0,
  spread_hours: float = 4.0,
  day_seconds: float = 24 * SECONDS_PER_HOUR,
) -> Availability:
  """A synthetic day: every client is on line once a day (charging and on Wi-Fi, as in
  Bonawitz et al. 2019), a window of ``online_hours`` (a draw per client, at most a day)
  centred at ``peak_hour`` plus a normal offset of ``spread_hours`` (time zones, habits).

  Args:
    key: the schedule's randomness.
    num_clients: ``C``.
    online_hours: length of every client's daily window, hours.
    peak_hour: the hour of the day around which windows are centred.
    spread_hours: standard deviation of a window's centre, hours.
    day_seconds: the period (seconds).

  Raises:
    ValueError: a negative ``spread_hours``, or a constant ``online_hours`` longer than the day
      (a distribution's draws are cut at the day).
  """
  if not float(spread_hours) >= 0:
    raise ValueError(f"spread_hours={spread_hours!r} must be >= 0")
  day = _positive("day_seconds", day_seconds)
  if not isinstance(online_hours, Distribution) and float(online_hours) * SECONDS_PER_HOUR > day:
    hours = day / SECONDS_PER_HOUR
    raise ValueError(f"online_hours={online_hours!r} is longer than the day ({hours:g} hours): a client is "
                     f"on line at most all day; choose online_hours <= {hours:g}, or no availability (always "
                     f"on line)")
  dist = online_hours if isinstance(online_hours, Distribution) else constant(online_hours)
  k1, k2 = jax.random.split(key)
  length = np.minimum(np.asarray(dist.sample(k1, (int(num_clients),)), np.float64) * SECONDS_PER_HOUR, day)
  centre = (float(peak_hour) + float(spread_hours) * np.asarray(
    jax.random.normal(k2, (int(num_clients),)), np.float64)) * SECONDS_PER_HOUR
  start = np.mod(centre - length / 2, day)
  intervals = []
  for s, n in zip(start, length, strict=True):
    e = s + n
    intervals.append([(s, e)] if e <= day else [(s, day), (0.0, e - day)])  # wraps past midnight
  return make_availability(intervals, day)


# ------------------------------------------------------------------------ round policies


@dataclasses.dataclass(frozen=True)
class RoundPolicy:
  """Which sampled clients a round keeps; build with :func:`wait_for_all`, :func:`deadline` or
  :func:`over_selection`.

  Attributes:
    kind: one of :data:`POLICIES`.
    seconds: the deadline (``"deadline"`` only).
    partial: under a deadline, a client that cannot finish does the steps that fit (at least
      one, else it drops out) instead of dropping out.
    factor: over-selection factor (``"over_selection"``): ``ceil(factor · k)`` sampled, the
      first ``k`` to finish kept.
    dropout: probability that a sampled client fails during the round (independently).
  """

  kind: str = "wait_for_all"
  seconds: float | None = None
  partial: bool = False
  factor: float = 1.0
  dropout: float = 0.0

  def __post_init__(self):
    if self.kind not in POLICIES:
      raise ValueError(f"round policy kind={self.kind!r}; choose one of {POLICIES}")
    if not 0.0 <= float(self.dropout) < 1.0:
      raise ValueError(f"dropout={self.dropout!r} must be a probability in [0, 1)")
    if self.kind == "deadline" and not (self.seconds is not None and float(self.seconds) > 0
                                        and math.isfinite(float(self.seconds))):
      raise ValueError(f"deadline seconds={self.seconds!r} must be a finite number > 0")
    if self.kind == "over_selection" and not float(self.factor) >= 1.0:
      raise ValueError(f"over-selection factor={self.factor!r} must be >= 1")

  def selected(self, k: int) -> int:
    """How many clients to sample for ``k`` kept ones."""
    return int(math.ceil(self.factor * k - 1e-9)) if self.kind == "over_selection" else int(k)


def wait_for_all(*, dropout: float = 0.0) -> RoundPolicy:
  """The round waits for every sampled client (today's rounds), less random ``dropout``."""
  return RoundPolicy("wait_for_all", dropout=dropout)


def deadline(seconds: float, *, partial: bool = False, dropout: float = 0.0) -> RoundPolicy:
  """Rounds last at most ``seconds``: a client that cannot finish by then drops out, or with
  ``partial`` does as many local steps as fit (FedProx's partial work)."""
  return RoundPolicy("deadline", seconds=seconds, partial=bool(partial), dropout=dropout)


def over_selection(factor: float = 1.3, *, dropout: float = 0.0) -> RoundPolicy:
  """Sample ``ceil(factor · k)`` clients per parent, keep the first ``k`` to finish (Bonawitz et al.
  2019)."""
  return RoundPolicy("over_selection", factor=factor, dropout=dropout)


# ------------------------------------------------------------------------ a round


class Attempt(NamedTuple):
  """What every slot's client manages in its round (:meth:`Systems.attempt`), ``[K]`` each.

  Attributes:
    steps: ``int32`` the local steps it does (partial work lowered; its wanted steps where late).
    dropped: ``bool`` it fails during its work (dropout).
    late: ``bool`` it cannot report within the deadline (and fails at it).
    seconds: ``float`` when it reports (or fails, at the deadline), from its start.
    full: ``float`` what its whole work would take.
  """

  steps: jax.Array
  dropped: jax.Array
  late: jax.Array
  seconds: jax.Array
  full: jax.Array


class RoundOutcome(NamedTuple):
  """What the systems model decided about one round of a tier.

  Attributes:
    valid: ``bool[K]`` the cohort slots kept (``cohort.valid`` for :func:`train_cohort`).
    num_steps: ``int32[C]`` local steps of every client this round (partial work lowered).
    seconds: ``float[]`` simulated duration of the tier's round (the slowest parent).
    stats: round metrics: ``clients_unavailable``, ``clients_dropped`` (sampled, on line, not
      kept: failures, deadline, over-selection), ``clients_partial``, ``round_seconds``.
  """

  valid: jax.Array
  num_steps: jax.Array
  seconds: jax.Array
  stats: dict[str, jax.Array]


def _per_client(name: str, value, num_clients: int) -> jax.Array | None:
  if value is None:
    return None
  arr = np.asarray(value, np.float64)
  if arr.ndim == 0:
    arr = np.full((num_clients,), float(arr))
  if arr.shape != (num_clients,):
    raise ValueError(f"{name} has shape {arr.shape}; give one value or one per client ({num_clients})")
  if np.any(~np.isfinite(arr) | (arr < 0)):
    i = int(np.flatnonzero(~np.isfinite(arr) | (arr < 0))[0])
    raise ValueError(f"{name}[{i}]={float(arr[i])!r} must be a finite number of bytes >= 0")
  return jnp.asarray(arr, _float())


def uplink_bytes(path: UpdatePath | None, params: PyTree) -> jax.Array | None:
  """Bytes a child sends through ``path``'s client transform: the ``uplink_bytes`` statistic
  it reports (:func:`fedtree.toolbox.compression.uplink`) for a zero update shaped like
  ``params`` (one unstacked model), or ``None`` when it reports none (the model is sent as it
  is). Exact for every compressor of :mod:`fedtree.toolbox.compression`, whose sizes follow from
  the shapes and hyperparameters alone; jittable, and under ``jit`` everything but the size is
  dead code."""
  if path is None or path.client is None:
    return None
  size = _client_stats(path, params, jnp.zeros((), jnp.int32)).get("uplink_bytes")
  return None if size is None else jnp.asarray(size, _float())


def client_ops(path: UpdatePath | None, params: PyTree, parents: jax.Array) -> jax.Array | None:
  """``float[K]`` the field elements every slot's client computes for the protocol of ``path``'s
  client transform (the ``secagg_client_ops`` statistic of :func:`fedtree.toolbox.secagg.client`,
  which depends on the slot's parent, ``parents[k]``), or ``None`` when it reports none; jittable,
  everything but the count dead code under ``jit``."""
  if path is None or path.client is None:
    return None
  ops = jax.vmap(lambda g: _client_stats(path, params, g).get("secagg_client_ops"))(parents)
  return None if ops is None else jnp.asarray(ops, _float())


def _client_stats(path: UpdatePath, params: PyTree, parent: jax.Array) -> dict:
  """The statistics ``path``'s client transform reports for a zero update shaped like ``params`` sent to
  ``parent`` (the node state of one parent: what sizes and counts read is the hyperparameters)."""
  assert path.client is not None   # (the callers return None without a client transform)
  state = init_update_state(path, params, 1, 1)
  row = jax.tree.map(lambda a: a[0], state.client)
  zero = jnp.zeros((), jnp.int32)
  ctx = ClientContext(client=zero, parent=parent, weight=jnp.ones((), _float()),
                      node_state=parents_node_state(state, zero))
  _, _, stats = path.client.apply(jax.tree.map(jnp.zeros_like, params), row, jax.random.key(0), ctx)
  return stats


def _links(name: str, value, num_nodes: Sequence[int]) -> list[np.ndarray]:
  """Per-node bandwidths of server levels ``1 .. depth-1`` (``num_nodes[l]`` nodes at level l)."""
  levels = list(range(1, len(num_nodes)))
  if isinstance(value, (int, float, np.floating, np.integer)):
    value = [value] * len(levels)
  value = list(value)
  if len(value) != len(levels):
    raise ValueError(f"{name} has {len(value)} entries; give one number, or one per server level "
                     f"below the root ({len(levels)}: levels {levels})")
  out = []
  for lv, v in zip(levels, value, strict=True):
    arr = np.asarray(v, np.float64)
    arr = np.full((num_nodes[lv],), float(arr)) if arr.ndim == 0 else arr
    if arr.shape != (num_nodes[lv],):
      raise ValueError(f"{name} for level {lv} has shape {arr.shape}; give one number or one per "
                       f"node ({num_nodes[lv]})")
    bad = np.flatnonzero(~(np.isfinite(arr) & (arr > 0)))
    if bad.size:
      raise ValueError(f"{name} of level {lv} node {int(bad[0])}={float(arr[bad[0]])!r} must be a "
                       f"finite number of bytes per second > 0")
    out.append(arr)
  return out


@dataclasses.dataclass(frozen=True, eq=False)
class Systems:
  """A device population and the policy of its rounds.

  Attributes:
    profile: every client's speed and bandwidths.
    policy: the round policy (default :func:`wait_for_all`).
    availability: every client's on-line schedule (``None``: always on line); a sampled client
      that is off line at the start of the round does not take part.
    uplink_bytes: bytes every client sends (one value or ``[C]``; default the model at its dtype).
    downlink_bytes: bytes every client receives (default the model at its dtype).
    level_seconds: fixed seconds a server level adds to a round in which it aggregates (on top
      of its transfers), one value per level ``0 .. depth-2`` or one for all (default 0).
    server_up: upload bandwidth (bytes per second) of every server node below the root, on the
      link to its parent: one number for all, or one entry per level ``1 .. depth-1``, each a
      number or one value per node of that level. ``None``: server transfers take no time.
    server_down: download bandwidth of the same links (default ``server_up``).
    field_ops_per_second: the field elements a client's secure aggregation computes per second
      (its masks expanded from a PRG and its shares: :func:`fedtree.toolbox.secagg.client_ops`),
      added to its work where an update path runs the protocol. The default, 10^8, is a PRG
      expanding 4-byte elements at 400 MB/s, the order of one phone core's AES-CTR throughput.
  """

  profile: DeviceProfile
  policy: RoundPolicy = RoundPolicy()
  availability: Availability | None = None
  uplink_bytes: Any = None
  downlink_bytes: Any = None
  level_seconds: float | Sequence[float] = 0.0
  server_up: Any = None
  server_down: Any = None
  field_ops_per_second: float = 1e8

  def __post_init__(self):
    c = self.profile.num_clients
    rate = self.field_ops_per_second
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
      raise ValueError(f"field_ops_per_second={rate!r} must be a finite number > 0")
    if self.availability is not None and self.availability.num_clients != c:
      raise ValueError(f"availability has {self.availability.num_clients} clients, the device "
                       f"profile {c}")
    object.__setattr__(self, "uplink_bytes", _per_client("uplink_bytes", self.uplink_bytes, c))
    object.__setattr__(self, "downlink_bytes", _per_client("downlink_bytes", self.downlink_bytes, c))
    secs = np.atleast_1d(np.asarray(self.level_seconds, np.float64))
    if np.any(~np.isfinite(secs) | (secs < 0)):
      raise ValueError(f"level_seconds={self.level_seconds!r} must be finite and >= 0")

  def check(self, num_clients: int, depth: int = 1) -> None:
    """Raises a ``ValueError`` if the profile is not for ``num_clients`` clients."""
    if self.profile.num_clients != num_clients:
      raise ValueError(f"the device profile has {self.profile.num_clients} clients, the data "
                       f"{num_clients}")
    secs = np.atleast_1d(np.asarray(self.level_seconds, np.float64))
    if secs.size not in (1, max(depth - 1, 1)):
      raise ValueError(f"level_seconds={self.level_seconds!r} needs 1 or {depth - 1} entries")

  @property
  def online(self) -> Callable[[jax.Array], jax.Array] | None:
    """``online(time) -> bool[C]`` (:meth:`Availability.at`), or ``None`` when always on line."""
    return None if self.availability is None else self.availability.at

  def cohort_sizes(self, parent, cohort_size, depth: int = 1) -> tuple[tuple[int, ...], list[int]]:
    """``(keep, sample)``: the clients kept per parent (``cohort_size`` as
    :func:`fedtree.core.sampling.cohort_sampler` reads it) and the clients to sample for them
    (``ceil(factor · k)`` at most the group under over-selection), after :meth:`check`."""
    from fedtree.core.sampling import cohort_sampler

    parent = np.asarray(parent)
    self.check(parent.shape[0], depth)
    keep = cohort_sampler(parent, cohort_size, chunk_size=None).sizes
    groups = np.bincount(parent, minlength=len(keep))
    return keep, [min(self.policy.selected(k), int(n)) for k, n in zip(keep, groups, strict=True)]

  def level_time(self, level: int) -> float:
    """Fixed seconds server level ``level`` adds to a round in which it aggregates."""
    secs = np.atleast_1d(np.asarray(self.level_seconds, np.float64))
    return float(secs[0] if secs.size == 1 else secs[level])

  def server_links(self, num_nodes: Sequence[int]) -> tuple[tuple[jax.Array, jax.Array] | None, ...] | None:
    """Every server level's ``(up, down)`` bandwidths per node, ``float[N_l]`` at index ``l``
    (``None`` at the root), for a tree with ``num_nodes[l]`` nodes at server level ``l``
    (``0 .. depth-1``); ``None`` when :attr:`server_up` is not set.

    Raises:
      ValueError: a bandwidth that is not finite and positive, or entries that do not match
        the levels or their nodes (naming them).
    """
    if self.server_up is None:
      if self.server_down is not None:
        raise ValueError("server_down needs server_up (the links' upload bandwidths)")
      return None
    up = _links("server_up", self.server_up, num_nodes)
    down = up if self.server_down is None else _links("server_down", self.server_down, num_nodes)
    return (None,) + tuple((jnp.asarray(u, _float()), jnp.asarray(d, _float()))
                           for u, d in zip(up, down, strict=True))

  def aggregation_seconds(self, level: int, links, uplink_bytes, downlink_bytes) -> jax.Array:
    """``float[]`` seconds server level ``level`` adds to a round in which it aggregates: its
    fixed :meth:`level_time`, plus (with ``links`` from :meth:`server_links`) the slowest of its
    children (the nodes of level ``level + 1``) sending ``uplink_bytes`` and receiving
    ``downlink_bytes`` (scalars or one per child) over their own links."""
    fixed = jnp.asarray(self.level_time(level), _float())
    if links is None:
      return fixed
    up, down = links[level + 1]
    up_b, down_b = jnp.asarray(uplink_bytes, _float()), jnp.asarray(downlink_bytes, _float())
    return fixed + jnp.max(up_b / up + down_b / down)

  def client_seconds(self, clients: jax.Array, steps: jax.Array, model_size: float, *,
                     uplink_bytes=None, downlink_bytes=None) -> jax.Array:
    """``float[K]`` simulated seconds of ``clients`` doing ``steps`` local steps:
    download, compute, upload (bytes as in :meth:`round`)."""
    comm = self._comm(clients, model_size, uplink_bytes, downlink_bytes)
    return comm + steps / jnp.take(self.profile.speed, clients)

  def _comm(self, clients: jax.Array, model_size: float, uplink_bytes=None, downlink_bytes=None) -> jax.Array:
    def size(own, reported):
      if own is not None:
        return jnp.take(own, clients)
      return jnp.asarray(model_size, _float()) if reported is None else jnp.asarray(reported, _float())
    up, down = size(self.uplink_bytes, uplink_bytes), size(self.downlink_bytes, downlink_bytes)
    return down / jnp.take(self.profile.down, clients) + up / jnp.take(self.profile.up, clients)

  def attempt(self, want: jax.Array, speed: jax.Array, comm: jax.Array, key: jax.Array) -> Attempt:
    """What every slot's client manages of ``want`` local steps at ``speed`` steps per second, after
    ``comm`` seconds of transfers, under the policy's dropout and deadline (jittable; the shared part
    of a synchronous round, :meth:`round`, and of an asynchronous client's work, FedBuff's)."""
    pol = self.policy
    full = comm + want / speed
    dropped = jnp.zeros(want.shape, bool)
    if pol.dropout > 0:   # fails during its work
      dropped = jax.random.uniform(key, want.shape) < pol.dropout
    if pol.kind != "deadline":
      return Attempt(want, dropped, jnp.zeros(want.shape, bool), full, full)
    limit = jnp.asarray(pol.seconds, _float())
    if not pol.partial:   # a client that cannot report in time fails at the deadline ...
      late = full > limit
      return Attempt(want, dropped, late, jnp.where(late, limit, full), full)
    # ... or does the steps that fit
    steps = jnp.minimum(want, jnp.maximum(jnp.floor((limit - comm) * speed), 0).astype(want.dtype))
    late = ((steps < 1) & (want > 0)) | (comm > limit)
    steps = jnp.where(late, want, steps)
    return Attempt(steps, dropped, late, jnp.where(late, limit, comm + steps / speed), full)

  def round(
    self,
    cohort: Cohort,
    num_steps: jax.Array,
    *,
    time: jax.Array,
    model_bytes: float,
    key: jax.Array,
    keep: Sequence[int] | None = None,
    uplink_bytes: jax.Array | float | None = None,
    downlink_bytes: jax.Array | float | None = None,
    field_ops: jax.Array | None = None,
  ) -> RoundOutcome:
    """Applies availability, dropout and the policy to a sampled ``cohort`` (jittable).

    Args:
      cohort: the sampled slots; for over-selection ``ceil(factor · k_g)`` per parent.
      num_steps: ``int32[C]`` the steps every client would do.
      time: ``float[]`` simulated seconds at the start of the round.
      model_bytes: bytes of the model (the default ``uplink_bytes`` / ``downlink_bytes``).
      key: randomness of dropouts.
      keep: ``k_g`` clients kept per parent (over-selection only).
      uplink_bytes: what every slot sends (a scalar or ``[K]``) where the update path compresses it
        (:func:`uplink_bytes`); ``None``: ``model_bytes``. :attr:`Systems.uplink_bytes` wins when set.
      downlink_bytes: what every slot receives (the downlink's ``bytes`` at its parent), likewise.
      field_ops: ``[K]`` field elements every slot's client computes for secure aggregation
      (:func:`client_ops`), at :attr:`field_ops_per_second` besides its transfers and local steps.

    Returns:
      The :class:`RoundOutcome`.
    """
    pol = self.policy
    clients = cohort.clients
    steps = jnp.take(num_steps, clients)
    speed = jnp.take(self.profile.speed, clients)
    comm = self._comm(clients, model_bytes, uplink_bytes, downlink_bytes)
    if field_ops is not None:   # the protocol's compute, before the masked vector goes up
      comm = comm + jnp.asarray(field_ops, _float()) / jnp.asarray(self.field_ops_per_second, _float())
    work = self.attempt(steps, speed, comm, key)
    online = cohort.valid
    if self.availability is not None:
      online = online & jnp.take(self.availability.at(time), clients)
    alive = online & ~work.dropped
    kept = alive & ~work.late
    if pol.kind == "over_selection":
      if keep is None:
        raise ValueError("over_selection needs keep= (the k clients kept per parent)")
      num_parents = len(keep)
      rank_key = jnp.where(alive, work.full, jnp.inf)
      order = jnp.lexsort((jnp.arange(clients.shape[0]), rank_key, cohort.parent))
      sorted_parent = jnp.take(cohort.parent, order)
      first = jnp.searchsorted(sorted_parent, jnp.arange(num_parents), side="left")
      pos_sorted = jnp.arange(clients.shape[0]) - jnp.take(first, sorted_parent)
      pos = jnp.zeros_like(pos_sorted).at[order].set(pos_sorted)
      kept = kept & (pos < jnp.take(jnp.asarray(keep, jnp.int32), cohort.parent))
    new_steps = jnp.where(kept, work.steps, steps)
    kept_seconds = comm + new_steps / speed
    duration = jnp.max(jnp.where(kept, kept_seconds, 0.0), initial=0.0)
    if pol.kind == "deadline":   # someone on line was cut by the deadline: the server waited for it
      limit = jnp.asarray(pol.seconds, _float())
      duration = jnp.where(jnp.any(alive & (work.full > limit)), limit, duration)
    # Per client rows: the steps each one does (only the slots kept matter to train_cohort).
    client_steps = num_steps.at[jnp.where(cohort.valid, clients, num_steps.shape[0])].set(
      new_steps.astype(num_steps.dtype), mode="drop")
    stats = {
      "clients_unavailable": jnp.sum(cohort.valid & ~online, dtype=jnp.int32),
      "clients_dropped": jnp.sum(online & ~kept, dtype=jnp.int32),
      "clients_partial": jnp.sum(kept & (new_steps < steps), dtype=jnp.int32),
      "round_seconds": duration.astype(_float()),
    }
    return RoundOutcome(valid=kept, num_steps=client_steps, seconds=duration.astype(_float()),
                        stats=stats)
