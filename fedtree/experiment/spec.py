"""How a run config becomes an algorithm's factory arguments: the spec of one algorithm and the
named converters of its config-only fields (:mod:`fedtree.experiment.registry` lists the specs;
a family's own converters live beside it, in :mod:`fedtree.experiment.families`)."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from typing import Any

import jax

from fedtree.experiment.builders import server_from_config


@dataclasses.dataclass(frozen=True)
class Fields:
  """A named converter: config-only ``names`` -> factory keyword arguments.

  ``convert(values, ctx)`` gets ``{name: value}`` for the names the run sets (possibly none:
  it is always called, so it can supply a context-dependent default) and returns the keyword
  arguments it sets.
  """

  names: tuple[str, ...]
  convert: Callable[[dict[str, Any], Any], dict[str, Any]]
  targets: tuple[str, ...] = ()  # factory parameters it sets that are not run fields themselves


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """How a run with ``algorithm=<name>`` becomes an algorithm.

  Attributes:
    factory: the algorithm's factory (its signature is the schema).
    fields: converters of the config-only fields.
    defaults: ``defaults(ctx) -> kwargs`` for parameters whose default comes from the config
      (e.g. a rate that defaults to ``config.local.learning_rate``).
    wrap: ``wrap(built, label, run, ctx)``, what the runner gets (B-HFL's report hook,
      GroupPerFL's stages).
    tree: ``tree(run, ctx) -> Topology``, the tree the algorithm is built on, for an algorithm
      whose factory is not given it as ``topology`` (GroupPerFL: its data groups); ``None``: read
      from the factory's signature (:func:`fedtree.experiment.registry.run_topology`).
  """

  factory: Callable[..., Any]
  fields: tuple[Fields, ...] = ()
  defaults: Callable[[Any], dict[str, Any]] | None = None
  wrap: Callable[..., Any] | None = None
  tree: Callable[[Any, Any], Any] | None = None


# ------------------------------------------------------------------------ shared converters
def number(value):
  """A float field as a float, or unchanged when it is a ``jax.Array`` (a swept value, possibly a
  tracer: its concrete values were checked before tracing)."""
  return value if isinstance(value, jax.Array) else float(value)


def per_level_servers(plural: str, single: str, target: str):
  def convert(v, ctx):
    if plural in v:
      return {target: [server_from_config(s) for s in v[plural]]}
    if single in v:
      return {target: server_from_config(v[single])}
    return {}

  return Fields((plural, single), convert)


def check_fields(what: str, given, allowed) -> None:
  """``ValueError`` for the first of ``given`` not in ``allowed``, with a did-you-mean."""
  allowed = sorted(set(allowed))
  for field in given:
    if field not in allowed:
      close = difflib.get_close_matches(field, allowed, n=1)
      hint = f" (did you mean {close[0]!r}?)" if close else ""
      raise ValueError(f"{what}: unknown field {field!r}{hint}; allowed fields: {allowed}")
