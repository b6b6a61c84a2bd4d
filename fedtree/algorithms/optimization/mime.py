"""Mime and MimeLite (Karimireddy et al. 2021): a base optimizer mimicked across clients, on any tree.

:func:`mime` and :func:`mimelite` share the client (:func:`mime_update`), the server rule
(:func:`mime_server`) and their refusals. The equations and how FedJAX's ``mime`` and ``mime_lite``
compare: :doc:`Mime on the optimization page <algorithms/optimization.md#mime-and-mimelite>`.

References:
  Karimireddy et al., Breaking the centralized barrier for cross-device federated learning,
  NeurIPS 2021 (arXiv 2008.03606, first titled "Mime: mimicking centralized stochastic algorithms in
  federated learning"; Algorithm 1).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedtree.algorithms.host import Host, cannot, hierfavg, method_over
from fedtree.algorithms.host.refusals import weighted_messages
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import check_positive
from fedtree.core.local import (
  Batch,
  ClientData,
  ClientRound,
  ClientUpdate,
  SGDCarry,
  full_gradient,
  make_train_loss,
  run_local_steps,
  stack,
)
from fedtree.core.model import Model, take_state, zero_state
from fedtree.core.server_rule import Downlink, Inbox, ServerRule, Uplink, per_node, zeros_like_stacked
from fedtree.toolbox.privacy import global_norm

PyTree = Any


class MimeState(NamedTuple):
  """What a Mime server keeps and broadcasts (every leaf stacked over the clients' parents).

  Attributes:
    statistics: ``[N, ...]`` the base optimizer's state (e.g. SGD's momentum trace).
    variate: ``[N, ...]`` Mime's ``c``, the cohort's full-batch gradient at ``x`` (MimeLite: ``()``).
  """

  statistics: PyTree
  variate: PyTree


def fixed_state(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
  """``optimizer``'s update applied with the state it is given, which it returns unchanged (Mime's
  ``U(y, g, s)``: every local step uses the server's statistics)."""

  def update(grads, state, params=None):
    updates, _ = optimizer.update(grads, state, params)
    return updates, state

  return optax.GradientTransformation(optimizer.init, update)


def _weighted_gradient(model: Model, params, data: ClientData, weight, *, batch_size: int, compute_dtype):
  """``weight · ∇f_i(params)`` (the message a client sends for the server's average)."""
  g = full_gradient(model, params, data, batch_size=batch_size, compute_dtype=compute_dtype)
  return jax.tree.map(lambda a: a * weight.astype(a.dtype), g)


def mime_update(
  model: Model, optimizer: optax.GradientTransformation, *, corrected: bool, batch_size: int,
  max_steps: int, delta_clip_norm: float | None = None, compute_dtype=None,
) -> ClientUpdate:
  """Mime's (``corrected``) or MimeLite's client (:doc:`docs <algorithms/optimization.md#mime-and-mimelite>`):
  local steps of ``optimizer`` with its state fixed to the broadcast statistics; MimeLite's also sends
  ``weight · ∇f_i(x)``.

  Args:
    model: the model.
    optimizer: the base optimizer (its ``init`` gives the server's statistics).
    corrected: Mime's SVRG-corrected gradient (with the broadcast ``c``), else MimeLite's.
    batch_size: minibatch size (also of the full-batch gradient's pass).
    max_steps: static scan length.
    delta_clip_norm: clip ``x − y`` to this global norm before sending (``None``: no clipping).
    compute_dtype: mixed-precision local steps (``None``: the params' dtype).
  """
  loss_fn = make_train_loss(model, compute_dtype)
  frozen = fixed_state(optimizer)

  def step(carry: SGDCarry, batch: Batch, rng: jax.Array):
    (loss, updated), g = jax.value_and_grad(loss_fn, has_aux=True)(carry.params, batch, rng)
    if corrected:   # ∇f_i(y; ζ) − ∇f_i(x; ζ) + c, the same minibatch and randomness
      x, c = carry.anchor
      gx = jax.grad(lambda p: loss_fn(p, batch, rng)[0])(x)
      g = jax.tree.map(lambda gy, gxx, cc: gy - gxx + cc.astype(gy.dtype), g, gx, c)
    updates, opt_state = frozen.update(zero_state(model, g), carry.opt_state, carry.params)
    params = take_state(model, optax.apply_updates(carry.params, updates), updated)
    return dataclasses.replace(carry, params=params, opt_state=opt_state), loss

  def apply(anchor, state, data: ClientData, num_steps, key, rnd: ClientRound):
    server: MimeState = rnd.broadcast
    carry = SGDCarry(params=anchor, opt_state=server.statistics,
                     anchor=(anchor, server.variate) if corrected else ())
    carry, loss = run_local_steps(step, carry, data, num_steps, key, batch_size=batch_size,
                                  max_steps=max_steps)
    y = carry.params
    if delta_clip_norm is not None:
      delta = jax.tree.map(jnp.subtract, anchor, y)
      norm = global_norm(delta)
      scale = jnp.minimum(1.0, delta_clip_norm / jnp.maximum(norm, 1e-30))
      y = jax.tree.map(lambda x, d: x - d * scale.astype(d.dtype), anchor, delta)
    message = () if corrected else _weighted_gradient(model, anchor, data, rnd.weight, batch_size=batch_size,
                                                      compute_dtype=compute_dtype)
    return y, state, loss, message

  return ClientUpdate(apply=apply, takes_round=True, model_state=True)


def gradient_pass(model: Model, *, batch_size: int, compute_dtype=None) -> ClientUpdate:
  """Mime's pass before training: every client sends ``weight · ∇f_i(x)`` (its model unchanged)."""

  def apply(anchor, state, data: ClientData, num_steps, key, rnd: ClientRound):
    loss = jnp.zeros((), jnp.result_type(jnp.float32, *jax.tree.leaves(anchor)))
    return anchor, state, loss, _weighted_gradient(model, anchor, data, rnd.weight, batch_size=batch_size,
                                                   compute_dtype=compute_dtype)

  return ClientUpdate(apply=apply, takes_round=True, model_state=True)


def mime_server(optimizer: optax.GradientTransformation, *, corrected: bool,
                gather: ClientUpdate | None = None) -> ServerRule:
  """The server's statistics ``s`` (``optimizer.init`` of the model, per node) and, for Mime
  (``corrected``, with ``gather`` the clients' pass before training), the variate ``c``; ``s`` moves
  once a round by ``V`` (``optimizer.update``'s new state) with the average full-batch gradient."""

  def init(params, num_nodes):
    return MimeState(statistics=stack(optimizer.init(params), num_nodes),
                     variate=zeros_like_stacked(params, num_nodes) if corrected else ())

  def average(inbox: Inbox):
    return per_node(1.0 / jnp.maximum(inbox.weight_sum, 1e-30), inbox.messages)

  def prepare(inbox: Inbox, state: MimeState) -> MimeState:
    return state._replace(variate=average(inbox))

  def receive(inbox: Inbox, state: MimeState):
    g = state.variate if corrected else average(inbox)
    stats = jax.vmap(lambda gg, s, p: optimizer.update(gg, s, p)[1])(g, state.statistics, inbox.params)
    return inbox.pseudo_gradient, state._replace(statistics=stats), {}

  if corrected:
    return ServerRule(init=init, receive=receive, name="mime", down=Downlink(gather=gather, prepare=prepare))
  # MimeLite's gradients travel with the updates: the same robust rule, the same client stage (one clip
  # over both, noise on both, both compressed) and node stage; under uniform weights their average is
  # then the rule's estimate (mimelite refuses those with weighting="examples": weighted_messages)
  return ServerRule(init=init, receive=receive, name="mimelite", up=Uplink(robust=True, with_update=True))


BESIDE = ("the clients' full-batch gradients travel beside the update, outside the path, so clipping or "
          "noise would leave them raw (no privacy) and compression would shrink one of the two models a "
          "client sends; run without it (delta_clip_norm= clips the update, as FedJAX)")
REFUSALS = (
  cannot("personal", "the server's optimizer statistics cover the whole model"),
  cannot("blockwise", "it would still average the clients' full-batch gradients, sent before training, into "
                      "the server's variate and statistics, so an attacker's gradient would steer every "
                      "client's steps"),
  cannot("client_transform", BESIDE),
  cannot("node_transform", BESIDE),
)
"""What Mime cannot compose with (:doc:`docs <algorithms/optimization.md#mime-and-mimelite>`); MimeLite's
gradients travel with its updates and refuses personal parameters only (and, under example weights,
a path that would weigh its gradients twice:
:func:`~fedtree.algorithms.host.refusals.weighted_messages`)."""
LITE_REFUSALS = REFUSALS[:1]


def _check(name: str, host, delta_clip_norm, server_learning_rate) -> dict:
  """The refusals Mime and MimeLite share (:doc:`docs <algorithms/optimization.md#mime-and-mimelite>`); the
  host with the clients' parents' server optimizer ``sgd(η_g)`` unless ``server_optimizers`` is given."""
  try:
    check_positive(server_learning_rate=server_learning_rate)
    if delta_clip_norm is not None:
      check_positive(delta_clip_norm=delta_clip_norm)
  except ValueError as e:
    raise ValueError(f"{name}: {e}") from None
  if host.get("local_optimizer") is None:
    raise ValueError(f"{name}: needs local_optimizer=, the base optimizer whose state the server keeps and "
                     f"every local step applies")
  return host.stepping(server_learning_rate)


@method_over(hierfavg, cannot=LITE_REFUSALS)
def mimelite(
  host: Host,
  *,
  server_learning_rate: float = 1.0,
  delta_clip_norm: float | None = None,
  weighting: str = "uniform",
  name: str = "mimelite",
) -> FederatedAlgorithm:
  """MimeLite on ``topology`` (default flat): the base optimizer (``local_optimizer``) with its state
  kept and moved by the server, fixed in every client step (:doc:`the method's page
  <algorithms/optimization.md#mime-and-mimelite>`).

  Args:
    server_learning_rate: ``η_g``, the server's step on the mean update (``sgd(η_g)`` at the clients'
      parents, unless ``server_optimizers`` is given).
    delta_clip_norm: clip every client's update to this global norm (FedJAX's
      ``client_delta_clip_norm``; ``None``: no clipping).
    weighting: ``"uniform"`` (paper) or ``"examples"`` (FedJAX) weights of the updates and gradients.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`
      (``local_optimizer``: the base optimizer, e.g. ``optax.sgd(η, momentum=0.9)``).

  Raises:
    ValueError: ``server_learning_rate`` or ``delta_clip_norm`` not > 0, no ``local_optimizer``,
      personal parameters, a ``server_rule``, or ``weighting="examples"`` with a robust aggregator or
      an update path's client or node stage. Those take the full-batch gradients with the updates:
      the same robust rule, one clip over both, noise on both, both compressed (:doc:`docs
      <algorithms/optimization.md#mime-and-mimelite>`).

  Example:
    MimeLite with SGD momentum 0.9 as the base optimizer, 3 of 5 clients a round:

    >>> alg = mimelite(model=model, data=data, local_optimizer=optax.sgd(0.1, momentum=0.9),
    ...                schedule=LocalSchedule(batch_size=8, steps=2), cohort_size=3)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> jax.tree.leaves(state.server_state.statistics)[0].shape    # the momentum of the one server
    (1, 3)
  """
  host = _check(name, host, delta_clip_norm, server_learning_rate)
  weighted_messages(name, host, weighting, "gradients")
  optimizer = host["local_optimizer"]

  def objective(s: LocalSetup):
    return mime_update(s.model, s.optimizer, corrected=False, batch_size=s.batch_size, max_steps=s.max_steps,
                       delta_clip_norm=delta_clip_norm, compute_dtype=s.compute_dtype)

  return host.build(client_update=objective, server_rule=mime_server(optimizer, corrected=False),
                 weighting=weighting, name=name)


@method_over(hierfavg, cannot=REFUSALS)
def mime(
  host: Host,
  *,
  server_learning_rate: float = 1.0,
  delta_clip_norm: float | None = None,
  weighting: str = "uniform",
  name: str = "mime",
) -> FederatedAlgorithm:
  """Mime on ``topology`` (default flat): MimeLite's fixed base-optimizer statistics and SVRG's
  correction with ``c``, the cohort's full-batch gradient at ``x`` gathered before training
  (:doc:`the method's page <algorithms/optimization.md#mime-and-mimelite>`).

  Args:
    server_learning_rate: ``η_g``, the server's step on the mean update.
    delta_clip_norm: clip every client's update to this global norm (``None``: no clipping).
    weighting: ``"uniform"`` (paper) or ``"examples"`` (FedJAX) weights of the updates and gradients.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`
      (``local_optimizer``: the base optimizer).

  Raises:
    ValueError: as :func:`mimelite`.

  Example:
    >>> alg = mime(model=model, data=data, local_optimizer=optax.sgd(0.1, momentum=0.9),
    ...            schedule=LocalSchedule(batch_size=8, steps=2), cohort_size=3)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> state.server_state.variate["Dense_0"]["kernel"].shape     # c of the one server
    (1, 8, 3)
  """
  host = _check(name, host, delta_clip_norm, server_learning_rate)
  optimizer = host["local_optimizer"]
  compute_dtype = host.get("compute_dtype")
  batch_size = host["schedule"].batch_size

  def objective(s: LocalSetup):
    return mime_update(s.model, s.optimizer, corrected=True, batch_size=s.batch_size, max_steps=s.max_steps,
                       delta_clip_norm=delta_clip_norm, compute_dtype=s.compute_dtype)

  rule = mime_server(optimizer, corrected=True,
                     gather=gradient_pass(host["model"], batch_size=batch_size, compute_dtype=compute_dtype))
  return host.build(client_update=objective, server_rule=rule, weighting=weighting, name=name)

