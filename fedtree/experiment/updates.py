"""Run config sections -> the update paths of an algorithm (:mod:`fedtree.core.updates`).

A run of any algorithm whose factory takes ``update_paths`` may carry one config section per
capability that acts on the updates between a client's training and its parent's server
optimizer. Each section is turned by its converter (:data:`SECTIONS`) into
:class:`PathParts` per server level (``{level: parts}``, levels ``0..depth-1`` or negative from
the clients' parents: ``-1``), and the parts of all sections are composed into one
:class:`~fedtree.core.updates.UpdatePath` per level, in the fixed order of :data:`SECTIONS`:
client transforms chained in that order (e.g. an attacker replaces its update before a
compressor encodes it), node transforms likewise, at most one aggregator and one downlink
transform per level (two are refused naming both sections).

Adding a capability: a converter ``convert(section, ctx) -> {level: PathParts}`` and one entry
in :data:`SECTIONS`; the registry then accepts the section as a field of every run whose
algorithm takes ``update_paths``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fedtree.core.updates import (
  Aggregator,
  UpdatePath,
  chain,
  chain_nodes,
)
from fedtree.experiment import robust as _robust
from fedtree.experiment.path_parts import PathParts

Converter = Callable[[Any, Any], Mapping[int, PathParts]]

SECTIONS: dict[str, Converter] = {
  "attack": _robust.attack_section,
  "aggregator": _robust.aggregator_section,
}
"""``{section name: converter}`` in the order their stages compose (filled by the capability
modules of the experiment layer, listed explicitly here as they land)."""


def _plain(section) -> Any:
  return section.to_dict() if hasattr(section, "to_dict") else section


def compose(parts_by_section: Mapping[str, Mapping[int, PathParts]]) -> dict[int, UpdatePath]:
  """One :class:`UpdatePath` per level from every section's parts (sections in
  :data:`SECTIONS` order; unknown section names first, in the given order)."""
  order = [s for s in parts_by_section if s not in SECTIONS] + [s for s in SECTIONS if s in parts_by_section]
  levels: dict[int, list[tuple[str, PathParts]]] = {}
  for name in order:
    for lv, parts in parts_by_section[name].items():
      levels.setdefault(int(lv), []).append((name, parts))
  out = {}
  for lv, items in levels.items():
    aggs = [(n, p.aggregator) for n, p in items if p.aggregator is not None]
    if len(aggs) > 1:
      raise ValueError(f"level {lv}: sections {[n for n, _ in aggs]} each set an aggregator "
                       f"({[a.name for _, a in aggs]}); a level aggregates one way")
    downs = [(n, p.down) for n, p in items if p.down is not None]
    if len(downs) > 1:
      raise ValueError(f"level {lv}: sections {[n for n, _ in downs]} each set a downlink transform")
    aggregator = aggs[0][1] if aggs else Aggregator()
    for wrap in [w for _, p in items for w in p.wrap_aggregator]:
      aggregator = wrap(aggregator)
    out[lv] = UpdatePath(
      client=chain(*[t for _, p in items for t in p.client]),
      aggregator=aggregator,
      node=chain_nodes(*[t for _, p in items for t in p.node]),
      down=downs[0][1] if downs else None,
    )
  return out


def update_paths_from_config(values: Mapping[str, Any], ctx) -> dict[str, Any]:
  """The ``update_paths`` keyword argument of a factory from a run's sections ``values``
  (``{section: config}``; absent or empty sections contribute nothing)."""
  parts = {}
  for name, section in values.items():
    if name not in SECTIONS:
      raise ValueError(f"unknown update-path section {name!r}; choose one of {sorted(SECTIONS)}")
    section = _plain(section)
    if section is None or section == {}:
      continue
    try:
      parts[name] = SECTIONS[name](section, ctx)
    except ValueError as e:
      raise ValueError(f"{name}: {e}") from e
  if not parts:
    return {}
  return {"update_paths": compose(parts)}
