"""FedRep (Collins et al. 2021): every client trains its own head, then the shared body, on any tree.

The client (``fedrep_update``) and the method (``fedrep``). The two phases and how PFLlib, FL-bench
and FLGo count their steps: :doc:`FedRep on the partial-personalization page
<algorithms/partial.md#fedrep>`.

References:
  Collins, Hassani, Mokhtari and Shakkottai, Exploiting shared representations for personalized
  federated learning, ICML 2021 (Algorithm 1).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.partial.split import Head, head_patterns, split_model
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import check_positive, named
from fedtree.core.local import (
  ClientData,
  ClientUpdate,
  LocalSchedule,
  SGDCarry,
  make_sgd_step,
  run_local_steps,
  train_only,
)
from fedtree.core.model import Model

PyTree = Any


def fedrep_update(
  model: Model, optimizer: optax.GradientTransformation, head_mask: PyTree, *, head_schedule: LocalSchedule,
  head_max_steps: int, batch_size: int, max_steps: int, compute_dtype=None,
) -> ClientUpdate:
  """FedRep's client (:doc:`docs <algorithms/partial.md#fedrep>`): the head for ``head_schedule``'s steps
  (body frozen), then the body for the round's steps (head frozen), from the model it is given.

  Args:
    model: the model.
    optimizer: the local optimizer (a fresh state in each phase).
    head_mask: a pytree of bools shaped as the params: the head.
    head_schedule: the head phase's epochs or steps (its ``batch_size`` is the local one).
    head_max_steps: static length of the head phase (``head_schedule.max_steps`` on the data).
    batch_size: minibatch size.
    max_steps: static length of the body phase.
    compute_dtype: mixed-precision local steps (``None``: the params' dtype).
  """
  body_mask = jax.tree.map(lambda m: not m, head_mask)
  head_opt, body_opt = train_only(optimizer, head_mask), train_only(optimizer, body_mask)
  head_step = make_sgd_step(model, head_opt, compute_dtype=compute_dtype)
  body_step = make_sgd_step(model, body_opt, compute_dtype=compute_dtype)

  def apply(anchor, state, data: ClientData, num_steps, key):
    head_key, body_key = jax.random.split(key)
    n_head = jnp.minimum(head_schedule.num_steps(jnp.asarray(data.n)[None])[0], head_max_steps)
    carry = SGDCarry(params=anchor, opt_state=head_opt.init(anchor), anchor=anchor)
    carry, head_loss = run_local_steps(head_step, carry, data, n_head, head_key, batch_size=batch_size,
                                       max_steps=head_max_steps)
    carry = SGDCarry(params=carry.params, opt_state=body_opt.init(carry.params), anchor=anchor)
    carry, body_loss = run_local_steps(body_step, carry, data, num_steps, body_key, batch_size=batch_size,
                                       max_steps=max_steps)
    n_body = jnp.minimum(num_steps, max_steps)
    total = (head_loss * n_head + body_loss * n_body) / jnp.maximum(n_head + n_body, 1).astype(
      head_loss.dtype)
    return carry.params, state, total

  return ClientUpdate(apply=apply, model_state=True)


@method_over(hierfavg, sets={"personal": "the head is personal: choose it with head= and personal_level="})
def fedrep(
  host: Host,
  *,
  head: Head = 1,
  head_epochs: float | None = 10.0,
  head_steps: int | None = None,
  personal_level: int | None = None,
  weighting: str = "uniform",
  name: str = "fedrep",
) -> FederatedAlgorithm:
  """FedRep on ``topology`` (default flat): every client trains its own head with the body frozen, then
  the shared body with the head frozen (:doc:`the method's page <algorithms/partial.md#fedrep>`).

  Args:
    head: the personal head: the model's last ``head`` layers (an int) or path patterns
      (:mod:`fedtree.algorithms.partial.split`).
    head_epochs: epochs of the head phase over each client's data (the paper: 10); ignored when
      ``head_steps`` is given.
    head_steps: steps of the head phase instead (every client alike), ``>= 1``.
    personal_level: ``None``: the head is personal to each client; ``l``: shared within each
      level-``l`` subtree.
    weighting: ``"uniform"`` (the paper) or ``"examples"`` weights of the bodies.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`; the body phase
      is its ``schedule`` (``config.local``).

  Raises:
    ValueError: a head covering every parameter, ``head_epochs <= 0`` without ``head_steps``,
      ``head_steps < 1``, ``batch_order="cyclic"``, ``personal=``.

  Example:
    Two rounds over 5 clients: 3 head steps, then 1 body step:

    >>> model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(8,))
    >>> alg = fedrep(model=model, data=data, local_optimizer=optax.sgd(0.1), head_steps=3,
    ...              schedule=LocalSchedule(batch_size=8, steps=1))
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['personal']
  """
  schedule: LocalSchedule = host["schedule"]
  if schedule.batch_order == "cyclic":
    raise ValueError(f"{name}: batch_order='cyclic' is not supported (the head phase reads batches that the "
                     f"per-client cursor, advanced by the body phase's steps, would not count); use "
                     f"'shuffled' or 'fixed'")
  if head_steps is not None:
    if int(head_steps) != head_steps or int(head_steps) < 1:   # as head_epochs > 0: the head phase trains
      raise ValueError(f"{name}: head_steps={head_steps} must be an integer >= 1 (as head_epochs must be "
                       f"> 0: the head phase trains)")
    head_schedule = LocalSchedule(batch_size=schedule.batch_size, steps=int(head_steps),
                                  batch_order=schedule.batch_order)
  else:
    if head_epochs is None:
      raise ValueError(f"{name}: give head_epochs (the paper: 10) or head_steps")
    with named(name):
      check_positive(head_epochs=head_epochs)
    head_schedule = LocalSchedule(batch_size=schedule.batch_size, epochs=float(head_epochs),
                                  batch_order=schedule.batch_order)
  split = split_model(host, head_patterns(host["model"], head, algorithm=name), algorithm=name, kept="head",
                      shared="body")
  mask = split.mask
  head_max = head_schedule.max_steps(host["data"].max_train)

  def objective(s: LocalSetup):
    if s.optimizer is None:
      raise ValueError(f"{name}: local_optimizer=None; FedRep's two phases need the local optimizer")
    return fedrep_update(s.model, s.optimizer, mask, head_schedule=head_schedule, head_max_steps=head_max,
                         batch_size=s.batch_size, max_steps=s.max_steps, compute_dtype=s.compute_dtype)

  alg = host.build(client_update=objective, personal=split.personal(personal_level), weighting=weighting,
                   name=name)
  return split.counted(alg, personal_level)
