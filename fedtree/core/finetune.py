"""Local fine-tuning (paper 000's Algorithm 3, "PerFL"), vectorized over clients and rates.

Every client ``c`` fine-tunes the model ``params[model_of_client[c]]`` (the global model for
PerFL, its group model for GroupPerFL) on its own training data for a
:class:`~fedtree.core.local.LocalSchedule` (``K_l`` epochs, batch ``B``) with learning rate
``η_{i,l}``. A whole sweep of learning rates (paper 000: 0.001, 0.01, 0.1, 1.0) is one
jitted program: the per-client fine-tune is ``vmap``-ed over the rates and then over the
clients (in chunks of ``chunk_size`` clients by ``lax.map``), so a sweep costs one compile
and no Python loop. Every rate sees the same minibatches (client ``c`` uses
``fold_in(key, c)``), so rates are compared on common randomness.

:func:`finetune` returns the personal models ``[L, C, ...]``; :func:`finetune_evaluate`
scores them on each client's test data without keeping them (memory ``O(chunk · L)``
models) and returns :class:`~fedtree.core.metrics.EvalStats` with a leading rate axis.

Selecting the rate (paper 000 reports one number per method and does not say how the rate
was picked; **choice**): :func:`best_rate` picks, per method, the rate with the lowest
example-weighted test loss (equivalently perplexity) or highest accuracy over all clients,
i.e. on the evaluation split as the paper's tables do. This favours every fine-tuned method
equally; pass a held-out split as the "test" data to select honestly.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.checks import check_positive
from fedtree.core.data import FederatedData
from fedtree.core.local import (
  ClientData,
  LocalSchedule,
  SGDCarry,
  make_sgd_step,
  run_local_steps,
  steps_per_epoch,
  train_only,
)
from fedtree.core.metrics import EvalStats, client_sums
from fedtree.core.model import Model
from fedtree.core.server import optimizer_by_name

PyTree = Any


def check_finetune(schedule: LocalSchedule, learning_rates: Sequence[float]) -> tuple[float, ...]:
  """Validates a fine-tune schedule and rates; returns the rates as a tuple."""
  if schedule.epochs is not None and not schedule.epochs > 0:
    raise ValueError(f"fine-tune epochs={schedule.epochs} must be > 0")
  if schedule.steps is not None and int(np.min(schedule.steps)) < 1:
    raise ValueError(f"fine-tune steps={schedule.steps} must be >= 1")
  rates = tuple(float(r) for r in np.atleast_1d(np.asarray(learning_rates, dtype=np.float64)))
  if not rates:
    raise ValueError("fine-tune learning_rates is empty: give at least one rate")
  for r in rates:
    check_positive(finetune_learning_rate=r)
  return rates


def _finetune_one(model, optimizer_name, schedule, max_steps, trainable):
  """``(start, ClientData, num_steps, key, lr) -> params``: one client, one rate."""

  def one(start, cdata: ClientData, num_steps, key, lr):
    opt = optimizer_by_name(optimizer_name, learning_rate=lr)
    if trainable is not None:   # the other leaves stay as they are (train_only)
      opt = train_only(opt, jax.tree.unflatten(jax.tree.structure(start), list(trainable)))
    step = make_sgd_step(model, opt)
    carry = SGDCarry(params=start, opt_state=opt.init(start), anchor=start)
    carry, _ = run_local_steps(
      step, carry, cdata, num_steps, key, batch_size=schedule.batch_size, max_steps=max_steps
    )
    return carry.params

  return one


@functools.lru_cache(maxsize=64)
def _finetune_program(model, schedule, max_steps, optimizer, chunk_size, evaluate, trainable):
  """The jitted fine-tune of :func:`make_finetuner` for one static setting, made once per setting
  (every fine-tuner of the same model and schedule, e.g. one per experiment of a sweep or per
  evaluation, reuses its compiled program; the cache holds functions, never data)."""
  one = _finetune_one(model, optimizer, schedule, max_steps, trainable)
  lm = model.token_labels  # token labels: also the sentence sums (sentence-level perplexity)
  over_rates = jax.vmap(one, in_axes=(None, None, None, None, 0))

  def run(params, model_of_client, data: FederatedData, rates, key):
    data.require_padded("fine-tuning (fedtree.core.finetune)")
    num_clients = data.num_clients
    num_steps = jnp.minimum(schedule.num_steps(data.n_train), max_steps)
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(num_clients))

    def client(args):
      m, x, y, n, steps, k, xt, yt, nt = args
      start = jax.tree.map(lambda a: a[m], params)
      personal = over_rates(start, ClientData(x, y, n), steps, k, rates)
      if not evaluate:
        return personal
      return jax.vmap(lambda p: client_sums(model, p, xt, yt, nt, sentences=lm))(personal)

    args = (jnp.asarray(model_of_client, jnp.int32), data.x_train, data.y_train, data.n_train,
            num_steps, keys, data.x_test, data.y_test, data.n_test)
    batch = num_clients if chunk_size is None else max(1, min(int(chunk_size), num_clients))
    out = jax.lax.map(client, args, batch_size=batch)  # leaves [C, L, ...]
    epochs = num_steps.astype(jnp.result_type(float)) / jnp.maximum(
      steps_per_epoch(data.n_train, schedule.batch_size), 1).astype(jnp.result_type(float))
    if evaluate and model.multi_label:   # + the label score buckets [C, L, 2, B, K]
      loss, correct, count = (a.T for a in out[:3])
      return EvalStats(loss, correct, count, label_scores=jnp.swapaxes(out[3], 0, 1)), epochs
    if evaluate:
      loss, correct, count, *sentence = (a.T for a in out)     # + sentence sums of an LM
      return EvalStats(loss, correct, count, None, *sentence), epochs
    return jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), out), epochs

  return jax.jit(run)


def make_finetuner(
  model: Model,
  schedule: LocalSchedule,
  *,
  max_train: int,
  optimizer: str = "sgd",
  chunk_size: int | None = None,
  evaluate: bool = True,
  trainable: PyTree | None = None,
):
  """A jitted ``(params [N, ...], model_of_client int32[C], data, rates f32[L], key) -> out``.

  With ``evaluate=True`` ``out = (EvalStats [L, C], epochs f32[C])``: each personal model
  scored on its client's test data. With ``evaluate=False`` ``out = (params [L, C, ...],
  epochs)``. ``epochs[c]`` is what client ``c`` actually trained (steps / steps per epoch).
  ``trainable`` (a pytree of bools shaped as one model): fine-tune those leaves only, the others
  frozen (:func:`fedtree.core.local.train_only`; ``None``: every leaf). Fine-tuners of the same
  model, schedule and settings share one compiled program.
  Raises ``ValueError`` for a schedule with no training.
  """
  check_finetune(schedule, [1.0])
  optimizer_by_name(optimizer, learning_rate=0.1)  # an unknown name fails here, not in jit
  frozen = None if trainable is None else tuple(bool(t) for t in jax.tree.leaves(trainable))
  return _finetune_program(model, schedule, schedule.max_steps(max_train), optimizer, chunk_size, evaluate,
                           frozen)


def finetune(
  model: Model, params: PyTree, model_of_client, data: FederatedData, *,
  learning_rates: Sequence[float], schedule: LocalSchedule, key: jax.Array,
  optimizer: str = "sgd", chunk_size: int | None = None,
) -> tuple[PyTree, jax.Array]:
  """Personal models ``[L, C, ...]`` of every client for every rate, and epochs ``[C]``."""
  rates = check_finetune(schedule, learning_rates)
  run = make_finetuner(model, schedule, max_train=data.max_train, optimizer=optimizer,
                       chunk_size=chunk_size, evaluate=False)
  return run(params, model_of_client, data, jnp.asarray(rates, jnp.result_type(float)), key)


def finetune_evaluate(
  model: Model, params: PyTree, model_of_client, data: FederatedData, *,
  learning_rates: Sequence[float], schedule: LocalSchedule, key: jax.Array,
  optimizer: str = "sgd", chunk_size: int | None = None,
) -> tuple[EvalStats, jax.Array]:
  """Test statistics ``EvalStats [L, C]`` of every fine-tuned model, and epochs ``[C]``."""
  rates = check_finetune(schedule, learning_rates)
  run = make_finetuner(model, schedule, max_train=data.max_train, optimizer=optimizer,
                       chunk_size=chunk_size, evaluate=True)
  return run(params, model_of_client, data, jnp.asarray(rates, jnp.result_type(float)), key)


SELECT_BY = ("loss", "accuracy")


def best_rate(stats: EvalStats, select_by: str = "loss") -> int:
  """Index of the rate with the lowest overall loss (or highest accuracy); stats ``[L, C]``."""
  if select_by not in SELECT_BY:
    raise ValueError(f"select_by={select_by!r}; choose one of {SELECT_BY}")
  count = np.maximum(np.asarray(stats.count, np.float64).sum(axis=1), 1.0)
  if select_by == "loss":
    score = np.asarray(stats.loss_sum, np.float64).sum(axis=1) / count
    score = np.where(np.isfinite(score), score, np.inf)
    return int(np.argmin(score))
  score = np.asarray(stats.correct, np.float64).sum(axis=1) / count
  return int(np.argmax(score))


def take_rate(stats: EvalStats, index: int) -> EvalStats:
  """The ``[C]`` statistics of rate ``index``."""
  return jax.tree.map(lambda a: a[index], stats)
