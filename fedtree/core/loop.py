"""Running an algorithm: jitted rounds (fused with ``lax.scan``) and the round loop.

The round key is ``fold_in(key, state.round)``, so a run is a pure function of the seed and
resumes bit-identically from a checkpoint. ``rounds_per_call`` rounds run in one compiled
call between host visits; the state buffers are donated.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import numpy as np

from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.data import FederatedData
from fedtree.core.rng import stream


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
