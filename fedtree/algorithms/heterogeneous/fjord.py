"""FjORD (Horváth et al. 2021) on any tree: ordered dropout, every local step training a width drawn up to
the client's own, each coordinate averaged over the clients that could train it (:doc:`the page
<algorithms/heterogeneous.md#fjord>`).

References:
  Horváth, Laskaridis, Almeida, Leontiadis, Venieris and Lane, FjORD: Fair and accurate federated
  learning under heterogeneous targets with ordered dropout, NeurIPS 2021.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedtree.algorithms.heterogeneous.heterofl import HOLDERS, REFUSALS, width_method
from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, ObjectiveFactory


@method_over(hierfavg, cannot=REFUSALS, sets={"server_rule": HOLDERS})
def fjord(host: Host, *, rates: Sequence[float] = (0.2, 0.4, 0.6, 0.8, 1.0),
          proportions: Sequence[float] | None = None, capacity_seed: int = 0, capacities: str = "seeded",
          client_update: ObjectiveFactory | None = None, name: str = "fjord") -> FederatedAlgorithm:
  """FjORD: every local step trains the first ``ceil(p · n)`` channels of every layer, ``p`` drawn
  uniformly among the ``rates`` up to the client's own (ordered dropout); no scaler.

  Every client has a capacity level fixed for the run (its ``p_max``); its parent averages each
  coordinate over the clients whose ``p_max`` holds it. Models: ``global``, every level's sub-model
  (``width_1_5``, ...) and each client's own (``own_width``). The paper's self-distillation from the
  client's widest sub-model is not built.

  Args:
    rates: the widths ``D_P``, each in (0, 1] (the paper's 0.2, 0.4, ..., 1).
    proportions: the share of clients whose ``p_max`` is each rate (``None``: equal), summing to 1.
    capacity_seed: the seed that places the levels on the clients (fixed for the run).
    capacities: ``"seeded"`` or ``"speed"`` (by the devices' speeds), as HeteroFL's.
    client_update: the local objective as a factory (default plain SGD), run on each step's width.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`.

  Raises:
    ValueError: as :func:`~fedtree.algorithms.heterogeneous.heterofl.heterofl`'s.

  Example:
    >>> mlp = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(10,))
    >>> alg = fjord(model=mlp, data=data, rates=(0.5, 1.0), local_optimizer=optax.sgd(0.1),
    ...             schedule=LocalSchedule(batch_size=8, steps=3))
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['global', 'own_width', 'width_1', 'width_1_2']
  """
  return width_method(host, rates=rates, proportions=proportions, capacity_seed=capacity_seed, mode="ordered",
                      scaler=False, client_update=client_update, name=name, capacities=capacities)
