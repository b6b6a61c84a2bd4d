"""The named converters from config values to the library's objects (optimizers, schedules,
``chunk_size="tune"``), used by :mod:`fedtree.experiment.registry` and the runner.

No algorithm is built here: each algorithm's config schema is its factory's signature, read
by :mod:`fedtree.experiment.registry`.
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np
import optax

from fedtree.core import sharding, tuning
from fedtree.core.local import LocalSchedule
from fedtree.core.server import optimizer_by_name, optimizer_from_config, server_optimizer


def local_optimizer_from_config(local: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """``config.local.optimizer`` (an optax name) with ``learning_rate`` and extra ``hparams``."""
  hparams = dict(local.get("hparams", {}) or {})
  lr = local.learning_rate
  if not isinstance(lr, jax.Array) and not (np.isfinite(lr) and lr > 0):  # a sweep traces it
    raise ValueError(f"config.local.learning_rate={lr} must be > 0 and finite")
  return optimizer_by_name(local.optimizer, learning_rate=local.learning_rate, **hparams)


def schedule_from_config(local: ml_collections.ConfigDict) -> LocalSchedule:
  """``config.local``'s ``batch_size``, ``steps`` (else ``epochs``, default 1) and
  ``batch_order`` (absent: :class:`~fedtree.core.local.LocalSchedule`'s default, ``"shuffled"``)."""
  steps = local.get("steps", None)
  epochs = None if steps is not None else local.get("epochs", 1)
  order = {"batch_order": local.batch_order} if local.get("batch_order", None) is not None else {}
  return LocalSchedule(batch_size=int(local.batch_size), epochs=epochs, steps=steps, **order)


def server_from_config(cfg: ml_collections.ConfigDict | None):
  """A server optimizer from ``{name: ..., **hparams}`` (default FedAvg), an optax chain
  ``{name: "chain", transforms: [...]}``, schedules as ``learning_rate`` (see
  :func:`fedtree.core.server.optimizer_from_config`)."""
  if cfg is None:
    return server_optimizer("fedavg")
  cfg = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
  lr = cfg.get("learning_rate", None)
  number = isinstance(lr, (int, float, np.number)) and not isinstance(lr, bool)
  if number and not (np.isfinite(lr) and lr > 0):
    raise ValueError(f"server learning_rate={lr!r} (server {cfg.get('name', 'fedavg')!r}) must be "
                     "> 0 and finite")
  return optimizer_from_config(cfg)


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

