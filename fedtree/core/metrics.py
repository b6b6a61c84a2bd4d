"""Scoring any model of the tree on any client's test data, vectorized like training.

:func:`evaluate` takes stacked models ``[N, ...]`` and the model each client should use
(``model_of_client[c]``: the root for a global model, the group for a group model, the
client itself for personal models) and returns per-client sums (loss, correct, count) as an
:class:`EvalStats`. Padding is masked out. :func:`summarize` turns the sums into per-client,
per-group and overall accuracy and loss on the host.

For a language model (``y: [M, T]`` next tokens), ``evaluate(..., sentences=True)`` (the
default of :func:`make_evaluator` for such a model) also sums each sentence's mean token NLL
and counts the sentences, so :func:`summarize` reports perplexity aggregated at two levels
(:func:`perplexities`): ``perplexity`` (token level) and ``sentence_perplexity``.

For keyword spotting (FedKWS-UI, paper 002), ``evaluate(..., confusion=True)`` also counts a
per-client confusion matrix (``EvalStats.confusion [C, K, K]``: true class x predicted
class) in the same pass, and ``summarize(..., positive_classes=)`` adds false-accept and
false-reject rates (:func:`keyword_rates`).

As the standard benchmarks score: ``ignore_labels`` leaves labels out of every sum (Reddi et
al. 2021's Stack Overflow next-word accuracy counts no OOV, BOS or EOS token, fedtree's ids 1-3;
padding, id 0, never counts), and ``top_k`` also counts the examples whose label is among the
``k`` highest logits (``EvalStats.topk_correct``; ``summarize(..., top_k=k)`` reports
``top{k}_accuracy``).

For a multi-label model (:attr:`fedtree.core.model.Model.multi_label`: multi-hot labels ``y: [M, K]``,
FLAIR) ``loss`` is the sigmoid binary cross-entropy averaged over labels, ``correct`` counts the labels
predicted right (score ``sigmoid(logit) >= 0.5``) as a fraction of the ``K`` per example, and
``EvalStats.label_scores`` (``[C, 2, B, K]``) counts every label's negative and positive examples per
score bucket, from which :func:`summarize` reports pfl-research's FLAIR metrics
(:func:`multi_label_metrics`): macro and micro averaged precision, precision and recall.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.core.model import Model, token_mask

PyTree = Any


class EvalStats(NamedTuple):
  """Per-client sums over the evaluated examples: ``[C]`` each. Mergeable by addition.

  ``confusion``: ``[C, K, K]`` counts of (true class, predicted class) per client, or ``None``
  (not requested). ``sentence_loss`` and ``sentences`` (language models, ``sentences=True``,
  else ``None``): the sum over the client's sentences of each sentence's mean token NLL, and
  the number of sentences (rows with at least one real token). ``topk_correct``: the examples
  (tokens) whose label is among the ``top_k`` highest logits, or ``None`` (not requested).
  ``label_scores``: a multi-label model's ``[C, 2, B, K]`` counts of the examples whose label ``k`` is
  negative (``[:, 0]``) or positive (``[:, 1]``) with score ``sigmoid(logit)`` in bucket ``b`` of
  ``[b / B, (b + 1) / B)`` (:data:`SCORE_BUCKETS`), else ``None``.
  """

  loss_sum: jax.Array
  correct: jax.Array
  count: jax.Array  # type: ignore[assignment]  # shadows tuple.count
  confusion: jax.Array | None = None
  sentence_loss: jax.Array | None = None
  sentences: jax.Array | None = None
  topk_correct: jax.Array | None = None
  label_scores: jax.Array | None = None


SCORE_BUCKETS = 200
"""Score buckets of a multi-label model's precision-recall curve (pfl-research's ``AveragedPrecision``
also cuts it at 200 thresholds)."""

MULTI_LABEL_METRICS = ("macro_ap", "micro_ap", "macro_precision", "micro_precision", "macro_recall",
                       "micro_recall")
"""What :func:`summarize` adds for a multi-label model (:func:`multi_label_metrics`)."""


def multi_label_sums(logits: jax.Array, y: jax.Array, mask: jax.Array) -> tuple[jax.Array, ...]:
  """``(loss sum, correct, count, label_scores [2, B, K])`` of multi-hot labels ``y [M, K]`` under
  ``logits [M, K]`` over the examples of ``mask`` (``bool[M]``): the loss and the right predictions
  (score >= 0.5) are means over the ``K`` labels of an example, ``count`` the examples, and
  ``label_scores`` counts the negative and positive labels per score bucket (:class:`EvalStats`)."""
  dt = logits.dtype
  k = logits.shape[-1]
  m = mask.astype(dt)
  truth = y.astype(dt)
  bce = jnp.mean(optax.sigmoid_binary_cross_entropy(logits, truth), axis=-1)
  right = jnp.mean(((logits >= 0) == (y > 0)).astype(dt), axis=-1)
  bucket = jnp.clip(jnp.floor(jax.nn.sigmoid(logits) * SCORE_BUCKETS), 0, SCORE_BUCKETS - 1).astype(jnp.int32)
  label = jnp.broadcast_to(jnp.arange(k), bucket.shape)
  scores = jnp.zeros((2, SCORE_BUCKETS, k), dt).at[(y > 0).astype(jnp.int32), bucket, label].add(
    jnp.broadcast_to(m[:, None], bucket.shape))
  return jnp.sum(bce * m), jnp.sum(right * m), jnp.sum(m), scores


def multi_label_metrics(label_scores, prefix: str = "") -> dict[str, float]:
  """pfl-research's FLAIR metrics from ``label_scores`` (``[..., 2, B, K]``, summed over the leading
  axes): per label ``k``, precision and recall at score >= 0.5 and the averaged precision (AP) of its
  precision-recall curve at the ``B`` thresholds ``t / B``, ``sum_t (R_t - R_{t+1}) P_t`` (equal to
  ``sklearn.metrics.average_precision_score`` on scores rounded down to a multiple of ``1 / B``);
  ``macro_*`` their mean over the labels, ``micro_*`` the same with every label's examples pooled.
  A 0 / 0 precision or recall (no predicted positive, no positive label) counts 0, as pfl-research's
  ``MacroWeighted`` and ``AveragedPrecision`` count it."""
  h = np.asarray(label_scores, np.float64)
  h = h.reshape((-1,) + h.shape[-3:]).sum(axis=0)                       # [2, B, K]
  above = np.cumsum(h[:, ::-1], axis=1)[:, ::-1]                          # [2, B, K]: score >= t / B
  half = h.shape[1] // 2

  def ratio(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
      return np.where(b > 0, a / np.where(b > 0, b, 1.0), 0.0)

  def ap(neg, pos):    # [B, ...] counts at score >= t / B
    precision, recall = ratio(pos, pos + neg), ratio(pos, pos[:1])
    drop = recall - np.concatenate([recall[1:], np.zeros_like(recall[:1])])
    return np.sum(drop * precision, axis=0)

  neg, pos = above[0], above[1]
  tp, fp, fn = pos[half], neg[half], pos[0] - pos[half]
  out = {"macro_ap": float(np.mean(ap(neg, pos))), "micro_ap": float(ap(neg.sum(-1), pos.sum(-1))),
         "macro_precision": float(np.mean(ratio(tp, tp + fp))),
         "micro_precision": float(ratio(tp.sum(), tp.sum() + fp.sum())),
         "macro_recall": float(np.mean(ratio(tp, tp + fn))),
         "micro_recall": float(ratio(tp.sum(), tp.sum() + fn.sum()))}
  return {f"{prefix}{k}": v for k, v in out.items()}


def central_keys(top_k: int | None = None) -> tuple[str, ...]:
  """The pooled summaries a central test set reports (``central_accuracy``, ``central_loss``, ...)."""
  return ("central_accuracy", "central_loss", "central_perplexity", f"central_top{top_k}_accuracy",
          *(f"central_{m}" for m in MULTI_LABEL_METRICS))


def client_sums(model: Model, params, x, y, n, *, confusion: bool = False, sentences: bool = False,
                ignore_labels: tuple[int, ...] = (), top_k: int | None = None):
  """``(loss sum, correct, count)`` of one model on one client's padded data ``x[:n]``, and
  with ``confusion`` its ``[K, K]`` (true, predicted) count matrix as a fourth entry.
  Examples (tokens) whose label is in ``ignore_labels`` are left out of every sum; with
  ``top_k`` the number of them whose label is among the ``top_k`` highest logits is the last
  entry.

  For a language model (``y: [M, T]`` next tokens) the sums run over real tokens
  (:func:`~fedtree.core.model.token_mask`): ``loss_sum`` is the total NLL, ``correct`` the
  correctly predicted next tokens and ``count`` the number of tokens, so
  ``exp(loss_sum / count)`` is the perplexity. With ``sentences`` (token labels only) two
  more entries follow: the sum over sentences (rows ``m < n`` with a real token) of the
  sentence's mean NLL ``sum_t nll[m, t] / n_tokens[m]``, and the number of such sentences.

  A multi-label model (``y: [M, K]`` multi-hot) gives :func:`multi_label_sums`.

  Raises:
    ValueError: ``sentences`` with class labels (``y: [M]``).
  """
  logits = model.apply(params, x, train=False)
  dt = jnp.promote_types(logits.dtype, jnp.float32)   # float64 under --config.dtype=float64
  logits = logits.astype(dt)
  if model.multi_label:
    return multi_label_sums(logits, y, jnp.arange(x.shape[0]) < n)
  mask = token_mask(y, jnp.arange(x.shape[0]) < n)
  for label in ignore_labels:
    mask = mask & (y != int(label))
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, y[..., None], axis=-1)[..., 0]
  pred = jnp.argmax(logits, -1)
  correct = (pred == y) & mask
  out: tuple[jax.Array, ...] = (
    jnp.sum(jnp.where(mask, nll, 0.0)),
    jnp.sum(correct.astype(dt)),
    jnp.sum(mask.astype(dt)),
  )
  if confusion:
    k = logits.shape[-1]
    true = jax.nn.one_hot(y, k, dtype=dt) * mask[..., None].astype(dt)
    out = out + (true.reshape(-1, k).T @ jax.nn.one_hot(pred, k, dtype=dt).reshape(-1, k),)
  if sentences:
    if y.ndim < 2:
      raise ValueError(f"sentences=True needs token labels [M, T]; got labels of shape {y.shape}")
    axes = tuple(range(1, y.ndim))
    tokens = jnp.sum(mask.astype(dt), axis=axes)   # [M]
    per_sentence = jnp.sum(jnp.where(mask, nll, 0.0), axis=axes) / jnp.maximum(tokens, 1.0)
    real = tokens > 0
    out = out + (jnp.sum(jnp.where(real, per_sentence, 0.0)), jnp.sum(real.astype(dt)))
  if top_k is not None:
    k = min(int(top_k), logits.shape[-1])
    # the label is in the top k when fewer than k logits beat it (ties counted in its favour)
    label_logit = jnp.take_along_axis(logits, y[..., None].astype(jnp.int32), axis=-1)
    in_top = jnp.sum(logits > label_logit, axis=-1) < k
    out = out + (jnp.sum((in_top & mask).astype(dt)),)
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
  sentences: bool = False,
  ignore_labels: tuple[int, ...] = (),
  top_k: int | None = None,
  client_params: PyTree = None,
) -> EvalStats:
  """Evaluates client ``c`` with ``params[model_of_client[c]]`` on ``x[c, :n[c]]``.

  Args:
    model: the model.
    params: stacked ``[N, ...]`` models.
    x, y, n: padded per-client data ``[C, M, ...]``, ``[C, M]``, ``[C]``.
    model_of_client: ``int32[C]``; ``None`` means ``N == C`` and client ``c`` uses row ``c``.
    chunk_size: clients evaluated at once (``lax.map`` batch); ``None``: all at once.
    confusion: also count each client's (true, predicted) class matrix.
    sentences: also sum the sentences' mean NLLs and count the sentences (token labels
      ``y: [C, M, T]`` only; see :func:`client_sums`).
    ignore_labels: labels left out of every sum (e.g. a language model's special tokens).
    top_k: also count the examples whose label is among the ``top_k`` highest logits.
    client_params: ``[C, ...]`` per-client inputs of ``model`` beside its row (a
      :class:`~fedtree.core.algorithm.ScoredModels`' ``client_params``: FedEM's mixture weights,
      kNN-Per's memory): client ``c`` is then scored with ``model.apply((params[m], client_params[c]),
      x)``. ``None``: ``model.apply(params[m], x)``.
  """
  if top_k is not None and int(top_k) < 1:
    raise ValueError(f"top_k={top_k} must be >= 1")
  check_multi_label(model, confusion=confusion, sentences=sentences, ignore_labels=ignore_labels, top_k=top_k)
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
    xc, yc, nc, m, own = args
    p = jax.tree.map(lambda a: a[m], params)
    if client_params is not None:
      p = (p, own)
    return client_sums(model, p, xc, yc, nc, confusion=confusion, sentences=sentences,
                       ignore_labels=tuple(ignore_labels), top_k=top_k)

  batch = num_clients if chunk_size is None else max(1, min(int(chunk_size), num_clients))
  own = () if client_params is None else client_params
  out = list(jax.lax.map(one, (x, y, n, model_of_client, own), batch_size=batch))
  if model.multi_label:
    return EvalStats(out[0], out[1], out[2], label_scores=out[3])
  topk = out.pop() if top_k is not None else None
  return EvalStats(out[0], out[1], out[2], confusion=out[3] if confusion else None,
                   sentence_loss=out[-2] if sentences else None,
                   sentences=out[-1] if sentences else None, topk_correct=topk)


def check_multi_label(model: Model, *, confusion: bool, sentences: bool, ignore_labels, top_k) -> None:
  """Refuses, for a multi-label model, the counts that need one class per example.

  Raises:
    ValueError: naming the option.
  """
  if not model.multi_label:
    return
  asked = {"confusion": bool(confusion), "sentences": bool(sentences),
           "ignore_labels": bool(tuple(ignore_labels)), "top_k": top_k is not None}
  bad = [k for k, v in asked.items() if v]
  if bad:
    raise ValueError(f"a multi-label model (multi-hot labels) has no single class per example, so no "
                     f"{', '.join(bad)}; leave them unset (its metrics: {MULTI_LABEL_METRICS})")


PERPLEXITY_LEVELS = ("token", "sentence")


def perplexities(stats: EvalStats, level: str = "token") -> tuple[float, np.ndarray]:
  """``(overall, per client [C])`` perplexity of language-model statistics, aggregated at
  ``level``:

  * ``"token"`` (default): ``exp(sum NLL / sum tokens)``, every token weighted alike (the
    usual corpus perplexity; per client over the client's tokens).
  * ``"sentence"``: ``exp(mean over sentences s of NLL_s / n_s)``, with ``NLL_s`` the summed
    NLL of sentence ``s`` and ``n_s`` its number of tokens (EOS included): the exponential of
    the sentence-averaged cross-entropy, i.e. the geometric mean of the per-sentence
    perplexities, every sentence weighted alike whatever its length.

  Paper 000 reports Table 3 as perplexity "aggregated at sentence level" and gives no
  formula. We read it as the token-level form with the average taken over sentences instead
  of tokens (the only change "aggregated at" names), keeping perplexity the exponential of a
  mean cross-entropy. The other reading, the arithmetic mean of per-sentence perplexities
  ``mean_s exp(NLL_s / n_s)``, is not used: it is always >= the geometric mean and is
  dominated by a few short, badly predicted sentences (one exponential per sentence).

  Raises:
    ValueError: unknown ``level``, or ``"sentence"`` on statistics without sentence sums
      (``evaluate(..., sentences=True)``).
  """
  if level not in PERPLEXITY_LEVELS:
    raise ValueError(f"perplexity level={level!r}; choose one of {PERPLEXITY_LEVELS}")
  if level == "token":
    loss, count = stats.loss_sum, stats.count
  elif stats.sentences is None or stats.sentence_loss is None:
    raise ValueError("sentence-level perplexity needs sentence sums: evaluate(..., sentences=True)")
  else:
    loss, count = stats.sentence_loss, stats.sentences
  loss_np, count_np = np.asarray(loss, np.float64), np.asarray(count, np.float64)
  with np.errstate(over="ignore", invalid="ignore"):
    overall = float(np.exp(loss_np.sum() / max(float(count_np.sum()), 1.0)))
    client = np.where(count_np > 0, np.exp(loss_np / np.maximum(count_np, 1.0)), np.nan)
  return overall, client


FAIRNESS_STATS = ("p10", "p50", "p90", "worst10_mean", "std", "gini")
"""The statistics of :func:`client_distribution`, besides ``metric`` and ``clients``."""


def client_distribution(values, *, metric: str = "accuracy", higher_is_better: bool = True
                        ) -> dict[str, Any]:
  """How a metric is spread across clients: the fairness of a model.

  Over the clients with a finite value (NaN: a client without test data): the 10th, 50th and
  90th percentiles (``np.percentile``, linear interpolation), ``worst10_mean`` the mean of the
  worst 10 % of clients (``ceil(0.1 * n)`` of them, at least one: the lowest accuracies, or the
  highest perplexities when ``higher_is_better`` is False), ``std`` the population standard
  deviation (``ddof=0``) and ``gini`` the Gini coefficient ``sum_ij |v_i - v_j| / (2 n^2 mean)``
  (0: every client alike; values must be >= 0; 0 when they are all 0).

  Args:
    values: ``float[C]`` per-client values (accuracy, perplexity, ...).
    metric: the name stored under ``"metric"``.
    higher_is_better: which end is the worst.

  Returns:
    ``{"metric", "clients" (the number counted), "p10", "p50", "p90", "worst10_mean", "std",
    "gini"}``; the statistics are NaN when no client has a value.

  Example:
    >>> d = client_distribution([0.5, 0.7, 0.9, 1.0])
    >>> round(d["p50"], 3), d["worst10_mean"], round(d["gini"], 4)
    (0.8, 0.5, 0.1371)
  """
  v = np.asarray(values, np.float64).reshape(-1)
  v = np.sort(v[np.isfinite(v)])
  out: dict[str, Any] = {"metric": metric, "clients": int(v.size)}
  if v.size == 0:
    return out | {k: float("nan") for k in FAIRNESS_STATS}
  if v[0] < 0:
    raise ValueError(f"client_distribution of {metric}: value {v[0]} < 0; the Gini coefficient needs "
                     "values >= 0")
  p10, p50, p90 = np.percentile(v, [10.0, 50.0, 90.0])
  k = max(1, int(np.ceil(0.1 * v.size)))
  worst = v[:k] if higher_is_better else v[-k:]
  n, total = v.size, v.sum()
  # sum_ij |v_i - v_j| = 2 sum_i (2i - n - 1) v_(i) over the sorted values, i = 1..n
  # (clipped at 0: equal values give -1e-16 by rounding)
  gini = max(0.0, float(np.sum((2 * np.arange(1, n + 1) - n - 1) * v) / (n * total))) if total > 0 else 0.0
  return out | {"p10": float(p10), "p50": float(p50), "p90": float(p90),
                "worst10_mean": float(worst.mean()), "std": float(v.std()), "gini": gini}


def summarize(stats: EvalStats, groups: np.ndarray | None = None, prefix: str = "",
              positive_classes=None, perplexity: bool = False, top_k: int | None = None) -> dict[str, Any]:
  """Host-side summary: overall (example-weighted) and mean-per-client accuracy and loss,
  per-client accuracy, and per-group accuracy/loss when ``groups[c]`` is given. With
  ``perplexity`` (language models: the sums are over tokens) also ``perplexity`` =
  ``exp(total NLL / total tokens)`` overall, per client and per group; ``accuracy`` is then
  next-token accuracy. When ``stats`` carry sentence sums (``evaluate(..., sentences=True)``)
  also ``sentence_perplexity`` overall, per client and per group (:func:`perplexities`,
  ``level="sentence"``). With
  ``top_k`` and ``stats.topk_correct``, also ``top{k}_accuracy`` (pooled) and
  ``client_mean_top{k}_accuracy``. With ``stats.label_scores`` (a multi-label model), also
  :func:`multi_label_metrics` (``macro_ap``, ...; ``accuracy`` is then the share of labels predicted
  right). With
  ``positive_classes`` (a ``bool[K]`` mask or class indices) and ``stats.confusion``, also
  the keyword-spotting rates of :func:`keyword_rates` over all clients. Always ``fairness``,
  the spread of per-client accuracy (perplexity for a language model) across clients
  (:func:`client_distribution`), and with ``groups`` the same per group (``group_fairness``,
  a list indexed by group)."""
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
  if stats.sentences is not None:
    out[f"{prefix}sentence_perplexity"], out[f"{prefix}client_sentence_perplexity"] = perplexities(
      stats, "sentence")
  if stats.label_scores is not None:
    out.update(multi_label_metrics(stats.label_scores, prefix))
  if stats.topk_correct is not None:
    if top_k is None:
      raise ValueError("stats carry top-k counts: pass summarize(..., top_k=k) to name them")
    topk = np.asarray(stats.topk_correct, np.float64)
    client_topk = np.where(has, topk / np.maximum(count, 1.0), np.nan)
    out[f"{prefix}top{int(top_k)}_accuracy"] = float(topk.sum() / total)
    out[f"{prefix}client_mean_top{int(top_k)}_accuracy"] = (float(np.nanmean(client_topk)) if has.any()
                                                            else float("nan"))
  spread, spread_name = ((out[f"{prefix}client_perplexity"], "perplexity") if perplexity
                         else (client_acc, "accuracy"))
  out[f"{prefix}fairness"] = client_distribution(spread, metric=spread_name,
                                                 higher_is_better=not perplexity)
  if groups is not None:
    groups = np.asarray(groups)
    g = int(groups.max()) + 1
    out[f"{prefix}group_fairness"] = [
      client_distribution(spread[groups == j], metric=spread_name, higher_is_better=not perplexity)
      for j in range(g)]
    gc = np.bincount(groups, weights=correct, minlength=g)
    gn = np.bincount(groups, weights=count, minlength=g)
    gl = np.bincount(groups, weights=loss, minlength=g)
    out[f"{prefix}group_accuracy"] = gc / np.maximum(gn, 1.0)
    out[f"{prefix}group_loss"] = gl / np.maximum(gn, 1.0)
    if perplexity:
      with np.errstate(over="ignore", invalid="ignore"):
        out[f"{prefix}group_perplexity"] = np.exp(out[f"{prefix}group_loss"])
    if stats.sentences is not None:
      gs = np.bincount(groups, weights=np.asarray(stats.sentence_loss, np.float64), minlength=g)
      gm = np.bincount(groups, weights=np.asarray(stats.sentences, np.float64), minlength=g)
      with np.errstate(over="ignore", invalid="ignore"):
        out[f"{prefix}group_sentence_perplexity"] = np.exp(gs / np.maximum(gm, 1.0))
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


def make_evaluator(model: Model, chunk_size: int | None = None, *, confusion: bool = False,
                   sentences: bool | None = None, ignore_labels: tuple[int, ...] = (),
                   top_k: int | None = None):
  """A jitted ``(params, x, y, n, model_of_client[, client_params]) -> EvalStats`` (with
  per-client confusion matrices when ``confusion``; with sentence sums when ``sentences``, by
  default for a model with token labels, :attr:`~fedtree.core.model.Model.token_labels`; without the labels
  ``ignore_labels``; with top-``k`` counts when ``top_k``; ``client_params``: see :func:`evaluate`)."""
  sentences = model.token_labels if sentences is None else sentences
  ignore_labels = tuple(int(v) for v in ignore_labels)
  if top_k is not None and int(top_k) < 1:
    raise ValueError(f"top_k={top_k} must be >= 1")
  check_multi_label(model, confusion=confusion, sentences=sentences, ignore_labels=ignore_labels, top_k=top_k)

  @jax.jit
  def run(params, x, y, n, moc, client_params=None) -> EvalStats:
    return evaluate(model, params, x, y, n, model_of_client=moc, chunk_size=chunk_size,
                    confusion=confusion, sentences=sentences, ignore_labels=ignore_labels, top_k=top_k,
                    client_params=client_params)

  return run


# ------------------------------------------------------------------------ clusters
def cluster_accuracy(
  correct: np.ndarray, count: np.ndarray, cluster_of_client: np.ndarray,
  model_of_client: np.ndarray | None = None, *, chosen_by_data: bool = False,
) -> dict[str, float]:
  """Intra- and inter-cluster accuracy (paper 004's metrics), example-weighted.

  Args:
    correct, count: ``[N, C]`` sums of cluster model ``k`` on client ``c``'s test data.
    cluster_of_client: ``int[C]`` cluster of every client.
    model_of_client: ``int[C]`` the model a device holding client ``c``'s test data uses,
      when it chooses by its data (MCFL).
    chosen_by_data: on a foreign client's data, a device of cluster ``k`` uses the model
      chosen from that data (``model_of_client[c]``) instead of its cluster's model ``k``.

  Returns:
    ``intra_cluster_accuracy`` (cluster model ``k`` on the test data of its members) and
    ``inter_cluster_accuracy`` (cluster model ``k`` on the test data of the clients of every
    *other* non-empty cluster, pooled over all ``k``; NaN with a single non-empty cluster),
    and ``num_clusters`` (non-empty ones).
  """
  correct, count = np.asarray(correct, np.float64), np.asarray(count, np.float64)
  cl = np.asarray(cluster_of_client, np.int64)
  num_models, c = correct.shape
  cols = np.arange(c)
  intra = correct[cl, cols].sum() / max(count[cl, cols].sum(), 1.0)
  nonempty = np.unique(cl)
  used = np.asarray(model_of_client, np.int64) if chosen_by_data else None
  inter_c, inter_n = 0.0, 0.0
  for k in nonempty:
    foreign = cols[cl != k]
    rows = used[foreign] if used is not None else np.full(foreign.shape, k)
    inter_c += correct[rows, foreign].sum()
    inter_n += count[rows, foreign].sum()
  inter = inter_c / inter_n if inter_n > 0 else float("nan")
  return {"intra_cluster_accuracy": float(intra), "inter_cluster_accuracy": float(inter),
          "num_clusters": int(nonempty.size)}


def adjusted_rand_index(labels_true, labels_pred) -> float:
  """Adjusted Rand index (Hubert & Arabie 1985) of two labelings of the same points.

  ``(Σ_ij C(n_ij,2) - E) / (½(Σ_i C(a_i,2) + Σ_j C(b_j,2)) - E)`` with ``n_ij`` the
  contingency table, ``a``/``b`` its row/column sums and ``E = Σ_i C(a_i,2) Σ_j C(b_j,2) /
  C(n,2)``: 1 for the same partition whatever the labels, about 0 for a random one. When
  both labelings put every point in one cluster, or every point alone, it is 1.
  """
  t, p = np.asarray(labels_true).ravel(), np.asarray(labels_pred).ravel()
  if t.shape != p.shape:
    raise ValueError(f"labels_true has {t.size} points but labels_pred has {p.size}")
  _, ti = np.unique(t, return_inverse=True)
  _, pi = np.unique(p, return_inverse=True)
  table = np.zeros((ti.max(initial=-1) + 1, pi.max(initial=-1) + 1), np.float64)
  np.add.at(table, (ti, pi), 1.0)

  def pairs(v):
    return float(np.sum(v * (v - 1) / 2.0))

  index, a, b = pairs(table), pairs(table.sum(1)), pairs(table.sum(0))
  n = pairs(np.asarray([t.size], np.float64))
  expected = a * b / n if n > 0 else 0.0
  top = (a + b) / 2.0
  if top == expected:
    return 1.0
  return float((index - expected) / (top - expected))
