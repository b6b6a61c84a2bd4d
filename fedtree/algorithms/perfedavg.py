"""Per-FedAvg (Fallah et al. 2020, "Personalized federated learning with theoretical
guarantees: a model-agnostic meta-learning approach") on any tree.

Clients take MAML steps ``w ← w - β ∇f(w - α∇f(w; D); D')`` (first-order ``"fo"``) or the
Hessian-free variant ``"hf"`` (:func:`fedtree.objectives.perfedavg_update`); the server side
is :func:`~fedtree.algorithms.hierfavg.hierfavg`. Evaluation follows the paper: each client
adapts the model it would download (its leaf-parent's) with one step of SGD at rate ``α``
on a minibatch of its own training data, vectorized over all clients
(:func:`fedtree.core.finetune.finetune`), and is scored with the adapted model (``adapted``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.algorithms.hierfavg import hierfavg
from fedtree.core.algorithm import FederatedAlgorithm, NodeModels
from fedtree.core.finetune import make_finetuner
from fedtree.core.local import LocalSchedule
from fedtree.core.rng import stream
from fedtree.core.topology import Topology
from fedtree.objectives import perfedavg_update


def perfedavg(*, alpha: float, beta: float, variant: str = "fo", topology: Topology | None = None,
              adapt_seed: int = 0, name: str = "perfedavg",
              **hierfavg_kwargs) -> FederatedAlgorithm:
  """Per-FedAvg on ``topology`` (default flat).

  Args:
    alpha: α > 0, the inner (adaptation) rate.
    beta: β > 0, the outer (meta) rate.
    variant: ``"fo"`` or ``"hf"``.
    topology: the tree (``None``: flat).
    adapt_seed: seed of the evaluation-time adaptation minibatches (folded with the round).
    name: label for reports.
    **hierfavg_kwargs: as for :func:`~fedtree.algorithms.hierfavg.hierfavg` (the
      ``local_optimizer`` is unused).
  """
  model, data, schedule = (hierfavg_kwargs[k] for k in ("model", "data", "schedule"))
  topology = Topology.flat(data.num_clients) if topology is None else topology
  update = perfedavg_update(model, alpha=alpha, beta=beta, variant=variant,
                            batch_size=schedule.batch_size,
                            max_steps=schedule.max_steps(data.max_train))
  inner = hierfavg(topology=topology, client_update=update, name=name, **hierfavg_kwargs)
  adapt = make_finetuner(model, LocalSchedule(batch_size=schedule.batch_size, epochs=None, steps=1),
                         max_train=data.max_train, evaluate=False)
  leaf_parent = jnp.asarray(topology.ancestor(topology.depth - 1), jnp.int32)
  clients = np.arange(topology.num_clients, dtype=np.int32)
  rates = jnp.asarray([alpha], jnp.float32)

  def models(state):
    out = dict(inner.models(state))
    key = jax.random.fold_in(stream(jax.random.key(adapt_seed), "perfedavg_adapt"), state.round)
    adapted, _ = adapt(state.params[topology.depth - 1], leaf_parent, data, rates, key)
    out["adapted"] = NodeModels(jax.tree.map(lambda a: a[0], adapted), clients)
    return out

  return inner._replace(models=models)
