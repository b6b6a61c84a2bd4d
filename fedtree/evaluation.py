"""Scoring any model of the tree on any client's test data, vectorized like training.

:func:`evaluate` takes stacked models ``[N, ...]`` and the model each client should use
(``model_of_client[c]``: the root for a global model, the group for a group model, the
client itself for personal models) and returns per-client sums (loss, correct, count) as an
:class:`EvalStats`. Padding is masked out. :func:`summarize` turns the sums into per-client,
per-group and overall accuracy and loss on the host.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.models import Model

PyTree = Any


class EvalStats(NamedTuple):
  """Per-client sums over the evaluated examples: ``[C]`` each. Mergeable by addition."""

  loss_sum: jax.Array
  correct: jax.Array
  count: jax.Array


def client_sums(model: Model, params, x, y, n):
  """``(loss sum, correct, count)`` of one model on one client's padded data ``x[:n]``."""
  logits = model.apply(params, x, train=False).astype(jnp.float32)
  mask = jnp.arange(x.shape[0]) < n
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, y[:, None], axis=-1)[:, 0]
  correct = (jnp.argmax(logits, -1) == y) & mask
  return (
    jnp.sum(jnp.where(mask, nll, 0.0)),
    jnp.sum(correct.astype(jnp.float32)),
    jnp.sum(mask.astype(jnp.float32)),
  )


def evaluate(
  model: Model,
  params: PyTree,
  x: jax.Array,
  y: jax.Array,
  n: jax.Array,
  *,
  model_of_client: jax.Array | None = None,
  chunk_size: int | None = None,
) -> EvalStats:
  """Evaluates client ``c`` with ``params[model_of_client[c]]`` on ``x[c, :n[c]]``.

  Args:
    model: the model.
    params: stacked ``[N, ...]`` models.
    x, y, n: padded per-client data ``[C, M, ...]``, ``[C, M]``, ``[C]``.
    model_of_client: ``int32[C]``; ``None`` means ``N == C`` and client ``c`` uses row ``c``.
    chunk_size: clients evaluated at once (``lax.map`` batch); ``None``: all at once.
  """
  num_clients = x.shape[0]
  if model_of_client is None:
    num_models = jax.tree.leaves(params)[0].shape[0]
    if num_models != num_clients:
      raise ValueError(
        f"{num_models} models for {num_clients} clients: pass model_of_client to say which "
        f"model scores which client"
      )
    model_of_client = jnp.arange(num_clients, dtype=jnp.int32)
  model_of_client = jnp.asarray(model_of_client, jnp.int32)

  def one(args):
    xc, yc, nc, m = args
    p = jax.tree.map(lambda a: a[m], params)
    return client_sums(model, p, xc, yc, nc)

  batch = num_clients if chunk_size is None else max(1, min(int(chunk_size), num_clients))
  loss, correct, count = jax.lax.map(one, (x, y, n, model_of_client), batch_size=batch)
  return EvalStats(loss_sum=loss, correct=correct, count=count)


def summarize(stats: EvalStats, groups: np.ndarray | None = None, prefix: str = "") -> dict[str, Any]:
  """Host-side summary: overall (example-weighted) and mean-per-client accuracy and loss,
  per-client accuracy, and per-group accuracy/loss when ``groups[c]`` is given."""
  loss = np.asarray(stats.loss_sum, np.float64)
  correct = np.asarray(stats.correct, np.float64)
  count = np.asarray(stats.count, np.float64)
  has = count > 0
  total = max(count.sum(), 1.0)
  client_acc = np.where(has, correct / np.maximum(count, 1.0), np.nan)
  out = {
    f"{prefix}accuracy": float(correct.sum() / total),
    f"{prefix}loss": float(loss.sum() / total),
    f"{prefix}client_mean_accuracy": float(np.nanmean(client_acc)) if has.any() else float("nan"),
    f"{prefix}client_accuracy": client_acc,
  }
  if groups is not None:
    groups = np.asarray(groups)
    g = int(groups.max()) + 1
    gc = np.bincount(groups, weights=correct, minlength=g)
    gn = np.bincount(groups, weights=count, minlength=g)
    gl = np.bincount(groups, weights=loss, minlength=g)
    out[f"{prefix}group_accuracy"] = gc / np.maximum(gn, 1.0)
    out[f"{prefix}group_loss"] = gl / np.maximum(gn, 1.0)
  return out
