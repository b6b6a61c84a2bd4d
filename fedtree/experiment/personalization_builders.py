"""Config -> algorithm builders of the personalization family (see ``BUILDERS``).

Besides the common run fields of :mod:`fedtree.experiment.builders` (``cohort_size``,
``chunk_size``, ``weighting``, ``server``/``servers``, ``periods``), every round-based method
here reads ``tree``: ``"flat"`` (default: one server over all clients, as in the original
papers) or ``"config"`` (the config's topology, e.g. root -> groups -> clients), so any local
objective runs on any tree. Method fields:

* ``fedprox``: ``mu``.
* ``ditto``: ``lam``, optional ``personal_learning_rate`` (default the local rate, same
  optimizer as ``config.local``).
* ``pfedme``: ``lam``, ``inner_steps``, ``personal_lr``, ``beta``, optional
  ``learning_rate`` (η of ``w``; default ``config.local.learning_rate``).
* ``perfedavg``: ``alpha``, ``beta``, ``variant`` (``fo``/``hf``).
* ``grouppfl``: ``global_rounds`` (default ``config.rounds``), ``group_rounds``,
  ``cohort_size``, ``global_server`` and ``group_server`` (default FedAdam, lr 1e-3 as the
  paper), ``finetune`` (``epochs``, ``learning_rates``, optional ``batch_size``,
  ``optimizer``), ``select_by``, ``stages``, ``group_names``, ``histogram_metric``,
  ``histogram_group``.
"""

from __future__ import annotations

import ml_collections

from fedtree.algorithms.ditto import ditto
from fedtree.algorithms.fedprox import fedprox
from fedtree.algorithms.grouppfl.grouppfl import STAGES, GroupPersonalizedFL
from fedtree.algorithms.perfedavg import perfedavg
from fedtree.algorithms.pfedme import pfedme
from fedtree.core.local import LocalSchedule
from fedtree.core.topology import Topology
from fedtree.experiment.builders import common, local_optimizer_from_config, num, server_from_config

TREES = ("flat", "config")


def tree_kwargs(run, ctx) -> dict:
  """``topology``, ``server_optimizers`` and ``periods`` of a round-based run."""
  tree = run.get("tree", "flat")
  if tree not in TREES:
    raise ValueError(f"run {run.algorithm}: tree={tree!r}; choose one of {TREES}")
  topology = Topology.flat(ctx.data.num_clients) if tree == "flat" else ctx.topology
  out = dict(topology=topology)
  if "servers" in run:
    out["server_optimizers"] = [server_from_config(s) for s in run.servers]
  elif "server" in run:
    out["server_optimizers"] = server_from_config(run.server)
  periods = run.get("periods", None)
  if periods is not None:
    out["periods"] = tuple(periods) if isinstance(periods, (list, tuple)) else periods
  return out


def _required(run, *names):
  missing = [n for n in names if n not in run]
  if missing:
    raise ValueError(f"run with algorithm={run.algorithm!r} needs field(s) {missing}")
  return [run[n] for n in names]


def build_fedprox(run, ctx):
  (mu,) = _required(run, "mu")
  return fedprox(mu=num(mu), name=run.algorithm, **tree_kwargs(run, ctx), **common(run, ctx))


def build_ditto(run, ctx):
  (lam,) = _required(run, "lam")
  personal = None
  if "personal_learning_rate" in run:
    local = ml_collections.ConfigDict(ctx.config.local.to_dict())
    local.learning_rate = float(run.personal_learning_rate)
    personal = local_optimizer_from_config(local)
  return ditto(lam=num(lam), personal_optimizer=personal, name=run.algorithm,
               **tree_kwargs(run, ctx), **common(run, ctx))


def build_pfedme(run, ctx):
  lam, inner, plr = _required(run, "lam", "inner_steps", "personal_lr")
  kw = tree_kwargs(run, ctx)
  return pfedme(lam=num(lam), inner_steps=int(inner), personal_lr=num(plr),
                beta=num(run.get("beta", 1.0)),
                learning_rate=num(run.get("learning_rate", ctx.config.local.learning_rate)),
                name=run.algorithm, **kw, **common(run, ctx))


def build_perfedavg(run, ctx):
  alpha, beta = _required(run, "alpha", "beta")
  return perfedavg(alpha=num(alpha), beta=num(beta), variant=run.get("variant", "fo"),
                   name=run.algorithm, **tree_kwargs(run, ctx), **common(run, ctx))


def _fedadam_default(cfg):
  if cfg is None:
    cfg = ml_collections.ConfigDict(dict(name="fedadam", learning_rate=1e-3))
  return server_from_config(cfg)


def build_grouppfl(run, ctx):
  """GroupPerFL (paper 000): its two federated stages as one algorithm whose report hook
  fine-tunes and reports FL, PerFL, GroupFL and GroupPerFL."""
  ft = run.get("finetune", ml_collections.ConfigDict())
  epochs = ft.get("epochs", 5)
  if not epochs > 0:
    raise ValueError(f"run {run.algorithm}: finetune.epochs={epochs} (K_l) must be > 0")
  schedule = LocalSchedule(batch_size=int(ft.get("batch_size", ctx.schedule.batch_size)),
                           epochs=epochs, steps=None)
  cohort = run.get("cohort_size", None)
  names = run.get("group_names", None)
  return GroupPersonalizedFL(
    global_rounds=int(run.get("global_rounds", ctx.config.rounds)),
    group_rounds=int(run.get("group_rounds", 0)),
    global_server=_fedadam_default(run.get("global_server", None)),
    group_server=_fedadam_default(run.get("group_server", None)),
    cohort_size=None if cohort in (None, -1) else int(cohort),
    finetune_schedule=schedule,
    finetune_rates=tuple(float(r) for r in ft.get("learning_rates", (0.001, 0.01, 0.1, 1.0))),
    finetune_optimizer=ft.get("optimizer", "sgd"),
    select_by=run.get("select_by", "loss"),
    stages=tuple(run.get("stages", STAGES)),
    group_names=tuple(names) if names is not None else None,
    histogram_metric=run.get("histogram_metric", "perplexity"),
    histogram_group=run.get("histogram_group", None),
    label=run.get("label", run.algorithm),
  ).algorithm(
    model=ctx.model, data=ctx.data, groups=ctx.groups, local_optimizer=ctx.local_optimizer,
    schedule=ctx.schedule, chunk_size=ctx.chunk_size(),
    eval_chunk_size=ctx.config.get("eval_chunk_size", None),
  )
