"""MOON (Li, He and Song 2021, "Model-contrastive federated learning") on any tree.

A client trains from the model ``w`` it receives on the supervised loss plus ``μ`` times a
model-contrastive loss that pulls the representation of its model towards that of ``w`` and pushes
it away from that of its own previous local model ``w_prev``:

  ``ℓ(θ) = CE(θ; x, y) + μ · mean_x −log(e^{s_g/τ} / (e^{s_g/τ} + e^{s_p/τ}))``, ``s_g = sim(z, z_glob)``,
  ``s_p = sim(z, z_prev)``

with ``z``, ``z_glob``, ``z_prev`` the representations of ``x`` under ``θ``, ``w`` and ``w_prev``,
``sim`` the cosine similarity and ``τ`` the temperature (the paper's Eq. 3, with one previous
model: its ``model_buffer_size`` of 1). The term is ``softplus((sim(z, z_prev) − sim(z, z_glob)) / τ)``,
computed so. After training the client keeps its model as its next ``w_prev``
(``TreeState.client_state``: ``[C, ...]`` models, one per client, and a ``bool[C]`` "has trained":
the memory of a personal model per client, e.g. 4 bytes x parameters x clients).

**The representation** is the model's penultimate one: the input of the ``nn.Dense`` layer whose
output is the logits, found by intercepting one forward pass
(:func:`fedtree.objectives.fedmmd.penultimate`, FedMMD's; any flax classifier, no change to the
model). The paper's networks add a projection head and take its output; a model whose logits are
not a ``nn.Dense``'s output is refused by name. ``z_glob`` and ``z_prev`` are constants of the step
(no gradient flows into ``w`` or ``w_prev``) computed in inference mode (BatchNorm's running
statistics, as the paper's code puts those networks in ``eval()``); ``z`` in training mode, whose
BatchNorm statistics the step keeps (``model_state``).

**Before a client has trained** it has no previous model: ``first_previous="received"`` (the
default) uses the model it receives, so that term's gradient is 0 and its first round is FedAvg's
local training (FL-bench's MOON, and the paper's code in round 0, where the pool of previous
models is empty); ``"initial"`` uses the run's initial model (PFLlib's, whose clients start with a
copy of it). The paper's code also keeps, for clients never sampled, the randomly initialised
networks of their slots as "previous" models (a different random network from the global one);
that artifact is not reproduced.

**Other implementations.** The loss and the default weights follow the paper; aggregation weights
are the host's ``weighting`` (``"examples"``, the default: the paper's code, FL-bench's and
PFLlib's FedAvg weights by data size over the sampled clients; ``"uniform"``: ``1/|S|``). FL-bench
applies its classifier to ``relu(z)`` of a representation taken before the last activation; PFLlib
splits its models into ``base`` and ``head``; both compare the representations the same way as here.

**On a tree** the model a client receives is its parent's (an edge server's), so ``z_glob`` is
that model's representation; the levels above aggregate as HierFAVG every ``periods[l]`` rounds.
MOON changes nothing but the local objective, so this is the paper's method at every edge, with the
edges themselves synchronised by HierFAVG. ``μ = 0`` is FedAvg (tested). Everything the host does
composes (DP, robust aggregation, compression, systems, personal parameters): a client sends one
model, as FedAvg's.
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
from fedtree.core.model import Model, masked_cross_entropy, take_state, zero_state
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
  """MOON's client (see the module docstring): local steps on ``CE + μ · ℓ_con`` from the received
  model, the trained model kept as the client's previous one.

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
    loss = masked_cross_entropy(logits, batch.y, batch.mask)
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
  """MOON on ``topology`` (default flat): see the module docstring.

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
