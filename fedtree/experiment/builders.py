"""Config -> algorithm builders for the round-based algorithms (see ``BUILDERS``).

Common run-config fields: ``cohort_size`` (per leaf-parent node; -1 or absent: all),
``chunk_size`` (an int, ``None`` for the whole cohort at once, ``"auto"`` for the
per-backend default or ``"tune"`` to time a few at start-up; see :mod:`fedtree.core.tuning`),
``compute_dtype`` (``None`` or ``"bfloat16"``: mixed-precision local training),
``weighting`` (``examples``/``uniform``), ``server`` (a config with ``name`` and
hyperparameters, see :func:`fedtree.core.server.server_optimizer`). ``chunk_size`` and
``compute_dtype`` fall back to the top-level config fields of the same name.
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np
import optax

from fedtree.algorithms.bhfl import with_level_report
from fedtree.algorithms.hierfavg import fedavg, hierfavg
from fedtree.core import sharding, tuning
from fedtree.core.local import LocalSchedule, sgd_client_update
from fedtree.core.server import optimizer_by_name, optimizer_from_config, server_optimizer


def local_optimizer_from_config(local: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """``config.local.optimizer`` (an optax name) with ``learning_rate`` and extra ``hparams``."""
  hparams = dict(local.get("hparams", {}) or {})
  if not isinstance(local.learning_rate, jax.Array) and local.learning_rate <= 0:  # a sweep traces it
    raise ValueError(f"config.local.learning_rate={local.learning_rate} must be > 0")
  return optimizer_by_name(local.optimizer, learning_rate=local.learning_rate, **hparams)


def num(x):
  """``float(x)``, except a ``jax.Array`` (a sweep's traced value, fedtree.experiment.sweep) unchanged."""
  return x if isinstance(x, jax.Array) else float(x)


def schedule_from_config(local: ml_collections.ConfigDict) -> LocalSchedule:
  steps = local.get("steps", None)
  epochs = None if steps is not None else local.get("epochs", 1)
  return LocalSchedule(batch_size=int(local.batch_size), epochs=epochs, steps=steps)


def server_from_config(cfg: ml_collections.ConfigDict | None):
  """A server optimizer from ``{name: ..., **hparams}`` (default FedAvg), an optax chain
  ``{name: "chain", transforms: [...]}``, schedules as ``learning_rate`` (see
  :func:`fedtree.core.server.optimizer_from_config`)."""
  if cfg is None:
    return server_optimizer("fedavg")
  return optimizer_from_config(cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg))


def common(run, ctx) -> dict:
  cohort = run.get("cohort_size", None)
  cohort = None if cohort in (None, -1) else cohort
  out = dict(
    model=ctx.model, data=ctx.data, local_optimizer=ctx.local_optimizer, schedule=ctx.schedule,
    cohort_size=cohort, chunk_size=ctx.chunk_size(run),
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


def build_pfedmt(run, ctx):
  """pFedMT (paper 003) on the config's root -> teams -> devices tree.

  Run fields: ``lam`` (λ), ``gamma`` (γ), ``eta`` (η), ``beta`` (β), ``team_iters`` (K),
  ``learning_rate`` (α; default ``config.local.learning_rate``), ``weighting``. ``L`` and the
  minibatch size are ``config.local.steps`` / ``batch_size``.
  """
  from fedtree.algorithms.pfedmt import pfedmt

  return pfedmt(
    model=ctx.model, topology=ctx.topology, data=ctx.data, schedule=ctx.schedule,
    learning_rate=num(run.get("learning_rate", ctx.config.local.learning_rate)),
    lam=num(run.get("lam", 15.0)), gamma=num(run.get("gamma", 0.1)),
    eta=num(run.get("eta", 0.03)), beta=num(run.get("beta", 1.0)),
    team_iters=int(run.get("team_iters", 30)), weighting=run.get("weighting", "examples"),
    chunk_size=ctx.chunk_size(run), name=run.algorithm,
  )


def _run_label(run, ctx) -> str:
  for label, cfg in ctx.config.runs.items():
    if cfg is run:
      return label
  return run.get("label", run.algorithm)


def _per_level_servers(run, plural: str, single: str, default):
  if plural in run:
    return [server_from_config(s) for s in run[plural]]
  if single in run:
    return server_from_config(run[single])
  return default


def build_bhfl(run, ctx):
  """B-HFL (paper 001) on the config's tree, with a report hook giving the table by level
  (printed and written to ``<workdir>/bhfl_levels_<label>.{json,md}``).

  Run fields (all optional): ``up`` / ``ups`` (server config for every level / a list per
  level 0..depth-1; default FedAvg), ``down`` / ``downs`` (down optimizer for levels
  1..depth) or ``eta_down`` (``sgd(η↓)`` at every level; default 1.0 = replacement),
  ``periods`` (int, per level, or per node lists), ``proxy_examples`` (0: none),
  ``proxy_levels`` (default ``(0,)``: the root), ``proxy_steps``, ``proxy_batch_size``,
  ``residual_k``, ``residual`` (server config of every residual link, default ``sgd(1.0)``),
  ``residual_down`` (bool), ``residual_down_eta``, ``buffer_sizes`` (per server level, ``None``
  = synchronous), ``latency`` (a config ``{kind, mean, sigma, low, high}`` or a list per level
  1..depth), ``staleness_exponent``.
  """
  import optax

  from fedtree.algorithms.bhfl import bhfl, proxy_from_clients
  from fedtree.algorithms.bhfl.asynchrony import latency_from_config
  from fedtree.core.local import LocalSchedule

  ups = _per_level_servers(run, "ups", "up", None)
  downs = _per_level_servers(run, "downs", "down", None)
  if downs is None:
    downs = optax.sgd(float(run.get("eta_down", 1.0)))
  periods = run.get("periods", None)
  if isinstance(periods, (list, tuple)):
    periods = [tuple(p) if isinstance(p, (list, tuple)) else int(p) for p in periods]
  proxy = {}
  n_proxy = int(run.get("proxy_examples", 0))
  if n_proxy:
    for lv in run.get("proxy_levels", (0,)):
      proxy[int(lv)] = proxy_from_clients(ctx.data, ctx.topology, int(lv), n_proxy,
                                          seed=int(ctx.config.seed) + int(lv))
  proxy_schedule = LocalSchedule(
    batch_size=int(run.get("proxy_batch_size", ctx.schedule.batch_size)), epochs=None,
    steps=int(run.get("proxy_steps", 5)),
  )
  lat = run.get("latency", None)
  if isinstance(lat, (list, tuple)):
    lat = [latency_from_config(v) for v in lat]
  else:
    lat = latency_from_config(lat)
  buffers = run.get("buffer_sizes", None)
  buffers = list(buffers) if isinstance(buffers, (list, tuple)) else buffers
  alg = bhfl(
    topology=ctx.topology, up_optimizers=ups, down_optimizers=downs, periods=periods,
    client_update=None, proxy=proxy, proxy_schedule=proxy_schedule,
    residual_k=int(run.get("residual_k", 0)),
    residual_optimizer=server_from_config(run.get("residual", None)),
    residual_down=bool(run.get("residual_down", False)),
    residual_down_optimizer=optax.sgd(float(run.get("residual_down_eta", 0.5))),
    buffer_sizes=buffers, latencies=lat,
    staleness_exponent=float(run.get("staleness_exponent", 0.0)), name=run.algorithm,
    **common(run, ctx),
  )
  return with_level_report(alg, ctx.model, ctx.topology, central_test=ctx.central_test,
                           chunk_size=ctx.config.get("eval_chunk_size", None), label=_run_label(run, ctx))
