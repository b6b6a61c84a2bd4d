"""pFedMe (Dinh et al. 2020, "Personalized federated learning with Moreau envelopes") on any
tree.

Client (:func:`fedtree.objectives.pfedme_update`): ``R`` local rounds (the local schedule's
steps), each solving ``θ̂ ≈ argmin_θ f_i(θ; batch) + (λ/2)‖θ - w‖²`` by ``K`` inner steps
of rate ``personal_lr`` and then ``w ← w - η λ (w - θ̂)``; ``w`` is sent up. Server:
``Θ ← (1-β)Θ + β·mean(w_i)``, which is ``Θ - β·Δ`` with the pseudo-gradient
``Δ = Θ - mean(w_i)``: exactly ``optax.sgd(β)`` as the leaf-parent server optimizer (upper
levels of a deeper tree default to FedAvg). The personal models ``θ̂_i`` live in
``TreeState.client_state`` (``PFedMeState.personal [C, ...]``). Models evaluated: the tree's
models and ``personal``.
"""

from __future__ import annotations

import optax

from fedtree.algorithms.hierfavg import hierfavg
from fedtree.core.algorithm import FederatedAlgorithm, with_personal_models
from fedtree.core.checks import check_positive
from fedtree.core.topology import Topology
from fedtree.objectives.moreau import pfedme_update


def pfedme(*, lam: float, inner_steps: int, personal_lr: float, beta: float = 1.0,
           learning_rate: float, topology: Topology | None = None, server_optimizers=None,
           name: str = "pfedme", **hierfavg_kwargs) -> FederatedAlgorithm:
  """pFedMe on ``topology`` (default flat).

  Args:
    lam: λ > 0 of the Moreau envelope.
    inner_steps: K inner steps per local round.
    personal_lr: rate of the inner steps.
    beta: β > 0, the server's mixing (``β = 1``: FedAvg of the ``w_i``).
    learning_rate: η, the clients' rate of ``w``.
    topology: the tree (``None``: flat).
    server_optimizers: override (default FedAvg above, ``sgd(β)`` at the leaf parents).
    name: label for reports.
    **hierfavg_kwargs: as for :func:`~fedtree.algorithms.hierfavg.hierfavg` (the
      ``local_optimizer`` is unused: pFedMe's steps are its own).
  """
  check_positive(beta=beta)
  model, data, schedule = (hierfavg_kwargs[k] for k in ("model", "data", "schedule"))
  topology = Topology.flat(data.num_clients) if topology is None else topology
  update = pfedme_update(
    model, lam=lam, inner_steps=inner_steps, personal_lr=personal_lr, learning_rate=learning_rate,
    batch_size=schedule.batch_size, max_steps=schedule.max_steps(data.max_train),
  )
  if server_optimizers is None:
    server_optimizers = (optax.sgd(1.0),) * (topology.depth - 1) + (optax.sgd(beta),)
  inner = hierfavg(topology=topology, client_update=update, server_optimizers=server_optimizers,
                   name=name, **hierfavg_kwargs)
  return with_personal_models(inner, "personal", lambda state: state.client_state.personal)
