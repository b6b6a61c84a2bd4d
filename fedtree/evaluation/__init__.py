"""Evaluation and reports: every model an algorithm names, scored on every client's test data.

:func:`evaluate_models` scores each entry of ``algorithm.models(state)`` with the vectorized
evaluator of :mod:`fedtree.core.metrics` and summarizes it per client, per group and overall
(false accept/reject rates for keyword spotting, intra- and inter-cluster accuracy for
clustered models).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.algorithms.clustering.ops import cluster_accuracy
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.data import FederatedData
from fedtree.core.metrics import make_evaluator, summarize
from fedtree.core.model import Model


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
    out[name] = summarize(stats, groups, positive_classes=positive_classes,
                          perplexity=bool(model.label_shape))
    if getattr(nm, "cluster_of_client", None) is not None:
      out[name].update(cluster_summary(nm, data, evaluator))
  return out


def cluster_summary(nm, data: FederatedData, evaluator) -> dict[str, Any]:
  """Intra- and inter-cluster accuracy of clustered models ``nm`` (every row scored on every
  client's test data; see :func:`fedtree.algorithms.clustering.ops.cluster_accuracy`)."""
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
