"""The toolbox's capabilities as runs use them: one :class:`~fedtree.experiment.capability.Capability`
each, listed once (:data:`CAPABILITIES`).

* :mod:`~fedtree.experiment.capabilities.robust`: ``attack`` (Byzantine clients: poisoned updates
  or data) and ``aggregator`` (robust aggregation);
* :mod:`~fedtree.experiment.capabilities.privacy`: ``privacy`` (clipping, noise, the ε spent);
* :mod:`~fedtree.experiment.capabilities.compression`: ``compression`` (compressed edges);
* :mod:`~fedtree.experiment.capabilities.secure`: ``secure`` (secure aggregation, distributed DP);
* :mod:`~fedtree.experiment.capabilities.systems`: ``systems`` (devices, availability, deadlines);
* :mod:`~fedtree.experiment.capabilities.mobility`: ``mobility`` (clients moving between edges, edge
  failures, association policies);
* :mod:`~fedtree.experiment.capabilities.adapters`: ``adapters`` (LoRA on a frozen base).

A config may add its own (``config.capabilities = ("my_module:my_capability",)``, each a
:class:`~fedtree.experiment.capability.Capability` importable by that path: :func:`of_config`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from fedtree.experiment.capabilities import adapters, compression, mobility, privacy, robust, secure, systems
from fedtree.experiment.capability import Capability, PathParts, RunContext, compose, plain

CAPABILITIES: Mapping[str, Capability] = {c.name: c for c in (
  robust.ATTACK, privacy.CAPABILITY, compression.CAPABILITY, robust.AGGREGATOR, secure.CAPABILITY,
  systems.CAPABILITY, mobility.CAPABILITY, adapters.CAPABILITY,
)}
"""Every capability by its section's name, in the order their update-path stages compose (an
attacker replaces its update before it is clipped or compressed; the defence aggregates last; a
secure sum encodes what the others made of the update, and refuses a defence that reads it)."""


def load(path: str) -> Any:
  """The object at ``"module:attribute"`` (``"my_methods.scaffold:scaffold"``), imported from
  ``sys.path`` (the working directory under ``python -m fedtree.main``)."""
  module, sep, attribute = str(path).partition(":")
  if not sep or not module or not attribute:
    raise ValueError(f"{path!r} is not 'module:attribute' (e.g. 'my_methods.scaffold:scaffold')")
  try:
    obj = importlib.import_module(module)
  except ImportError as e:
    raise ValueError(f"{path!r}: module {module!r} cannot be imported ({e}); is its folder on the path "
                     f"(python -m fedtree.main adds the working directory)?") from e
  for part in attribute.split("."):
    if not hasattr(obj, part):
      raise ValueError(f"{path!r}: module {module!r} has no attribute {attribute!r}")
    obj = getattr(obj, part)
  return obj


def of_config(config) -> Mapping[str, Capability]:
  """:data:`CAPABILITIES` and the config's own (``config.capabilities``: ``"module:attribute"``
  paths of :class:`~fedtree.experiment.capability.Capability` objects, their stages composed
  before the built-in ones')."""
  paths = config.get("capabilities", None) if config is not None else None
  if not paths:
    return CAPABILITIES
  own = {}
  for path in ([paths] if isinstance(paths, str) else list(paths)):
    cap = load(path)
    if not isinstance(cap, Capability):
      raise ValueError(f"config.capabilities: {path!r} is a {type(cap).__name__}, not a "
                       f"fedtree.experiment.capability.Capability")
    if cap.name in CAPABILITIES or cap.name in own:
      raise ValueError(f"config.capabilities: {path!r} names section {cap.name!r}, which another "
                       f"capability has; choose another name")
    own[cap.name] = cap
  return {**own, **CAPABILITIES}


def sections(run, capabilities: Mapping[str, Capability] = CAPABILITIES) -> list[tuple[Capability, Any]]:
  """``[(capability, its section)]`` of every capability run ``run`` sets, in :data:`CAPABILITIES`
  order. A section absent or ``None`` sets nothing; an empty one (``{}``) sets nothing for a
  capability that only contributes update-path stages, and is the capability's defaults for one
  that fills a factory argument or changes the model (``systems={}``: every client always
  available, at the default speeds; ``adapters={}``: LoRA's default rank)."""
  out = []
  for name, cap in capabilities.items():
    section = plain(run.get(name, None)) if run is not None and hasattr(run, "get") else None
    if section is None or (section == {} and cap.argument is None and cap.wrap is None):
      continue
    out.append((cap, section))
  return out


def update_paths_from_config(values: Mapping[str, Any], ctx) -> dict[str, Any]:
  """The ``update_paths`` keyword argument of a factory from sections ``values`` (``{section:
  config}`` of capabilities with update-path parts; absent or empty sections contribute nothing),
  converted on ``ctx`` (a run's :class:`~fedtree.experiment.capability.RunContext`, or a shared
  context: its tree, no run)."""
  parts: dict[str, Mapping[int, PathParts]] = {}
  ctx = RunContext.of(ctx) if ctx is not None else None
  for name, section in values.items():
    cap = CAPABILITIES.get(name)
    if cap is None or cap.parts is None:
      raise ValueError(f"unknown update-path section {name!r}; choose one of "
                       f"{sorted(n for n, c in CAPABILITIES.items() if c.parts is not None)}")
    section = plain(section)
    if section is None or section == {}:
      continue
    try:
      parts[name] = cap.parts(section, ctx)
    except ValueError as e:
      raise ValueError(f"{name}: {e}") from e
  return {"update_paths": compose(parts, list(CAPABILITIES))} if parts else {}


__all__ = ["CAPABILITIES", "load", "of_config", "sections", "update_paths_from_config"]
