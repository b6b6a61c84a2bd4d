"""Flax models by name (:func:`build_model`); any flax module works through
:func:`~fedtree.core.model.from_flax`.

* :mod:`fedtree.models.classifiers`: logistic regression, MLP, CNN.
* :mod:`fedtree.models.kws`: DS-CNN, MHAttRNN, ResNet-15 and KWT for keyword spotting (paper 002).
* :mod:`fedtree.models.lm`: LSTM (optionally character-aware) and causal Transformer language
  models (paper 000).
"""

from __future__ import annotations

from collections.abc import Sequence

from fedtree.core.model import Model, from_flax, masked_cross_entropy
from fedtree.models.classifiers import CNN, MLP, Conv, LogisticRegression, im2col_conv, max_pool
from fedtree.models.kws import (
  DSCNN,
  KWT,
  MHAttRNN,
  ResNet15,
  depthwise_conv,
  dilated_conv,
  same_padding,
  view_indices,
  with_views,
)
from fedtree.models.lm import LSTMLM, TransformerLM, build_lm, lm_model

MODELS = ("logreg", "mlp", "cnn", "dscnn", "kwt", "mhattrnn", "resnet15", "lstm_lm", "transformer_lm")


_MODULES = {"logreg": LogisticRegression, "mlp": MLP, "cnn": CNN, "dscnn": DSCNN, "kwt": KWT,
            "mhattrnn": MHAttRNN, "resnet15": ResNet15, "lstm_lm": LSTMLM, "transformer_lm": TransformerLM}


def model_fields(name: str) -> frozenset[str] | None:
  """The ``config.model`` fields (keyword arguments of :func:`build_model`) that model ``name``
  takes besides ``name``; ``None`` for an unknown name.

  Example:
    >>> sorted(model_fields("logreg")), sorted(model_fields("mlp"))
    (['views'], ['hidden', 'views'])
  """
  import dataclasses

  module = _MODULES.get(name)
  if module is None:
    return None
  internal = {"parent", "name", "num_classes", "vocab_size", "max_len"}
  fields = {f.name for f in dataclasses.fields(module) if f.init} - internal
  extra = {"vocab_size"} if name in ("lstm_lm", "transformer_lm") else set()
  extra |= {"char_len"} if name == "lstm_lm" else set()
  return frozenset(fields | extra | {"views"})


def build_model(name: str, *, example_shape: Sequence[int], num_classes: int, **kwargs) -> Model:
  """A model by name: ``logreg``, ``mlp`` (``hidden=``) or ``cnn`` (``features=``, ``dense=``,
  ``dropout=``, ``pool_every_conv=``) or ``dscnn`` (``width=``, ``blocks=``, ``first_kernel=``,
  ``first_stride=``, ``norm=``; :class:`DSCNN`) or ``kwt`` (``dim=``, ``depth=``, ``heads=``,
  ``mlp_dim=``, ``dropout=``; :class:`KWT`) or ``mhattrnn`` (``hidden=``, ``heads=``,
  ``layers=``, ``cell=``, ``conv_channels=``, ``norm=``; :class:`MHAttRNN`) or ``resnet15``
  (``width=``, ``blocks=``, ``norm=``, ``conv_impl=``; :class:`ResNet15`), or a language model ``lstm_lm`` /
  ``transformer_lm`` (:func:`fedtree.models.lm.build_lm`).

  ``views=V`` (any classifier): the inputs are ``[B, V, *example]``, ``V`` pre-drawn
  augmentations per example, and each training step reads one per example
  (:func:`fedtree.models.kws.with_views`); ``example_shape`` is then ``(V, *example)``."""
  views = kwargs.pop("views", None)
  if views is not None and int(views) > 1:
    if int(example_shape[0]) != int(views):
      raise ValueError(f"views={views} but the examples' shape {tuple(example_shape)} does not start with it")
    inner = build_model(name, example_shape=example_shape[1:], num_classes=num_classes, **kwargs)
    return with_views(inner, int(views))
  if name in ("lstm_lm", "transformer_lm"):
    return build_lm(name, example_shape=example_shape, num_classes=num_classes, **kwargs)
  if name == "logreg":
    module = LogisticRegression(num_classes=num_classes, **kwargs)
  elif name == "mlp":
    kwargs = {k: tuple(v) if k == "hidden" else v for k, v in kwargs.items()}
    module = MLP(num_classes=num_classes, **kwargs)
  elif name == "cnn":
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}
    module = CNN(num_classes=num_classes, **kwargs)
  elif name == "dscnn":
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}
    module = DSCNN(num_classes=num_classes, **kwargs)
  elif name == "kwt":
    module = KWT(num_classes=num_classes, **kwargs)
  elif name == "mhattrnn":
    module = MHAttRNN(num_classes=num_classes, **kwargs)
  elif name == "resnet15":
    module = ResNet15(num_classes=num_classes, **kwargs)
  else:
    raise ValueError(f"model name {name!r} is unknown; choose one of {MODELS}")
  return from_flax(module, example_shape, num_classes)


__all__ = [
  "model_fields",
  "CNN", "DSCNN", "KWT", "LSTMLM", "MLP", "MODELS", "Conv", "LogisticRegression", "MHAttRNN", "Model",
  "ResNet15", "TransformerLM", "build_lm", "build_model", "depthwise_conv", "dilated_conv", "from_flax",
  "im2col_conv", "lm_model", "masked_cross_entropy", "max_pool", "same_padding", "view_indices", "with_views",
]
