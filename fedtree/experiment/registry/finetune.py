"""X + FT: the run fields that fine-tune every algorithm's models per client before evaluation
(:data:`FINETUNE_FIELDS`), for the algorithms without fine-tuning of their own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from fedtree.experiment.registry.coercion import coerce
from fedtree.experiment.spec import number

FINETUNE_FIELDS: Mapping[str, Any] = {
  "finetune_steps": int, "finetune_epochs": float, "finetune_learning_rate": float,
  "finetune_params": str | tuple[str, ...], "finetune_models": str | tuple[str, ...],
}
"""Run fields of every algorithm (that has no fine-tuning of its own) that fine-tune its models per
client before evaluation (:func:`fedtree.algorithms.partial.finetuned.finetuned`): ``finetune_steps`` or
``finetune_epochs`` (0: none), ``finetune_learning_rate`` (default ``config.local.learning_rate``),
``finetune_params`` (patterns of the parameters fine-tuned; default all), ``finetune_models`` (the
models fine-tuned; default all). ``runs.fedavg_ft = {algorithm: fedavg, finetune_steps: 20}`` is
FedAvg + FT (its ``global_ft`` model)."""


def with_finetune(label: str, run, ctx, built):
  """``built`` fine-tuned per client before evaluation as run ``label``'s :data:`FINETUNE_FIELDS`
  say (``built`` itself when it sets none)."""
  from fedtree.algorithms.partial.finetuned import finetuned
  from fedtree.algorithms.partial.split import mask_of

  given = {n: run[n] for n in FINETUNE_FIELDS if n in run and run[n] is not None}
  if not given:
    return built
  where = f"config.runs.{label}"
  kw = {n: coerce(v, FINETUNE_FIELDS[n], f"{where}.{n}") for n, v in given.items()}
  kw = {n: (v,) if n in ("finetune_params", "finetune_models") and isinstance(v, str) else v
        for n, v in kw.items()}
  trainable = None
  if "finetune_params" in kw:
    template = jax.eval_shape(ctx.model.init, jax.random.key(0))
    trainable = mask_of(kw["finetune_params"], template, algorithm=f"{where}.finetune_params")
  rate = kw.get("finetune_learning_rate", number(ctx.config.local.learning_rate))
  return finetuned(built, model=ctx.model, data=ctx.data, batch_size=ctx.schedule.batch_size,
                   learning_rate=rate, steps=kw.get("finetune_steps", 0),
                   epochs=kw.get("finetune_epochs", 0.0),
                   optimizer=str(ctx.config.local.get("optimizer", "sgd")), trainable=trainable,
                   models=kw.get("finetune_models"))
