"""FedBN (Li et al. 2021): FedAvg in which every client keeps its BatchNorm layers, on any tree.

Which layers, on a tree, and how PFLlib, FLGo and FL-bench find them: :doc:`FedBN on the
partial-personalization page <algorithms/partial.md#fedbn>`.

References:
  Li et al., FedBN: federated learning on non-IID features via local batch normalization,
  ICLR 2021.
"""

from __future__ import annotations

import re

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.partial.split import split_model
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
  """FedBN on ``topology`` (default flat): FedAvg in which every client keeps its BatchNorm layers
  (:doc:`the method's page <algorithms/partial.md#fedbn>`).

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
