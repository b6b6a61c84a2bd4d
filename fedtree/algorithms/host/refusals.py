"""What a method cannot compose with, declared on its spec as data (:func:`cannot`) and checked once,
before anything is built, in one format: ``"<method>: <what the run asks for>: <why not>"``.

Each composition is named (:data:`COMPOSITIONS`) by what a run gives its host: personal parameters, a
robust (blockwise) aggregator, differential privacy at the clients, a transform of the update path (at
the clients, at their parents, on the downlink), a model with state, server optimizers. The docs'
composition matrix reads the same declarations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from fedtree.core.updates import UpdatePath, per_level_paths
from fedtree.toolbox.privacy import private_stages, private_stages_where

Host = Mapping[str, Any]


def tree_depth(host: Host) -> int:
  """The depth of the host's tree (1: one server over the clients, where ``topology`` is absent)."""
  topology = host.get("topology")
  return 1 if topology is None else topology.depth


def clients_path(host: Host, algorithm: str = "the method") -> UpdatePath | None:
  """The update path of the clients' tier (the last server level)."""
  return per_level_paths(host.get("update_paths"), tree_depth(host), algorithm=algorithm)[-1]


def weighted_messages(name: str, host: Host, weighting: str, sent: str) -> None:
  """For a method whose clients send ``w_i m_i`` beside their update (``sent``: what ``m_i`` is; MimeLite's
  gradients, q-FFL's ``h_k``), weighted as the server's rule needs, and whose messages take the update's
  path (:attr:`fedtree.core.server_rule.Uplink.robust` and ``with_update``): a robust rule, or a client
  or node stage (the messages then travel the path with the update, weighted there again) is refused with
  ``weighting="examples"``."""
  if weighting != "examples":
    return
  path = clients_path(host, name)
  if path is not None and (path.aggregator.blockwise or path.client is not None or path.node is not None):
    raise ValueError(f"{name}: weighting='examples' with an update path's robust aggregator or client or "
                     f"node stage at the clients' tier: the clients' {sent}, sent weighted by their "
                     f"examples, travel the path with the update and would be weighted a second time; use "
                     f"weighting='uniform' (the paper's)")


def _stage_of(host: Host, field: str):
  """One stage (``field`` of :class:`UpdatePath`) of the clients' tier's path, or ``None``."""
  path = clients_path(host)
  return None if path is None else getattr(path, field)


def _personal(host: Host) -> list[str]:
  return ["personal parameters are not supported"] if host.get("personal") is not None else []


def _blockwise(host: Host) -> list[str]:
  paths = host.get("update_paths")
  if paths is None:
    return []
  items = ([("the clients' tier", paths)] if isinstance(paths, UpdatePath) else
           list(paths.items()) if isinstance(paths, Mapping) else list(enumerate(paths)))
  depth = tree_depth(host)
  out = []
  for lv, p in items:
    if p is None or not p.aggregator.blockwise:
      continue
    where = ("at the clients' tier" if isinstance(lv, str) or lv in (-1, depth - 1)
             else f"at level {lv % depth}")   # (a config's paths are keyed from the clients' tier, -1)
    attack = p.aggregator.for_attack
    out.append(f"the omniscient attack {attack!r} {where} is not supported (it rewrites every "
               f"parent's whole cohort in front of a blockwise mean)" if attack is not None else
               f"a robust (blockwise) aggregator {where}")
  return out


def _private_clients(host: Host) -> list[str]:
  return [f"differential privacy ({s!r}) at the clients' tier" for s in private_stages(clients_path(host))]


def _private(host: Host) -> list[str]:
  return [f"privacy stage {s}" for s in private_stages_where(host.get("update_paths"))]


def _stage(field: str, what: str) -> Callable[[Host], list[str]]:
  """The probe of one stage of the clients' tier's update path (``field`` of :class:`UpdatePath`)."""
  def probe(host: Host) -> list[str]:
    stage = _stage_of(host, field)
    return [] if stage is None else [f"the update path's {what} {stage.name!r} at the clients' tier"]
  return probe


def _parts(host: Host, field: str) -> list[str]:
  """The names of the parts of one stage of the clients' tier's path (a chain's, split at ``+``)."""
  stage = _stage_of(host, field)
  return [] if stage is None else stage.name.split("+")


def _beyond_privacy(field: str, what: str) -> Callable[[Host], list[str]]:
  """The probe of the parts of a stage of the clients' tier that are not differential privacy's."""
  def probe(host: Host) -> list[str]:
    return [f"the update path's {what} {p!r} at the clients' tier" for p in _parts(host, field)
            if not p.startswith("dp")]
  return probe


def _local_noise(host: Host) -> list[str]:
  return [f"local differential privacy ({p!r}) at the clients' tier" for p in _parts(host, "client")
          if p.startswith("dp") and p != "dp_clip"]


def _upper_paths(host: Host) -> list[str]:
  paths = per_level_paths(host.get("update_paths"), tree_depth(host), algorithm="the method")[:-1]
  return [f"an update path at level {lv} (above the clients' parents)" for lv, p in enumerate(paths)
          if p is not None and not p.is_default]


def _update_paths(host: Host) -> list[str]:
  paths = host.get("update_paths")
  if isinstance(paths, Mapping):
    items = list(paths.values())
  elif isinstance(paths, (list, tuple)) and not isinstance(paths, UpdatePath):
    items = list(paths)
  else:
    items = [paths]
  if any(p is not None and not p.is_default for p in items):
    return ["update paths (privacy, robust aggregation, compression) act on a model delta"]
  return []


def _server_optimizers(host: Host) -> list[str]:
  given = host.get("server_optimizers") is not None
  return ["server_optimizers has no shared model to step"] if given else []


def _model_state(host: Host) -> list[str]:
  model = host.get("model")
  if model is None or not model.state:
    return []
  return [f"the model keeps state {list(model.state)} (BatchNorm statistics)"]


class Composition(NamedTuple):
  """A composition a run may ask of a host: its name in the docs, what in the host's arguments asks
  for it (``present(host) -> [phrase]``, one phrase naming each instance, ``[]`` if none), and what
  the run can do instead (``remedy(phrase)``, appended to the refusal; ``None``: nothing)."""

  label: str
  present: Callable[[Host], list[str]]
  remedy: Callable[[str], str | None] = lambda phrase: None


def _blockwise_remedy(phrase: str) -> str | None:
  """A robust aggregator's refusal points to the weighted mean the method runs; an attack's has none."""
  return None if phrase.startswith("the omniscient attack") else "use the mean aggregator"


COMPOSITIONS: Mapping[str, Composition] = {
  "personal": Composition("personal parameters", _personal),
  "blockwise": Composition("a robust (blockwise) aggregator", _blockwise, _blockwise_remedy),
  "private_clients": Composition("differential privacy at the clients' tier", _private_clients),
  "private": Composition("differential privacy at any level", _private),
  "client_transform": Composition("a client transform at the clients' tier",
                                 _stage("client", "client transform")),
  "node_transform": Composition("a node transform at the clients' tier", _stage("node", "node transform")),
  "down_transform": Composition("a downlink transform at the clients' tier",
                                 _stage("down", "downlink transform")),
  "client_coding": Composition("a client stage other than differential privacy's (compression, an attack)",
                               _beyond_privacy("client", "client transform")),
  "node_coding": Composition("a node stage other than differential privacy's (secure aggregation)",
                             _beyond_privacy("node", "node transform")),
  "local_noise": Composition("noise at the clients (local differential privacy)", _local_noise),
  "upper_paths": Composition("an update path above the clients' parents", _upper_paths),
  "update_paths": Composition("any update path (privacy, robust aggregation, compression)", _update_paths),
  "server_optimizers": Composition("server optimizers", _server_optimizers),
  "model_state": Composition("a model with state (BatchNorm statistics)", _model_state),
}
"""Every composition a method may declare it cannot run with, by name."""


class Refusal(NamedTuple):
  """A composition a method cannot run with (a key of :data:`COMPOSITIONS`), and why."""

  composition: str
  why: str


def cannot(composition: str, why: str) -> Refusal:
  """Declares that a method cannot run with ``composition`` (a key of :data:`COMPOSITIONS`), for the
  reason ``why``.

  Raises:
    ValueError: an unknown composition, naming the known ones.
  """
  if composition not in COMPOSITIONS:
    raise ValueError(f"cannot({composition!r}, ...): unknown composition; choose one of "
                     f"{sorted(COMPOSITIONS)}")
  return Refusal(composition, why)


def check_refusals(method: str, refusals: Sequence[Refusal], host: Host) -> None:
  """Raises the first declared refusal whose composition ``host`` asks for, as one line:
  ``"<method>: <what>: <why>"``."""
  for refusal in refusals:
    composition = COMPOSITIONS[refusal.composition]
    for phrase in composition.present(host):
      remedy = composition.remedy(phrase)
      raise ValueError(f"{method}: {phrase}: {refusal.why}" + (f"; {remedy}" if remedy else ""))
