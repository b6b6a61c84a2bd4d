"""Config -> algorithm builders for the round-based algorithms (see ``BUILDERS``).

Common run-config fields: ``cohort_size`` (per leaf-parent node; -1 or absent: all),
``chunk_size`` (an int, ``None`` for the whole cohort at once, ``"auto"`` for the
per-backend default or ``"tune"`` to time a few at start-up; see :mod:`fedtree.tuning`),
``compute_dtype`` (``None`` or ``"bfloat16"``: mixed-precision local training),
``weighting`` (``examples``/``uniform``), ``server`` (a config with ``name`` and
hyperparameters, see :func:`fedtree.server.server_optimizer`). ``chunk_size`` and
``compute_dtype`` fall back to the top-level config fields of the same name.
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np

from fedtree import sharding, tuning
from fedtree.algorithms.hierfavg import fedavg, hierfavg
from fedtree.local import sgd_client_update
from fedtree.server import server_optimizer


def server_from_config(cfg: ml_collections.ConfigDict | None):
  """A server optimizer from ``{name: ..., **hparams}`` (default FedAvg)."""
  if cfg is None:
    return server_optimizer("fedavg")
  hp = {k: v for k, v in cfg.items() if k != "name"}
  return server_optimizer(cfg.get("name", "fedavg"), **hp)


def common(run, ctx) -> dict:
  cohort = run.get("cohort_size", None)
  cohort = None if cohort in (None, -1) else cohort
  out = dict(
    model=ctx.model, data=ctx.data, local_optimizer=ctx.local_optimizer, schedule=ctx.schedule,
    cohort_size=cohort, chunk_size=run.get("chunk_size", ctx.config.get("chunk_size", None)),
    weighting=run.get("weighting", "examples"),
  )
  compute_dtype = run.get("compute_dtype", ctx.config.get("compute_dtype", None))
  if compute_dtype is not None:
    out["client_update"] = sgd_client_update(
      ctx.model, ctx.local_optimizer, batch_size=ctx.schedule.batch_size,
      max_steps=ctx.schedule.max_steps(ctx.data.max_train), compute_dtype=compute_dtype,
    )
  return out


CHUNK_CHOICES = ("an int >= 1", "None", "'auto'", "'tune'")


def resolve_chunk_size(kwargs: dict, cohort_slots: int, build, ctx) -> dict:
  """Replaces ``chunk_size="auto"``/``"tune"`` in ``kwargs`` by a number (see fedtree.tuning).

  ``build(**kwargs)`` makes the algorithm (for ``"tune"``, which times one round per candidate).
  """
  chunk = kwargs["chunk_size"]
  if chunk is None or (isinstance(chunk, (int, np.integer)) and not isinstance(chunk, bool)):
    return kwargs
  devices = sharding.mesh_size()
  if chunk == "auto":
    return {**kwargs, "chunk_size": tuning.default_chunk_size(cohort_slots, num_devices=devices)}
  if chunk == "tune":
    timer = tuning.round_timer(
      lambda c: build(**{**kwargs, "chunk_size": c}), ctx.data, jax.random.key(0)
    )
    best, _ = tuning.autotune_chunk_size(
      timer, tuning.candidate_chunks(cohort_slots, num_devices=devices), repeats=1
    )
    return {**kwargs, "chunk_size": best}
  raise ValueError(f"chunk_size={chunk!r}; choose {', '.join(CHUNK_CHOICES)}")


def _slots(cohort, sizes) -> int:
  """Cohort slots per round: ``cohort`` per leaf-parent (``None``: every client)."""
  sizes = np.asarray(sizes)
  return int(sizes.sum() if cohort is None else np.minimum(cohort, sizes).sum())


def build_fedavg(run, ctx):
  """FedAvg / FedOpt: one server over all clients (the tree is flattened)."""
  kw = dict(server_optimizer=server_from_config(run.get("server", None)), name=run.algorithm,
            **common(run, ctx))
  kw = resolve_chunk_size(kw, _slots(kw["cohort_size"], [ctx.data.num_clients]), fedavg, ctx)
  return fedavg(**kw)


def build_hierfavg(run, ctx):
  """HierFAVG on the config's tree; ``periods`` per upper level; ``server`` for every level or
  ``servers`` (a list, one per server level)."""
  if "servers" in run:
    servers = [server_from_config(s) for s in run.servers]
  else:
    servers = server_from_config(run.get("server", None))
  periods = run.get("periods", None)
  kw = dict(topology=ctx.topology, server_optimizers=servers,
            periods=tuple(periods) if isinstance(periods, (list, tuple)) else periods,
            name=run.algorithm, **common(run, ctx))
  leaf_sizes = ctx.topology.leaf_counts(ctx.topology.depth - 1)
  kw = resolve_chunk_size(kw, _slots(kw["cohort_size"], leaf_sizes), hierfavg, ctx)
  return hierfavg(**kw)
