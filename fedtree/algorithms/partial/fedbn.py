"""FedBN (Li et al. 2021, "FedBN: federated learning on non-IID features via local batch
normalization") on any tree.

FedAvg in which every client keeps its **BatchNorm layers** local: their affine parameters
(``scale``, ``bias``) and their running statistics (``mean``, ``var``), the paper's choice. A
sampled client starts from its parent's other parameters and its own BatchNorm layers, trains the
whole model (its statistics come from the real rows of each batch,
:func:`fedtree.core.model.forward_train`), sends everything else and keeps its BatchNorm layers;
they are never sent, never aggregated (the servers' copies stay at their initial values) and not
counted in bytes. Each client is scored with its own model, its running statistics included
(``personal``). The model must have BatchNorm: ``build_model("mlp" | "cnn", ..., norm="batch")``.

The layers are found by a name pattern (``norm``, a regular expression searched in every
parameter's path; flax names them ``BatchNorm_<i>``): the affine parameters are the ``params``
collection's leaves under a matching layer, the statistics the ``batch_stats`` collection's.

**On a tree** the other parameters are aggregated up to the root as HierFAVG; the BatchNorm layers
are personal to each client (``personal_level=None``, the paper) or shared within each level-``l``
subtree (``personal_level=l``: e.g. one normalization per site behind an edge server).

**Other implementations** (all keep the statistics local; they differ in how they find the
layers). PFLlib keeps the parameters whose name contains ``bn`` and never sends buffers (running
statistics), so a model whose BatchNorm layers are not named ``bn...`` keeps its statistics
local but averages its affine parameters: ``affine=False``. FLGo keeps every ``state_dict`` entry
whose name contains ``bn`` (affine and statistics: the default, with ``norm="bn"`` for such names).
FL-bench keeps the parameters of ``BatchNorm2d`` modules and every buffer: an MLP's
``BatchNorm1d`` layers then share their affine parameters and keep their statistics
(``affine=False``); a CNN's keep both (the default).
"""

from __future__ import annotations

import re

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.partial.split import (
  split_model,
)
from fedtree.core.algorithm import FederatedAlgorithm


@method_over(hierfavg, sets={"personal": "the normalization layers are personal: choose them with norm=, "
                                         "affine=, statistics= and personal_level="})
def fedbn(
  host: Host,
  *,
  norm: str = "BatchNorm",
  affine: bool = True,
  statistics: bool = True,
  personal_level: int | None = None,
  name: str = "fedbn",
) -> FederatedAlgorithm:
  """FedBN on ``topology`` (default flat): see the module docstring.

  Args:
    norm: a regular expression naming the normalization layers (searched in the path of every
      parameter and statistic).
    affine: keep the layers' affine parameters local (the paper); ``False``: average them.
    statistics: keep the layers' running statistics local (the paper); ``False``: average them
      (FedAvg of a BatchNorm model, for the affine-only variant).
    personal_level: ``None``: personal to each client (the paper); ``l``: shared within each
      level-``l`` subtree.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`.

  Raises:
    ValueError: a model without such layers (a pattern matching nothing names the model's
      parameters), neither ``affine`` nor ``statistics``, a pattern that is not a regular
      expression, ``personal=``.

  Example:
    Two rounds over 5 clients of an MLP with BatchNorm:

    >>> import jax, optax
    >>> from fedtree.core import loop
    >>> from fedtree.core.local import LocalSchedule
    >>> from fedtree.datasets.synthetic import grouped_synthetic
    >>> from fedtree.models import build_model
    >>> data, _ = grouped_synthetic(group_sizes=(3, 2), dim=8, num_classes=3)
    >>> model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(8,),
    ...                     norm="batch")
    >>> alg = fedbn(model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...             schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['personal']
  """
  try:
    re.compile(norm)
  except re.error as e:
    raise ValueError(f"{name}: norm={norm!r} is not a regular expression: {e}") from e
  if not (affine or statistics):
    raise ValueError(f"{name}: affine=False and statistics=False keep nothing local: that is FedAvg")
  model = host["model"]
  if statistics and "batch_stats" not in model.state:
    raise ValueError(f"{name}: the model keeps no BatchNorm statistics (its state: {list(model.state)}); ask "
                     f"for one with BatchNorm (mlp, cnn, resnet18): on the command line "
                     f"--config.model.norm=batch (every run's model) or "
                     f"--config.runs.<label>.model.norm=batch (this run's own), in a config "
                     f"model=dict(..., norm='batch'), in Python build_model(..., norm='batch')")
  root = "params/" if model.state else ""
  patterns = ((f"^{root}(.*/)?[^/]*({norm})",) if affine else ()) + (
    (f"^batch_stats/(.*/)?[^/]*({norm})",) if statistics else ())
  split = split_model(host, patterns, algorithm=name, kept="normalization set", shared="rest of the model")
  return split.counted(host.build(personal=split.personal(personal_level), name=name), personal_level)
