"""What a capability sees of one run: the shared build context, the run, and the tree and cohort
of the algorithm the capability is attached to (issue 43 item 1).

A config has one tree (``config.topology``), but not every run is built on it: FedAvg and FedOpt
are one server over every client whatever the config's tree, a method whose tree is optional
runs on it only with ``tree="config"``, GroupPerFL on its data groups. The capabilities of a run
(privacy and its accounting, attacks, robust aggregation, compression, systems, the memory of a
blockwise aggregator) act on that run's algorithm, so they read :attr:`RunContext.topology` and
:attr:`RunContext.cohort`, the run's, never the config's: a one-server run in a config whose tree
has groups accounts privacy at its own sampling rate, normalises by its own expected cohort, and
an attack's ``level`` names a level of its own tree.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class RunContext:
  """The build context seen by a run's capabilities: every attribute of the shared context
  (``data``, ``config``, ``model``, ...) plus the run (``run``, ``label``, ``params``: its
  factory's signature, e.g. for the privacy section's check of the run's weighting), and in place
  of the config's tree the run's own (:attr:`topology`, :attr:`cohort`).

  Args:
    ctx: the shared context (:class:`fedtree.experiment.runner.Context`), or a run context (its
      shared context is taken).
    label: the run's label (``config.runs.<label>``).
    run: the run's config.
    params: its factory's parameters (``{}``: unknown; the privacy section then reads the
      run's ``weighting`` field only).
    topology: the run's tree (default: the shared context's
      :meth:`~fedtree.experiment.runner.Context.run_topology` of the run).
  """

  def __init__(self, ctx, label: str, run, params=None, *, topology=None):
    if isinstance(ctx, RunContext):
      ctx = ctx.shared
    self.shared, self.label, self.run, self.params = ctx, label, run, params or {}
    if topology is None:   # (the shared context asks the registry, which imports this module)
      topology = ctx.run_topology(label, run)
    self.topology = topology

  def __getattr__(self, name):
    if name == "shared":   # (not set yet: no recursion)
      raise AttributeError(name)
    return getattr(self.shared, name)

  @property
  def cohort(self) -> np.ndarray:
    """``int[P]`` the clients the run samples under every clients' parent of its tree: its
    ``cohort_size`` (an int for every parent, one per parent, or ``None``/``-1``: all of them),
    at most the parent's clients; with Poisson sampling, its slots."""
    counts = np.asarray(self.topology.leaf_counts(self.topology.depth - 1), np.int64)
    return cohort_of(self.run.get("cohort_size", None) if self.run is not None else None, counts)


def cohort_of(cohort_size: Any, counts: np.ndarray) -> np.ndarray:
  """``int[P]``: ``cohort_size`` (an int, one per parent, or ``None``/``-1``: all) against the
  clients ``counts`` of every parent, at most each parent's count."""
  counts = np.asarray(counts, np.int64)
  if cohort_size is None or (np.isscalar(cohort_size) and int(cohort_size) == -1):
    return counts.copy()
  k = np.asarray(cohort_size, np.int64)
  if k.ndim and k.shape != counts.shape:
    raise ValueError(f"cohort_size has {k.size} entries for {counts.size} parent nodes of the run's tree")
  return np.minimum(counts, k)


def run_context(ctx, label: str, run, params=None) -> RunContext:
  """``ctx`` when it is already run ``run``'s context, else :class:`RunContext` of the run."""
  if isinstance(ctx, RunContext) and ctx.run is run:
    return ctx
  return RunContext(ctx, label, run, params)
