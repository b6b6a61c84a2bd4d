"""The attack and robust-aggregation capabilities: the ``attack`` and ``aggregator`` run sections,
Byzantine clients (:mod:`fedtree.toolbox.attacks`) and robust aggregation (:mod:`fedtree.toolbox.robust`)
for every algorithm that takes ``update_paths`` (:data:`ATTACK`, :data:`AGGREGATOR`); the
aggregators and attacks by name (:data:`AGGREGATORS`, :data:`CLIENT_ATTACKS`, :data:`OMNISCIENT`).

``attack``: ``{"name": ..., "fraction": f | "ids": [...], "seed": s, "redraw": bool, ...}``
plus the attack's hyperparameters (``scale``, ``factor``, ``std``; ``z``, ``eps``,
``gamma_init``, ``iterations``, ``perturbation``; ``label_flip``: ``permutation`` or
``target``; ``backdoor``: ``target``, ``poison_fraction`` of each attacker's examples,
``trigger``: ``{"corner": size, "value": v}`` or ``{"features": [flat indices], "value": v}``,
and the seed of the examples drawn). ``level`` (default ``-1``: the clients' parents, so the
clients attack) is the server level whose children attack: at level ``l`` above the clients'
parents the attackers are nodes of level ``l + 1`` (``fraction`` / ``ids`` of those nodes;
e.g. ``level=0``: captured edge servers send their poisoned aggregate to the root); data
attacks are the clients' only. ``seed`` defaults to the config's. The model-poisoning attacks
(:data:`CLIENT_ATTACKS`) transform each attacker's update; the omniscient
ones (:data:`OMNISCIENT`) wrap the level's aggregator (the blockwise mean
when none is chosen), so they need an algorithm that can run a blockwise aggregator. The data
attacks (:data:`DATA_ATTACKS`) poison the attackers' stored training data for the run
(:func:`poisoned_data`, the capability's data hook; a backdoor adds ``attack_success_rate`` to the
evaluation, also per experiment of a sweep); they need a fixed set of attackers (no ``redraw``,
no swept fraction).

``aggregator``: ``{"name": ..., "levels": -1 | [levels], ...}`` plus the aggregator's
hyperparameters (``beta``, ``f``, ``m``, ``weighted``: multi-Krum's kept updates averaged with the
clients' weights as Flower's are, ``iterations``, ``nu``, ``tau``, ``center``,
``trusted``: FLTrust's root-data clients, or ``root_fraction``: that fraction of the clients
drawn by ``seed``); ``levels``
are server levels (``0`` the root, ``-1`` the clients' parents, the default).

Example (a run field of any algorithm with ``update_paths``)::

  config.runs.krum = dict(algorithm="fedavg", attack=dict(name="sign_flip", fraction=0.2),
                          aggregator=dict(name="multi_krum", f=1))
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.updates import Aggregator, ClientTransform
from fedtree.datasets import poison
from fedtree.experiment.capability import Capability, PathParts, RunContext, plain
from fedtree.experiment.fields import field
from fedtree.toolbox import attacks, robust


def weighted_mean() -> Aggregator:
  """The weighted mean, streamed: what every algorithm runs without an ``aggregator`` section, so an
  explicit ``{name: mean}`` asks for exactly that and every method that refuses a robust (blockwise)
  aggregator takes it (an omniscient attack runs in front of its blockwise form,
  :func:`fedtree.toolbox.attacks.omniscient`)."""
  return Aggregator()


AGGREGATORS: dict[str, Callable[..., Aggregator]] = {
  "mean": weighted_mean,
  "median": robust.median,
  "trimmed_mean": robust.trimmed_mean,
  "krum": functools.partial(robust.krum, m=1),
  "multi_krum": robust.krum,
  "bulyan": robust.bulyan,
  "geometric_median": robust.geometric_median,
  "norm_bound": robust.norm_bound,
  "centered_clip": robust.centered_clip,
  "fltrust": robust.fltrust,
}
"""The robust aggregators by name, factories of :mod:`fedtree.toolbox.robust` (``krum`` is
multi-Krum with ``m=1``). A count annotated ``int | jax.Array`` (Krum's and Bulyan's ``f``,
multi-Krum's ``m``) may be a traced value: a sweep axis."""


def robust_aggregator(name: str, **hyper) -> Aggregator:
  """The aggregator ``name`` (a key of :data:`AGGREGATORS`) built with ``hyper``.

  Raises:
    ValueError: an unknown name (the allowed ones listed) or hyperparameters it does not take.
  """
  if name not in AGGREGATORS:
    raise ValueError(f"aggregator {name!r} is unknown; choose one of {sorted(AGGREGATORS)}")
  try:
    return AGGREGATORS[name](**hyper)
  except TypeError as e:
    raise ValueError(f"aggregator {name!r}: bad hyperparameters {sorted(hyper)} ({e})") from e


CLIENT_ATTACKS: dict[str, Callable[..., ClientTransform]] = {
  "sign_flip": attacks.sign_flip, "scaling": attacks.scaling, "gaussian": attacks.gaussian,
}
"""The attacks on one update by name (factories of :mod:`fedtree.toolbox.attacks`, given the
attackers and the section's hyperparameters)."""
OMNISCIENT: dict[str, Callable[..., attacks.OmniscientAttack]] = {
  "alie": attacks.alie, "ipm": attacks.ipm, "min_max": attacks.min_max, "min_sum": attacks.min_sum,
}
"""The omniscient attacks by name (factories of :mod:`fedtree.toolbox.attacks`)."""
DATA_ATTACKS = ("label_flip", "backdoor")
"""The attacks that poison the attackers' training data (:func:`poisoned_data`), not their updates."""
ATTACKS = tuple(sorted(CLIENT_ATTACKS)) + tuple(OMNISCIENT) + DATA_ATTACKS


def _levels(v) -> list[int]:
  if isinstance(v, int):
    return [v]
  if isinstance(v, (list, tuple)) and v and all(isinstance(x, int) for x in v):
    return list(v)
  raise ValueError(f"levels={v!r} must be a server level or a list of them (0 the root, -1 the "
                   f"clients' parents)")


def aggregator_parts(section: dict[str, Any], ctx) -> dict[int, Any]:
  """``{level: PathParts(aggregator=...)}`` of an ``aggregator`` section."""
  section = dict(plain(section))
  name = section.pop("name", None)
  if name is None:
    raise ValueError(f"a 'name' is required; choose one of {sorted(AGGREGATORS)}")
  levels = _levels(section.pop("levels", section.pop("level", -1)))
  if name == "fltrust" and "root_fraction" in section:
    section["trusted"] = root_clients(float(section.pop("root_fraction")), section.pop("seed", None), ctx)
  agg = robust_aggregator(name, **section)
  return {lv: PathParts(aggregator=agg) for lv in levels}


def root_clients(fraction: float, seed: int | None, ctx) -> tuple[int, ...]:
  """FLTrust's root-data clients: ``max(1, round(fraction * clients))`` of them, the last ones of
  the seeded order the attackers are drawn from (:func:`fedtree.toolbox.attacks.attackers`), so an
  ``attack`` section with the same seed (the config's by default) never marks them."""
  if not 0.0 < fraction < 1.0:
    raise ValueError(f"fltrust: root_fraction={fraction!r} must be in (0, 1) (the share of clients whose "
                     f"data is the server's root dataset)")
  if seed is None:
    seed = int(field(ctx.config, "seed")) if ctx is not None and ctx.config is not None else 0
  n = int(ctx.data.num_clients)
  order = np.asarray(attacks.attackers(n, fraction=0.0, seed=int(seed)).order)
  k = max(1, round(fraction * n))
  return tuple(int(c) for c in np.flatnonzero(order >= n - k))


def attack_parts(section: dict[str, Any], ctx) -> dict[int, Any]:
  """``{level: PathParts(...)}`` of an ``attack`` section (``-1`` for clients that attack)."""
  section = dict(plain(section))
  name = section.pop("name", None)
  if name not in ATTACKS:
    raise ValueError(f"attack name={name!r}; choose one of {list(ATTACKS)}")
  level = section.pop("level", -1)
  depth = RunContext.of(ctx).depth
  if isinstance(level, bool) or not isinstance(level, int) or not -depth <= level < depth:
    raise ValueError(f"level={level!r}: the server level whose children attack; choose one of "
                     f"{list(range(depth))} or -1 (the clients' parents: the clients attack)")
  lv = level % depth
  if lv != depth - 1 and name in DATA_ATTACKS:
    raise ValueError(f"attack {name!r} poisons clients' data: its level is -1 (the clients' parents), "
                     f"not {level!r}")
  seed = section.pop("seed", None)
  if seed is None:
    seed = int(field(ctx.config, "seed")) if ctx is not None and ctx.config is not None else 0
  who = {k: section.pop(k) for k in ("fraction", "ids", "redraw") if k in section}
  num = int(ctx.data.num_clients) if lv == depth - 1 else int(ctx.topology.num_nodes(lv + 1))
  mask = attacks.attackers(num, seed=int(seed), **who)
  key = -1 if lv == depth - 1 else lv

  def watch(agg):
    return attacks.watch_kept(agg, mask)

  if name in DATA_ATTACKS:
    if mask.redraw:
      raise ValueError(f"attack {name!r} poisons the attackers' stored data: it cannot redraw them "
                       f"each round")
    if isinstance(who.get("fraction"), jax.core.Tracer):
      raise ValueError(f"attack {name!r}: its fraction cannot be a sweep axis (the attackers' data is "
                       f"poisoned once, before the run); sweep it as separate runs")
    with jax.ensure_compile_time_eval():   # a sweep builds the run inside a trace
      host = attacks.attackers(num, seed=int(seed), **who)
      _data_attack(name, section, ctx.data, host)   # validates; the runner poisons the run's data
    return {key: PathParts(wrap_aggregator=(watch,))}
  if name in CLIENT_ATTACKS:
    try:
      transform = CLIENT_ATTACKS[name](mask, **section)
    except TypeError as e:
      raise ValueError(f"attack {name!r}: bad hyperparameters {sorted(section)} ({e})") from e
    return {key: PathParts(client=(transform,), wrap_aggregator=(watch,))}
  attack = omniscient_attack(name, **section)
  return {key: PathParts(wrap_aggregator=(lambda agg: attacks.omniscient(agg, mask, attack),))}


def omniscient_attack(name: str, **hyper) -> attacks.OmniscientAttack:
  """The omniscient attack ``name`` (a key of :data:`OMNISCIENT`) built with ``hyper``.

  Raises:
    ValueError: an unknown name (the allowed ones listed); a hyperparameter no omniscient attack
      takes (theirs listed), or another one's (``eps`` given to ``alie``: its own listed); the
      factory's own refusals (an unknown ``perturbation``).
  """
  if name not in OMNISCIENT:
    raise ValueError(f"attack={name!r} is not an omniscient attack; choose one of {list(OMNISCIENT)}")
  every = sorted({p for f in OMNISCIENT.values() for p in inspect.signature(f).parameters})
  unknown = set(hyper) - set(every)
  if unknown:
    raise ValueError(f"{name}: unknown hyperparameters {sorted(unknown)}; choose from {every}")
  own = list(inspect.signature(OMNISCIENT[name]).parameters)
  foreign = sorted(set(hyper) - set(own))
  if foreign:
    raise ValueError(f"{name}: {foreign} are other omniscient attacks' hyperparameters; {name} takes "
                     f"{own or 'none'}")
  return OMNISCIENT[name](**hyper)


def _trigger(spec, example_shape) -> poison.Trigger:
  if spec is None or spec == "corner":
    return poison.corner_trigger(example_shape)
  spec = dict(spec)
  if "corner" in spec:
    return poison.corner_trigger(example_shape, size=int(spec["corner"]), value=float(spec.get("value", 1.0)))
  if "features" not in spec:
    raise ValueError(f"trigger={spec!r}: give 'corner' (a square's size) or 'features' (flat indices) "
                     f"and 'value'")
  return poison.Trigger(features=tuple(int(i) for i in spec["features"]), value=spec.get("value", 1.0))


def _data_attack(name: str, section: dict[str, Any], data, mask: attacks.Attackers):
  """``(poisoned data, backdoor (trigger, target) or None)``."""
  bad = np.asarray(mask.mask(jnp.arange(int(data.num_clients)), None))
  section = dict(section)
  if name == "label_flip":
    known = {"permutation", "target"}
    if set(section) - known:
      raise ValueError(f"attack 'label_flip': unknown hyperparameters {sorted(set(section) - known)}; "
                       f"choose from {sorted(known)}")
    return poison.flip_labels(data, bad, **section), None
  known = {"target", "poison_fraction", "trigger", "seed"}
  if set(section) - known or "target" not in section:
    raise ValueError(f"attack 'backdoor': hyperparameters {sorted(section)}; it needs 'target' and takes "
                     f"{sorted(known)}")
  trig = _trigger(section.pop("trigger", None), data.example_shape)
  target = int(section.pop("target"))
  if "poison_fraction" in section:
    section["fraction"] = section.pop("poison_fraction")
  return (poison.add_backdoor(data, bad, trigger=trig, target=target, **section), (trig, target))


def poisoned_data(section, ctx):
  """``(the run's training data, {"attack_success_rate": its backdoor test split} or {})``:
  ``ctx.data`` unless the ``attack`` section poisons data (``label_flip``, ``backdoor``); the
  attack capability's data hook."""
  section = plain(section)
  if not section or section.get("name") not in DATA_ATTACKS:
    return ctx.data, {}
  section = dict(section)
  name = section.pop("name")
  section.pop("level", None)
  seed = section.pop("seed", None)
  seed = int(field(ctx.config, "seed")) if seed is None else int(seed)
  who = {k: section.pop(k) for k in ("fraction", "ids") if k in section}
  mask = attacks.attackers(int(ctx.data.num_clients), seed=seed, **who)
  data, backdoor = _data_attack(name, section, ctx.data, mask)
  if backdoor is None:
    return data, {}
  split = poison.backdoor_test_split(data, trigger=backdoor[0], target=backdoor[1])
  return data, {"attack_success_rate": split}


def _factory_hint(factory, name: str):
  try:
    function = getattr(factory, "func", factory)   # (a partial: its function)
    return typing.get_type_hints(function).get(name, None)
  except Exception:  # noqa: BLE001  (an annotation that does not resolve: unknown)
    return None


def aggregator_hint(path: Sequence[str], section):
  """The annotation of an ``aggregator`` section's field ``path`` in the factory its ``name``
  names (Krum's ``f`` and ``m`` may be traced: sweep axes)."""
  factory = AGGREGATORS.get(plain(section).get("name"), None)
  return None if factory is None or len(path) != 1 else _factory_hint(factory, path[0])


ATTACK = Capability(name="attack", about="Byzantine clients: poisoned updates or data",
                    parts=attack_parts, data=poisoned_data)
"""The ``attack`` section (see the module docstring)."""

AGGREGATOR = Capability(name="aggregator", about="robust aggregation", parts=aggregator_parts,
                        hint=aggregator_hint)
"""The ``aggregator`` section (see the module docstring)."""
