"""A configured run read against its algorithm: checked (:func:`validate_run`), placed on its
tree (:func:`run_topology`), the context it builds in and the one its capabilities see
(:func:`run_context`), both resolved once (:func:`resolved_context`: what every builder reads the
run's capabilities from), and what its method holds beyond one model's client step
(:func:`memory_needs`)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping

from fedtree.core.topology import Topology
from fedtree.experiment import capabilities as caps
from fedtree.experiment.capability import Capability, RunContext
from fedtree.experiment.registry.coercion import coerce
from fedtree.experiment.registry.converters import convert_cohort, convert_tree
from fedtree.experiment.registry.schema import schema
from fedtree.experiment.registry.specs import algorithms_taking, spec_named
from fedtree.experiment.spec import check_fields


def run_topology(label: str, run, ctx) -> Topology:
  """The tree run ``label``'s algorithm is built on, which its capabilities read
  (:class:`~fedtree.experiment.capability.RunContext`): the config's tree for a factory that
  requires ``topology`` (HierFAVG, B-HFL, pFedMT); for one whose ``topology`` is optional, the
  run's ``tree`` field (``"flat"``, the default: one server over every client; ``"config"``: the
  config's); the spec's own ``tree`` (GroupPerFL: its data groups); else one server over every
  client (FedAvg, FedOpt, the clustered family)."""
  spec = spec_named(label, run)
  if spec.tree is not None:
    return spec.tree(run, ctx)
  flat = Topology.flat(int(ctx.data.num_clients))
  topo = inspect.signature(spec.factory).parameters.get("topology")
  if topo is None:
    return flat
  if topo.default is inspect.Parameter.empty:
    return ctx.topology
  return convert_tree({"tree": run["tree"]} if "tree" in run else {}, ctx)["topology"] or flat


def validate_run(label: str, run, capabilities: Mapping[str, Capability] = caps.CAPABILITIES) -> None:
  """Named errors for an unknown algorithm or an unknown field of ``config.runs.<label>``, and
  for the section of a capability its algorithm does not take (naming those that take it)."""
  spec = spec_named(label, run)
  sch = schema(spec, capabilities)
  for name, cap in capabilities.items():
    if name in run and name not in sch.sections:
      raise ValueError(f"config.runs.{label}: unknown field {name!r}: algorithm {run.algorithm!r} cannot run "
                       f"a {name!r} section ({cap.about}); the algorithms that take it: "
                       f"{algorithms_taking(cap)}")
  check_fields(f"config.runs.{label} (algorithm={run.algorithm!r})", list(run.keys()), sch.allowed)


def validate_runs(config) -> None:
  """Early, named errors for every run of ``config``: unknown or missing ``algorithm``, and
  fields the algorithm does not know (with a did-you-mean)."""
  capabilities = caps.of_config(config)
  for label, run_cfg in config.runs.items():
    validate_run(label, run_cfg, capabilities)


def own_context(label: str, run, ctx):
  """The context run ``label`` builds in: ``ctx``, or with the run's own ``data``/``model``
  (the context's ``for_run``, :func:`fedtree.experiment.context.run_context`, which returns a
  run's context unchanged)."""
  if run.get("data", None) is None and run.get("model", None) is None:
    return ctx
  try:
    return ctx.for_run(run)
  except ValueError as e:
    raise ValueError(f"config.runs.{label}: {e}") from e


def _capabilities(ctx) -> Mapping[str, Capability]:
  """The capabilities of ``ctx``'s config: a run context's, read once, else read from the config."""
  known = ctx.capabilities if isinstance(ctx, RunContext) else None
  return known if known is not None else caps.of_config(ctx.config)


def run_context(ctx, label: str, run, *, capabilities: Mapping[str, Capability] | None = None) -> RunContext:
  """What the capabilities of run ``label`` (its ``config.runs.<label>``) see: the shared context
  with the run's own tree (:func:`run_topology`), its factory, the factory's parameters and the
  capabilities the config names (``capabilities``, else those of ``ctx``: read once); ``ctx``
  itself when it is this run's already."""
  if isinstance(ctx, RunContext) and ctx.run is run:
    return ctx
  spec = spec_named(label, run)
  params = {n: p for n, p in inspect.signature(spec.factory).parameters.items()
            if p.kind is not inspect.Parameter.VAR_KEYWORD}
  shared = ctx.shared if isinstance(ctx, RunContext) else ctx
  if capabilities is None:
    capabilities = _capabilities(ctx)
  return RunContext(shared, label, run, params, topology=run_topology(label, run, shared),
                    factory=spec.factory, capabilities=capabilities)


def resolved_context(label: str, run, ctx) -> RunContext:
  """Run ``label`` resolved once into the context it is built from: ``ctx`` itself when it is this
  run's already (a resolved :class:`~fedtree.experiment.run.Run`'s, a sweep's setting of one), else
  the capabilities of the config read, the run checked against its algorithm (:func:`validate_run`),
  on its own data and model (:func:`own_context`) and its tree (:func:`run_context`, a bad ``tree``
  named by its run)."""
  if isinstance(ctx, RunContext) and ctx.run is run:
    return ctx
  capabilities = _capabilities(ctx)
  validate_run(label, run, capabilities)
  own = own_context(label, run, ctx.shared if isinstance(ctx, RunContext) else ctx)
  try:
    return run_context(own, label, run, capabilities=capabilities)
  except ValueError as e:
    if str(e).startswith("config."):
      raise
    raise ValueError(f"config.runs.{label} (algorithm={run.algorithm!r}): {e}") from e


def memory_needs(label: str, run, ctx, update_paths=None):
  """What run ``label``'s method holds beyond one model's client step
  (:class:`fedtree.experiment.memory.Needs`, from its spec's ``memory``), or ``None``: its factory's
  defaults, the run's scalar fields, its tree (``ctx``: the run's context, or a shared one) and the
  update paths its capability sections make (``update_paths``)."""
  spec = spec_named(label, run)
  if spec.memory is None:
    return None
  rctx = run_context(ctx, label, run)
  params = inspect.signature(spec.factory).parameters
  kw = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
  for n, hint in schema(spec).scalars.items():
    if n in run:
      kw[n] = coerce(run[n], hint, f"config.runs.{label}.{n}")
  if "cohort_size" in params:   # (a field of its own, one size or one per parent, not a scalar)
    kw.update(convert_cohort(run, ctx))
  kw["topology"] = rctx.topology
  if update_paths is not None:
    kw["update_paths"] = update_paths
  return spec.memory(kw, rctx.shared)
