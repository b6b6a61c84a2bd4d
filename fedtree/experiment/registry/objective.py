"""A run's ``objective`` field: the local objective of the algorithms that take a
``client_update`` (:data:`OBJECTIVES`, :func:`objective_from_config`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from fedtree import objectives
from fedtree.experiment.registry.coercion import coerce, is_scalar, type_hints
from fedtree.experiment.spec import check_fields

OBJECTIVES: Mapping[str, Callable[..., Any]] = {
  "alo": objectives.alo_update, "ditto": objectives.ditto_update, "fedprox": objectives.fedprox_update,
  "moreau": objectives.moreau_client_update, "perfedavg": objectives.perfedavg_update,
  "pfedme": objectives.pfedme_update,
}
"""Local objectives a run can select with ``objective: {name: <key>, **hyperparameters}``."""


OBJECTIVE_CONTEXT = ("model", "optimizer", "batch_size", "max_steps", "compute_dtype")


def objective_from_config(cfg, ctx, *, compute_dtype: str | None = None):
  """The :class:`~fedtree.core.local.ClientUpdate` of a run's ``objective`` field:
  ``{name: one of OBJECTIVES, **its scalar hyperparameters}`` (e.g. ``{name: "fedprox", mu:
  0.01, persistent: True}`` for FedProx clients under B-HFL). The context supplies the model,
  the local optimizer, the schedule's batch size and step count, and ``compute_dtype`` (the
  run's, unless the objective sets its own)."""
  cfg = dict(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg)
  name = cfg.pop("name", None)
  if name not in OBJECTIVES:
    raise ValueError(f"objective name={name!r}; choose one of {sorted(OBJECTIVES)}")
  if name == "alo" and cfg.get("private", "persistent") == "head":  # refused here, not at compile time
    raise ValueError("objective 'alo' with private='head' trains a second classifier head that the "
                     "host's model must carry: select it through the fedkws algorithm "
                     "(algorithm: fedkws, private: head), or use private='persistent'")
  factory = OBJECTIVES[name]
  params, hints = inspect.signature(factory).parameters, type_hints(factory)
  supplied = {"model": ctx.model, "optimizer": ctx.local_optimizer, "batch_size": ctx.schedule.batch_size,
              "max_steps": ctx.schedule.max_steps(ctx.data.max_train),
              "compute_dtype": cfg.pop("compute_dtype", compute_dtype)}
  allowed = [n for n in params if n not in OBJECTIVE_CONTEXT and is_scalar(hints.get(n, object))]
  check_fields(f"objective {name!r}", list(cfg), allowed)
  kw = {n: v for n, v in supplied.items() if n in params}
  kw.update({n: coerce(v, hints[n], f"objective.{n}") for n, v in cfg.items()})
  missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in kw]
  if missing:
    raise ValueError(f"objective {name!r} needs field(s) {missing}")
  return factory(**kw)
