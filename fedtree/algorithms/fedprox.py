"""FedProx (Li et al. 2020, "Federated optimization in heterogeneous networks") on any tree.

Clients minimize ``f_i(θ) + (μ/2)‖θ - Θ‖²`` from the downloaded ``Θ``
(:func:`fedtree.objectives.fedprox_update`); everything above the clients is
:func:`~fedtree.algorithms.hierfavg.hierfavg`, so FedProx runs under any tree and any server
optimizers (a flat tree and FedAvg servers give the original method). ``μ = 0`` is FedAvg.
"""

from __future__ import annotations

from fedtree.algorithms.hierfavg import hierfavg
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.topology import Topology
from fedtree.objectives import fedprox_update


def fedprox(*, mu: float, topology: Topology | None = None, name: str = "fedprox",
            **hierfavg_kwargs) -> FederatedAlgorithm:
  """FedProx with proximal weight ``mu`` on ``topology`` (default flat).

  Args:
    mu: μ >= 0.
    topology: the tree (``None``: one server over all clients).
    name: label for reports.
    **hierfavg_kwargs: ``model, data, local_optimizer, schedule, server_optimizers, periods,
      cohort_size, chunk_size, weighting`` as for :func:`~fedtree.algorithms.hierfavg.hierfavg`.
  """
  model, data, schedule = (hierfavg_kwargs[k] for k in ("model", "data", "schedule"))
  topology = Topology.flat(data.num_clients) if topology is None else topology
  update = fedprox_update(
    model, hierfavg_kwargs["local_optimizer"], mu=mu, batch_size=schedule.batch_size,
    max_steps=schedule.max_steps(data.max_train),
  )
  return hierfavg(topology=topology, client_update=update, name=name, **hierfavg_kwargs)
