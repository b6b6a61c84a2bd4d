"""GroupPerFL's run fields (paper 000): its fine-tune and server converters, its stages, its spec.

Experiment layer (they read config values); the algorithm is :mod:`fedtree.algorithms.hierarchical.grouppfl`.
"""

from __future__ import annotations

from fedtree.algorithms.hierarchical.grouppfl.grouppfl import GroupPersonalizedFL
from fedtree.core.topology import Topology
from fedtree.experiment.builders import server_from_config
from fedtree.experiment.fields import field
from fedtree.experiment.spec import AlgorithmSpec, Fields, check_fields


def _grouppfl_stages(spec, label, run, ctx):
  return spec.algorithm(
    model=ctx.model, data=ctx.data, groups=ctx.groups, local_optimizer=ctx.local_optimizer,
    schedule=ctx.schedule, chunk_size=ctx.chunk_size(run),
    eval_chunk_size=field(ctx.config, "eval_chunk_size"), init_params=ctx.initial_params(run, label),
  )


# ``finetune.<field>`` -> GroupPersonalizedFL's ``finetune_<field>`` (its defaults: the paper's).
FINETUNE_FIELDS = {"epochs": "finetune_epochs", "learning_rates": "finetune_rates",
                   "batch_size": "finetune_batch_size", "optimizer": "finetune_optimizer"}


def _grouppfl_finetune(v, ctx):
  ft = v.get("finetune", None) or {}
  check_fields("finetune", list(ft.keys()), FINETUNE_FIELDS)
  return {FINETUNE_FIELDS[k]: ft[k] for k in ft}   # GroupPersonalizedFL validates them


def _grouppfl_servers(v, ctx):
  return {f: server_from_config(v[f]) for f in ("global_server", "group_server") if f in v}


SPEC = AlgorithmSpec(
  GroupPersonalizedFL,
  fields=(Fields(("finetune",), _grouppfl_finetune, ("finetune_schedule", *FINETUNE_FIELDS.values())),
          Fields(("global_server", "group_server"), _grouppfl_servers)),
  defaults=lambda ctx: {"global_rounds": int(ctx.config.rounds), "group_names": ctx.group_names},
  wrap=_grouppfl_stages,
  tree=lambda run, ctx: Topology.from_labels(ctx.groups),   # root -> data groups -> clients
  takes=("adapters",),
)
