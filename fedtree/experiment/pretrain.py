"""A base model that is really pretrained, offline, in the same command (issue 26 item 3).

``config.pretrain`` trains the config's language model centrally on text that ships with Python
(standard-library docstrings of ``packages``, :func:`fedtree.datasets.text.stdlib_corpus`),
encoded with the federated data's vocabulary, before any run; every run then starts from the
pretrained parameters (as from ``config.init_params``): full fine-tuning runs train them, runs
with ``adapters`` keep them as their frozen base. The federated data's packages (the groups
fine-tuned on) should be left out of ``packages``, so fine-tuning is on held-out groups.

Fields (``config.pretrain``): ``packages`` (stdlib packages), ``max_sentences`` (per module,
``None``: all), ``steps``, ``batch_size``, ``optimizer`` (an optax name, default ``"adam"``),
``learning_rate``, ``seed`` and ``save`` (a path: the pretrained parameters are written there by
:func:`fedtree.experiment.params.save_params`, so a later run can load them through
``init_params`` instead of pretraining again).

:func:`pretrain_context` also scores the pretrained base on every client's test data (the
"before fine-tuning" perplexity), reported as the run ``pretrained``, model ``base``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.core.local import stack
from fedtree.core.metrics import make_evaluator, summarize
from fedtree.core.model import Model, masked_loss
from fedtree.core.server import optimizer_by_name
from fedtree.experiment.fields import field

PRETRAIN_FIELDS = ("packages", "max_sentences", "steps", "batch_size", "optimizer", "learning_rate",
                   "seed", "save")


def train_central(model: Model, optimizer: optax.GradientTransformation, x: np.ndarray, y: np.ndarray,
                  *, params: Any, steps: int, batch_size: int, key: jax.Array) -> tuple[Any, np.ndarray]:
  """``steps`` minibatch steps of ``optimizer`` on the masked cross-entropy of ``model`` over the
  pooled examples ``x, y`` (label id 0 is padding), batches drawn uniformly with replacement;
  one jitted ``lax.scan``. Returns ``(params, losses [steps])``."""
  x, y = jnp.asarray(x), jnp.asarray(y)

  @jax.jit
  def run(params, key):
    def step(carry, k):
      p, opt = carry
      idx = jax.random.randint(k, (batch_size,), 0, x.shape[0])
      xb, yb = x[idx], y[idx]

      def loss_fn(p):
        return masked_loss(model, model.apply(p, xb, train=True, rng=k), yb, jnp.ones((batch_size,), bool))

      loss, grads = jax.value_and_grad(loss_fn)(p)
      updates, opt = optimizer.update(grads, opt, p)
      return (optax.apply_updates(p, updates), opt), loss

    (params, _), losses = jax.lax.scan(step, (params, optimizer.init(params)), jax.random.split(key, steps))
    return params, losses

  params, losses = run(params, key)
  return params, np.asarray(losses)


def pretraining_text(cfg: dict, data_cfg, vocab: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
  """``(x, y)`` int32 ``[N, seq_len]``: every docstring sentence of ``cfg["packages"]``, tokenized
  as the data is (``level``, ``lowercase``) and encoded with the data's vocabulary."""
  from fedtree.datasets import text

  corpus = text.stdlib_corpus(packages=tuple(cfg["packages"]), min_sentences=1, min_clients=1,
                              max_sentences=cfg.get("max_sentences", None))
  level = data_cfg.get("level", "word")
  lowercase = data_cfg.get("lowercase", True)
  tokens = [text.tokenize(s, level, lowercase) for client in corpus.sentences for s in client]
  return text.encode_sentences(tokens, text.Vocabulary(tuple(vocab), level),
                               int(data_cfg.seq_len))


class Pretraining(NamedTuple):
  """A ``config.pretrain`` checked and its data read (:func:`prepare_pretrain`), before anything is
  written; :func:`pretrain_context` trains on it."""

  x: np.ndarray                            # int32 [N, seq_len] the sentences' tokens
  y: np.ndarray                            # int32 [N, seq_len] the next tokens
  optimizer: optax.GradientTransformation
  steps: int
  batch_size: int


def prepare_pretrain(ctx) -> Pretraining:
  """Refuses a ``ctx.config.pretrain`` no run can use, and reads its text: the runner calls it
  before anything is written, so that every refusal (a field, a package, an optimizer) comes first.

  Raises:
    ValueError: an unknown field, ``config.init_params`` set as well, data without a vocabulary
      (not a text dataset), a non-positive ``steps`` / ``batch_size``, a package that is not in the
      standard library, an unknown optimizer or a bad learning rate.
  """
  from fedtree.experiment.registry import check_fields

  config = ctx.config
  cfg = dict(config.pretrain)
  check_fields("config.pretrain", list(cfg), PRETRAIN_FIELDS)
  if field(config, "init_params") is not None:
    raise ValueError(f"config.pretrain and config.init_params={config.init_params!r} are both set; "
                     "set one (a saved pretrained model is loaded through init_params)")
  if ctx.vocab is None:
    raise ValueError(f"config.pretrain needs a text dataset with a vocabulary; config.data.name="
                     f"{config.data.name!r} has none")
  steps, batch = int(cfg.get("steps", 200)), int(cfg.get("batch_size", 32))
  if steps < 1 or batch < 1:
    raise ValueError(f"config.pretrain steps={steps} and batch_size={batch} must be >= 1")
  try:
    optimizer = optimizer_by_name(cfg.get("optimizer", "adam"),
                                  learning_rate=float(cfg.get("learning_rate", 3e-3)))
  except ValueError as e:
    raise ValueError(f"config.pretrain: {e}") from e
  try:
    x, y = pretraining_text(cfg, config.data, ctx.vocab)
  except ValueError as e:
    raise ValueError(f"config.pretrain.packages: {e}") from e
  return Pretraining(x=x, y=y, optimizer=optimizer, steps=steps, batch_size=batch)


def pretrain_context(ctx, print_fn=print, prepared: Pretraining | None = None):
  """``(ctx with init_params = the pretrained model, {"base": summary})`` for ``ctx.config.pretrain``
  (``prepared``: what :func:`prepare_pretrain` read; default: read here).

  Raises:
    ValueError: as :func:`prepare_pretrain`.
  """
  config = ctx.config
  cfg = dict(config.pretrain)
  x, y, optimizer, steps, batch = prepared if prepared is not None else prepare_pretrain(ctx)
  key = jax.random.key(int(cfg.get("seed", config.seed)))
  params = ctx.model.init(jax.random.fold_in(key, 0))
  params, losses = train_central(ctx.model, optimizer, x, y, params=params, steps=steps, batch_size=batch,
                                 key=jax.random.fold_in(key, 1))
  head, tail = float(np.mean(losses[: max(1, steps // 10)])), float(np.mean(losses[-max(1, steps // 10):]))
  print_fn(f"pretrain: {len(x)} sentences of {len(cfg['packages'])} stdlib packages, {steps} steps of "
           f"{batch}: training loss {head:.3f} -> {tail:.3f} "
           f"(perplexity {np.exp(head):.1f} -> {np.exp(tail):.1f})")
  if cfg.get("save", None):
    from fedtree.experiment.params import save_params

    print_fn(f"pretrain: parameters saved to {save_params(cfg['save'], params)}")
  data = ctx.run_data
  stats = make_evaluator(ctx.model, field(config, "eval_chunk_size"))(
    stack(params, 1), data.x_test, data.y_test, data.n_test, jnp.zeros((data.num_clients,), jnp.int32))
  summary = summarize(jax.device_get(stats), ctx.groups, perplexity=True)
  print_fn(f"pretrain: the base's perplexity on the federated test data (before fine-tuning) "
           f"{summary['perplexity']:.2f}")
  return dataclasses.replace(ctx, init_params=params), {"base": summary}
