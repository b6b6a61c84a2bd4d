"""FedProto (Tan et al. 2022): clients exchange class prototypes, never models, on any tree.

The representation (``representation``), the loss (``prototype_loss``), the client
(``fedproto_update``), the server rule (``fedproto_server``) and the method (``fedproto``). The
equations and how the authors' code, FL-bench and PFLlib differ: :doc:`FedProto on the peers page
<algorithms/peers.md#fedproto>`.

References:
  Tan et al., FedProto: Federated prototype learning across heterogeneous clients, AAAI 2022.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.personalized.peers import personal_only, sends_whole
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import check_nonnegative
from fedtree.core.local import (
  Batch,
  ClientData,
  ClientRound,
  ClientUpdate,
  SGDCarry,
  batch_at,
  cast_floating,
  check_compute_dtype,
  run_local_steps,
  steps_per_epoch,
)
from fedtree.core.model import Model, label_kind, masked_cross_entropy
from fedtree.core.personal import personal
from fedtree.core.server_rule import Inbox, ServerRule
from fedtree.objectives.fedmmd import last_dense

PyTree = Any
WEIGHTINGS = ("examples", "uniform")


def representation(model: Model, params: PyTree, x: jax.Array, *, train: bool = False,
                   rng: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """``(f(x) [B, d], logits)`` of one forward pass: ``f`` the input of the last dense layer."""
  _, feats, logits = last_dense(model, params, x, train=train, rng=rng)
  return feats.reshape((feats.shape[0], -1)), logits


def feature_width(model: Model, example_shape, name: str = "fedproto") -> int:
  """``d``, the width of ``model``'s representation, or a ``ValueError`` saying why FedProto cannot
  take the model."""
  if tuple(model.label_shape) != ():
    raise ValueError(f"{name}: prototypes are per class; this model's labels have shape "
                     f"{tuple(model.label_shape)} ({label_kind(model)}), choose a classifier")
  params = jax.eval_shape(model.init, jax.random.key(0))
  x = jax.ShapeDtypeStruct((2,) + tuple(example_shape), jnp.dtype(model.input_dtype))
  found = {}

  def probe(p, v):
    layer, feats, _ = last_dense(model, p, v)
    found["ok"] = layer is not None
    return feats.reshape((feats.shape[0], -1))

  feats = jax.eval_shape(probe, params, x)
  if not found["ok"]:
    raise ValueError(f"{name}: prototypes are the input of the layer that makes the logits, which must be a "
                     f"flax nn.Dense; this model's logits are not")
  return int(feats.shape[-1])


def prototype_loss(feats: jax.Array, labels: jax.Array, mask: jax.Array, protos: jax.Array,
                   present: jax.Array) -> jax.Array:
  """``mean_{rows, k} (f_k − C̄^(y)_k)²`` over a batch's real rows (``mask``), a row whose class has
  no global prototype (``present``) adding 0."""
  target = jnp.take(protos, labels, axis=0).astype(feats.dtype)
  has = mask & jnp.take(present, labels)
  sq = jnp.where(has[:, None], jnp.square(feats - jax.lax.stop_gradient(target)), 0.0)
  rows = jnp.maximum(jnp.sum(mask), 1).astype(feats.dtype)
  return jnp.sum(sq) / (rows * feats.shape[1])


def class_sums(model: Model, params: PyTree, data: ClientData, *, num_classes: int, width: int,
               batch_size: int) -> tuple[jax.Array, jax.Array]:
  """``(sums [K, d], counts [K])`` of the client's representations by class over all its ``n``
  examples (evaluation mode, stored order, minibatches of ``batch_size``)."""
  data = data._replace(cursor=0, shuffle=False)
  batches = jnp.maximum(steps_per_epoch(data.n, batch_size), 0)
  dtype = jnp.result_type(jnp.float32, *jax.tree.leaves(params))
  key = jax.random.key(0)

  def body(state):
    t, sums, counts = state
    batch = batch_at(key, data, t, batch_size)
    feats, _ = representation(model, params, batch.x)
    onehot = jax.nn.one_hot(batch.y, num_classes, dtype=dtype) * batch.mask[:, None].astype(dtype)
    return t + 1, sums + onehot.T @ feats.astype(dtype), counts + jnp.sum(onehot, axis=0)

  start = (jnp.zeros((), jnp.int32), jnp.zeros((num_classes, width), dtype), jnp.zeros((num_classes,), dtype))
  _, sums, counts = jax.lax.while_loop(lambda st: st[0] < batches, body, start)
  return sums, counts


def fedproto_update(model: Model, optimizer: optax.GradientTransformation, *, lam, weighting: str, width: int,
                    batch_size: int, max_steps: int, compute_dtype=None) -> ClientUpdate:
  """FedProto's client (:doc:`docs <algorithms/peers.md#fedproto>`): local steps with the prototype term
  towards the global prototypes it receives, then its prototypes (the message: class sums and counts, or class
  means and presence flags for ``weighting="uniform"``)."""
  if weighting not in WEIGHTINGS:
    raise ValueError(f"weighting={weighting!r}; choose one of {WEIGHTINGS}")
  dtype = check_compute_dtype(compute_dtype)
  k = int(model.num_classes)

  def objective(params, protos, present, batch: Batch, rng):
    if dtype is not None:
      params = cast_floating(params, dtype)
      batch = batch._replace(x=cast_floating(batch.x, dtype))
    feats, logits = representation(model, params, batch.x, train=True, rng=rng)
    loss = masked_cross_entropy(logits, batch.y, batch.mask)
    reg = prototype_loss(feats.astype(loss.dtype), batch.y, batch.mask, protos, present)
    return loss + lam * reg, loss

  def step(carry: SGDCarry, batch: Batch, rng):
    protos, present = carry.anchor
    grads, loss = jax.grad(objective, has_aux=True)(carry.params, protos, present, batch, rng)
    updates, opt_state = optimizer.update(grads, carry.opt_state, carry.params)
    return carry.replace(params=optax.apply_updates(carry.params, updates), opt_state=opt_state), loss

  def apply(own, state, data: ClientData, num_steps, key, rnd: ClientRound):
    carry = SGDCarry(params=own, opt_state=optimizer.init(own), anchor=rnd.broadcast)
    carry, loss = run_local_steps(step, carry, data, num_steps, key, batch_size=batch_size,
                                  max_steps=max_steps)
    sums, counts = class_sums(model, carry.params, data, num_classes=k, width=width, batch_size=batch_size)
    if weighting == "uniform":   # its class means and which classes it has
      has = counts > 0
      return carry.params, state, loss, (sums / jnp.maximum(counts, 1.0)[:, None], has.astype(counts.dtype))
    return carry.params, state, loss, (sums, counts)

  return ClientUpdate(apply=apply, takes_round=True)


def fedproto_server(num_classes: int, width: int) -> ServerRule:
  """FedProto's server: the global prototypes ``[N, K, d]`` and which classes have one ``[N, K]``,
  broadcast, replaced every round by the reporting clients' average."""

  def init(params, n):
    dtype = jnp.result_type(jnp.float32, *jax.tree.leaves(params))
    return (jnp.zeros((n, num_classes, width), dtype), jnp.zeros((n, num_classes), bool))

  def receive(inbox: Inbox, state):
    total, weight = inbox.messages
    present = weight > 0
    protos = total / jnp.where(present, weight, 1.0)[..., None]
    return jax.tree.map(jnp.zeros_like, inbox.pseudo_gradient), (protos, present), {}

  return ServerRule(init=init, receive=receive, name="fedproto")


@method_over(hierfavg, drops=("personal", "server_optimizers"), cannot=sends_whole(
  "FedProto's clients send prototypes, not models", personal=False))
def fedproto(host: Host, *, lam: float = 1.0, name: str = "fedproto") -> FederatedAlgorithm:
  """FedProto on ``topology`` (default flat): clients train with a term pulling their representations
  towards the global prototype of each example's class, and send their class prototypes
  (:doc:`the method's page <algorithms/peers.md#fedproto>`).

  Args:
    lam: ``λ`` >= 0, the weight of the prototype term (the authors' ``ld``; 0: local training).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg` (``weighting``:
      ``"examples"`` (the paper's class counts) or ``"uniform"`` (an unweighted mean over the clients
      with the class, the authors' code); ``cohort_size``, ``topology``, ``local_optimizer``, ...).

  Raises:
    ValueError: ``λ`` < 0, a model without a dense classifier layer, a sequence model, a model with
      BatchNorm statistics, update paths or server optimizers.

  Example:
    Two rounds of FedProto over 5 clients: prototypes travel, models do not:

    >>> model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(16,))
    >>> alg = fedproto(model=model, data=data, local_optimizer=optax.sgd(0.1), lam=1.0,
    ...                schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state, metrics = alg.round(alg.init(jax.random.key(0)), data, jax.random.key(1))
    >>> int(metrics["uplink_bytes"]), state.server_state[0].shape   # 3 x 16 sums and 3 counts
    (204, (1, 3, 16))
  """
  try:
    check_nonnegative(lam=lam)
  except ValueError as e:
    raise ValueError(f"{name}: {e}") from e
  weighting = host.get("weighting", "examples")
  if weighting not in WEIGHTINGS:
    raise ValueError(f"{name}: weighting={weighting!r}; choose one of {WEIGHTINGS}")
  model = host["model"]
  width = feature_width(model, host["data"].example_shape, name)
  rule = fedproto_server(int(model.num_classes), width)

  def objective(s: LocalSetup):
    return fedproto_update(s.model, s.optimizer, lam=lam, weighting=weighting, width=width,
                           batch_size=s.batch_size, max_steps=s.max_steps, compute_dtype=s.compute_dtype)

  return personal_only(host.build(client_update=objective, server_rule=rule, personal=personal(".*"),
                               name=name))
