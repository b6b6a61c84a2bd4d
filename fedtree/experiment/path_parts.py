"""What one run config section contributes to the update path of a server level (its own module
so that the capability modules that build it and :mod:`fedtree.experiment.updates`, which lists
them, import it without a cycle)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from fedtree.core.updates import Aggregator, ClientTransform, DownTransform, NodeTransform


class PathParts(NamedTuple):
  """What one config section contributes to the update path of one server level.

  ``wrap_aggregator``: functions of the level's aggregator (whichever section chose it, or the
  streamed mean) returning the one it runs, applied in section order (an omniscient attack
  rewrites a parent's cohort before the defence sees it).
  """

  client: tuple[ClientTransform, ...] = ()
  aggregator: Aggregator | None = None
  node: tuple[NodeTransform, ...] = ()
  down: DownTransform | None = None
  wrap_aggregator: tuple[Callable[[Aggregator], Aggregator], ...] = ()


def one_server(ctx) -> bool:
  """Whether the run the sections are converted for has one server over every client although
  the config's tree has groups: its algorithm takes no ``topology`` (fedavg, fedopt, the
  clustered ones, ...), so its update path has one level (``0``, the same as ``-1``)."""
  params = getattr(ctx, "params", None)
  topology = getattr(ctx, "topology", None)
  return bool(params) and "topology" not in params and topology is not None and int(topology.depth) > 1


def run_depth(ctx) -> int:
  """The server levels of the run's own tree: 1 for a :func:`one_server` run, else the config's
  tree's (1 without a tree)."""
  topology = getattr(ctx, "topology", None)
  return 1 if topology is None or one_server(ctx) else int(topology.depth)


def check_level(section: str, field: str, level, ctx) -> None:
  """Refuses a server level other than ``-1`` in a section of a :func:`one_server` run, saying
  which level the section would act on: the one server, the clients' parent, not a level of the
  config's tree (``level=0`` there is its root, above the groups)."""
  if not one_server(ctx) or level == -1:
    return
  run = getattr(ctx, "run", None)
  algorithm = run.get("algorithm", None) if run is not None else None
  depth = int(ctx.topology.depth)
  raise ValueError(
    f"{field}={level!r}: algorithm {algorithm!r} has one server over all {int(ctx.data.num_clients)} clients "
    f"and does not use the config's {depth}-level tree, so its only level is that server, the clients' "
    f"parent, where the {section} section acts with {field}=-1 (the default); the tree's levels "
    f"(0: its root, above the groups) are those of a tree algorithm such as hierfavg")
