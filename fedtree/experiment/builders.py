"""The named converters from config values to the library's objects (optimizers, schedules,
``chunk_size="tune"``), used by :mod:`fedtree.experiment.registry` and the runner, and B-HFL's
pipeline (its table by level after the standard loop).

No algorithm is built here: each algorithm's config schema is its factory's signature, read
by :mod:`fedtree.experiment.registry`.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

from fedtree.algorithms.bhfl import format_level_table, level_table
from fedtree.core import sharding, tuning
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.local import LocalSchedule
from fedtree.core.server import optimizer_by_name, server_optimizer


def local_optimizer_from_config(local: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """``config.local.optimizer`` (an optax name) with ``learning_rate`` and extra ``hparams``."""
  hparams = dict(local.get("hparams", {}) or {})
  if local.learning_rate <= 0:
    raise ValueError(f"config.local.learning_rate={local.learning_rate} must be > 0")
  return optimizer_by_name(local.optimizer, learning_rate=local.learning_rate, **hparams)


def schedule_from_config(local: ml_collections.ConfigDict) -> LocalSchedule:
  """``config.local``'s ``batch_size`` and ``steps`` (else ``epochs``, default 1)."""
  steps = local.get("steps", None)
  epochs = None if steps is not None else local.get("epochs", 1)
  return LocalSchedule(batch_size=int(local.batch_size), epochs=epochs, steps=steps)


def server_from_config(cfg: ml_collections.ConfigDict | None):
  """A server optimizer from ``{name: ..., **hparams}`` (default FedAvg)."""
  if cfg is None:
    return server_optimizer("fedavg")
  hp = {k: v for k, v in cfg.items() if k != "name"}
  return server_optimizer(cfg.get("name", "fedavg"), **hp)


CHUNK_CHOICES = ("an int >= 1", "None", "'auto'", "'tune'")


def resolve_chunk_size(kwargs: dict, cohort_slots: int, build, ctx) -> dict:
  """Replaces ``chunk_size="tune"`` in ``kwargs`` by a number (see fedtree.core.tuning); ``"auto"``
  and policies (:meth:`Context.chunk_size`) are left to the cohort sampler.

  ``build(**kwargs)`` makes the algorithm (for ``"tune"``, which times one round per candidate).
  """
  chunk = kwargs["chunk_size"]
  if chunk is None or (isinstance(chunk, (int, np.integer)) and not isinstance(chunk, bool)):
    return kwargs
  if callable(chunk) or chunk == "auto":
    return kwargs  # the cohort sampler sizes it, knowing every parent's cohort
  devices = sharding.mesh_size()
  if chunk == "tune":
    timer = tuning.round_timer(
      lambda c: build(**{**kwargs, "chunk_size": c}), ctx.data, jax.random.key(0)
    )
    best, _ = tuning.autotune_chunk_size(
      timer, tuning.candidate_chunks(cohort_slots, num_devices=devices), repeats=1
    )
    return {**kwargs, "chunk_size": best}
  raise ValueError(f"chunk_size={chunk!r}; choose {', '.join(CHUNK_CHOICES)}")


def cohort_slots(cohort, sizes) -> int:
  """Cohort slots per round: ``cohort`` per leaf-parent (``None``: every client)."""
  sizes = np.asarray(sizes)
  return int(sizes.sum() if cohort is None else np.minimum(cohort, sizes).sum())


class BHFLPipeline:
  """Runs a B-HFL algorithm with the standard loop, then reports the table by level.

  The table goes to the reporter (stdout) and to ``<workdir>/bhfl_levels_<label>.{json,md}``;
  its central accuracies are also returned as ``<level>@central`` summaries.
  """

  def __init__(self, algorithm: FederatedAlgorithm, label: str, num_rounds: int):
    self.algorithm, self.label, self.num_rounds = algorithm, label, num_rounds

  def run(self, ctx, key, reporter) -> dict[str, dict[str, Any]]:
    from fedtree.experiment.runner import run_algorithm

    cfg = ctx.config
    state, summaries = run_algorithm(
      self.algorithm, ctx, key, reporter, num_rounds=self.num_rounds,
      eval_every=int(cfg.eval_every), rounds_per_call=int(cfg.rounds_per_call), label=self.label,
    )
    rows = level_table(ctx.model, state.params, ctx.topology, ctx.data, ctx.central_test,
                       cfg.get("eval_chunk_size", None))
    text = format_level_table(self.label, rows)
    reporter.print("\n" + text)
    workdir = getattr(reporter, "workdir", None)
    if workdir:
      with open(os.path.join(workdir, f"bhfl_levels_{self.label}.json"), "w") as f:
        json.dump(rows, f, indent=2)
      with open(os.path.join(workdir, f"bhfl_levels_{self.label}.md"), "w") as f:
        f.write(text + "\n")
    out = dict(summaries)
    for r in rows:
      out[f"{r['name']}@central"] = dict(accuracy=r["central_accuracy"], loss=r["central_loss"],
                                         client_mean_accuracy=float("nan"))
    return out
