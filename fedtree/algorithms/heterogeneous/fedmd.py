"""FedMD (Li and Wang 2019) on any tree: every client keeps its own model, and the clients of a parent
share only their scores on public inputs, whose mean (the consensus) each client digests before it
revisits its own data (:doc:`the page <algorithms/heterogeneous.md#fedmd>`).

References:
  Li and Wang, FedMD: Heterogenous federated learning via model distillation, NeurIPS 2019 workshop on
  federated learning (Algorithm 1).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms.heterogeneous.feddf import public_batch, public_inputs
from fedtree.algorithms.host import Host, cannot, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import check_positive, named
from fedtree.core.local import ClientUpdate, SGDCarry, make_sgd_step, run_local_steps, stack
from fedtree.core.server_rule import Downlink, Inbox, ServerRule, Uplink

REFUSALS = (
  cannot("update_paths", "the clients send scores on public inputs, not a model delta; run it without "
                         "update_paths"),
  cannot("personal", "every client's whole model is its own already; run it without personal"),
  cannot("server_optimizers", "no server model is stepped (the server averages scores); run it without "
                              "server_optimizers"),
  cannot("model_state", "the digest steps do not train BatchNorm statistics; use a model without BatchNorm"),
)


class Consensus(NamedTuple):
  """A parent's state: the mean of its clients' scores on the next round's public inputs
  (``[N, S, K]``), whether it holds one (``bool[N]``: not before the first round), and the rounds so far
  (``int32[N]``: the public inputs' seed)."""

  scores: jax.Array
  ready: jax.Array
  rounds: jax.Array


def fedmd_update(setup: LocalSetup, public: jax.Array, *, subset: int, digest_steps: int,
                 digest_learning_rate: float, seed: int) -> ClientUpdate:
  """A FedMD client, from its own model (its state): ``digest_steps`` full-batch Adam steps on the mean
  absolute error between its logits and the consensus on this round's public inputs (when its parent
  holds one), its local training on its own data (the host's optimizer and schedule), then its logits on
  the next round's public inputs as its message (the model it sends is its parent's, unchanged)."""
  model, size = setup.model, int(public.shape[0])
  local = make_sgd_step(model, setup.optimizer, compute_dtype=setup.compute_dtype)
  adam = optax.adam(digest_learning_rate)

  def inputs(rounds):
    return jnp.take(public, public_batch(seed, rounds, 0, size, subset), axis=0)

  def apply(anchor, own, data, num_steps, key, rnd):
    consensus = rnd.broadcast
    x = inputs(consensus.rounds)
    mae = lambda p: jnp.mean(jnp.abs(model.apply(p, x) - consensus.scores))   # noqa: E731

    def digest(_, carry):
      p, opt = carry
      updates, opt = adam.update(jax.grad(mae)(p), opt, p)
      return optax.apply_updates(p, updates), opt

    digested, _ = jax.lax.fori_loop(0, digest_steps, digest, (own, adam.init(own)))
    own = jax.tree.map(lambda d, o: jnp.where(consensus.ready, d, o), digested, own)
    carry = SGDCarry(params=own, opt_state=setup.optimizer.init(own), anchor=own)
    carry, loss = run_local_steps(local, carry, data, num_steps, key, batch_size=setup.batch_size,
                                  max_steps=setup.max_steps)
    return anchor, carry.params, loss, model.apply(carry.params, inputs(consensus.rounds + 1))

  return ClientUpdate(apply=apply, init_state=stack, takes_round=True, starts_from_own_model=True,
                      personal_models=lambda state: state)


def consensus_rule(subset: int, num_classes: int, name: str) -> ServerRule:
  """FedMD's server: the mean of its reporting clients' scores, sent to every child with the round count;
  the model is not stepped (a zero pseudo-gradient)."""
  def init(params, n):
    real = jnp.result_type(*[a.dtype for a in jax.tree.leaves(params)])
    return Consensus(jnp.zeros((n, subset, num_classes), real), jnp.zeros((n,), bool),
                     jnp.zeros((n,), jnp.int32))

  def receive(inbox: Inbox, state: Consensus):
    got = inbox.reported > 0
    count = jnp.maximum(inbox.reported, 1).astype(state.scores.dtype)[:, None, None]
    scores = jnp.where(got[:, None, None], inbox.messages / count, state.scores)
    return inbox.pseudo_gradient, Consensus(scores, state.ready | got, state.rounds + 1), {}

  score_bytes = subset * num_classes * 4
  return ServerRule(init=init, receive=receive, name=name,
                    down=Downlink(bytes=lambda _: score_bytes), up=Uplink(bytes=lambda _: score_bytes))


@method_over(hierfavg, cannot=REFUSALS, sets={"server_rule": "FedMD's parents average their clients' scores"})
def fedmd(host: Host, *, public: np.ndarray | jax.Array | None = None, public_subset: int = 64,
          digest_steps: int = 10, digest_learning_rate: float = 1e-3, public_seed_rounds: int = 0,
          name: str = "fedmd") -> FederatedAlgorithm:
  """FedMD: every client's own model digests its parent's consensus of scores on public inputs, then
  revisits its own data.

  Each round a sampled client takes ``digest_steps`` full-batch Adam steps (``digest_learning_rate``) on
  the mean absolute error between its logits and the consensus on the round's ``public_subset`` public
  inputs (FedMD's code fits the logits with Keras' MAE), then trains on its own data (the host's local
  optimizer and schedule: the revisit), and sends its logits on the next round's public inputs; its parent
  averages the scores of its reporting clients into the next consensus (uniformly). The public inputs of
  round ``t`` are drawn from ``public`` with seed ``public_seed_rounds`` and ``t``. The scores of a round are
  computed at the end of the round before (the same models: a client's model changes only when it
  trains), so with every client taking part each round, FedMD's setting, this is its algorithm; with a
  sampled cohort the consensus is the last cohort's. Each client is scored with its own model
  (``personal``). Not built: the transfer-learning stage on labeled public data, and models of different
  architectures (the clients here share one).

  Args:
    public: the public inputs ``[P, *example_shape]`` (a run's ``public_examples`` draws a stand-in from
      the clients' training inputs).
    public_subset: public inputs scored and digested a round.
    digest_steps: Adam steps of the digest per round.
    digest_learning_rate: Adam's learning rate.
    public_seed_rounds: the seed of the rounds' public inputs.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`.

  Raises:
    ValueError: no public inputs, inputs whose shape is not the data's examples, a non-positive count or
      rate, update paths, personal parameters, server optimizers or BatchNorm.

  Example:
    >>> public = np.asarray(jax.random.normal(jax.random.key(1), (10,) + data.example_shape))
    >>> alg = fedmd(model=model, data=data, public=public, public_subset=4, digest_steps=2,
    ...             local_optimizer=optax.sgd(0.1), schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state)), bool(state.server_state.ready.all())
    (['personal'], True)
  """
  model, data = host["model"], host["data"]
  inputs = jnp.asarray(public_inputs(public, data, name, "FedMD's clients score public inputs"))
  with named(name):
    check_positive(public_subset=public_subset, digest_steps=digest_steps,
                   digest_learning_rate=digest_learning_rate)

  def objective(s: LocalSetup) -> ClientUpdate:
    return fedmd_update(s, inputs, subset=int(public_subset), digest_steps=int(digest_steps),
                        digest_learning_rate=float(digest_learning_rate), seed=int(public_seed_rounds))

  rule = consensus_rule(int(public_subset), model.num_classes, name)
  alg = host.build(client_update=objective, server_rule=rule, name=name)
  return alg._replace(models=lambda state: {"personal": alg.models(state)["personal"]})
