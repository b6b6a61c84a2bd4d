"""Language-model benchmarks beside perplexity: multiple choice by log-likelihood (MMLU-style) and
short greedy generation scored by exact match.

Each function takes ``forward(params, tokens int32[B, T]) -> logits [B, T, V]`` (a jitted model, or
adapters applied on their frozen base, :class:`fedtree.experiment.capability.Wrapping`'s ``forward``)
and a tokenized task (:class:`fedtree.datasets.instructions.ChoiceTask`,
:class:`~fedtree.datasets.instructions.GenerationTask`); nothing here reads a file.

References:
  Hendrycks et al. 2021, "Measuring massive multitask language understanding" (MMLU).
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Forward = Callable[[Any, jax.Array], jax.Array]


def sequence_logprob(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """``[B]``: the sum over positions of ``log p(labels[t] | ...)`` where ``labels[t] != 0`` (a
  continuation's log-likelihood)."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
  picked = jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return jnp.sum(jnp.where(labels != 0, picked, 0.0), axis=-1)


def choice_scores(
  forward: Forward, params, tokens: np.ndarray, labels: np.ndarray, *, batch_size: int = 16
) -> np.ndarray:
  """``float32[N * K]`` the log-likelihood of every (question, choice) sequence, in batches of
  ``batch_size`` sequences (the last one padded)."""
  score = _scorer(forward)
  n = len(tokens)
  out = []
  for i in range(0, n, batch_size):
    x, y = tokens[i : i + batch_size], labels[i : i + batch_size]
    pad = batch_size - len(x)
    if pad:
      x = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
      y = np.concatenate([y, np.zeros((pad,) + y.shape[1:], y.dtype)])
    out.append(np.asarray(score(params, jnp.asarray(x), jnp.asarray(y)))[: batch_size - pad])
  return np.concatenate(out)


def choice_accuracy(forward: Forward, params, task, *, batch_size: int = 16) -> dict[str, float]:
  """``{"accuracy", "count"}`` of a multiple-choice task: the fraction of questions whose choice of
  highest log-likelihood is the answer."""
  scores = choice_scores(forward, params, task.tokens, task.labels, batch_size=batch_size)
  picked = np.argmax(scores.reshape(-1, task.num_choices), axis=1)
  return {"accuracy": float(np.mean(picked == task.answer)), "count": int(len(task.answer))}


def greedy_generate(
  forward: Forward, params, prompts: np.ndarray, lengths: np.ndarray, *, max_new_tokens: int, eos: int
) -> np.ndarray:
  """``int32[N, max_new_tokens]``: every right-padded prompt continued greedily, one token a step
  written after its own last token (a full forward per step over the fixed ``[N, T]`` buffer: no
  cache, one compiled program); after ``eos`` a row writes ``eos`` again.

  Raises:
    ValueError: a prompt that leaves less than ``max_new_tokens`` free positions.
  """
  n, t = prompts.shape
  if int(np.max(lengths)) + max_new_tokens > t:
    raise ValueError(
      f"prompts of up to {int(np.max(lengths))} tokens leave no room for {max_new_tokens} new "
      f"tokens in {t} positions"
    )

  run = _generator(forward, n, int(max_new_tokens), int(eos))
  return np.asarray(run(params, jnp.asarray(prompts), jnp.asarray(lengths)))


@functools.lru_cache(maxsize=64)
def _generator(forward: Forward, n: int, max_new_tokens: int, eos: int):
  @jax.jit
  def run(p, buf, length):
    rows = jnp.arange(n)

    def step(s, carry):
      buf, done, out = carry
      logits = forward(p, buf)
      nxt = jnp.argmax(logits[rows, length + s - 1], axis=-1).astype(jnp.int32)
      nxt = jnp.where(done, eos, nxt)
      buf = buf.at[rows, length + s].set(nxt)
      return buf, done | (nxt == eos), out.at[:, s].set(nxt)

    init = (buf, jnp.zeros((n,), bool), jnp.zeros((n, max_new_tokens), jnp.int32))
    return jax.lax.fori_loop(0, max_new_tokens, step, init)[2]

  return run


def normalize(text: str) -> str:
  """Lower case, punctuation and articles removed, whitespace collapsed (SQuAD's answer
  normalization)."""
  text = text.lower()
  text = "".join(ch for ch in text if ch not in set(string.punctuation))
  text = re.sub(r"\b(a|an|the)\b", " ", text)
  return " ".join(text.split())


def exact_match(predictions: Sequence[str], references: Sequence[str]) -> float:
  """The fraction of predictions equal to their reference after :func:`normalize`."""
  if len(predictions) != len(references):
    raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
  if not references:
    return float("nan")
  return float(np.mean([normalize(p) == normalize(r) for p, r in zip(predictions, references, strict=True)]))


def decode(tokenizer, generated: np.ndarray, eos: int) -> list[str]:
  """Every row of ``generated`` up to its first ``eos``, as text."""
  out = []
  for row in np.asarray(generated):
    ids = row.tolist()
    if eos in ids:
      ids = ids[: ids.index(eos)]
    out.append(tokenizer.decode(ids, skip_special_tokens=True))
  return out


def generation_exact_match(forward: Forward, params, task, tokenizer) -> dict[str, Any]:
  """``{"exact_match", "count"}`` of a generation task (greedy, :func:`exact_match`)."""
  generated = greedy_generate(
    forward, params, task.prompts, task.lengths, max_new_tokens=task.max_new_tokens, eos=task.eos
  )
  predictions = decode(tokenizer, generated, task.eos)
  return {"exact_match": exact_match(predictions, task.references), "count": len(predictions)}


# ------------------------------------------------------------------------ a run's models on its tasks
@functools.lru_cache(maxsize=64)
def _scorer(forward: Forward):
  return jax.jit(lambda p, x, y: sequence_logprob(forward(p, x), y))


def score_tasks(
  models: Mapping[str, Any],
  bind: Callable[[Any], Any],
  forward: Forward,
  tasks: Mapping[str, Any],
  *,
  batch_size: int = 16,
) -> dict[str, dict[str, float]]:
  """``{model set: {"<task>_accuracy" | "<task>_exact_match": score}}`` of every model set of one row
  (the global model; a set of one model per node or client is left out: a benchmark per client is
  a benchmark times the clients) on every task.

  Args:
    models: ``algorithm.models(state)``.
    bind: ``bind(row params) -> what forward takes`` (adapters: with their base).
    forward: ``forward(bound, tokens) -> logits``.
    tasks: ``{name: (task, tokenizer)}``: a :class:`~fedtree.datasets.instructions.ChoiceTask`, or a
      :class:`~fedtree.datasets.instructions.GenerationTask` and the tokenizer that decodes it.
  """
  out: dict[str, dict[str, float]] = {}
  for name, node in models.items():
    leaves = jax.tree.leaves(getattr(node, "params", None))
    if not leaves or np.shape(leaves[0])[0] != 1:
      continue
    params = bind(jax.tree.map(lambda a: a[0], node.params))
    scores: dict[str, float] = {}
    for task_name, (task, tokenizer) in tasks.items():
      if hasattr(task, "answer"):
        scores[f"{task_name}_accuracy"] = choice_accuracy(forward, params, task, batch_size=batch_size)[
          "accuracy"
        ]
      else:
        scores[f"{task_name}_exact_match"] = generation_exact_match(forward, params, task, tokenizer)[
          "exact_match"
        ]
    out[name] = scores
  return out
