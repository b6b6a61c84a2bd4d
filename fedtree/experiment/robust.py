"""The ``attack`` and ``aggregator`` run config sections (:data:`fedtree.experiment.updates.SECTIONS`):
Byzantine clients (:mod:`fedtree.core.attacks`) and robust aggregation
(:mod:`fedtree.core.robust`) for every algorithm that takes ``update_paths``.

``attack``: ``{"name": ..., "fraction": f | "ids": [...], "seed": s, "redraw": bool, ...}``
plus the attack's hyperparameters (``scale``, ``factor``, ``std``; ``z``, ``eps``,
``gamma_init``, ``iterations``, ``perturbation``). The attackers are clients (level ``-1``, the
clients' parents aggregate them); ``seed`` defaults to the config's. The model-poisoning attacks
(:data:`~fedtree.core.attacks.CLIENT_ATTACKS`) transform each attacker's update; the omniscient
ones (:data:`~fedtree.core.attacks.OMNISCIENT`) wrap the level's aggregator (the blockwise mean
when none is chosen), so they need an algorithm that can run a blockwise aggregator.

``aggregator``: ``{"name": ..., "levels": -1 | [levels], ...}`` plus the aggregator's
hyperparameters (``beta``, ``f``, ``m``, ``iterations``, ``nu``, ``tau``, ``center``); ``levels``
are server levels (``0`` the root, ``-1`` the clients' parents, the default).

Example (a run field of any algorithm with ``update_paths``)::

  config.runs.krum = dict(algorithm="fedavg", attack=dict(name="sign_flip", fraction=0.2),
                          aggregator=dict(name="multi_krum", f=1))
"""

from __future__ import annotations

from typing import Any

from fedtree.core import attacks, robust
from fedtree.experiment.path_parts import PathParts

ATTACKS = tuple(sorted(attacks.CLIENT_ATTACKS)) + attacks.OMNISCIENT


def _levels(v) -> list[int]:
  if isinstance(v, int):
    return [v]
  if isinstance(v, (list, tuple)) and v and all(isinstance(x, int) for x in v):
    return list(v)
  raise ValueError(f"levels={v!r} must be a server level or a list of them (0 the root, -1 the "
                   f"clients' parents)")


def aggregator_section(section: dict[str, Any], ctx) -> dict[int, Any]:
  """``{level: PathParts(aggregator=...)}`` of an ``aggregator`` section."""
  section = dict(section)
  name = section.pop("name", None)
  if name is None:
    raise ValueError(f"a 'name' is required; choose one of {sorted(robust.AGGREGATORS)}")
  levels = _levels(section.pop("levels", section.pop("level", -1)))
  agg = robust.robust_aggregator(name, **section)
  return {lv: PathParts(aggregator=agg) for lv in levels}


def attack_section(section: dict[str, Any], ctx) -> dict[int, Any]:
  """``{-1: PathParts(...)}`` of an ``attack`` section."""
  section = dict(section)
  name = section.pop("name", None)
  if name not in ATTACKS:
    raise ValueError(f"attack name={name!r}; choose one of {list(ATTACKS)}")
  level = section.pop("level", -1)
  if level != -1:
    raise ValueError(f"level={level!r}: the attackers are clients (level -1, the clients' parents "
                     f"aggregate them); attacks on server nodes are not configurable")
  seed = section.pop("seed", None)
  if seed is None:
    seed = int(ctx.config.get("seed", 0)) if ctx is not None and ctx.config is not None else 0
  who = {k: section.pop(k) for k in ("fraction", "ids", "redraw") if k in section}
  mask = attacks.attackers(int(ctx.data.num_clients), seed=int(seed), **who)
  if name in attacks.CLIENT_ATTACKS:
    try:
      transform = attacks.CLIENT_ATTACKS[name](mask, **section)
    except TypeError as e:
      raise ValueError(f"attack {name!r}: bad hyperparameters {sorted(section)} ({e})") from e
    return {-1: PathParts(client=(transform,))}
  attacks.omniscient(robust.mean(), mask, attack=name, **section)   # validates the hyperparameters
  return {-1: PathParts(
    wrap_aggregator=(lambda agg: attacks.omniscient(agg, mask, attack=name, **section),))}
