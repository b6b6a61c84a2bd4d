"""Per-FedAvg (Fallah et al. 2020): MAML steps on the clients, each client scored after one adaptation
step, on any tree.

References:
  Fallah, Mokhtari and Ozdaglar, Personalized federated learning with theoretical guarantees: a
  model-agnostic meta-learning approach, NeurIPS 2020.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup, NodeModels
from fedtree.core.finetune import make_finetuner
from fedtree.core.local import LocalSchedule
from fedtree.core.membership import clients_node
from fedtree.core.rng import stream
from fedtree.core.topology import Topology
from fedtree.objectives import perfedavg_update


@method_over(hierfavg)
def perfedavg(
  host: Host,
  *,
  alpha: float,
  beta: float,
  variant: str = "fo",
  adapt_seed: int = 0,
  name: str = "perfedavg",
) -> FederatedAlgorithm:
  """Per-FedAvg on ``topology`` (default flat).

  Args:
    alpha: α > 0, the inner (adaptation) rate.
    beta: β > 0, the outer (meta) rate.
    variant: ``"fo"`` or ``"hf"``.
    adapt_seed: seed of the evaluation-time adaptation minibatches (folded with the round).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`;
      ``local_optimizer`` is not used (Per-FedAvg's steps are its own), ``compute_dtype`` gives
      mixed-precision MAML steps.

  Example:
    One round of Per-FedAvg (α = 0.05, β = 0.1):

    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=1))
    >>> alg = perfedavg(alpha=0.05, beta=0.1, **common)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    [...]
  """

  def objective(s: LocalSetup):
    return perfedavg_update(s.model, alpha=alpha, beta=beta, variant=variant, batch_size=s.batch_size,
                            max_steps=s.max_steps, compute_dtype=s.compute_dtype)

  inner = host.build(client_update=objective, name=name)
  model, data, schedule = host["model"], host["data"], host["schedule"]
  topology = host.get("topology") or Topology.flat(data.num_clients)
  adapt = make_finetuner(model, LocalSchedule(batch_size=schedule.batch_size, epochs=None, steps=1),
                         max_train=data.max_train, evaluate=False)
  clients = np.arange(topology.num_clients, dtype=np.int32)
  rates = jnp.asarray([alpha])  # the default float dtype: alpha is not rounded to float32 under x64

  def models(state):
    out = dict(inner.models(state))
    key = jax.random.fold_in(stream(jax.random.key(adapt_seed), "perfedavg_adapt"), state.round)
    leaf_parent = jnp.asarray(clients_node(topology, topology.depth - 1, host.get("membership"), state.round),
                              jnp.int32)
    adapted, _ = adapt(state.params[topology.depth - 1], leaf_parent, data, rates, key)
    out["adapted"] = NodeModels(jax.tree.map(lambda a: a[0], adapted), clients)
    return out

  return inner._replace(models=models)
