"""Flax models by name (:func:`build_model`); any flax module works through
:func:`~fedtree.core.model.from_flax`.

* :mod:`fedtree.models.classifiers`: logistic regression, MLP, CNN.
* :mod:`fedtree.models.kws`: DS-CNN, MHAttRNN, ResNet-15 and KWT for keyword spotting (paper 002).
* :mod:`fedtree.models.lm`: LSTM (optionally character-aware) and causal Transformer language
  models (paper 000), and the standard tasks' LSTMs (``shakespeare_lstm``, ``stackoverflow_lstm``).
* :mod:`fedtree.models.decoder` and :mod:`fedtree.models.pretrained`: a decoder-only Transformer
  holding Hugging Face checkpoints of the Llama family and GPT-2 (:func:`load_pretrained`;
  ``build_model("pretrained", checkpoint=DIR)``, ``--config.model.checkpoint=DIR``).
* :mod:`fedtree.models.vision`: the standard benchmarks' image models (McMahan's CNN, LeNet-5,
  FLGo's CIFAR CNN, ResNet-18 with GroupNorm or BatchNorm, Reddi et al.'s ResNet-18, VGG-11).

:data:`STANDARD_MODELS` names the models of the standard federated tasks (docs/standard-tasks.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from fedtree.core.model import Model, from_flax, masked_cross_entropy
from fedtree.models.classifiers import CNN, MLP, Conv, LogisticRegression, im2col_conv, max_pool
from fedtree.models.decoder import Decoder, DecoderConfig, decoder_model
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
from fedtree.models.lm import LSTMLM, NAMED_LMS, TransformerLM, build_lm, lm_model
from fedtree.models.pretrained import Pretrained, load_pretrained, load_tokenizer, pretrained_model
from fedtree.models.vision import VGG11, CifarCNN, FedAvgCNN, LeNet5, ResNet18, ResNet18AFO, image_shape

STANDARD_MODELS = ("fedavg_cnn", "leaf_cnn", "emnist_cnn", "lenet5", "flgo_cnn", "resnet18", "resnet18_afo",
                   "vgg11") + tuple(NAMED_LMS)
"""The models of the standard federated tasks, each as its paper or reference code lists it."""
MODELS = ("logreg", "mlp", "cnn", "dscnn", "kwt", "mhattrnn", "resnet15", "lstm_lm",
          "transformer_lm", "pretrained") + STANDARD_MODELS
PRETRAINED_FIELDS = frozenset({"checkpoint", "dtype", "remat"})
"""``config.model`` fields of ``name="pretrained"``: the checkpoint directory, the dtype its
weights are loaded in (:data:`fedtree.models.pretrained.DTYPES`) and layer rematerialization."""

_IMAGE_MODELS = {
  # name: (module, fixed fields, smallest side, largest side)
  "fedavg_cnn": (FedAvgCNN, {}, 1, None),
  "leaf_cnn": (FedAvgCNN, {"dense": 2048}, 1, None),
  "emnist_cnn": (CNN, {}, 6, None),
  "lenet5": (LeNet5, {}, 1, 32),
  "flgo_cnn": (CifarCNN, {}, 16, None),
  "resnet18": (ResNet18, {}, 1, None),
  "resnet18_afo": (ResNet18AFO, {}, 1, None),
  "vgg11": (VGG11, {}, 32, 63),
}

def _standard_image_model(name: str, example_shape: Sequence[int], num_classes: int, **kwargs) -> Model:
  cls, fixed, low, high = _IMAGE_MODELS[name]
  image_shape(name, example_shape, min_size=low, max_size=high)
  kwargs = {**fixed, **{k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}}
  return from_flax(cls(num_classes=num_classes, **kwargs), example_shape, num_classes)


_MODULES = {"logreg": LogisticRegression, "mlp": MLP, "cnn": CNN, "dscnn": DSCNN, "kwt": KWT,
            "mhattrnn": MHAttRNN, "resnet15": ResNet15, "lstm_lm": LSTMLM, "transformer_lm": TransformerLM}


def model_fields(name: str) -> frozenset[str] | None:
  """The ``config.model`` fields (keyword arguments of :func:`build_model`) that model ``name``
  takes besides ``name``; ``None`` for an unknown name.

  Example:
    >>> sorted(model_fields("logreg")), sorted(model_fields("mlp"))
    (['views'], ['hidden', 'norm', 'running_var', 'views'])
  """
  import dataclasses

  if name == "pretrained":
    return PRETRAINED_FIELDS
  module = _MODULES.get(name)
  if name in _IMAGE_MODELS:
    module = _IMAGE_MODELS[name][0]
  elif name in NAMED_LMS:
    module = LSTMLM
  if module is None:
    return None
  internal = {"parent", "name", "num_classes", "vocab_size", "max_len"}
  fields = {f.name for f in dataclasses.fields(module) if f.init} - internal
  extra = {"vocab_size"} if name in ("lstm_lm", "transformer_lm") or name in NAMED_LMS else set()
  extra |= {"char_len"} if name == "lstm_lm" or name in NAMED_LMS else set()
  return frozenset(fields | extra | {"views"})


def _pretrained(example_shape: Sequence[int], num_classes: int, *, checkpoint: str | None = None,
                dtype: str = "float32", remat: bool = False) -> Model:
  """The decoder of a Hugging Face checkpoint (its ``config.json``; the weights are the context's
  initial parameters, :func:`load_pretrained`) over sentences of ``example_shape = (T,)`` tokens."""
  from fedtree.models.pretrained import DTYPES

  if not checkpoint:
    raise ValueError("model 'pretrained' needs checkpoint=DIR (--config.model.checkpoint=DIR: a folder "
                     "written by save_pretrained, with config.json and *.safetensors)")
  if dtype not in DTYPES:
    raise ValueError(f"model 'pretrained' dtype={dtype!r}; choose one of {DTYPES}")
  example_shape = tuple(int(s) for s in example_shape)
  if len(example_shape) != 1:
    raise ValueError(f"model 'pretrained' takes sentences of T token ids, example_shape=(T,); the data's "
                     f"examples have shape {example_shape}")
  model, config = pretrained_model(checkpoint, seq_len=example_shape[0], remat=remat)
  if config.vocab_size != int(num_classes):
    raise ValueError(f"model 'pretrained' vocabulary of {config.vocab_size} tokens but the data has "
                     f"{num_classes} classes; tokenize the data with the checkpoint's tokenizer "
                     f"(num_classes = its vocab_size)")
  return model


def build_model(name: str, *, example_shape: Sequence[int], num_classes: int, **kwargs) -> Model:
  """A model by name: ``logreg``, ``mlp`` (``hidden=``) or ``cnn`` (``features=``, ``dense=``,
  ``dropout=``, ``pool_every_conv=``) or ``dscnn`` (``width=``, ``blocks=``, ``first_kernel=``,
  ``first_stride=``, ``norm=``; :class:`DSCNN`) or ``kwt`` (``dim=``, ``depth=``, ``heads=``,
  ``mlp_dim=``, ``dropout=``; :class:`KWT`) or ``mhattrnn`` (``hidden=``, ``heads=``,
  ``layers=``, ``cell=``, ``conv_channels=``, ``norm=``; :class:`MHAttRNN`) or ``resnet15``
  (``width=``, ``blocks=``, ``norm=``, ``conv_impl=``; :class:`ResNet15`), or a language model ``lstm_lm`` /
  ``transformer_lm`` (:func:`fedtree.models.lm.build_lm`), or ``pretrained`` (``checkpoint=DIR``,
  ``dtype=``, ``remat=``: a Hugging Face checkpoint's decoder, :func:`load_pretrained`).

  ``views=V`` (any classifier): the inputs are ``[B, V, *example]``, ``V`` pre-drawn
  augmentations per example, and each training step reads one per example
  (:func:`fedtree.models.kws.with_views`); ``example_shape`` is then ``(V, *example)``."""
  views = kwargs.pop("views", None)
  if views is not None and int(views) > 1:
    if int(example_shape[0]) != int(views):
      raise ValueError(f"views={views} but the examples' shape {tuple(example_shape)} does not start with it")
    inner = build_model(name, example_shape=example_shape[1:], num_classes=num_classes, **kwargs)
    return with_views(inner, int(views))
  if name in ("lstm_lm", "transformer_lm") or name in NAMED_LMS:
    return build_lm(name, example_shape=example_shape, num_classes=num_classes, **kwargs)
  if name == "pretrained":
    return _pretrained(example_shape, num_classes, **kwargs)
  if name in _IMAGE_MODELS:
    return _standard_image_model(name, example_shape, num_classes, **kwargs)
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
  "CNN", "CifarCNN", "Conv", "DSCNN", "Decoder", "DecoderConfig", "FedAvgCNN", "KWT", "LSTMLM", "LeNet5",
  "LogisticRegression", "MHAttRNN", "MLP", "MODELS", "Model", "NAMED_LMS", "Pretrained", "ResNet15",
  "ResNet18", "ResNet18AFO", "STANDARD_MODELS", "TransformerLM", "VGG11", "build_lm", "build_model",
  "decoder_model", "depthwise_conv", "dilated_conv", "from_flax", "im2col_conv", "image_shape", "lm_model",
  "load_pretrained", "load_tokenizer", "masked_cross_entropy", "max_pool", "model_fields",
  "pretrained_model", "same_padding", "view_indices", "with_views",
]
