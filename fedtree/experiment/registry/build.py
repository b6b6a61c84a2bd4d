"""A run's algorithm built from its config: its factory's keyword arguments
(:func:`factory_kwargs`), the algorithm itself (:func:`build_algorithm`, wrapped by a capability
that changes its model), and :data:`BUILDERS` by algorithm name."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

from fedtree.core.topology import Topology
from fedtree.experiment.builders import cohort_slots, resolve_chunk_size
from fedtree.experiment.capability import RunContext, Wrapping
from fedtree.experiment.fields import run_field
from fedtree.experiment.registry.coercion import coerce
from fedtree.experiment.registry.finetune import with_finetune
from fedtree.experiment.registry.objective import objective_from_config
from fedtree.experiment.registry.runs import resolved_context
from fedtree.experiment.registry.schema import schema
from fedtree.experiment.registry.sections import capability_arguments, wrapping
from fedtree.experiment.registry.specs import SPECS, factory_name, spec_named


def factory_kwargs(label: str, run, ctx, *, arguments: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """The keyword arguments of run ``label``'s factory (validated, coerced, converted), with the
  arguments its capabilities fill (``arguments``: :func:`capability_arguments`, computed here when
  ``None``); ``ctx``: the run's context, or a shared one the run is resolved on here
  (:func:`~fedtree.experiment.registry.runs.resolved_context`)."""
  spec = spec_named(label, run)
  rctx = resolved_context(label, run, ctx)
  ctx = rctx.shared
  sch = schema(spec, rctx.capabilities)
  params = sch.params
  where = f"config.runs.{label}"
  kw: dict[str, Any] = {}
  supplied = {"model": ctx.model, "data": ctx.data, "local_optimizer": ctx.local_optimizer,
              "schedule": ctx.schedule, "name": factory_name(run.algorithm), "topology": ctx.topology,
              "label": run.get("label", run.algorithm),
              "local_learning_rate": ctx.config.local.learning_rate}
  for n, v in supplied.items():
    if n in params:
      kw[n] = v
  if "chunk_size" in params:
    kw["chunk_size"] = ctx.chunk_size(run)
  if "compute_dtype" in params:
    dtype = run_field(ctx.config, run, "compute_dtype")
    if dtype is not None:
      kw["compute_dtype"] = dtype
  if "init_params" in params:
    init = ctx.initial_params(run, label)
    if init is not None:
      kw["init_params"] = init
  if spec.defaults is not None:
    kw.update(spec.defaults(ctx))
  for n, hint in sch.scalars.items():
    if n in run:
      kw[n] = coerce(run[n], hint, f"{where}.{n}")
  for f in sch.fields:
    try:
      kw.update(f.convert({n: run[n] for n in f.names if n in run}, ctx))
    except ValueError as e:
      raise ValueError(f"{where} (algorithm={run.algorithm!r}): {e}") from e
  kw.update(capability_arguments(label, run, rctx) if arguments is None else arguments)
  if "objective" in run:   # the objective is built with the run's compute_dtype, the host without
    try:
      dtype = kw.pop("compute_dtype", None)
      kw["client_update"] = objective_from_config(run.objective, ctx, compute_dtype=dtype)
    except ValueError as e:
      raise ValueError(f"{where} (algorithm={run.algorithm!r}): {e}") from e
  missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in kw]
  if missing:
    raise ValueError(f"{where} (algorithm={run.algorithm!r}) needs field(s) {missing}")
  return kw


def _tune_slots(kw: dict, ctx) -> int:
  topology = kw.get("topology") or Topology.flat(ctx.data.num_clients)
  return cohort_slots(kw.get("cohort_size"), topology.leaf_counts(topology.depth - 1))


def build_algorithm(label: str, run_cfg, ctx, *, arguments: Mapping[str, Any] | None = None):
  """The :class:`~fedtree.core.algorithm.FederatedAlgorithm` of run ``label`` (its
  ``config.runs.<label>``) on the shared context (with its ``report`` hook where the spec's
  ``wrap`` adds one: B-HFL's table by level, GroupPerFL's fine-tune stage and tables), its
  capabilities' arguments filled (``arguments``, else converted here) and wrapped by a capability
  that changes the model it trains (:func:`wrapping`); ``ctx``: the run's context, or a shared one
  the run is resolved on here (:func:`~fedtree.experiment.registry.runs.resolved_context`)."""
  spec = spec_named(label, run_cfg)
  rctx = resolved_context(label, run_cfg, ctx)
  wrapped = wrapping(label, run_cfg, rctx)
  if wrapped is not None:
    arguments = capability_arguments(label, run_cfg, rctx) if arguments is None else arguments
    return wrapped_algorithm(label, *wrapped, rctx, arguments)
  kw = factory_kwargs(label, run_cfg, rctx, arguments=arguments)
  ctx = rctx.shared
  if kw.get("chunk_size") == "tune":
    kw = resolve_chunk_size(kw, _tune_slots(kw, ctx), spec.factory, ctx)
  try:
    built = spec.factory(**kw)
    if spec.wrap is not None:
      built = spec.wrap(built, label, run_cfg, ctx)
    if not schema(spec, rctx.capabilities).own_finetune:
      built = with_finetune(label, run_cfg, ctx, built)
  except ValueError as e:  # the factory's refusal, named by its run
    if str(e).startswith("config."):
      raise
    raise ValueError(f"config.runs.{label} (algorithm={run_cfg.algorithm!r}): {e}") from e
  return built


def wrapped_algorithm(label: str, inner_run, wrap: Wrapping, ctx, arguments: Mapping[str, Any]):
  """Run ``label``'s algorithm as ``wrap`` makes it: the inner run (:func:`wrapping`) built on the
  model it is given, with the capabilities' ``arguments`` converted once on the run's context
  (``ctx``, whose tree, factory and capabilities the inner run keeps)."""
  rctx = resolved_context(label, inner_run, ctx.with_run(inner_run) if isinstance(ctx, RunContext) else ctx)

  def make(model):
    inner = rctx.on(dataclasses.replace(rctx.shared, model=model, init_params=None))
    return build_algorithm(label, inner_run, inner, arguments=arguments)

  return wrap.build(make)


def _run_label(run, ctx) -> str:
  for label, cfg in ctx.config.runs.items():
    if cfg is run:
      return label
  return run.get("label", run.algorithm)


def _builder(name: str):
  def build(run, ctx):
    return build_algorithm(_run_label(run, ctx), run, ctx)

  build.__name__ = f"build_{name}"
  return build


BUILDERS = {name: _builder(name) for name in SPECS}
"""``BUILDERS[name](run_config, context)``: :func:`build_algorithm` by algorithm name."""
