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

from fedtree.core import compression
from fedtree.core.updates import (
  Aggregator,
  UpdatePath,
  chain,
  chain_nodes,
)
from fedtree.experiment import privacy
from fedtree.experiment import robust as _robust
from fedtree.experiment.path_parts import PathParts
from fedtree.experiment.run_context import RunContext  # noqa: F401  (the converters' ctx; re-exported)

Converter = Callable[[Any, Any], Mapping[int, PathParts]]

def _privacy(section, ctx) -> Mapping[int, PathParts]:
  return {lv: PathParts(**parts) for lv, parts in privacy.convert(section, ctx).items()}


# ------------------------------------------------------------------------ compression
_EDGE_KEYS = {"uplink", "downlink"}


def _compressor_of(spec: Mapping[str, Any], where: str):
  spec = dict(_plain(spec))
  if "name" not in spec:
    raise ValueError(f"{where} needs a 'name'; choose one of {list(compression.NAMES)}")
  name = spec.pop("name")
  extra = {k: spec.pop(k) for k in ("error_feedback", "vote") if k in spec}
  allowed = {"bits", "k", "fraction"}
  if set(spec) - allowed:
    raise ValueError(f"{where}: unknown field(s) {sorted(set(spec) - allowed)}; choose from "
                     f"{sorted(allowed | {'name', 'error_feedback', 'vote'})}")
  return compression.compressor(name, **spec), extra


def convert_compression(section: Mapping[str, Any], ctx) -> dict[int, PathParts]:
  """The ``compression`` section: ``{uplink: {name, bits | k | fraction, error_feedback, vote},
  downlink: {name, bits}, level: -1}`` compresses what the children of server level ``level``
  (default ``-1``, the clients' parents) send up and what that level sends down; several levels
  as ``{levels: {"-1": {uplink: ..., downlink: ...}, "0": {...}}}`` (a level absent is not
  compressed). ``vote: step`` (``sign`` uplinks) makes the parents take signSGD's majority vote.
  """
  section = dict(_plain(section))
  if "levels" in section:
    if set(section) != {"levels"}:
      raise ValueError(f"give either 'levels' or uplink/downlink/level, not both (got {sorted(section)})")
    items = [(int(lv), dict(_plain(v))) for lv, v in dict(_plain(section["levels"])).items()]
  else:
    items = [(int(section.pop("level", -1)), section)]
  out = {}
  for lv, edges in items:
    if not edges or set(edges) - _EDGE_KEYS:
      raise ValueError(f"level {lv}: fields {sorted(edges)}; choose from {sorted(_EDGE_KEYS)} (and 'level')")
    parts = PathParts()
    if edges.get("uplink"):
      c, extra = _compressor_of(edges["uplink"], f"level {lv} uplink")
      node = ()
      if "vote" in extra:
        if c.name != "sign":
          raise ValueError(f"level {lv} uplink: vote is signSGD's majority vote; it needs name='sign' "
                           f"(got {c.name!r})")
        node = (compression.majority_vote(step=extra["vote"]),)
      ef = bool(extra.get("error_feedback"))
      parts = parts._replace(client=(compression.uplink(c, error_feedback=ef),), node=node)
    if edges.get("downlink"):
      c, extra = _compressor_of(edges["downlink"], f"level {lv} downlink")
      if extra:
        raise ValueError(f"level {lv} downlink: {sorted(extra)} apply to the uplink only")
      parts = parts._replace(down=compression.downlink(c))
    out[lv] = parts
  return out


SECTIONS: dict[str, Converter] = {
  "attack": _robust.attack_section,
  "privacy": _privacy,
  "compression": convert_compression,
  "aggregator": _robust.aggregator_section,
}
"""``{section name: converter}`` in the order their stages compose (filled by the capability
modules of the experiment layer, listed explicitly here as they land)."""

TRACED_INTS: dict[str, tuple[str, ...]] = {"compression": ("bits",), "aggregator": ("f", "m")}
"""Integer fields of a section that may be sweep axes: their builders take them traced (QSGD's
and the rotated quantizer's ``bits``; (multi-)Krum's and Bulyan's ``f`` and ``m``, used as
counts in masks); every other int of a section changes shapes or host-side accounting."""


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
