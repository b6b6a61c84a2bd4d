"""Evaluation and reports: every model an algorithm names, scored on every client's test data.

:func:`evaluate_models` scores each entry of ``algorithm.models(state)`` with the vectorized
evaluator of :mod:`fedtree.core.metrics` and summarizes it per client, per group and overall
(false accept/reject rates for keyword spotting, intra- and inter-cluster accuracy for
clustered models).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.data import FederatedData
from fedtree.core.metrics import adjusted_rand_index, cluster_accuracy, make_evaluator, summarize
from fedtree.core.model import Model
from fedtree.core.sharding import to_host


def evaluate_models(
  algorithm: FederatedAlgorithm, state, model: Model, data: FederatedData, *,
  groups: np.ndarray | None = None, chunk_size: int | None = None, evaluator=None,
  positive_classes=None, backdoor=None,
) -> dict[str, dict[str, Any]]:
  """Summaries of every model ``algorithm.models(state)`` names, on every client's test data
  (with ``positive_classes``, also keyword-spotting false-accept/reject rates; the evaluator
  must then be ``make_evaluator(..., confusion=True)``; with ``backdoor``, the ``(x, y, n)`` of
  :func:`fedtree.datasets.poison.backdoor_test_split`, also ``attack_success_rate``).

  A model set that carries its own model (:class:`~fedtree.core.algorithm.ScoredModels`: FedEM's
  mixtures, kNN-Per's memories) is scored with that model and its ``client_params``, by an
  evaluator compiled once per model (``chunk_size`` clients at a time)."""
  confusion = positive_classes is not None
  evaluator = evaluator or make_evaluator(model, chunk_size, confusion=confusion)
  out = {}
  for name, nm in algorithm.models(state).items():
    moc = jnp.asarray(nm.model_of_client)
    own = getattr(nm, "model", None)
    if own is None:
      def score(x, y, n, nm=nm, moc=moc):
        return to_host(evaluator(nm.params, x, y, n, moc))
    else:
      def score(x, y, n, nm=nm, moc=moc, own=own):
        return to_host(own_evaluator(own, chunk_size, confusion)(nm.params, x, y, n, moc, nm.client_params))
    stats = score(data.x_test, data.y_test, data.n_test)
    out[name] = summarize(stats, groups, positive_classes=positive_classes,
                          perplexity=bool(model.label_shape))
    if backdoor is not None:
      out[name]["attack_success_rate"] = summarize(score(*backdoor), groups)["accuracy"]
    if getattr(nm, "cluster_of_client", None) is not None:
      out[name].update(cluster_summary(nm, data, evaluator, true_clusters=groups))
  return out


@functools.lru_cache(maxsize=32)
def own_evaluator(model: Model, chunk_size: int | None, confusion: bool):
  """The evaluator of a model set's own model (:func:`fedtree.core.metrics.make_evaluator`), made
  once per model: an algorithm builds that model once, so its evaluations compile once."""
  return make_evaluator(model, chunk_size, confusion=confusion)


def cluster_summary(nm, data: FederatedData, evaluator, true_clusters=None) -> dict[str, Any]:
  """Intra- and inter-cluster accuracy of clustered models ``nm`` (a model set with
  ``cluster_of_client`` and ``chosen_by_data``, e.g. the clustered family's ``ClusterModels``;
  every row scored on every client's test data; see :func:`fedtree.core.metrics.cluster_accuracy`), and
  with ``true_clusters`` (``int[C]``, at least two distinct values: e.g. the flipped/rotated
  clients of paper 004's setups) the adjusted Rand index of the clustering against them."""
  num_models = jax.tree.leaves(nm.params)[0].shape[0]
  correct, count = [], []
  for k in range(num_models):
    s = to_host(evaluator(nm.params, data.x_test, data.y_test, data.n_test,
                          jnp.full((data.num_clients,), k, jnp.int32)))
    correct.append(s.correct)
    count.append(s.count)
  cluster_of_client, model_of_client = to_host((nm.cluster_of_client, nm.model_of_client))
  out = cluster_accuracy(np.stack(correct), np.stack(count), cluster_of_client, model_of_client,
                         chosen_by_data=nm.chosen_by_data)
  out["cluster_of_client"] = cluster_of_client
  if true_clusters is not None and np.unique(np.asarray(true_clusters)).size > 1:
    out["adjusted_rand_index"] = adjusted_rand_index(true_clusters, cluster_of_client)
  return out
