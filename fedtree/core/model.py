"""The :class:`Model` pair every algorithm trains, and the masked loss.

A :class:`Model` is ``init(key) -> params`` plus ``apply(params, x, *, train, rng) -> logits``:
pure functions, so a whole tier of clients is ``vmap(apply)`` over stacked params. Any flax
module becomes one with :func:`from_flax`; the architectures live in :mod:`fedtree.models`.

**Models with state.** A model may carry non-trainable collections beside its parameters (flax
``batch_stats`` of BatchNorm layers: :attr:`Model.state`). Its ``params`` pytree is then flax's
whole variables dict ``{"params": ..., "batch_stats": ...}``, stacked per client and per node like
any parameters (so statistics are aggregated, or kept personal, by the same rules as weights:
:mod:`fedtree.core.personal`). Training calls :func:`forward_train`, which runs the model in
training mode on the real rows of a batch (its mask: padding never enters a statistic) and
returns the updated collections; gradients never touch them (:func:`zero_state`); evaluation
(``apply(train=False)``) uses the statistics the model was trained with. A model without state
is unchanged (its ``params`` are the ``"params"`` collection alone).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

Params = Any


class Model(NamedTuple):
  """A pure model: ``init(key) -> params`` and ``apply(params, x, train=, rng=) -> logits``.

  ``input_dtype`` is the dtype of ``x`` (``"int32"`` for token ids) and ``label_shape`` the
  shape of one example's label: ``()`` for a classifier, ``(T,)`` for a language model whose
  label is the next token at every position (see :func:`token_mask`).

  ``state`` names the non-trainable collections the params carry (``("batch_stats",)`` for a
  BatchNorm model; ``()``: none, the params are the trainable parameters alone), and
  ``apply_train(params, x, *, rng, mask) -> (logits, updates)`` runs such a model in training
  mode on the rows of ``mask`` and returns ``{collection: new value}`` (see the module
  docstring; :func:`forward_train` is what training calls).

  ``multi_label``: every example carries a multi-hot ``label_shape=(K,)`` label (FLAIR's 17 coarse
  labels) and the ``K`` logits are independent binary scores: the loss is the sigmoid binary
  cross-entropy (:func:`masked_loss`), not a softmax over classes (:func:`as_multi_label`).
  """

  init: Callable[[jax.Array], Params]
  apply: Callable[..., jax.Array]
  num_classes: int
  input_dtype: str = "float32"
  label_shape: tuple[int, ...] = ()
  state: tuple[str, ...] = ()
  apply_train: Callable[..., tuple[jax.Array, dict]] | None = None
  multi_label: bool = False

  @property
  def token_labels(self) -> bool:
    """Whether a label is a sequence of next tokens (a language model): ``label_shape`` non-empty and
    not multi-hot."""
    return bool(self.label_shape) and not self.multi_label


def label_kind(model: Model) -> str:
  """What ``model``'s labels are, as a refusal names them: ``"one class per example"``, ``"token
  sequences (a sequence model)"`` or ``"multi-hot (a multi-label model)"``."""
  if model.multi_label:
    return "multi-hot (a multi-label model)"
  return "token sequences (a sequence model)" if model.label_shape else "one class per example"


def as_multi_label(model: Model) -> Model:
  """``model`` (a classifier of ``num_classes`` outputs, ``label_shape=()``) scoring multi-hot labels
  ``[num_classes]`` with the sigmoid binary cross-entropy.

  Raises:
    ValueError: a model whose labels are token sequences.
  """
  if model.label_shape not in ((), (model.num_classes,)):
    raise ValueError(f"a multi-label model needs a classifier (label_shape=()); this one has label_shape="
                     f"{tuple(model.label_shape)} (a sequence model)")
  return model._replace(multi_label=True, label_shape=(int(model.num_classes),))


def _takes_mask(module: nn.Module) -> bool:
  return "mask" in inspect.signature(type(module).__call__).parameters


def from_flax(module: nn.Module, example_shape: Sequence[int], num_classes: int) -> Model:
  """Wraps a flax module taking ``[B, *example_shape]`` into a :class:`Model`.

  A module whose variables hold collections beside ``"params"`` (``batch_stats``) becomes a model
  with state (:attr:`Model.state`): its ``__call__`` must take ``mask`` (``bool[B]``, the real rows
  of a padded batch) and pass it to every ``nn.BatchNorm`` (``BatchNorm(...)(x, mask=...)``), so
  that padding never enters a statistic.

  Raises:
    ValueError: a module with state whose ``__call__`` takes no ``mask``.
  """
  example_shape = tuple(int(s) for s in example_shape)
  example = jnp.zeros((1,) + example_shape, jnp.float32)
  shapes = jax.eval_shape(lambda k: module.init(k, example, train=False), jax.random.key(0))
  state = tuple(sorted(k for k in shapes if k != "params"))
  takes_mask = _takes_mask(module)

  def rngs(train, rng):
    return {"dropout": rng} if (train and rng is not None) else None

  if not state:
    def init(key):
      return module.init(key, example, train=False)["params"]

    def apply(params, x, *, train: bool = False, rng: jax.Array | None = None):
      return module.apply({"params": params}, x, train=train, rngs=rngs(train, rng))

    return Model(init=init, apply=apply, num_classes=int(num_classes))

  if not takes_mask:
    raise ValueError(
      f"{type(module).__name__} keeps state {list(state)} (e.g. BatchNorm statistics), so its __call__ must "
      f"take mask= (bool[B], the real rows of a padded batch) and pass it to every BatchNorm; otherwise "
      f"padding rows would enter the statistics")

  def init_state(key):
    return dict(module.init(key, example, train=False))

  def apply_state(params, x, *, train: bool = False, rng: jax.Array | None = None, mask=None):
    if not train:
      return module.apply(params, x, train=False)
    logits, _ = module.apply(params, x, train=True, mask=mask, rngs=rngs(train, rng), mutable=list(state))
    return logits

  def apply_train(params, x, *, rng: jax.Array | None = None, mask=None):
    logits, updates = module.apply(params, x, train=True, mask=mask, rngs=rngs(True, rng),
                                   mutable=list(state))
    return logits, dict(updates)

  return Model(init=init_state, apply=apply_state, num_classes=int(num_classes), state=state,
               apply_train=apply_train)


def forward_train(model: Model, params: Params, x: jax.Array, *, rng: jax.Array | None,
                  mask: jax.Array) -> tuple[jax.Array, Params]:
  """Logits of ``model`` in training mode and its params with the non-trainable collections
  updated from the rows of ``mask`` (a model without state: ``params`` unchanged)."""
  if not model.state:
    return model.apply(params, x, train=True, rng=rng), params
  assert model.apply_train is not None
  logits, updates = model.apply_train(params, x, rng=rng, mask=mask)
  return logits, {**params, **updates}


def zero_state(model: Model, grads: Params) -> Params:
  """``grads`` with the model's non-trainable collections zeroed (no gradient step moves a
  statistic; :func:`forward_train` sets them)."""
  if not model.state:
    return grads
  return {k: jax.tree.map(jnp.zeros_like, v) if k in model.state else v for k, v in grads.items()}


def take_state(model: Model, params: Params, updated: Params) -> Params:
  """``params`` with the non-trainable collections of ``updated`` (what :func:`forward_train`
  computed)."""
  if not model.state:
    return params
  return {k: updated[k] if k in model.state else v for k, v in params.items()}


def param_paths(params: Params) -> list[str]:
  """The ``"a/b/kernel"`` path of every leaf of ``params``, in ``jax.tree.leaves`` order (what
  path patterns, such as LoRA targets or personal parameters, are matched against)."""
  return [jax.tree_util.keystr(p, simple=True, separator="/")
          for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


def layer_order(model: Model) -> tuple[str, ...]:
  """The model's top-level layers (the keys of its trainable collection: ``Dense_0``,
  ``BatchNorm_0``, ``Conv_1``, ...) in the order ``model.init`` creates them, which for a flax
  module is the order its ``__call__`` first uses them: the forward order, the last one producing
  the logits. Read from an abstract trace of ``model.init`` (nothing is allocated), where the
  dictionaries still hold flax's insertion order (``jax.tree`` operations sort keys)."""
  seen: list[tuple[str, ...]] = []

  def init(key):
    params = model.init(key)
    trainable = params["params"] if model.state else params
    seen.append(tuple(trainable.keys()) if hasattr(trainable, "keys") else ())
    return params

  jax.eval_shape(init, jax.random.key(0))
  return seen[0]


PAD_ID = 0  # the padding token of sequence labels (fedtree.datasets.text reserves it)


def token_mask(labels: jax.Array, mask: jax.Array) -> jax.Array:
  """``mask`` broadcast to the shape of ``labels``.

  ``mask`` marks real examples (``[B]``). Labels with more axes than the mask are token
  sequences (``[B, T]``, a language model's next tokens): there a position counts only if its
  label is not :data:`PAD_ID`, so padded tokens of a short sentence are never trained on nor
  evaluated. Class labels (same shape as the mask) are returned unchanged: class 0 is a class.
  """
  if labels.ndim == mask.ndim:
    return mask
  mask = mask.reshape(mask.shape + (1,) * (labels.ndim - mask.ndim))
  return mask & (labels != PAD_ID)


def masked_cross_entropy(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy over the entries where ``mask`` is true (0 if none); for
  sequence labels the mean is over real tokens (:func:`token_mask`)."""
  logp = jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)))
  nll = -jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
  m = token_mask(labels, mask).astype(logp.dtype)
  return jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)


def masked_sigmoid_cross_entropy(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean over the examples where ``mask`` (``bool[B]``) is true (0 if none) of the mean over the ``K``
  labels of the sigmoid binary cross-entropy (:func:`optax.sigmoid_binary_cross_entropy`) of
  ``logits [B, K]`` against multi-hot ``labels [B, K]``: PyTorch's ``BCEWithLogitsLoss()``, which
  pfl-research trains FLAIR with."""
  dt = jnp.promote_types(logits.dtype, jnp.float32)
  bce = jnp.mean(optax.sigmoid_binary_cross_entropy(logits.astype(dt), labels.astype(dt)), axis=-1)
  m = mask.astype(dt)
  return jnp.sum(bce * m) / jnp.maximum(jnp.sum(m), 1.0)


def masked_loss(model: Model, logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  """The training loss of ``model``: :func:`masked_sigmoid_cross_entropy` for a multi-label model,
  else :func:`masked_cross_entropy`."""
  if model.multi_label:
    return masked_sigmoid_cross_entropy(logits, labels, mask)
  return masked_cross_entropy(logits, labels, mask)


def masked_kl(teacher: jax.Array, student: jax.Array, mask: jax.Array, temperature: float = 1.0) -> jax.Array:
  """Mean over the entries where ``mask`` is true (0 if none) of ``KL(softmax(teacher / T) ‖
  softmax(student / T))`` over the last axis of the logits (distillation's loss, before its ``T²``)."""
  dt = jnp.promote_types(student.dtype, jnp.float32)
  t = jax.nn.log_softmax(teacher.astype(dt) / temperature)
  s = jax.nn.log_softmax(student.astype(dt) / temperature)
  m = mask.astype(dt)
  return jnp.sum(jnp.sum(jnp.exp(t) * (t - s), axis=-1) * m) / jnp.maximum(jnp.sum(m), 1.0)


def independent_models(model, key: jax.Array, k: int) -> Any:
  """``k`` independently initialized models ``[k, ...]``, model ``j`` from ``fold_in(key, j)``: IFCA's
  random initialization of its cluster models, and FedEM's of its components."""
  return jax.vmap(lambda j: model.init(jax.random.fold_in(key, j)))(jnp.arange(k))
