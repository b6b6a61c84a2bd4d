"""FedPer (Arivazhagan et al. 2019): every client keeps its own head and shares the body, on any tree.

How it runs on a tree and what PFLlib, FL-bench and FLGo keep as the head: :doc:`FedPer on the
partial-personalization page <algorithms/partial.md#fedper>`.

References:
  Arivazhagan et al., Federated learning with personalization layers, 2019.
"""

from __future__ import annotations

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.partial.split import Head, head_patterns, split_model
from fedtree.core.algorithm import FederatedAlgorithm


@method_over(hierfavg, sets={"personal": "the head is personal: choose it with head= and personal_level="})
def fedper(host: Host, *, head: Head = 1, personal_level: int | None = None,
           name: str = "fedper") -> FederatedAlgorithm:
  """FedPer on ``topology`` (default flat): every client keeps its head and shares the body
  (:doc:`the method's page <algorithms/partial.md#fedper>`).

  Args:
    head: the personalization layers: the model's last ``head`` layers (an int), or path
      patterns (:mod:`fedtree.algorithms.partial.split`).
    personal_level: ``None``: the head is personal to each client (the paper); ``l``: shared
      within each level-``l`` subtree of the tree.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg` (``weighting``,
      ``update_paths``, ``systems``, ...).

  Raises:
    ValueError: a head that covers every parameter (nothing shared: use ``local``), a pattern that
      matches no parameter, a level that is not a server level below the root, or ``personal=``.

  Example:
    Two rounds over 5 clients, the MLP's last layer personal:

    >>> model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(8,))
    >>> alg = fedper(model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...              schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['personal']
  """
  split = split_model(host, head_patterns(host["model"], head, algorithm=name), algorithm=name, kept="head",
                      shared="body")
  return split.counted(host.build(personal=split.personal(personal_level), name=name), personal_level)
