"""The systems capability: a run's ``systems`` section -> a :class:`fedtree.toolbox.systems.Systems`
(devices, availability, round policy), the argument of every algorithm whose factory takes
``systems`` (HierFAVG and the methods over it, FedBuff; the registry refuses the section elsewhere,
naming the algorithms that take it).

The section::

  systems = {
    "seed": 0,                       # the profile's randomness (default: the config's seed)
    "speed": {"dist": "lognormal", "median": 2.0, "sigma": 1.0},   # local steps / s, or a number
    "up": 1e6, "down": 4e6,          # bytes / s: numbers or distributions as "speed"
    "capacity_trace": "path.pkl",    # FedScale's device capacity (replaces speed, up, down)
    "availability": {"kind": "diurnal", "online_hours": 8.0, "peak_hour": 22.0, "spread_hours": 4.0},
                                     # or {"kind": "trace", "path": ...} (FedScale), or absent: always
    "policy": {"kind": "deadline", "seconds": 60.0, "partial": False, "dropout": 0.1},
                                     # or wait_for_all, or over_selection (factor)
    "uplink_bytes": None, "downlink_bytes": None,   # default: the model, or the update path's
                                     # compressed sizes
    "server_up": None, "server_down": None, # bytes / s of every server node's link to its parent: a
                                     # number, or one entry per level below the root (a number or a list
                                     # over its nodes); None: server transfers are free
    "level_seconds": 0.0,            # fixed seconds a server level adds when it aggregates
    "field_ops_per_second": 1e8,     # a client's secure-aggregation compute rate (config.secure)
  }
"""

from __future__ import annotations

from typing import Any

import jax

from fedtree.datasets.device_traces import availability_trace, device_capacity_profile
from fedtree.experiment.capability import Capability
from fedtree.experiment.fields import field
from fedtree.toolbox import systems as sysm

FIELDS = ("seed", "speed", "up", "down", "capacity_trace", "availability", "policy", "uplink_bytes",
          "downlink_bytes", "level_seconds", "server_up", "server_down", "field_ops_per_second")
DISTRIBUTIONS = {"lognormal": sysm.lognormal, "pareto": sysm.pareto, "uniform": sysm.uniform,
                 "constant": sysm.constant}
AVAILABILITY = ("diurnal", "trace", "always")
POLICY_FIELDS = {"wait_for_all": ("dropout",), "deadline": ("seconds", "partial", "dropout"),
                 "over_selection": ("factor", "dropout")}


def _plain(v):
  return v.to_dict() if hasattr(v, "to_dict") else v


def _unknown(what: str, given, allowed) -> None:
  bad = sorted(set(given) - set(allowed))
  if bad:
    raise ValueError(f"{what}: unknown field {bad[0]!r}; allowed fields: {sorted(allowed)}")


def distribution(value, what: str) -> sysm.Distribution:
  """A number (constant) or ``{"dist": name, **parameters}``."""
  value = _plain(value)
  if not isinstance(value, dict):
    return sysm.constant(float(value))
  value = dict(value)
  name = value.pop("dist", None)
  if name not in DISTRIBUTIONS:
    raise ValueError(f"{what}.dist={name!r}; choose one of {sorted(DISTRIBUTIONS)}")
  return DISTRIBUTIONS[name](**value)


def systems_from_config(section, ctx) -> sysm.Systems:
  """The :class:`~fedtree.toolbox.systems.Systems` of a run's ``systems`` section (see the module)."""
  cfg = dict(_plain(section))
  _unknown("systems", cfg, FIELDS)
  num = ctx.data.num_clients
  with jax.ensure_compile_time_eval():   # concrete draws, also when a sweep builds the run inside its trace
    return _systems(cfg, ctx, num)


def _systems(cfg: dict, ctx, num: int) -> sysm.Systems:
  key = jax.random.key(int(cfg.get("seed", field(ctx.config, "seed"))))
  k_profile, k_avail = jax.random.split(key)
  if "capacity_trace" in cfg:
    clash = [f for f in ("speed", "up", "down") if f in cfg]
    if clash:
      raise ValueError(f"systems: capacity_trace replaces {clash}; give one or the other")
    profile = device_capacity_profile(cfg["capacity_trace"], num, batch_size=ctx.schedule.batch_size)
  else:
    profile = sysm.device_profile(
      k_profile, num, speed=distribution(cfg.get("speed", 1.0), "systems.speed"),
      up=distribution(cfg.get("up", 1e6), "systems.up"),
      down=None if "down" not in cfg else distribution(cfg["down"], "systems.down"))
  avail = _plain(cfg.get("availability", None))
  availability = None
  if avail is not None:
    avail = dict(avail)
    kind = avail.pop("kind", None)
    if kind not in AVAILABILITY:
      raise ValueError(f"systems.availability.kind={kind!r}; choose one of {AVAILABILITY}")
    if kind == "diurnal":
      if "online_hours" in avail and not isinstance(avail["online_hours"], (int, float)):
        avail["online_hours"] = distribution(avail["online_hours"], "systems.availability.online_hours")
      _unknown("systems.availability", avail, ("online_hours", "peak_hour", "spread_hours", "day_seconds"))
      availability = sysm.diurnal_availability(k_avail, num, **avail)
    elif kind == "trace":
      _unknown("systems.availability", avail, ("path",))
      availability = availability_trace(avail["path"], num)
  policy: Any = dict(_plain(cfg.get("policy", None)) or {"kind": "wait_for_all"})
  kind = policy.pop("kind", None)
  if kind not in POLICY_FIELDS:
    raise ValueError(f"systems.policy.kind={kind!r}; choose one of {sorted(POLICY_FIELDS)}")
  _unknown(f"systems.policy ({kind})", policy, POLICY_FIELDS[kind])
  if kind == "deadline":
    if "seconds" not in policy:
      raise ValueError("systems.policy: a deadline needs seconds")
    policy = sysm.deadline(policy.pop("seconds"), **policy)
  else:
    policy = sysm.RoundPolicy(kind, **policy)
  return sysm.Systems(profile=profile, policy=policy, availability=availability,
                      uplink_bytes=cfg.get("uplink_bytes", None),
                      downlink_bytes=cfg.get("downlink_bytes", None),
                      level_seconds=cfg.get("level_seconds", 0.0),
                      server_up=_plain(cfg.get("server_up", None)),
                      server_down=_plain(cfg.get("server_down", None)),
                      field_ops_per_second=float(cfg.get("field_ops_per_second", 1e8)))


CAPABILITY = Capability(name="systems", about="device speeds, availability, round policies",
                        argument="systems", value=systems_from_config)
"""The ``systems`` section (see the module docstring)."""
