"""Any algorithm's models fine-tuned per client before evaluation: "X + FT" (:func:`finetuned`).

What is fine-tuned, its run fields and how FL-bench and FLGo differ: :doc:`X + FT on the
partial-personalization page <algorithms/partial.md#x-ft>`.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.algorithm import FederatedAlgorithm, NodeModels, ScoredModels
from fedtree.core.checks import check_positive
from fedtree.core.data import FederatedData
from fedtree.core.finetune import make_finetuner
from fedtree.core.local import LocalSchedule
from fedtree.core.model import Model
from fedtree.core.rng import stream

PyTree = Any
SUFFIX = "_ft"


def finetune_schedule(steps: int, epochs: float, batch_size: int, *, algorithm: str) -> LocalSchedule | None:
  """The fine-tune's :class:`~fedtree.core.local.LocalSchedule` (``None``: no fine-tuning, both 0).

  Raises:
    ValueError: a negative count, or both ``steps`` and ``epochs`` given; the message names
      ``algorithm``.
  """
  if isinstance(steps, bool) or int(steps) != steps or int(steps) < 0:
    raise ValueError(f"{algorithm}: finetune_steps={steps!r} must be an int >= 0 (0: no fine-tuning)")
  if not float(epochs) >= 0:
    raise ValueError(f"{algorithm}: finetune_epochs={epochs!r} must be >= 0 (0: no fine-tuning)")
  if int(steps) > 0 and float(epochs) > 0:
    raise ValueError(f"{algorithm}: give finetune_steps={steps} or finetune_epochs={epochs}, not both")
  if int(steps) > 0:
    return LocalSchedule(batch_size=batch_size, steps=int(steps))
  if float(epochs) > 0:
    return LocalSchedule(batch_size=batch_size, epochs=float(epochs))
  return None


def finetuned(
  algorithm: FederatedAlgorithm,
  *,
  model: Model,
  data: FederatedData,
  batch_size: int,
  learning_rate: float,
  steps: int = 0,
  epochs: float = 0.0,
  optimizer: str = "sgd",
  trainable: PyTree | None = None,
  models: Sequence[str] | None = None,
  seed: int = 0,
  chunk_size: int | None = None,
) -> FederatedAlgorithm:
  """``algorithm`` whose ``models()`` adds ``<model>_ft``: each of ``models`` (default every one)
  fine-tuned by every client from its row for ``steps`` steps (or ``epochs`` epochs) of
  ``optimizer`` at ``learning_rate`` (:doc:`docs <algorithms/partial.md#x-ft>`). ``steps = epochs = 0``: the
  algorithm unchanged.

  Args:
    algorithm: any algorithm.
    model: its model.
    data: the federated data (padded; the clients' training splits fine-tune).
    batch_size: the fine-tune's minibatch size.
    learning_rate: the fine-tune's rate (> 0; a traced scalar in a sweep).
    steps: fine-tuning steps per client (``>= 0``).
    epochs: fine-tuning epochs over each client's data instead (``>= 0``).
    optimizer: an optax optimizer's name.
    trainable: a pytree of bools shaped as one model: fine-tune those leaves only (``None``: all).
    models: the names of the models to fine-tune (default every model the algorithm reports but
      the :class:`~fedtree.core.algorithm.ScoredModels` ones, which carry their own model).
    seed: the fine-tune's minibatch order (folded with the round).
    chunk_size: clients fine-tuned at once (``None``: all).

  Raises:
    ValueError: a negative count, both counts, a rate that is not > 0, ragged data; at the first
      evaluation, a name in ``models`` that the algorithm does not report or that names a
      :class:`~fedtree.core.algorithm.ScoredModels` set.

  Example:
    FedAvg and FedAvg + FT (5 steps) in one run:

    >>> from fedtree.algorithms import fedavg
    >>> alg = finetuned(fedavg(model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...                        schedule=LocalSchedule(batch_size=8, steps=2)),
    ...                 model=model, data=data, batch_size=8, learning_rate=0.1, steps=5)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['global', 'global_ft']
  """
  name = algorithm.name
  schedule = finetune_schedule(steps, epochs, batch_size, algorithm=name)
  if schedule is None:
    return algorithm
  check_positive(finetune_learning_rate=learning_rate)
  data.require_padded(f"{name}: fine-tuning before evaluation")
  tune = make_finetuner(model, schedule, max_train=data.max_train, optimizer=optimizer, chunk_size=chunk_size,
                        evaluate=False, trainable=trainable)
  wanted = None if models is None else tuple(models)
  inner = algorithm.models
  rates = jnp.asarray(learning_rate)[None]   # the default float dtype (float64 under x64); traced in a sweep
  root = stream(jax.random.key(int(seed)), "finetune")

  def with_finetuned(state):
    out = dict(inner(state))
    scored = [n for n, m in out.items() if isinstance(m, ScoredModels)]
    names = [n for n in out if n not in scored] if wanted is None else list(wanted)
    unknown = [n for n in names if n not in out]
    if unknown:
      raise ValueError(f"{name}: finetune_models={list(wanted or ())} names {unknown}, which this algorithm "
                       f"does not report; its models are {sorted(out)}")
    if not names and scored:
      raise ValueError(f"{name}: every model it reports {sorted(scored)} is scored by a model of its own "
                       f"(a mixture or a memory, not one model of the run's architecture): nothing to "
                       f"fine-tune; drop finetune_steps/finetune_epochs")
    carried = [n for n in names if n in scored]
    if carried:
      raise ValueError(f"{name}: finetune_models={list(wanted or ())} names {carried}, scored by a model "
                       f"of their own (a mixture or a memory, not one model of the run's architecture); "
                       f"fine-tune one of {sorted(n for n in out if n not in scored)}")
    key = jax.random.fold_in(root, jnp.asarray(getattr(state, "round", 0)))
    for n in names:
      nm = out[n]
      tuned, _ = tune(nm.params, jnp.asarray(nm.model_of_client, jnp.int32), data, rates,
                      jax.random.fold_in(key, zlib.crc32(n.encode()) & 0x7FFFFFFF))
      out[f"{n}{SUFFIX}"] = NodeModels(jax.tree.map(lambda a: a[0], tuned),
                                       np.arange(data.num_clients, dtype=np.int32))
    return out

  return algorithm._replace(models=with_finetuned)
