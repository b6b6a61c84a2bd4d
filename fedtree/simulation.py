"""Running an algorithm: jitted rounds (fused with ``lax.scan``), evaluation, metric reports.

The round key is ``fold_in(key, state.round)``, so a run is a pure function of the seed and
resumes bit-identically from a checkpoint. ``rounds_per_call`` rounds run in one compiled
call between host visits; the state buffers are donated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.algorithms.base import FederatedAlgorithm
from fedtree.data import FederatedData
from fedtree.evaluation import EvalStats, evaluate, summarize
from fedtree.models import Model
from fedtree.rng import stream


class NonFiniteLossError(FloatingPointError):
  """Raised when a round's training loss is NaN or infinite."""


def init_key(key: jax.Array) -> jax.Array:
  """The key an algorithm's initial state is drawn from, given a run's root key (one rule
  for every entry point, so the same seed gives the same initial model everywhere)."""
  return stream(key, "init")


def make_multi_round(algorithm: FederatedAlgorithm, rounds_per_call: int) -> Callable:
  """``(state, data, key) -> (state, metrics stacked [rounds_per_call])``, for ``jax.jit``."""
  if rounds_per_call < 1:
    raise ValueError(f"rounds_per_call={rounds_per_call} must be >= 1")

  def multi(state, data, key):
    def body(s, _):
      return algorithm.round(s, data, jax.random.fold_in(key, s.round))

    return jax.lax.scan(body, state, None, length=rounds_per_call)

  return multi


def compile_rounds(algorithm: FederatedAlgorithm, rounds_per_call: int = 1, *, donate: bool = True):
  """The jitted fused-round function (state buffers donated)."""
  return jax.jit(make_multi_round(algorithm, rounds_per_call), donate_argnums=(0,) if donate else ())


def evaluate_models(
  algorithm: FederatedAlgorithm, state, model: Model, data: FederatedData, *,
  groups: np.ndarray | None = None, chunk_size: int | None = None, evaluator=None,
  positive_classes=None,
) -> dict[str, dict[str, Any]]:
  """Summaries of every model ``algorithm.models(state)`` names, on every client's test data
  (with ``positive_classes``, also keyword-spotting false-accept/reject rates; the evaluator
  must then be ``make_evaluator(..., confusion=True)``)."""
  evaluator = evaluator or make_evaluator(model, chunk_size, confusion=positive_classes is not None)
  out = {}
  for name, nm in algorithm.models(state).items():
    stats = evaluator(nm.params, data.x_test, data.y_test, data.n_test, jnp.asarray(nm.model_of_client))
    out[name] = summarize(stats, groups, positive_classes=positive_classes)
    if getattr(nm, "cluster_of_client", None) is not None:
      out[name].update(cluster_summary(nm, data, evaluator))
  return out


def cluster_summary(nm, data: FederatedData, evaluator) -> dict[str, Any]:
  """Intra- and inter-cluster accuracy of clustered models ``nm`` (every row scored on every
  client's test data; see :func:`fedtree.clustering.cluster_accuracy`)."""
  from fedtree.clustering import cluster_accuracy

  num_models = jax.tree.leaves(nm.params)[0].shape[0]
  correct, count = [], []
  for k in range(num_models):
    s = evaluator(nm.params, data.x_test, data.y_test, data.n_test,
                  jnp.full((data.num_clients,), k, jnp.int32))
    correct.append(np.asarray(s.correct))
    count.append(np.asarray(s.count))
  out = cluster_accuracy(np.stack(correct), np.stack(count), np.asarray(nm.cluster_of_client),
                         np.asarray(nm.model_of_client), chosen_by_data=nm.chosen_by_data)
  out["cluster_of_client"] = np.asarray(nm.cluster_of_client)
  return out


def make_evaluator(model: Model, chunk_size: int | None = None, *, confusion: bool = False):
  """A jitted ``(params, x, y, n, model_of_client) -> EvalStats`` (with per-client confusion
  matrices when ``confusion``)."""

  @jax.jit
  def run(params, x, y, n, moc) -> EvalStats:
    return evaluate(model, params, x, y, n, model_of_client=moc, chunk_size=chunk_size,
                    confusion=confusion)

  return run


def run(
  algorithm: FederatedAlgorithm,
  data: FederatedData,
  *,
  num_rounds: int,
  key: jax.Array,
  rounds_per_call: int = 1,
  state=None,
  on_metrics: Callable[[int, dict[str, float]], None] | None = None,
  check_finite: bool = True,
):
  """Runs ``num_rounds`` rounds; returns the final state.

  ``on_metrics(round, metrics)`` is called after every fused call with the last round's
  metrics (host floats). Raises :class:`NonFiniteLossError` naming the round when the
  training loss stops being finite (``check_finite``).
  """
  if num_rounds < 0:
    raise ValueError(f"num_rounds={num_rounds} must be >= 0")
  state = algorithm.init(init_key(key)) if state is None else state
  step = compile_rounds(algorithm, rounds_per_call)
  calls = math.ceil(num_rounds / rounds_per_call) if rounds_per_call else 0
  done = int(state.round)
  for _ in range(calls):
    if done >= num_rounds:
      break
    if num_rounds - done < rounds_per_call:  # a short tail: its own (one-off) compile
      step = compile_rounds(algorithm, num_rounds - done)
    state, metrics = step(state, data, key)
    done = int(state.round)
    host = {k: np.asarray(v)[-1].item() for k, v in metrics.items()}
    if check_finite and "train_loss" in metrics:
      losses = np.asarray(metrics["train_loss"])
      if not np.all(np.isfinite(losses)):
        bad = done - len(losses) + int(np.argmin(np.isfinite(losses))) + 1
        raise NonFiniteLossError(
          f"{algorithm.name}: training loss became {losses[~np.isfinite(losses)][0]} at round "
          f"{bad}; lower the local learning rate or check the data"
        )
    if on_metrics is not None:
      on_metrics(done, host)
  return state
