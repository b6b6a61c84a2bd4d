"""The run fields of one algorithm, read from its factory's signature (:func:`schema`): the
scalars coerced to their annotations, the converters, the parameters the context supplies and the
capabilities' sections it takes."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

from fedtree.experiment import capabilities as caps
from fedtree.experiment.capability import Capability
from fedtree.experiment.registry.coercion import is_scalar, type_hints
from fedtree.experiment.registry.converters import (
  convert_cohort,
  convert_local_rate,
  convert_personal,
  convert_tree,
  servers,
)
from fedtree.experiment.registry.finetune import FINETUNE_FIELDS
from fedtree.experiment.spec import AlgorithmSpec, Fields

RUNNER_FIELDS = ("algorithm", "label", "rounds", "data", "model")
"""Run fields the runner reads: ``data`` and ``model`` are the run's own overrides of ``config.data``
and ``config.model`` (:func:`fedtree.experiment.context.run_context`)."""


CONTEXT_PARAMS = ("model", "data", "local_optimizer", "schedule", "name", "local_learning_rate")


NOT_CONFIGURABLE = ("client_update", "init_params", "update_paths")
"""Factory parameters that are not run fields of their own name: ``init_params`` is a path
that the context loads (:meth:`fedtree.experiment.context.Context.initial_params`),
``update_paths`` what the capabilities' sections compose (:func:`capability_arguments`)."""


@dataclasses.dataclass(frozen=True)
class Schema:
  """The run fields of one algorithm: scalar parameters (name -> hint), converters, the
  parameters the context or a converter supplies, and the capabilities' sections it takes."""

  params: Mapping[str, inspect.Parameter]
  scalars: Mapping[str, Any]
  fields: tuple[Fields, ...]
  sections: tuple[str, ...] = ()

  @property
  def own_finetune(self) -> bool:
    """Whether the factory takes fine-tuning parameters of its own (FedBABU's); the others take the
    common fine-tune-before-evaluation fields (:data:`FINETUNE_FIELDS`)."""
    return bool(set(FINETUNE_FIELDS) & set(self.params))

  @property
  def allowed(self) -> list[str]:
    names = set(RUNNER_FIELDS) | {"chunk_size", "init_params"} | set(self.scalars) | set(self.sections)
    if not self.own_finetune:
      names |= set(FINETUNE_FIELDS)
    if "client_update" in self.params:
      names.add("objective")
    for f in self.fields:
      names |= set(f.names)
    return sorted(names)


def schema(spec: AlgorithmSpec, capabilities: Mapping[str, Capability] = caps.CAPABILITIES) -> Schema:
  """The run fields of ``spec`` (see the module docstring), with the sections of the
  ``capabilities`` it takes (:meth:`~fedtree.experiment.capability.Capability.takes`)."""
  params = {n: p for n, p in inspect.signature(spec.factory).parameters.items()
            if p.kind is not inspect.Parameter.VAR_KEYWORD}
  hints = type_hints(spec.factory)
  fields = list(spec.fields)
  converted = {n for f in fields for n in f.names}
  common = []
  if "cohort_size" in params:
    common.append(Fields(("cohort_size",), convert_cohort))
  if "server_optimizers" in params:
    common.append(servers("server_optimizers"))
  elif "server_optimizer" in params:
    common.append(servers("server_optimizer"))
  topo = params.get("topology")
  if topo is not None and topo.default is None:
    common.append(Fields(("tree",), convert_tree))
  if "local_optimizer" in params and "local_learning_rate" in params:   # a per-run client learning rate
    common.append(Fields(("local_learning_rate",), convert_local_rate, ("local_optimizer",)))
  if "personal" in params:   # parameters kept per client or per subtree (fedtree.core.personal)
    common.append(Fields(("personal",), convert_personal))
  fields = [f for f in common if not set(f.names) & converted] + fields
  skip = set(CONTEXT_PARAMS) | set(NOT_CONFIGURABLE) | {"chunk_size", "topology"}
  skip |= {n for f in fields for n in f.names + f.targets}
  skip |= {c.argument for c in capabilities.values() if c.argument is not None}
  scalars = {n: hints.get(n, Any) for n, p in params.items()
             if n not in skip and n in hints and is_scalar(hints[n])}
  sections = tuple(n for n, c in capabilities.items() if c.takes(spec))
  return Schema(params=params, scalars=scalars, fields=tuple(fields), sections=sections)
