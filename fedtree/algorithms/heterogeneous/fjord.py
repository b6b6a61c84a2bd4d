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
from fedtree.core.checks import check_positive, check_unit_interval, named
from fedtree.core.model import label_kind


@method_over(hierfavg, cannot=REFUSALS, sets={"server_rule": HOLDERS})
def fjord(host: Host, *, rates: Sequence[float] = (0.2, 0.4, 0.6, 0.8, 1.0),
          proportions: Sequence[float] | None = None, capacity_seed: int = 0, capacities: str = "seeded",
          distill: bool = False, distill_weight: float = 1.0, temperature: float = 1.0,
          client_update: ObjectiveFactory | None = None, name: str = "fjord") -> FederatedAlgorithm:
  """FjORD: every local step trains the first ``ceil(p · n)`` channels of every layer, ``p`` drawn
  uniformly among the ``rates`` up to the client's own (ordered dropout); no scaler.

  Every client has a capacity level fixed for the run (its ``p_max``); its parent averages each
  coordinate over the clients whose ``p_max`` holds it. Models: ``global``, every level's sub-model
  (``width_1_5``, ...) and each client's own (``own_width``). With ``distill``, the paper's
  self-distillation (Sec. 3.3): every step also trains the client's widest sub-model on the labels, and
  the drawn width learns from its predictions (:func:`~fedtree.algorithms.heterogeneous.heterofl.
  distilled_update`).

  Args:
    rates: the widths ``D_P``, each in (0, 1] (the paper's 0.2, 0.4, ..., 1).
    proportions: the share of clients whose ``p_max`` is each rate (``None``: equal), summing to 1.
    capacity_seed: the seed that places the levels on the clients (fixed for the run).
    capacities: ``"seeded"``, ``"speed"`` (by the devices' speeds) or ``"dynamic"`` (drawn every round), as
      HeteroFL's.
    distill: self-distillation from the client's ``p_max`` sub-model (each step then costs both widths:
      the systems clock counts it).
    distill_weight: ``α`` in ``[0, 1]``, the drawn width's loss ``(1 − α) CE + α T² KL(teacher ‖ it)``
      (1: Flower's FjORD baseline, which trains it on the teacher's probabilities alone).
    temperature: ``T > 0`` of the distillation's softmax (1: Flower's).
    client_update: the local objective as a factory (default plain SGD), run on each step's width.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`.

  Raises:
    ValueError: as :func:`~fedtree.algorithms.heterogeneous.heterofl.heterofl`'s; with ``distill``, an
      ``α`` outside ``[0, 1]``, ``T <= 0``, a ``client_update``, or a multi-label model.

  Example:
    >>> mlp = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(10,))
    >>> alg = fjord(model=mlp, data=data, rates=(0.5, 1.0), local_optimizer=optax.sgd(0.1),
    ...             schedule=LocalSchedule(batch_size=8, steps=3))
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['global', 'own_width', 'width_1', 'width_1_2']
  """
  if distill:
    with named(name):
      check_unit_interval(distill_weight=distill_weight)
      check_positive(temperature=temperature)
    if client_update is not None:
      raise ValueError(f"{name}: distill=True trains on its own loss (the teacher's cross-entropy and the "
                       f"student's distillation), not a client_update's; leave it out or distill=False")
    if host["model"].multi_label:
      raise ValueError(f"{name}: distill=True distills softmax predictions, and the model's labels are "
                       f"{label_kind(host['model'])}; use distill=False")
  return width_method(host, rates=rates, proportions=proportions, capacity_seed=capacity_seed, mode="ordered",
                      scaler=False, client_update=client_update, name=name, capacities=capacities,
                      distill=(distill_weight, temperature) if distill else None)
