"""LG-FedAvg (Liang et al. 2020, "Think locally, act globally: federated learning with local and
global representations") on any tree.

Every client keeps its own **local representation** (the body: every layer below the head) and
shares the **global head** (by default the model's last layer, :mod:`fedtree.algorithms.partial.split`):
a sampled client starts from its own body and its parent's head, trains the whole model jointly
for the local schedule, sends the head and keeps the body; the server averages the heads (weighted
by examples; ``weighting="uniform"`` for the plain mean). Each client is scored with its own model
(its body and the shared head: ``personal``). A model with BatchNorm keeps its statistics in the
body, so they stay local too. The paper's code starts LG-FedAvg from a FedAvg-trained model; give
it as ``init_params`` (``config.init_params``) to do the same.

**On a tree** the head is aggregated up to the root as HierFAVG; the body is personal to each
client (``personal_level=None``, the paper) or shared within each level-``l`` subtree
(``personal_level=l``: a representation per edge server).

**Other implementations.** The paper's code keeps the top ``num_layers_keep`` layers global;
PFLlib's LG-FedAvg shares ``model.head`` (the last linear layer) and FLGo's the last ``p=2``
tensors (the last linear layer's weight and bias): ``head=1``. **FL-bench differs:** its
``num_global_layers`` first layers (Conv/BatchNorm/Linear, counted from the input) are the global
ones and the rest personal, the reverse of the paper's local representation and global head;
``head`` patterns naming those first layers reproduce it (``head=["Dense_0"]``), but the default
follows the paper.
"""

from __future__ import annotations

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.partial.split import (
  Head,
  head_patterns,
  split_model,
)
from fedtree.core.algorithm import FederatedAlgorithm


@method_over(hierfavg, sets={"personal": "the local representation is every parameter outside head="})
def lgfedavg(host: Host, *, head: Head = 1, personal_level: int | None = None,
             name: str = "lgfedavg") -> FederatedAlgorithm:
  """LG-FedAvg on ``topology`` (default flat): see the module docstring.

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
