"""LG-FedAvg (Liang et al. 2020): every client keeps its own local representation and shares the
global head, on any tree.

How it runs and how the paper's code, PFLlib, FLGo and FL-bench differ: :doc:`LG-FedAvg on the
partial-personalization page <algorithms/partial.md#lg-fedavg>`.

References:
  Liang et al., Think locally, act globally: federated learning with local and global
  representations, 2020.
"""

from __future__ import annotations

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.partial.split import Head, head_patterns, split_model
from fedtree.core.algorithm import FederatedAlgorithm


@method_over(hierfavg, sets={"personal": "the local representation is every parameter outside head="})
def lgfedavg(host: Host, *, head: Head = 1, personal_level: int | None = None,
             name: str = "lgfedavg") -> FederatedAlgorithm:
  """LG-FedAvg on ``topology`` (default flat): every client keeps its body (its local representation)
  and shares the head (:doc:`the method's page <algorithms/partial.md#lg-fedavg>`).

  Args:
    head: the global (shared) head: the model's last ``head`` layers (an int) or path patterns;
      every other parameter is the client's local representation.
    personal_level: ``None``: the representation is personal to each client (the paper); ``l``:
      shared within each level-``l`` subtree.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`.

  Raises:
    ValueError: a head covering every parameter (no local representation left: that is FedAvg),
      a pattern matching nothing, ``personal=``.

  Example:
    Two rounds over 5 clients, the MLP's last layer global:

    >>> model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(8,))
    >>> alg = lgfedavg(model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...                schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['personal']
  """
  split = split_model(host, head_patterns(host["model"], head, algorithm=name), algorithm=name,
                      kept="local representation", shared="global head", complement=True)
  return split.counted(host.build(personal=split.personal(personal_level), name=name), personal_level)
