"""Config -> algorithm builders for the round-based algorithms (see ``BUILDERS``).

Common run-config fields: ``cohort_size`` (per leaf-parent node; -1 or absent: all),
``chunk_size``, ``weighting`` (``examples``/``uniform``), ``server`` (a config with ``name``
and hyperparameters, see :func:`fedtree.server.server_optimizer`).
"""

from __future__ import annotations

import ml_collections

from fedtree.algorithms.hierfavg import fedavg, hierfavg
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
  return dict(
    model=ctx.model, data=ctx.data, local_optimizer=ctx.local_optimizer, schedule=ctx.schedule,
    cohort_size=cohort, chunk_size=run.get("chunk_size", ctx.config.get("chunk_size", None)),
    weighting=run.get("weighting", "examples"),
  )


def build_fedavg(run, ctx):
  """FedAvg / FedOpt: one server over all clients (the tree is flattened)."""
  return fedavg(server_optimizer=server_from_config(run.get("server", None)), name=run.algorithm,
                **common(run, ctx))


def build_hierfavg(run, ctx):
  """HierFAVG on the config's tree; ``periods`` per upper level; ``server`` for every level or
  ``servers`` (a list, one per server level)."""
  if "servers" in run:
    servers = [server_from_config(s) for s in run.servers]
  else:
    servers = server_from_config(run.get("server", None))
  periods = run.get("periods", None)
  return hierfavg(topology=ctx.topology, server_optimizers=servers,
                  periods=tuple(periods) if isinstance(periods, (list, tuple)) else periods,
                  name=run.algorithm, **common(run, ctx))


def build_pfedmt(run, ctx):
  """pFedMT (paper 003) on the config's root -> teams -> devices tree.

  Run fields: ``lam`` (λ), ``gamma`` (γ), ``eta`` (η), ``beta`` (β), ``team_iters`` (K),
  ``learning_rate`` (α; default ``config.local.learning_rate``), ``weighting``. ``L`` and the
  minibatch size are ``config.local.steps`` / ``batch_size``.
  """
  from fedtree.algorithms.pfedmt import pfedmt

  return pfedmt(
    model=ctx.model, topology=ctx.topology, data=ctx.data, schedule=ctx.schedule,
    learning_rate=float(run.get("learning_rate", ctx.config.local.learning_rate)),
    lam=float(run.get("lam", 15.0)), gamma=float(run.get("gamma", 0.1)),
    eta=float(run.get("eta", 0.03)), beta=float(run.get("beta", 1.0)),
    team_iters=int(run.get("team_iters", 30)), weighting=run.get("weighting", "examples"),
    chunk_size=run.get("chunk_size", ctx.config.get("chunk_size", None)), name=run.algorithm,
  )
