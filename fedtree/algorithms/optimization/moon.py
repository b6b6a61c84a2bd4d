"""MOON (Li, He and Song 2021): a model-contrastive term on the local loss, on any tree.

The loss (:func:`contrastive`), the client (:func:`moon_update`) and the method (:func:`moon`). The
equations and how the paper's code, FL-bench and PFLlib differ: :doc:`MOON on the optimization page
<algorithms/optimization.md#moon>`.

References:
  Li, He and Song, Model-contrastive federated learning, CVPR 2021.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import check_nonnegative, check_positive, named
from fedtree.core.local import (
  Batch,
  ClientData,
  ClientUpdate,
  SGDCarry,
  cast_floating,
  check_compute_dtype,
  run_local_steps,
  stack,
)
from fedtree.core.model import Model, masked_loss, take_state, zero_state
from fedtree.objectives.fedmmd import check_features, penultimate, penultimate_train

FIRST_PREVIOUS = ("received", "initial")
COSINE_EPS = 1e-8
"""The floor of ``‖a‖·‖b‖`` in the cosine similarity (as ``torch.nn.functional.cosine_similarity``'s
``eps``), so that an all-zero representation (a dead ReLU layer) has similarity 0, not NaN."""


def cosine(a: jax.Array, b: jax.Array) -> jax.Array:
  """Row-wise cosine similarity of ``[B, D]`` arrays (0 where a row is all zeros)."""
  dot = jnp.sum(a * b, axis=-1)
  sq = jnp.sum(jnp.square(a), axis=-1) * jnp.sum(jnp.square(b), axis=-1)
  return dot * jax.lax.rsqrt(jnp.maximum(sq, COSINE_EPS ** 2))


def contrastive(z: jax.Array, z_glob: jax.Array, z_prev: jax.Array, mask: jax.Array,
                temperature) -> jax.Array:
  """MOON's model-contrastive loss averaged over the rows of ``mask`` (0 if none):
  ``−log(e^{s_g/τ} / (e^{s_g/τ} + e^{s_p/τ})) = softplus((s_p − s_g) / τ)``."""
  dtype = jnp.promote_types(jnp.result_type(z), jnp.float32)
  z, z_glob, z_prev = z.astype(dtype), z_glob.astype(dtype), z_prev.astype(dtype)
  per_row = jax.nn.softplus((cosine(z, z_prev) - cosine(z, z_glob)) / jnp.asarray(temperature, dtype))
  m = mask.astype(dtype)
  return jnp.sum(per_row * m) / jnp.maximum(jnp.sum(m), 1.0)


def moon_update(
  model: Model, optimizer: optax.GradientTransformation, *, mu: float, temperature: float = 0.5,
  first_previous: str = "received", batch_size: int, max_steps: int, compute_dtype=None,
) -> ClientUpdate:
  """MOON's client (:doc:`docs <algorithms/optimization.md#moon>`): local steps on ``CE + μ · ℓ_con`` from the
  received model, the trained model kept as the client's previous one.

  Args:
    model: a flax classifier whose logits come from an ``nn.Dense`` (its input is ``z``).
    optimizer: the local optimizer.
    mu: ``μ >= 0``, the weight of the contrastive term.
    temperature: ``τ > 0``.
    first_previous: ``"received"`` or ``"initial"``, the previous model of a client that has not
      trained yet.
    batch_size: minibatch size.
    max_steps: static scan length.
    compute_dtype: mixed-precision local steps (``None``: the params' dtype); the contrastive loss
      is computed in at least float32.
  """
  check_nonnegative(mu=mu)
  check_positive(temperature=temperature)
  if first_previous not in FIRST_PREVIOUS:
    raise ValueError(f"first_previous={first_previous!r}; choose one of {FIRST_PREVIOUS}")
  dtype = check_compute_dtype(compute_dtype)

  def objective(params, refs, batch: Batch, rng):
    glob, prev = refs
    if dtype is not None:
      params, glob, prev = (cast_floating(t, dtype) for t in (params, glob, prev))
      batch = batch._replace(x=cast_floating(batch.x, dtype))
    z, logits, updated = penultimate_train(model, params, batch.x, rng=rng, mask=batch.mask, method="MOON")
    z_glob, _ = penultimate(model, glob, batch.x, method="MOON")
    z_prev, _ = penultimate(model, prev, batch.x, method="MOON")
    loss = masked_loss(model, logits, batch.y, batch.mask)
    con = contrastive(z, jax.lax.stop_gradient(z_glob), jax.lax.stop_gradient(z_prev), batch.mask,
                      temperature)
    return loss + jnp.asarray(mu, loss.dtype) * con.astype(loss.dtype), (loss, updated)

  def step(carry: SGDCarry, batch: Batch, rng):
    grads, (loss, updated) = jax.grad(objective, has_aux=True)(carry.params, carry.anchor, batch, rng)
    updates, opt_state = optimizer.update(zero_state(model, grads), carry.opt_state, carry.params)
    params = optax.apply_updates(carry.params, updates)
    if dtype is not None:   # statistics back in the params' dtypes
      updated = jax.tree.map(lambda u, p: u.astype(jnp.result_type(p)), updated, carry.params)
    return carry.replace(params=take_state(model, params, updated), opt_state=opt_state), loss

  def init_state(params, num_clients):
    return stack(params, num_clients), jnp.zeros((num_clients,), bool)

  def apply(anchor, state, data: ClientData, num_steps, key):
    previous, trained = state
    if first_previous == "received":
      previous = jax.tree.map(lambda p, a: jnp.where(trained, p, a), previous, anchor)
    carry = SGDCarry(params=anchor, opt_state=optimizer.init(anchor), anchor=(anchor, previous))
    carry, loss = run_local_steps(step, carry, data, num_steps, key, batch_size=batch_size,
                                  max_steps=max_steps)
    return carry.params, (carry.params, jnp.ones((), bool)), loss

  return ClientUpdate(apply=apply, init_state=init_state, model_state=True)


@method_over(hierfavg)
def moon(
  host: Host,
  *,
  mu: float = 1.0,
  temperature: float = 0.5,
  first_previous: str = "received",
  name: str = "moon",
) -> FederatedAlgorithm:
  """MOON on ``topology`` (default flat): clients train on ``CE + μ · ℓ_con``, a model-contrastive
  loss pulling their representation towards the received model's and away from their previous
  model's (:doc:`the method's page <algorithms/optimization.md#moon>`).

  Args:
    mu: ``μ >= 0``, the weight of the model-contrastive loss (the paper's code defaults to 1, its
      experiments use 1, 5 or 10; FL-bench defaults to 5).
    temperature: ``τ > 0`` (0.5: the paper's, FL-bench's).
    first_previous: the previous model of a client that has not trained yet: ``"received"`` (the
      model it receives: FedAvg's local training in its first round; FL-bench, the paper's code in
      round 0) or ``"initial"`` (the run's initial model; PFLlib).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`; the model must
      have a penultimate representation (:func:`fedtree.objectives.fedmmd.check_features`).

  Raises:
    ValueError: ``mu < 0``, ``temperature <= 0``, an unknown ``first_previous``, or a model without
      a penultimate representation.

  Example:
    Two rounds of MOON over 5 clients with an MLP (its hidden layer is the representation):

    >>> model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(8,))
    >>> alg = moon(model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...            schedule=LocalSchedule(batch_size=8, steps=2), mu=1.0)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> state.client_state[1].tolist()    # every client has trained: its previous model is its own
    [True, True, True, True, True]
  """
  with named(name):
    check_nonnegative(mu=mu)
    check_positive(temperature=temperature)
  if first_previous not in FIRST_PREVIOUS:
    raise ValueError(f"{name}: first_previous={first_previous!r}; choose one of {FIRST_PREVIOUS}")
  check_features(host["model"], host["data"].example_shape, method=name)

  def objective(s: LocalSetup):
    return moon_update(s.model, s.optimizer, mu=mu, temperature=temperature, first_previous=first_previous,
                       batch_size=s.batch_size, max_steps=s.max_steps, compute_dtype=s.compute_dtype)

  return host.build(client_update=objective, name=name)
