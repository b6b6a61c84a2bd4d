"""Config -> algorithm builder of FedKWS-UI (paper 002; see ``BUILDERS``).

Run fields of ``fedkws`` (all optional): ``mu`` (0.2), ``lam`` (0.001), ``alo`` (True),
``alt`` (True), ``r0`` (``None``: work conserved), ``min_steps`` (1), ``private_steps``,
``private_learning_rate`` (default the local rate, same optimizer as ``config.local``),
and the common round-based fields (``tree``, ``server``/``servers``, ``periods``,
``cohort_size``, ``chunk_size``, ``weighting``; see
:mod:`fedtree.experiment.personalization_builders`). ``alt=True`` needs
``config.local.steps`` (E).
"""

from __future__ import annotations

import ml_collections

from fedtree.algorithms.fedkws.fedkws import fedkws
from fedtree.experiment.builders import common, local_optimizer_from_config, num
from fedtree.experiment.personalization_builders import tree_kwargs


def build_fedkws(run, ctx):
  private = None
  if "private_learning_rate" in run:
    local = ml_collections.ConfigDict(ctx.config.local.to_dict())
    local.learning_rate = float(run.private_learning_rate)
    private = local_optimizer_from_config(local)
  r0 = run.get("r0", None)
  private_steps = run.get("private_steps", None)
  return fedkws(
    mu=num(run.get("mu", 0.2)), lam=num(run.get("lam", 0.001)), alo=bool(run.get("alo", True)),
    alt=bool(run.get("alt", True)), r0=None if r0 is None else float(r0),
    min_steps=int(run.get("min_steps", 1)), private_optimizer=private,
    private_steps=None if private_steps is None else int(private_steps), name=run.algorithm,
    **tree_kwargs(run, ctx), **common(run, ctx),
  )
