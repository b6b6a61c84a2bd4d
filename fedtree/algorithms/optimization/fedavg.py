"""FedAvg (McMahan et al. 2017) and FedOpt (Reddi et al. 2021): the host on one server.

References:
  McMahan et al., Communication-efficient learning of deep networks from decentralized data,
  AISTATS 2017.
  Reddi et al., Adaptive federated optimization, ICLR 2021.
"""

from __future__ import annotations

import optax

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, ObjectiveFactory
from fedtree.core.local import ClientUpdate


@method_over(hierfavg, drops=("server_optimizers", "periods", "top_level", "topology"))
def fedavg(
  host: Host,
  *,
  server_optimizer: optax.GradientTransformation | None = None,
  client_update: ClientUpdate | ObjectiveFactory | None = None,
  name: str = "fedavg",
) -> FederatedAlgorithm:
  """FedAvg (McMahan et al. 2017), or FedOpt with ``server_optimizer`` (Reddi et al. 2021): one
  server, one tier.

  Args:
    server_optimizer: the server's optax optimizer (default FedAvg, ``sgd(1.0)``).
    client_update: the local objective (as :func:`hierfavg`'s).
    name: label for reports.
    **host: every other argument of :func:`hierfavg` (``model``, ``data``, ``local_optimizer``,
      ``schedule``, ``cohort_size``, ``sampling``, ``server_rule``, ``personal``, ``update_paths``,
      ``systems``, ...).

  Example:
    One round of FedAvg over 5 clients:

    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=1))
    >>> alg = fedavg(local_optimizer=optax.sgd(0.1), **common)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['global']
  """
  return host.build(server_optimizers=server_optimizer, client_update=client_update, name=name)
