"""A capability of the toolbox as a run uses it: one object, both halves declared in one place.

Privacy, attacks, robust aggregation, compression, systems and LoRA each act on a run through a
section of its config (``config.runs.<label>.<name>``). A :class:`Capability` declares what the
section does, every hook a function ``hook(section, run)`` of the section (a dict) and the run
(:class:`RunContext`: the shared context, the run's config, its tree and cohort):

* **in jit**: the update-path parts it contributes at each server level (``parts``; every
  capability's parts are composed into one :class:`~fedtree.core.updates.UpdatePath` per level by
  :func:`compose`, in :data:`fedtree.experiment.capabilities.CAPABILITIES` order), an argument
  of the algorithm's factory (``argument`` and ``value``: systems' devices and clock), or the
  model the algorithm trains (``wrap``: LoRA's adapters on a frozen base, :class:`Wrapping`);
* **on the host**: the data it alters and the extra test splits its runs are scored on
  (``data``: a data attack's poisoned copy and its backdoor split), per-round metrics
  (``round_metrics``: the privacy spent), files beside the run's (``files``: the membership a
  mobility section made), a sweep's calibration of a field no trace can drive
  (``calibration``: a target ε to the noise multiplier that reaches it), and the annotation of a
  section's field a sweep may trace (``hint``: read from the factory the section names).

Its memory is derived, never declared: data it alters count as a copy beside the shared data,
and a blockwise aggregator among the composed parts as the cohort blocks it holds
(:func:`blocks`, :func:`fedtree.experiment.memory.block_bytes`).

The registry (:mod:`fedtree.experiment.registry`) accepts a capability's section in every run
whose algorithm takes it (:meth:`Capability.takes`), and :mod:`fedtree.experiment.run` resolves
each configured run once into a typed :class:`~fedtree.experiment.run.Run` through these hooks;
the runner and the sweep drive runs without knowing any capability by name. Adding one: a module
with its :class:`Capability`, and one entry in :data:`fedtree.experiment.capabilities.CAPABILITIES`
(a user's own: its ``"module:attribute"`` path in ``config.capabilities``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from fedtree.core.updates import (
  Aggregator,
  ClientTransform,
  DownTransform,
  NodeTransform,
  UpdatePath,
  chain,
  chain_nodes,
)


class PathParts(NamedTuple):
  """What one capability contributes to the update path of one server level.

  ``wrap_aggregator``: functions of the level's aggregator (whichever capability chose it, or the
  streamed mean) returning the one it runs, applied in capability order (an omniscient attack
  rewrites a parent's cohort before the defence sees it; a secure sum replaces the mean and
  refuses anything else). ``wrap_down``: likewise of the level's downlink transform (``None``
  when none is set): secure aggregation adds the protocol's download to what is sent down.
  """

  client: tuple[ClientTransform, ...] = ()
  aggregator: Aggregator | None = None
  node: tuple[NodeTransform, ...] = ()
  down: DownTransform | None = None
  wrap_aggregator: tuple[Callable[[Aggregator], Aggregator], ...] = ()
  wrap_down: tuple[Callable[[DownTransform | None], DownTransform | None], ...] = ()


class RunContext:
  """What a capability sees of one run: every attribute of the shared context (``data``,
  ``config``, ``model``, ...) and, in place of the config's tree, the tree of the run's algorithm.

  A config has one tree (``config.topology``), but not every run is built on it: FedAvg is one
  server over every client whatever the config's tree, a method whose tree is optional runs on it
  only with ``tree="config"``, GroupPerFL on its data groups. A run's capabilities act on its
  algorithm, so they read :attr:`topology` and :attr:`cohort`, the run's: a one-server run in a
  config whose tree has groups accounts privacy at its own sampling rate, and an attack's
  ``level`` names a level of its own tree.
  (:func:`fedtree.experiment.registry.run_context` makes the one of a configured run, and
  :func:`fedtree.experiment.registry.resolved_context` the one a run is built from, checked once:
  every builder given it reads the run's capabilities, tree and factory from it.)

  Args:
    ctx: the shared context (:class:`fedtree.experiment.context.Context`), or a run context (its
      shared context is taken).
    label: the run's label (``config.runs.<label>``).
    run: the run's config (``None``: no run, e.g. sections converted alone in a test).
    params: its factory's parameters (``{}``: unknown; the privacy section then reads the run's
      ``weighting`` field only).
    topology: the run's tree.
    factory: the run's algorithm factory (``None``: unknown).
    capabilities: the capabilities its config names, by section
      (:func:`fedtree.experiment.capabilities.of_config`, read once; ``None``: not read).
  """

  def __init__(self, ctx, label: str, run, params=None, *, topology, factory=None,
               capabilities: Mapping[str, Capability] | None = None):
    if isinstance(ctx, RunContext):
      ctx = ctx.shared
    self.shared, self.label, self.run, self.params = ctx, label, run, params or {}
    self.topology, self.factory, self.capabilities = topology, factory, capabilities

  @classmethod
  def of(cls, ctx) -> RunContext:
    """``ctx`` when it is a run context, else one for no run on the shared context's tree."""
    if isinstance(ctx, RunContext):
      return ctx
    return cls(ctx, "<label>", None, {}, topology=getattr(ctx, "topology", None))

  def on(self, ctx) -> RunContext:
    """This run on another shared context (``ctx``: e.g. the run's own data, a sweep's setting)."""
    return RunContext(ctx, self.label, self.run, self.params, topology=self.topology, factory=self.factory,
                      capabilities=self.capabilities)

  def with_run(self, run) -> RunContext:
    """This run with another config of its fields (``run``: a sweep's setting, or the run without
    the section of a capability that wraps it): the same algorithm, tree and capabilities."""
    return RunContext(self.shared, self.label, run, self.params, topology=self.topology,
                      factory=self.factory, capabilities=self.capabilities)

  def __getattr__(self, name):
    if name == "shared":   # (not set yet: no recursion)
      raise AttributeError(name)
    return getattr(self.shared, name)

  @property
  def depth(self) -> int:
    """The server levels of the run's tree (1 without one)."""
    return 1 if self.topology is None else int(self.topology.depth)

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


class Wrapping(NamedTuple):
  """What a capability that changes the model a run trains contributes (LoRA's adapters).

  Attributes:
    model: the model the algorithm trains (built on the base's shapes): what one message is.
    build: ``build(make) -> FederatedAlgorithm`` from ``make(model) -> FederatedAlgorithm``, the
      run's algorithm on a given model (its capabilities' parts included).
    evaluator: ``evaluator(chunk_size, *, confusion, **scoring) -> (state -> evaluator)``: how
      the run's models are scored from a state.
    forward: ``forward(bound, tokens) -> logits`` and ``bind(state) -> (row params -> bound)``: one
      model of a state applied as it trains (adapters with the state's base, an argument of the
      compiled program), for benchmarks beside the evaluator's scores (:mod:`fedtree.experiment.llm`);
      ``None``: the model as it is.
  """

  model: Any
  build: Callable[[Callable[[Any], Any]], Any]
  evaluator: Callable[..., Callable[[Any], Callable]]
  forward: tuple[Callable, Callable] | None = None


class Calibration(NamedTuple):
  """A field of a section that a sweep sets on the host, each setting's value turned into one
  the builder traces (a search no traced value can drive).

  Attributes:
    swept: the field a sweep gives (``target_epsilon``).
    traced: the field the builder traces in its place (``noise_multiplier``).
    value: ``value(section, run) -> float``, the traced field's value for a section that holds
      the swept one.
    what: the traced values, as the sweep's note names them (``"noise multipliers"``).
    symbol: the traced value's symbol in the note (``"z"``).
  """

  swept: str
  traced: str
  value: Callable[[dict, RunContext], float]
  what: str
  symbol: str


Hook = Callable[[dict, RunContext], Any]


class Capability(NamedTuple):
  """One capability of the toolbox, its in-jit and host halves (see the module docstring).

  Attributes:
    name: its section in a run's config (``config.runs.<label>.<name>``).
    about: what it models, in a few words (named where an algorithm cannot take it).
    parts: ``parts(section, run) -> {level: PathParts}`` (levels ``0..depth-1``, or negative
      from the clients' parents): its update-path stages; it then needs a factory that takes
      ``update_paths``.
    argument: the factory parameter ``value`` fills (``"systems"``).
    value: ``value(section, run) -> the argument``.
    wrap: ``wrap(section, run) -> Wrapping``: it changes the model the algorithm trains.
    data: ``data(section, run) -> (training data, {metric: (x, y, n) test split})``: the run's
      own copy of the clients' data and the splits its models are also scored on (accuracy,
      reported as ``metric``).
    round_metrics: ``round_metrics(section, run) -> (r -> {name: number})`` added to round
      ``r``'s row and every final summary, or ``None``.
    files: ``files(section, run) -> {file name: str | bytes}`` written into the workdir when the
      run starts (the membership a mobility section made, drawn by
      :func:`fedtree.experiment.plots.write_run_plots`).
    calibration: a field a sweep sets on the host (:class:`Calibration`), or ``None``.
    hint: ``hint(path, section) -> annotation`` of the section's field at ``path`` (a tuple of
      keys), from the factory the section names; ``None``: unknown (a sweep then goes by the
      value: a float is an axis, an int refused).
    algorithms: ``algorithms(spec) -> bool``, whether algorithm ``spec`` (an
      :class:`~fedtree.experiment.spec.AlgorithmSpec`) takes the section; ``None``: every
      algorithm whose factory takes the parameter the capability fills (``update_paths`` for
      ``parts``, ``argument``), or one whose spec names it in ``takes``.
  """

  name: str
  about: str = ""
  parts: Hook | None = None
  argument: str | None = None
  value: Hook | None = None
  wrap: Hook | None = None
  data: Hook | None = None
  round_metrics: Hook | None = None
  files: Hook | None = None
  calibration: Calibration | None = None
  hint: Callable[[Sequence[str], Any], Any] | None = None
  algorithms: Callable[[Any], bool] | None = None

  def takes(self, spec) -> bool:
    """Whether algorithm ``spec`` (an :class:`~fedtree.experiment.spec.AlgorithmSpec`) takes this
    capability's section (see :attr:`algorithms`)."""
    if self.name in getattr(spec, "takes", ()):
      return True
    if self.algorithms is not None:
      return bool(self.algorithms(spec))
    params = inspect.signature(spec.factory).parameters
    if self.parts is not None:
      return "update_paths" in params
    if self.argument is not None:
      return self.argument in params
    return False


def plain(section) -> Any:
  """A config section (a ``ConfigDict``) as plain Python values."""
  return section.to_dict() if hasattr(section, "to_dict") else section


def compose(parts_by_section: Mapping[str, Mapping[int, PathParts]], order: Sequence[str] = ()
            ) -> dict[int, UpdatePath]:
  """One :class:`~fedtree.core.updates.UpdatePath` per level from every capability's parts:
  client transforms chained in ``order`` (capability names; names not in it first, as given),
  node transforms likewise, the aggregators' and downlinks' wrappers in that order, at most one
  aggregator and one downlink transform per level (two are refused naming both)."""
  order = [s for s in parts_by_section if s not in order] + [s for s in order if s in parts_by_section]
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
    down = downs[0][1] if downs else None
    for wrap_down in [w for _, p in items for w in p.wrap_down]:
      down = wrap_down(down)
    out[lv] = UpdatePath(
      client=chain(*[t for _, p in items for t in p.client]),
      aggregator=aggregator,
      node=chain_nodes(*[t for _, p in items for t in p.node]),
      down=down,
    )
  return out


def blocks(paths: Mapping[int, UpdatePath] | None, run: RunContext, param_bytes: int, membership=None
           ) -> tuple[int, int, int, bool] | None:
  """``(param_bytes, rows, block_size, pairwise)`` of the cohort blocks a blockwise aggregator
  of ``paths`` holds at the clients' tier (:func:`fedtree.experiment.memory.block_bytes`): ``rows``
  the run's cohort over every clients' parent of its tree, ``block_size`` the largest parent's (under
  a moving ``membership``, :class:`~fedtree.core.membership.Membership`: the largest any edge holds in
  any round), ``pairwise`` when an aggregator keeps ``K x K`` distances; ``None`` when every level
  aggregates by the streamed mean."""
  if not paths or not any(p.aggregator.blockwise for p in paths.values()):
    return None
  pairwise = any(p.aggregator.pairwise for p in paths.values())
  if membership is not None:
    k = None if run.run is None else run.run.get("cohort_size", None)
    every = k is None or int(k) == -1
    block = membership.max_load if every else min(int(k), membership.max_load)
    return int(param_bytes), membership.num_edges * int(block), int(block), bool(pairwise)   # [E, block]
  cohort = run.cohort
  clusters = _clusters(run)
  if clusters:   # [K, S]: every cluster's block may hold the whole cohort (clustered FL)
    return int(param_bytes), clusters * int(cohort.sum()), int(cohort.sum()), bool(pairwise)
  return int(param_bytes), int(cohort.sum()), int(cohort.max()), bool(pairwise)


def _clusters(run: RunContext) -> int:
  """The cluster slots of a clustered-FL run (its factory's ``num_clusters`` or ``max_clusters``),
  0 for any other."""
  for name in ("num_clusters", "max_clusters"):
    if name in run.params:
      given = None if run.run is None else run.run.get(name, None)
      value = run.params[name].default if given is None else given
      return 0 if value is inspect.Parameter.empty else int(value)
  return 0
