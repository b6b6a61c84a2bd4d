"""FedPer (Arivazhagan et al. 2019, "Federated learning with personalization layers") on any tree.

Every client keeps its own **head** (the personalization layers; by default the model's last
layer, :mod:`fedtree.algorithms.partial.split`) and shares the **body** (the base layers): a sampled
client starts from its parent's body and its own head, trains the whole model jointly for the
local schedule (plain SGD, or any optax local optimizer), sends the body and keeps the head. The
server averages the bodies as FedAvg (weighted by examples, as the paper's FedAvg; ``weighting=
"uniform"`` for the plain mean). Each client is scored with its own model (the shared body and
its own head: ``personal``); there is no global model, a server's head being nobody's.

**On a tree** the body is aggregated up to the root as HierFAVG (every ``periods[l]`` rounds per
level); the head is personal to each client (``personal_level=None``, the paper) or shared within
each level-``l`` subtree (``personal_level=l``: e.g. one head per edge server, aggregated by the
edges and never above them). The host's personal-parameter seam does the bookkeeping
(:mod:`fedtree.core.personal`): heads are never broadcast, aggregated above their level nor
counted in bytes.

**Other implementations.** PFLlib's FedPer keeps ``model.head`` (the last linear layer) and
weighs by data size: the defaults. FL-bench's keeps the ``classifier`` (the last linear layer):
``head=1``. FLGo's keeps the last ``Kp=2`` tensors of ``model.parameters()``, the last linear
layer's weight and bias: ``head=1`` again (``head=["Dense_1/kernel"]``-style patterns name any
other set). FedPer is FedAvg with ``personal=``; this module names the method, checks that a body
is left, and reports the parameter counts.
"""

from __future__ import annotations

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.partial.split import (
  Head,
  head_patterns,
  split_model,
)
from fedtree.core.algorithm import FederatedAlgorithm


@method_over(hierfavg, sets={"personal": "the head is personal: choose it with head= and personal_level="})
def fedper(host: Host, *, head: Head = 1, personal_level: int | None = None,
           name: str = "fedper") -> FederatedAlgorithm:
  """FedPer on ``topology`` (default flat): see the module docstring.

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
