"""SCAFFOLD (Karimireddy et al. 2020): local steps corrected by control variates, on any tree.

The client (:func:`scaffold_update`), the server rule (:func:`scaffold_server`) and the method
(:func:`scaffold`). The equations, the tree and how FLGo, FedLab, PFLlib and FL-bench differ:
:doc:`SCAFFOLD on the optimization page <algorithms/optimization.md#scaffold>`.

References:
  Karimireddy et al., SCAFFOLD: Stochastic controlled averaging for federated learning, ICML 2020
  (Algorithm 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedtree.algorithms.host import Host, cannot, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import check_positive, named
from fedtree.core.local import (
  ClientData,
  ClientRound,
  ClientUpdate,
  SGDCarry,
  full_gradient,
  linear,
  make_sgd_step,
  run_local_steps,
)
from fedtree.core.model import Model
from fedtree.core.server_rule import Inbox, ServerRule, Uplink, per_node, zeros_like_stacked

OPTIONS = ("I", "II")
VARIATE_AVERAGES = ("all", "sampled")


def scaffold_update(
  model: Model, optimizer: optax.GradientTransformation, *, option: str = "II", batch_size: int,
  max_steps: int, compute_dtype=None,
) -> ClientUpdate:
  """SCAFFOLD's client (:doc:`docs <algorithms/optimization.md#scaffold>`): corrected local steps from the
  received model, the variate ``c_i`` kept as the client's state, ``Δc_i`` sent as its message.

  Args:
    model: the model.
    optimizer: the local optimizer (SGD in the paper).
    option: ``"I"`` or ``"II"``, the client's new variate.
    batch_size: minibatch size.
    max_steps: static scan length.
    compute_dtype: mixed-precision local steps (``None``: the params' dtype).
  """
  if option not in OPTIONS:
    raise ValueError(f"option={option!r}; choose one of {OPTIONS}")
  step = make_sgd_step(model, optimizer, linear(), compute_dtype=compute_dtype)

  def apply(anchor, c_i, data: ClientData, num_steps, key, rnd: ClientRound):
    c = rnd.broadcast
    correction = jax.tree.map(jnp.subtract, c, c_i)           # the gradient of ⟨c − c_i, y⟩
    carry = SGDCarry(params=anchor, opt_state=optimizer.init(anchor), anchor=correction)
    carry, loss = run_local_steps(step, carry, data, num_steps, key, batch_size=batch_size,
                                  max_steps=max_steps)
    y = carry.params
    if option == "I":
      new_c = full_gradient(model, anchor, data, batch_size=batch_size, compute_dtype=compute_dtype)
    else:
      if rnd.learning_rate is None:
        raise ValueError("scaffold option 'II' needs the local learning rate η_l (local_learning_rate=)")
      k = jnp.minimum(num_steps, max_steps)
      scale = 1.0 / (jnp.maximum(k, 1) * rnd.learning_rate)   # the default float dtype (float64 under x64)
      new_c = jax.tree.map(
        lambda ci, cc, x, yy: jnp.where(k > 0, ci - cc + (x - yy) * scale.astype(x.dtype), ci),
        c_i, c, anchor, y)
    return y, new_c, loss, jax.tree.map(jnp.subtract, new_c, c_i)

  return ClientUpdate(apply=apply, init_state=lambda params, n: zeros_like_stacked(params, n),
                      takes_round=True, model_state=True)


def scaffold_server(*, variate_average: str = "all") -> ServerRule:
  """SCAFFOLD's server variate ``c`` (zeros at the start), broadcast to the clients and moved by
  the sum of their changes over ``N`` (``"all"``) or over the clients that answered
  (``"sampled"``)."""
  if variate_average not in VARIATE_AVERAGES:
    raise ValueError(f"variate_average={variate_average!r}; choose one of {VARIATE_AVERAGES}")

  def receive(inbox: Inbox, c):
    count = inbox.population if variate_average == "all" else inbox.reported
    c = jax.tree.map(jnp.add, c, per_node(1.0 / jnp.maximum(count, 1.0), inbox.messages))
    return inbox.pseudo_gradient, c, {}

  # Δc_i takes the updates' robust rule and travels their path (one clip over both: docs, "Privacy").
  return ServerRule(init=zeros_like_stacked, receive=receive, name="scaffold",
                    up=Uplink(robust=True, with_update=True))


@method_over(hierfavg, cannot=(
  cannot("personal", "the control variates cover the whole model"),
))
def scaffold(
  host: Host,
  *,
  option: str = "II",
  variate_average: str = "all",
  server_learning_rate: float = 1.0,
  weighting: str = "uniform",
  name: str = "scaffold",
) -> FederatedAlgorithm:
  """SCAFFOLD on ``topology`` (default flat): clients take steps ``y ← y − η_l (g_i(y) − c_i + c)``
  corrected by their control variate ``c_i`` and their parent's ``c`` (:doc:`the method's page
  <algorithms/optimization.md#scaffold>`).

  Args:
    option: the client's new variate, ``"II"`` (paper's cheap choice; needs
      ``local_learning_rate``) or ``"I"`` (the full local gradient at the received model).
    variate_average: ``"all"`` (paper: the variates' changes summed over the ``N`` clients of a
      parent) or ``"sampled"`` (over the clients that answered).
    server_learning_rate: ``η_g``, the global step size (``sgd(η_g)`` at the clients' parents,
      unless ``server_optimizers`` is given).
    weighting: ``"uniform"`` (paper) or ``"examples"`` weights of the model updates.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`
      (``local_learning_rate``: the local SGD rate ``η_l``, option ``"II"``).

  Raises:
    ValueError: an option that does not exist, ``server_learning_rate <= 0``, option ``"II"`` without
      ``local_learning_rate``, or personal parameters.

  Example:
    Two rounds of SCAFFOLD over 5 clients, 3 sampled a round:

    >>> alg = scaffold(model=model, data=data, local_optimizer=optax.sgd(0.1), local_learning_rate=0.1,
    ...                schedule=LocalSchedule(batch_size=8, steps=2), cohort_size=3)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> state.server_state["Dense_0"]["kernel"].shape    # c of the one server
    (1, 8, 3)
  """
  if option not in OPTIONS:
    raise ValueError(f"{name}: option={option!r}; choose one of {OPTIONS}")
  with named(name):   # (a negative η_g ascends: Mime checks the same field)
    check_positive(server_learning_rate=server_learning_rate)
  if option == "II" and host.get("local_learning_rate") is None:
    raise ValueError(f"{name}: option 'II' computes c_i from (x - y_i) / (K η_l) and needs the local "
                     f"learning rate η_l: pass local_learning_rate= (from a config: local.learning_rate), or "
                     f"use option='I'")
  host = host.stepping(server_learning_rate)

  def objective(s: LocalSetup):
    return scaffold_update(s.model, s.optimizer, option=option, batch_size=s.batch_size,
                           max_steps=s.max_steps, compute_dtype=s.compute_dtype)

  rule = scaffold_server(variate_average=variate_average)
  return host.build(client_update=objective, server_rule=rule, weighting=weighting, name=name)
