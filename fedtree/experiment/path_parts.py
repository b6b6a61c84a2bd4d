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


def run_depth(ctx) -> int:
  """The server levels of the tree of the run the sections are converted for (its
  :class:`~fedtree.experiment.run_context.RunContext`'s: a one-server run has one level, ``0``, the
  same as ``-1``, whatever the config's tree; 1 without a tree)."""
  topology = getattr(ctx, "topology", None)
  return 1 if topology is None else int(topology.depth)
