"""FedRoD (Chen & Chao 2022): a generic model trained with a balanced loss and a personal head per
client, on any tree.

The balanced loss (``balanced_cross_entropy``), the personal model (``personal_head``), the client
(``fedrod_update``) and the method (``fedrod``). The losses and how PFLlib, FL-bench and FLGo differ:
:doc:`FedRoD on the partial-personalization page <algorithms/partial.md#fedrod>`.

References:
  Chen and Chao, On bridging generic and personalized federated learning for image classification,
  ICLR 2022.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.partial.split import Head, head_patterns, split_model, with_parameter_counts
from fedtree.core.algorithm import ClientModels, FederatedAlgorithm, LocalSetup, NodeModels, TreeState
from fedtree.core.checks import check_nonnegative
from fedtree.core.local import (
  Batch,
  ClientData,
  ClientUpdate,
  cast_floating,
  check_compute_dtype,
  run_local_steps,
)
from fedtree.core.membership import clients_parent_rows
from fedtree.core.model import Model, forward_train, label_kind, masked_cross_entropy, take_state, zero_state
from fedtree.core.personal import merge, parameter_counts, personal_part, shared_part
from fedtree.core.topology import Topology

PyTree = Any
ABSENT_LOGIT = -1e9
"""The balanced loss's log-prior of a class the client has no example of (``log 0``)."""
PERSONAL_INITS = ("copy", "zeros")


def label_counts(data: ClientData, num_classes: int) -> jax.Array:
  """``float[K]``: the client's training examples of every class (padding and, in flat storage,
  other clients' rows excluded)."""
  rows = jnp.arange(data.y.shape[0])
  start = 0 if data.offset is None else data.offset
  real = (rows >= start) & (rows < start + data.n)
  dtype = jnp.result_type(float)
  return jnp.zeros((num_classes,), dtype).at[data.y.astype(jnp.int32)].add(real.astype(dtype))


def balanced_cross_entropy(logits: jax.Array, labels: jax.Array, mask: jax.Array, log_prior: jax.Array):
  """The balanced softmax loss: the mean cross-entropy of ``logits + log_prior`` over the rows of
  ``mask``."""
  z = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
  z = z + log_prior.astype(z.dtype).reshape((1,) * (z.ndim - 1) + (-1,))
  logp = jax.nn.log_softmax(z)
  nll = -jnp.take_along_axis(logp, labels[:, None].astype(jnp.int32), axis=-1)[:, 0]
  return jnp.sum(jnp.where(mask, nll, 0.0)) / jnp.maximum(jnp.sum(mask.astype(z.dtype)), 1.0)


def personal_head(params: PyTree, own: PyTree, mask: PyTree, add_generic: bool) -> PyTree:
  """The model scoring a client: ``params``' body and, as head, its generic head plus the client's
  personal head ``own`` (``None`` outside the head) or ``own`` alone (``add_generic=False``)."""
  head = own if not add_generic else jax.tree.map(jnp.add, personal_part(params, mask), own)
  return merge(shared_part(params, mask), head, mask)


class RoDCarry(NamedTuple):
  """FedRoD's local training state."""

  params: PyTree       # the generic model (body and generic head)
  opt_state: PyTree    # its local optimizer's state
  head: PyTree         # the personal head (None outside the head)
  head_state: PyTree   # its optimizer's state


def fedrod_update(
  model: Model, optimizer: optax.GradientTransformation, head_mask: PyTree, *, balanced: bool = True,
  gamma: float = 1.0, detach: bool = True, add_generic: bool = True, personal_init: str = "copy",
  batch_size: int, max_steps: int, compute_dtype=None,
) -> ClientUpdate:
  """FedRoD's client (:doc:`docs <algorithms/partial.md#fedrod>`): its state is its personal head.

  Args:
    model: the model (a classifier).
    optimizer: the local optimizer (a fresh state for each, the generic model and the personal head).
    head_mask: a pytree of bools shaped as the params: the generic head.
    balanced: the generic loss is the balanced softmax loss (``False``: the cross-entropy).
    gamma: the exponent of the class counts in the balanced loss (``1``: the paper).
    detach: the personal loss trains the personal head only (``False``: also the body and the
      generic head).
    add_generic: the personal prediction is the generic head's plus the personal head's
      (``False``: the personal head's alone).
    personal_init: ``"copy"`` of the initial generic head, or ``"zeros"``.
    batch_size: minibatch size.
    max_steps: static scan length.
    compute_dtype: mixed-precision local steps (``None``: the params' dtype).
  """
  if personal_init not in PERSONAL_INITS:
    raise ValueError(f"personal_init={personal_init!r}; choose one of {PERSONAL_INITS}")
  low = check_compute_dtype(compute_dtype)

  def forward(params, batch: Batch, rng):
    logits, updated = forward_train(model, cast_floating(params, low), cast_floating(batch.x, low), rng=rng,
                                    mask=batch.mask)
    updated = jax.tree.map(lambda u, p: u.astype(jnp.result_type(p)), updated, params)
    return logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), updated

  def losses(params, head, batch: Batch, rng, log_prior):
    logits_g, updated = forward(params, batch, rng)
    loss_g = (balanced_cross_entropy(logits_g, batch.y, batch.mask, log_prior) if balanced
              else masked_cross_entropy(logits_g, batch.y, batch.mask))
    base = jax.lax.stop_gradient(params) if detach else params
    logits_p, _ = forward(personal_head(base, head, head_mask, add_generic), batch, rng)
    loss_p = masked_cross_entropy(logits_p, batch.y, batch.mask)
    return loss_g + loss_p, (loss_p, updated)

  def apply(anchor, head, data: ClientData, num_steps, key):
    counts = label_counts(data, model.num_classes)
    log_prior = jnp.where(counts > 0, gamma * jnp.log(jnp.maximum(counts, 1.0)), ABSENT_LOGIT)

    def step(carry: RoDCarry, batch: Batch, rng):
      (g, gh), (loss_p, updated) = jax.grad(losses, argnums=(0, 1), has_aux=True)(
        carry.params, carry.head, batch, rng, log_prior)
      updates, opt_state = optimizer.update(zero_state(model, g), carry.opt_state, carry.params)
      params = take_state(model, optax.apply_updates(carry.params, updates), updated)
      head_updates, head_state = optimizer.update(gh, carry.head_state, carry.head)
      return RoDCarry(params, opt_state, optax.apply_updates(carry.head, head_updates), head_state), loss_p

    carry = RoDCarry(anchor, optimizer.init(anchor), head, optimizer.init(head))
    carry, loss = run_local_steps(step, carry, data, num_steps, key, batch_size=batch_size,
                                  max_steps=max_steps)
    return carry.params, carry.head, loss

  def init_state(params, num_clients):
    head = personal_part(params, head_mask)
    if personal_init == "zeros":
      head = jax.tree.map(jnp.zeros_like, head)
    return jax.tree.map(lambda a: jnp.array(jnp.broadcast_to(a, (num_clients,) + jnp.shape(a)), copy=True),
                        head)

  return ClientUpdate(apply=apply, init_state=init_state, model_state=True)


@method_over(hierfavg, sets={"personal": "the personal head is FedRoD's own, in the client state"})
def fedrod(
  host: Host,
  *,
  head: Head = 1,
  balanced: bool = True,
  gamma: float = 1.0,
  detach: bool = True,
  add_generic: bool = True,
  personal_init: str = "copy",
  name: str = "fedrod",
) -> FederatedAlgorithm:
  """FedRoD (BSM) on ``topology`` (default flat): the generic model trained with the balanced softmax
  loss, every client's personal head with the cross-entropy of generic + personal head
  (:doc:`the method's page <algorithms/partial.md#fedrod>`).

  Args:
    head: the generic head (and the personal head's shape): the model's last ``head`` layers or
      path patterns.
    balanced: the generic loss is the balanced softmax loss (the paper); ``False``: cross-entropy.
    gamma: ``γ >= 0``, the exponent of the class counts in the balanced loss (FL-bench's ``gamma``).
    detach: the personal loss trains the personal head only (the paper); ``False``: also the rest.
    add_generic: personal prediction = generic + personal head (the paper); ``False``: the personal
      head alone (FL-bench).
    personal_init: ``"copy"`` of the initial generic head or ``"zeros"``.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`.

  Raises:
    ValueError: a head covering every parameter, a model whose labels are not classes (a language
      model), an unknown ``personal_init``, a negative ``gamma``, ``personal=``.

  Example:
    Two rounds over 5 clients: the generic and the personal models:

    >>> model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(8,))
    >>> alg = fedrod(model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...              schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['global', 'personal']
  """
  model: Model = host["model"]
  if model.label_shape:
    raise ValueError(f"{name}: the balanced loss is a classifier's; this model's labels have shape "
                     f"{model.label_shape} ({label_kind(model)})")
  if personal_init not in PERSONAL_INITS:
    raise ValueError(f"{name}: personal_init={personal_init!r}; choose one of {PERSONAL_INITS}")
  check_nonnegative(gamma=gamma)
  patterns = head_patterns(model, head, algorithm=name)
  template, mask = split_model(host, patterns, algorithm=name, kept="head", shared="body")[1:]

  def objective(s: LocalSetup):
    if s.optimizer is None:
      raise ValueError(f"{name}: local_optimizer=None; FedRoD's local training needs one")
    return fedrod_update(s.model, s.optimizer, mask, balanced=balanced, gamma=gamma, detach=detach,
                         add_generic=add_generic, personal_init=personal_init, batch_size=s.batch_size,
                         max_steps=s.max_steps, compute_dtype=s.compute_dtype)

  inner = host.build(client_update=objective, name=name)
  topology = host.get("topology") or Topology.flat(host["data"].num_clients)
  leaf = topology.depth - 1

  def personal(state: TreeState, clients):   # every client's (clients None) or those clients' heads
    parent = clients_parent_rows(topology, leaf, host.get("membership"), state.round, state.params[leaf],
                                 clients)
    rows = np.arange(jax.tree.leaves(parent)[0].shape[0], dtype=np.int32)
    return {"personal": NodeModels(personal_head(parent, state.client_state, mask, add_generic), rows)}

  host_sets = inner.client_sets()

  def sets(state: TreeState, clients):
    return {**host_sets.sets(state, clients), **personal(state, clients)}

  def models(state: TreeState):
    return {**host_sets.nodes(state), **sets(state, None)}

  p, _ = parameter_counts(template, mask)
  total = sum(int(np.prod(np.shape(x))) for x in jax.tree.leaves(template))
  client_models = ClientModels(models, sets, host_sets.nodes)
  return with_parameter_counts(inner._replace(models=models, client_models=client_models),
                               {"personal": p, "shared": total},
                               "personal: a head per client beside the shared model")
