"""The compression capability: a run's ``compression`` section, lossy encodings of what travels
along an edge of the run's tree (:mod:`fedtree.toolbox.compression`), with their sizes in the round's
byte counts (:data:`CAPABILITY`); the compressors by name (:data:`COMPRESSORS`).

Example (a run field of any algorithm with ``update_paths``)::

  config.runs.qsgd = dict(algorithm="hierfavg", compression=dict(
    uplink=dict(name="qsgd", bits=4, error_feedback=True), downlink=dict(name="fp16")))
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fedtree.experiment.capability import Capability, PathParts, plain
from fedtree.toolbox import compression

_EDGE_KEYS = {"uplink", "downlink"}

COMPRESSORS: dict[str, Callable[..., compression.Compressor]] = {
  "none": compression.identity, "fp16": compression.fp16, "bf16": compression.bf16,
  "qsgd": compression.qsgd, "rotated": compression.rotated, "drive": compression.drive,
  "topk": compression.topk, "randk": compression.randk, "sign": compression.sign,
  "scaled_sign": compression.scaled_sign,
}
"""The compressors a section names, each a factory of :mod:`fedtree.toolbox.compression` (the
names its table gives); their hyperparameters are the factories' (``bits``, ``k``, ``fraction``)."""


def _takers(field: str) -> list[str]:
  return [n for n, f in COMPRESSORS.items() if field in inspect.signature(f).parameters]


def compressor(name: str, **hyper) -> compression.Compressor:
  """The compressor ``name`` (a key of :data:`COMPRESSORS`) built with ``hyper``.

  Raises:
    ValueError: an unknown name (the allowed ones listed), a hyperparameter the compressor does
      not take (those that do named) or one it needs missing; the factory's own refusals.
  """
  if name not in COMPRESSORS:
    raise ValueError(f"compressor name={name!r} is unknown; choose one of {list(COMPRESSORS)}")
  params = inspect.signature(COMPRESSORS[name]).parameters
  for field, value in hyper.items():
    if field not in params:
      takers = _takers(field)
      if not takers:
        raise ValueError(f"compressor {name!r}: unknown hyperparameter {field}={value!r}; it takes "
                         f"{sorted(params) or 'none'}")
      raise ValueError(f"compressor {name!r} takes no {field} (got {field}={value!r}); only "
                       f"{' and '.join(repr(t) for t in takers)} do")
  missing = [p.name for p in params.values() if p.default is inspect.Parameter.empty and p.name not in hyper]
  if missing:
    raise ValueError(f"compressor {name!r} needs {' and '.join(missing)}")
  return COMPRESSORS[name](**hyper)


def _compressor_of(spec: Mapping[str, Any], where: str):
  spec = dict(plain(spec))
  if "name" not in spec:
    raise ValueError(f"{where} needs a 'name'; choose one of {list(COMPRESSORS)}")
  name = spec.pop("name")
  extra = {k: spec.pop(k) for k in ("error_feedback", "vote") if k in spec}
  allowed = {"bits", "k", "fraction"}
  if set(spec) - allowed:
    raise ValueError(f"{where}: unknown field(s) {sorted(set(spec) - allowed)}; choose from "
                     f"{sorted(allowed | {'name', 'error_feedback', 'vote'})}")
  return compressor(name, **spec), extra


def compression_parts(section: Mapping[str, Any], ctx) -> dict[int, PathParts]:
  """The ``compression`` section: ``{uplink: {name, bits | k | fraction, error_feedback, vote},
  downlink: {name, bits}, level: -1}`` compresses what the children of server level ``level``
  (default ``-1``, the clients' parents) send up and what that level sends down; several levels
  as ``{levels: {"-1": {uplink: ..., downlink: ...}, "0": {...}}}`` (a level absent is not
  compressed). ``vote: step`` (``sign`` uplinks) makes the parents take signSGD's majority vote.
  """
  section = dict(plain(section))
  if "levels" in section:
    if set(section) != {"levels"}:
      raise ValueError(f"give either 'levels' or uplink/downlink/level, not both (got {sorted(section)})")
    items = [(int(lv), dict(plain(v))) for lv, v in dict(plain(section["levels"])).items()]
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


def compression_hint(path: Sequence[str], section):
  """The annotation of a ``compression`` section's field (``uplink.bits``, ...) in the compressors'
  factories: QSGD's and the rotated quantizer's ``bits`` may be traced (a sweep axis)."""
  if not path or path[-1] in ("name", "error_feedback", "vote"):
    return None
  for factory in COMPRESSORS.values():   # (every factory that takes a field annotates it alike)
    hints = typing.get_type_hints(factory)
    if path[-1] in hints:
      return hints[path[-1]]
  return None


CAPABILITY = Capability(name="compression", about="compressed uplinks and downlinks", parts=compression_parts,
                        hint=compression_hint)
"""The ``compression`` section (see :func:`compression_parts`)."""
