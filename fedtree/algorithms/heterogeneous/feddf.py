"""FedDF (Lin et al. 2020) on any tree: every parent's FedAvg model distilled, on unlabeled public inputs,
from the ensemble of the models its clients sent (:doc:`the page <algorithms/heterogeneous.md#feddf>`).

References:
  Lin, Kong, Stich and Jaggi, Ensemble distillation for robust model fusion in federated learning,
  NeurIPS 2020 (Algorithm 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms.host import Host, cannot, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.checks import check_positive, named
from fedtree.core.model import Model, masked_kl
from fedtree.core.server_rule import Downlink, Inbox, ServerRule, Uplink

REFUSALS = (
  cannot("server_optimizers", "the distilled model replaces the parent's (FedDF's server step); run it "
                              "without server_optimizers"),
  cannot("model_state", "the distillation steps do not train BatchNorm statistics; use a model without "
                        "BatchNorm"),
  cannot("personal", "the ensemble and the distilled model are whole models; run it without personal"),
)


def public_inputs(public, data, name: str, why: str) -> np.ndarray:
  """``public`` checked against the data's examples, in the data's dtype.

  Raises:
    ValueError: ``None`` (``why`` says what the method needs them for), or a shape that is not
      ``[P, *example_shape]`` with ``P >= 1``.
  """
  if public is None:
    raise ValueError(f"{name}: public=None; {why}: give public= (an array [P, *example_shape]) or a run's "
                     f"public_examples")
  public = np.asarray(public)
  if public.ndim < 1 or public.shape[0] < 1 or tuple(public.shape[1:]) != tuple(data.example_shape):
    raise ValueError(f"{name}: public has shape {public.shape}; it must be [P, *example_shape] with P >= 1 "
                     f"and example_shape={tuple(data.example_shape)}")
  return public.astype(np.dtype(data.x_train.dtype))


def public_batch(seed: int, rounds, step, size: int, batch_size: int):
  """The indices of distillation step ``step``'s batch in round ``rounds`` (uniform, with replacement),
  the same at every parent."""
  key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), rounds), step)
  return jax.random.randint(key, (batch_size,), 0, size)


def distillation_loss(student_logits, teacher_logits, temperature: float):
  """``T² · KL(softmax(teacher / T) ‖ softmax(student / T))``, averaged over the batch."""
  rows = jnp.ones(jnp.shape(student_logits)[:-1], bool)
  return temperature ** 2 * masked_kl(teacher_logits, student_logits, rows, temperature)


def ensemble_distillation(model: Model, public, *, steps: int, batch_size: int, learning_rate: float,
                          temperature: float, seed: int, name: str) -> ServerRule:
  """FedDF's server rule: each parent's weighted mean of its clients' models (the host's), then ``steps``
  Adam steps on the distillation loss against the mean logits of the models its reporting clients sent,
  on batches of ``public`` (``[P, *example_shape]``, no labels); a parent none of whose clients reported
  keeps its model. Its state counts the rounds (the batches' seed)."""
  public = jnp.asarray(public)
  size, adam = int(public.shape[0]), optax.adam(learning_rate)

  def receive(inbox: Inbox, rounds):
    slots, n = inbox.slots, rounds.shape[0]
    fused = jax.tree.map(jnp.subtract, inbox.params, inbox.pseudo_gradient)   # the FedAvg models
    member = (slots.parent[:, None] == jnp.arange(n)[None, :]) & slots.reported[:, None]   # [K, N]
    count = jnp.sum(member, axis=0)

    def teacher(x):   # [N, B, classes]: each parent's mean of its clients' logits
      logits = jax.vmap(lambda p: model.apply(p, x))(slots.sent)
      weights = member.astype(logits.dtype) / jnp.maximum(count, 1).astype(logits.dtype)[None, :]
      return jnp.einsum("kn,kbc->nbc", weights, logits)

    def step(j, carry):
      students, opt_state, _ = carry
      x = jnp.take(public, public_batch(seed, rounds[0], j, size, batch_size), axis=0)
      target = teacher(x)
      loss_of = lambda p, t: distillation_loss(model.apply(p, x), t, temperature)   # noqa: E731
      losses, grads = jax.vmap(jax.value_and_grad(loss_of))(students, target)
      updates, opt_state = jax.vmap(adam.update)(grads, opt_state, students)
      return optax.apply_updates(students, updates), opt_state, losses

    init = (fused, jax.vmap(adam.init)(fused), jnp.zeros((n,), jnp.result_type(float)))
    students, _, losses = jax.lax.fori_loop(0, steps, step, init)
    keep = count > 0
    distilled = jax.tree.map(
      lambda s, f: jnp.where(keep.reshape((-1,) + (1,) * (s.ndim - 1)), s, f), students, fused)
    pseudo_gradient = jax.tree.map(jnp.subtract, inbox.params, distilled)
    return pseudo_gradient, rounds + 1, {"distill_loss": jnp.where(keep, losses, 0.0)}

  return ServerRule(init=lambda params, n: jnp.zeros((n,), jnp.int32), receive=receive, name=name,
                    down=Downlink(broadcast=lambda rounds: ()), up=Uplink(slots=True))


@method_over(hierfavg, cannot=REFUSALS, sets={"server_rule": "FedDF's parents distill their clients' "
                                                             "ensemble"})
def feddf(host: Host, *, public: np.ndarray | jax.Array | None = None, distill_steps: int = 100,
          distill_batch_size: int = 32, distill_learning_rate: float = 1e-3, temperature: float = 1.0,
          distill_seed: int = 0, name: str = "feddf") -> FederatedAlgorithm:
  """FedDF: FedAvg, then every parent's model distilled from its clients' ensemble on unlabeled data.

  Each round every parent averages the models its clients sent (the host's weights), then takes
  ``distill_steps`` Adam steps (``distill_learning_rate``, the paper's 1e-3) from that average on the
  KL divergence between the mean of its reporting clients' logits and its own (temperature
  ``temperature``), on batches of ``distill_batch_size`` public inputs drawn uniformly (the same at
  every parent; ``distill_seed``). The paper's early stopping on a validation set is not built: the
  steps are fixed.

  Args:
    public: the unlabeled public inputs ``[P, *example_shape]`` (a run's ``public_examples`` draws a
      stand-in from the clients' training inputs).
    distill_steps: Adam steps of distillation per round and parent.
    distill_batch_size: public inputs per step.
    distill_learning_rate: Adam's learning rate.
    temperature: the softmax temperature of teacher and student (the loss is scaled by its square).
    distill_seed: the seed of the public batches.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`.

  Raises:
    ValueError: no public inputs, inputs whose shape is not the data's examples, a non-positive count
      or rate, server optimizers, personal parameters or BatchNorm.

  Example:
    Ten unlabeled inputs, 5 distillation steps a round:

    >>> public = np.asarray(jax.random.normal(jax.random.key(1), (10,) + data.example_shape))
    >>> alg = feddf(model=model, data=data, public=public, distill_steps=5, distill_batch_size=4,
    ...             local_optimizer=optax.sgd(0.1), schedule=LocalSchedule(batch_size=8, steps=2))
    >>> losses = []
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0),
    ...                  on_metrics=lambda r, m: losses.append(m["distill_loss"]))
    >>> len(losses), all(loss >= 0 for loss in losses)
    (2, True)
  """
  model, data = host["model"], host["data"]
  public = public_inputs(public, data, name, "FedDF distills on unlabeled public inputs")
  with named(name):
    check_positive(distill_steps=distill_steps, distill_batch_size=distill_batch_size,
                   distill_learning_rate=distill_learning_rate, temperature=temperature)
  rule = ensemble_distillation(model, public, steps=int(distill_steps),
                               batch_size=int(distill_batch_size), learning_rate=float(distill_learning_rate),
                               temperature=float(temperature), seed=int(distill_seed), name=name)
  return host.build(server_rule=rule, name=name)
