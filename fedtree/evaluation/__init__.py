"""Evaluation and reports: every model an algorithm names, scored on every client's test data.

:func:`evaluate_models` scores each entry of ``algorithm.models(state)`` with the vectorized
evaluator of :mod:`fedtree.core.metrics` and summarizes it per client, per group and overall
(false accept/reject rates for keyword spotting, intra- and inter-cluster accuracy for
clustered models).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.data import FederatedData
from fedtree.core.metrics import (
  adjusted_rand_index,
  central_keys,
  cluster_accuracy,
  make_evaluator,
  summarize,
)
from fedtree.core.model import Model
from fedtree.core.sharding import to_host


def evaluate_models(
  algorithm: FederatedAlgorithm, state, model: Model, data: FederatedData, *,
  groups: np.ndarray | None = None, chunk_size: int | None = None, evaluator=None,
  positive_classes=None, splits: Mapping[str, Any] | None = None, top_k: int | None = None, central=None,
) -> dict[str, dict[str, Any]]:
  """Summaries of every model ``algorithm.models(state)`` names, on every client's test data
  (with ``positive_classes``, also keyword-spotting false-accept/reject rates; the evaluator
  must then be ``make_evaluator(..., confusion=True)``; with ``splits``, ``{metric: (x, y, n)}``
  further test splits of every client, each model's accuracy on them reported as ``metric``: a
  backdoor's :func:`fedtree.datasets.poison.backdoor_test_split` as ``attack_success_rate``; with
  ``top_k``, the evaluator's top-k counts as ``top{k}_accuracy``).

  ``central``: the ``(x, y, n)`` of a central test set cut into pseudo-clients
  (:func:`central_blocks`); every model that is one set of parameters for all clients (a global
  model) is also scored on it: ``central_accuracy``, ``central_loss`` (``central_perplexity``,
  ``central_top{k}_accuracy``), pooled over its examples as a benchmark scoring the server's model
  on the dataset's test split reports it. Data without any client test example get only these.

  A model set that carries its own model (:class:`~fedtree.core.algorithm.ScoredModels`: FedEM's
  mixtures, kNN-Per's memories) is scored with that model and its ``client_params``, by an
  evaluator compiled once per model (``chunk_size`` clients at a time); its clients' own inputs
  leave it out of the central test set.
  """
  evaluator = evaluator or make_evaluator(model, chunk_size, confusion=positive_classes is not None,
                                          top_k=top_k)
  perplexity = model.token_labels
  local = int(np.asarray(to_host(data.n_test)).sum()) > 0
  out = {}
  for name, nm in algorithm.models(state).items():
    moc = jnp.asarray(nm.model_of_client)
    own = getattr(nm, "model", None)
    score = set_scorer(nm, evaluator, chunk_size, positive_classes is not None, top_k)
    out[name] = {}
    if local:
      stats = score(data.x_test, data.y_test, data.n_test, moc)
      out[name] = summarize(stats, groups, positive_classes=positive_classes, perplexity=perplexity,
                            top_k=top_k)
    rows = np.unique(np.asarray(to_host(moc)))
    if central is not None and rows.size == 1 and own is None:
      x, y, n = central
      c = score(x, y, n, jnp.full((x.shape[0],), int(rows[0]), jnp.int32))
      pooled = summarize(c, prefix="central_", perplexity=perplexity, top_k=top_k)
      out[name].update({k: v for k, v in pooled.items() if k in central_keys(top_k)})
    if not local:
      continue
    for metric, split in (splits or {}).items():
      hit = score(*split, moc)
      out[name][metric] = summarize(hit, groups, top_k=top_k)["accuracy"]
    if getattr(nm, "cluster_of_client", None) is not None:
      out[name].update(cluster_summary(nm, data, evaluator, true_clusters=groups))
  return out


def set_scorer(nm, evaluator, chunk_size: int | None, confusion: bool, top_k: int | None):
  """``score(x, y, n, model_of_client) -> EvalStats`` (on the host) of the model set ``nm``: with the
  run's ``evaluator``, or with the set's own model and its clients' inputs
  (:class:`~fedtree.core.algorithm.ScoredModels`, :func:`own_evaluator`)."""
  own = getattr(nm, "model", None)
  if own is None:
    return lambda x, y, n, moc: to_host(evaluator(nm.params, x, y, n, moc))
  scorer = own_evaluator(own, chunk_size, confusion, top_k)
  return lambda x, y, n, moc: to_host(scorer(nm.params, x, y, n, moc, nm.client_params))


@functools.lru_cache(maxsize=32)
def own_evaluator(model: Model, chunk_size: int | None, confusion: bool, top_k: int | None = None):
  """The evaluator of a model set's own model (:func:`fedtree.core.metrics.make_evaluator`), made
  once per model: an algorithm builds that model once, so its evaluations compile once."""
  return make_evaluator(model, chunk_size, confusion=confusion, top_k=top_k)


def central_blocks(x: np.ndarray, y: np.ndarray, block: int = 500,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A central test set ``(x [N, ...], y [N, ...])`` as ``(x [K, block, ...], y [K, block, ...],
  n int32[K])``: ``K = ceil(N / block)`` pseudo-clients of ``block`` examples (the last padded), so
  that the evaluator scores it like clients' test data, one block at a time."""
  x, y = np.asarray(x), np.asarray(y)
  num = x.shape[0]
  if num == 0:
    raise ValueError("the central test set is empty")
  block = max(1, min(int(block), num))
  k = -(-num // block)
  pad = k * block - num
  xp = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
  yp = np.concatenate([y, np.zeros((pad,) + y.shape[1:], y.dtype)])
  n = np.full((k,), block, np.int32)
  n[-1] = block - pad
  return xp.reshape((k, block) + x.shape[1:]), yp.reshape((k, block) + y.shape[1:]), n


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
