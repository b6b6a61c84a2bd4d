"""Scoring any model of the tree on any client's test data, vectorized like training.

:func:`evaluate` takes stacked models ``[N, ...]`` and the model each client should use
(``model_of_client[c]``: the root for a global model, the group for a group model, the
client itself for personal models) and returns per-client sums (loss, correct, count) as an
:class:`EvalStats`. Padding is masked out. :func:`summarize` turns the sums into per-client,
per-group and overall accuracy and loss on the host.

For keyword spotting (FedKWS-UI, paper 002), ``evaluate(..., confusion=True)`` also counts a
per-client confusion matrix (``EvalStats.confusion [C, K, K]``: true class x predicted
class) in the same pass, and ``summarize(..., positive_classes=)`` adds false-accept and
false-reject rates (:func:`keyword_rates`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.model import Model, token_mask

PyTree = Any


class EvalStats(NamedTuple):
  """Per-client sums over the evaluated examples: ``[C]`` each. Mergeable by addition.

  ``confusion``: ``[C, K, K]`` counts of (true class, predicted class) per client, or ``None``
  (not requested).
  """

  loss_sum: jax.Array
  correct: jax.Array
  count: jax.Array  # type: ignore[assignment]  # shadows tuple.count
  confusion: jax.Array | None = None


def client_sums(model: Model, params, x, y, n, *, confusion: bool = False):
  """``(loss sum, correct, count)`` of one model on one client's padded data ``x[:n]``, and
  with ``confusion`` its ``[K, K]`` (true, predicted) count matrix as a fourth entry.

  For a language model (``y: [M, T]`` next tokens) the sums run over real tokens
  (:func:`~fedtree.core.model.token_mask`): ``loss_sum`` is the total NLL, ``correct`` the
  correctly predicted next tokens and ``count`` the number of tokens, so
  ``exp(loss_sum / count)`` is the perplexity.
  """
  logits = model.apply(params, x, train=False).astype(jnp.float32)
  mask = token_mask(y, jnp.arange(x.shape[0]) < n)
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, y[..., None], axis=-1)[..., 0]
  pred = jnp.argmax(logits, -1)
  correct = (pred == y) & mask
  out: tuple[jax.Array, ...] = (
    jnp.sum(jnp.where(mask, nll, 0.0)),
    jnp.sum(correct.astype(jnp.float32)),
    jnp.sum(mask.astype(jnp.float32)),
  )
  if confusion:
    k = logits.shape[-1]
    true = jax.nn.one_hot(y, k, dtype=jnp.float32) * mask[..., None].astype(jnp.float32)
    out = out + (true.reshape(-1, k).T @ jax.nn.one_hot(pred, k, dtype=jnp.float32).reshape(-1, k),)
  return out


def evaluate(
  model: Model,
  params: PyTree,
  x: jax.Array,
  y: jax.Array,
  n: jax.Array,
  *,
  model_of_client: jax.Array | None = None,
  chunk_size: int | None = None,
  confusion: bool = False,
) -> EvalStats:
  """Evaluates client ``c`` with ``params[model_of_client[c]]`` on ``x[c, :n[c]]``.

  Args:
    model: the model.
    params: stacked ``[N, ...]`` models.
    x, y, n: padded per-client data ``[C, M, ...]``, ``[C, M]``, ``[C]``.
    model_of_client: ``int32[C]``; ``None`` means ``N == C`` and client ``c`` uses row ``c``.
    chunk_size: clients evaluated at once (``lax.map`` batch); ``None``: all at once.
    confusion: also count each client's (true, predicted) class matrix.
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
    return client_sums(model, p, xc, yc, nc, confusion=confusion)

  batch = num_clients if chunk_size is None else max(1, min(int(chunk_size), num_clients))
  return EvalStats(*jax.lax.map(one, (x, y, n, model_of_client), batch_size=batch))


def summarize(stats: EvalStats, groups: np.ndarray | None = None, prefix: str = "",
              positive_classes=None, perplexity: bool = False) -> dict[str, Any]:
  """Host-side summary: overall (example-weighted) and mean-per-client accuracy and loss,
  per-client accuracy, and per-group accuracy/loss when ``groups[c]`` is given. With
  ``perplexity`` (language models: the sums are over tokens) also ``perplexity`` =
  ``exp(total NLL / total tokens)`` overall, per client and per group; ``accuracy`` is then
  next-token accuracy. With
  ``positive_classes`` (a ``bool[K]`` mask or class indices) and ``stats.confusion``, also
  the keyword-spotting rates of :func:`keyword_rates` over all clients."""
  loss = np.asarray(stats.loss_sum, np.float64)
  correct = np.asarray(stats.correct, np.float64)
  count = np.asarray(stats.count, np.float64)
  has = count > 0
  total = max(count.sum(), 1.0)
  client_acc = np.where(has, correct / np.maximum(count, 1.0), np.nan)
  out: dict[str, Any] = {
    f"{prefix}accuracy": float(correct.sum() / total),
    f"{prefix}loss": float(loss.sum() / total),
    f"{prefix}client_mean_accuracy": float(np.nanmean(client_acc)) if has.any() else float("nan"),
    f"{prefix}client_accuracy": client_acc,
  }
  if perplexity:
    client_loss = np.where(has, loss / np.maximum(count, 1.0), np.nan)
    with np.errstate(over="ignore", invalid="ignore"):
      out[f"{prefix}perplexity"] = float(np.exp(loss.sum() / total))
      out[f"{prefix}client_perplexity"] = np.exp(client_loss)
  if groups is not None:
    groups = np.asarray(groups)
    g = int(groups.max()) + 1
    gc = np.bincount(groups, weights=correct, minlength=g)
    gn = np.bincount(groups, weights=count, minlength=g)
    gl = np.bincount(groups, weights=loss, minlength=g)
    out[f"{prefix}group_accuracy"] = gc / np.maximum(gn, 1.0)
    out[f"{prefix}group_loss"] = gl / np.maximum(gn, 1.0)
    if perplexity:
      with np.errstate(over="ignore", invalid="ignore"):
        out[f"{prefix}group_perplexity"] = np.exp(out[f"{prefix}group_loss"])
  if positive_classes is not None:
    if stats.confusion is None:
      raise ValueError("positive_classes needs stats with a confusion matrix: evaluate(..., confusion=True)")
    conf = np.asarray(stats.confusion, np.float64).sum(axis=0)
    out.update({f"{prefix}{k}": v for k, v in keyword_rates(conf, positive_classes).items()})
  return out


def positive_mask(positive_classes, num_classes: int) -> np.ndarray:
  """``bool[K]`` from a mask or a sequence of class indices (``ValueError`` if out of range)."""
  p = np.asarray(positive_classes)
  if p.dtype == bool:
    if p.shape != (num_classes,):
      raise ValueError(f"positive class mask has shape {p.shape}, need ({num_classes},)")
    return p
  p = p.astype(int).reshape(-1)
  bad = p[(p < 0) | (p >= num_classes)]
  if bad.size:
    raise ValueError(f"positive class index {int(bad[0])} is outside [0, {num_classes})")
  mask = np.zeros(num_classes, bool)
  mask[p] = True
  return mask


def keyword_split(class_names, negative_classes) -> np.ndarray:
  """``bool[K]`` positive (keyword) mask: every class not named in ``negative_classes``.

  Raises ``ValueError`` naming a negative class that is not among ``class_names``.
  """
  names = [str(c) for c in class_names]
  for c in negative_classes:
    if str(c) not in names:
      raise ValueError(f"negative class {c!r} is not a class name; choose among {names}")
  neg = {str(c) for c in negative_classes}
  return np.asarray([c not in neg for c in names])


def keyword_rates(confusion: np.ndarray, positive_classes) -> dict[str, float]:
  """False-accept and false-reject rates of keyword spotting from a ``[K, K]`` (true,
  predicted) count matrix; positive classes are the keywords, the others negative.

  As FedKWS-UI (paper 002) reports them, per keyword and averaged over the keywords:
  ``false_accept_rate`` = mean over keywords ``k`` of the fraction of negative examples
  predicted as ``k``; ``false_reject_rate`` = mean over keywords ``k`` of the fraction of
  ``k``'s examples predicted as a negative class. Also the pooled (binary keyword vs. not)
  ``binary_false_accept_rate`` (negatives predicted as any keyword) and
  ``binary_false_reject_rate`` (keywords predicted as any negative class). NaN where a
  denominator is 0.
  """
  conf = np.asarray(confusion, np.float64)
  pos = positive_mask(positive_classes, conf.shape[0])
  neg = ~pos
  n_neg = conf[neg].sum()
  per_true = conf.sum(axis=1)
  with np.errstate(divide="ignore", invalid="ignore"):
    fa_k = conf[neg][:, pos].sum(axis=0) / n_neg                         # [P]
    fr_k = conf[pos][:, neg].sum(axis=1) / per_true[pos]                 # [P]
    has = per_true[pos] > 0
    return {
      "false_accept_rate": float(np.mean(fa_k)) if n_neg > 0 and pos.any() else float("nan"),
      "false_reject_rate": float(np.mean(fr_k[has])) if has.any() else float("nan"),
      "binary_false_accept_rate": float(conf[neg][:, pos].sum() / n_neg) if n_neg > 0 else float("nan"),
      "binary_false_reject_rate": (float(conf[pos][:, neg].sum() / per_true[pos].sum())
                                   if per_true[pos].sum() > 0 else float("nan")),
    }


def make_evaluator(model: Model, chunk_size: int | None = None, *, confusion: bool = False):
  """A jitted ``(params, x, y, n, model_of_client) -> EvalStats`` (with per-client confusion
  matrices when ``confusion``)."""

  @jax.jit
  def run(params, x, y, n, moc) -> EvalStats:
    return evaluate(model, params, x, y, n, model_of_client=moc, chunk_size=chunk_size,
                    confusion=confusion)

  return run
