"""The image classifiers of the standard federated benchmarks, each as its paper or reference code
lists its layers (cited per class, with the parameter count that ``tests/test_standard_models.py``
checks against a count made by hand from that list).

* :class:`FedAvgCNN`: McMahan et al. 2017's CNN (``fedavg_cnn``; LEAF's FEMNIST CNN is the same
  with a 2048-unit dense layer, ``leaf_cnn``);
* :class:`LeNet5`: LeCun et al. 1998's LeNet-5 in its usual modern form (``lenet5``);
* :class:`CifarCNN`: FLGo's CIFAR-10 CNN (``flgo_cnn``);
* :class:`ResNet18`: ResNet-18 for 32x32 inputs with GroupNorm or BatchNorm (``resnet18``);
* :class:`ResNet18AFO`: the pre-activation, GroupNorm ResNet-18 of Reddi et al. 2021's CIFAR-100
  task, as google-research/federated builds it (``resnet18_afo``);
* :class:`VGG11`: VGG-11 (configuration "A") as FedNova (Wang et al. 2020) runs it on CIFAR-10
  (``vgg11``).

The EMNIST CNN of Reddi et al. 2021 is :class:`fedtree.models.classifiers.CNN` with its defaults
(``emnist_cnn``). Convolutions go through :class:`~fedtree.models.classifiers.Conv` (its ``impl``
choice, ``conv_impl=`` here), so every model vmaps over a cohort like the others; "SAME" padding is
an explicit pad before a VALID convolution, as Keras (:func:`pad_same`) or PyTorch
(:func:`pad_symmetric`) places it. :func:`image_shape` refuses, by the model's name, inputs a model
cannot take.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedtree.models.classifiers import Conv, UnbiasedBatchNorm, check_running_var, max_pool


def image_shape(model: str, example_shape: Sequence[int], *, min_size: int = 1,
                max_size: int | None = None) -> tuple[int, int, int]:
  """``(H, W, C)`` of images ``[H, W]`` or ``[H, W, C]`` that ``model`` can take.

  Raises:
    ValueError: naming ``model`` and the shape, when the examples are not images or their side is
      outside ``[min_size, max_size]``.
  """
  shape = tuple(int(s) for s in example_shape)
  if len(shape) == 2:
    shape = shape + (1,)
  if len(shape) != 3:
    raise ValueError(f"model {model!r} takes images [H, W] or [H, W, C], but the data's examples have "
                     f"shape {shape}; choose a model for this data (token sequences: 'shakespeare_lstm', "
                     "'stackoverflow_lstm', 'lstm_lm'; vectors: 'mlp', 'logreg')")
  h, w, _ = shape
  if min(h, w) < min_size or (max_size is not None and max(h, w) > max_size):
    bound = f"between {min_size} and {max_size}" if max_size is not None else f"at least {min_size}"
    raise ValueError(f"model {model!r} takes images whose sides are {bound} pixels; the data's examples "
                     f"have shape {tuple(int(s) for s in example_shape)}")
  return shape


def pad_same(x: jax.Array, kernel: int, stride: int = 1, value: float = 0.0) -> jax.Array:
  """Pads the spatial axes of ``x: [B, H, W, C]`` as TensorFlow/Keras ``padding="same"`` does for a
  ``kernel`` x ``kernel`` window with ``stride``: the output has ``ceil(H / stride)`` rows, the
  odd pixel of padding goes at the end."""
  pads = []
  for size in x.shape[1:3]:
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    pads.append((total // 2, total - total // 2))
  return jnp.pad(x, ((0, 0), pads[0], pads[1], (0, 0)), constant_values=value)


def pad_symmetric(x: jax.Array, pad: int) -> jax.Array:
  """Pads the spatial axes of ``x: [B, H, W, C]`` by ``pad`` on every side (PyTorch's
  ``Conv2d(padding=pad)``)."""
  return jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))


def max_pool_strided(x: jax.Array, window: int, stride: int) -> jax.Array:
  """VALID max pooling of ``x: [B, H, W, C]`` with a ``window`` x ``window`` window and ``stride``
  (windows may overlap), as the maximum of ``window**2`` strided slices (no ``reduce_window``,
  for the reason :func:`fedtree.models.classifiers.max_pool` gives)."""
  h = (x.shape[1] - window) // stride + 1
  w = (x.shape[2] - window) // stride + 1
  out = None
  for i in range(window):
    for j in range(window):
      s = x[:, i:i + (h - 1) * stride + 1:stride, j:j + (w - 1) * stride + 1:stride, :]
      out = s if out is None else jnp.maximum(out, s)
  return out


def _channels_last(x: jax.Array) -> jax.Array:
  return x[..., None] if x.ndim == 3 else x   # [B, H, W] grey images


class FedAvgCNN(nn.Module):
  """The CNN of McMahan et al. 2017 ("Communication-efficient learning of deep networks from
  decentralized data", Sec. 3: two 5x5 convolutions of 32 and 64 channels, each followed by 2x2 max
  pooling, a dense ReLU layer of 512 units and a softmax output), as google-research/federated
  ``utils/models/emnist_models.py:create_original_fedavg_cnn_model`` builds it:

  ``conv 5x5 32 "same" ReLU - maxpool 2x2 "same" - conv 5x5 64 "same" ReLU - maxpool 2x2 "same" -
  dense 512 ReLU - dense num_classes``.

  Parameters on 28x28x1: ``832 + 51,264 + 3,136 * dense + dense + (dense + 1) * num_classes``:
  1,663,370 for 10 classes (the paper's count) and 1,690,046 for EMNIST's 62. With ``dense=2048``
  it is LEAF's FEMNIST CNN (TalwalkarLab/leaf ``models/femnist/cnn.py``, whose VALID pooling is the
  same on 28x28): 6,603,710 parameters for 62 classes.
  """

  num_classes: int
  dense: int = 512
  conv_impl: str = "auto"

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = _channels_last(x)
    for i, f in enumerate((32, 64)):
      x = nn.relu(Conv(f, (5, 5), impl=self.conv_impl, name=f"Conv_{i}")(pad_same(x, 5)))
      x = max_pool(pad_same(x, 2, 2, -jnp.inf), (2, 2))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(self.dense, name="Dense_0")(x))
    return nn.Dense(self.num_classes, name="Dense_1")(x)


class LeNet5(nn.Module):
  """LeNet-5 (LeCun et al. 1998, "Gradient-based learning applied to document recognition",
  Fig. 2) in the form most federated code uses (e.g. the PyTorch CIFAR-10 tutorial's ``Net``): C1
  ``conv 5x5 6`` - S2 ``maxpool 2x2`` - C3 ``conv 5x5 16`` (every C3 map reads every S2 map, not
  the paper's partial table) - S4 ``maxpool 2x2`` - C5 ``dense 120`` - F6 ``dense 84`` - output
  ``dense num_classes``, ReLU after every hidden layer (the paper: scaled tanh, trainable
  subsampling, RBF outputs).

  Inputs smaller than 32x32 are zero-padded to 32x32, centred, as the paper placed MNIST's 28x28
  digits in a 32x32 field; larger ones are refused (:func:`image_shape`). Parameters with ``C``
  input channels: ``(150 C + 6) + 2,416 + 48,120 + 10,164 + 85 num_classes``: 61,706 for 28x28x1
  and 10 classes, 62,006 for CIFAR-10 (32x32x3).
  """

  num_classes: int
  conv_impl: str = "auto"

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = _channels_last(x)
    ph, pw = 32 - x.shape[1], 32 - x.shape[2]
    x = jnp.pad(x, ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
    for i, f in enumerate((6, 16)):
      x = max_pool(nn.relu(Conv(f, (5, 5), impl=self.conv_impl, name=f"Conv_{i}")(x)), (2, 2))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(120, name="Dense_0")(x))
    x = nn.relu(nn.Dense(84, name="Dense_1")(x))
    return nn.Dense(self.num_classes, name="Dense_2")(x)


class CifarCNN(nn.Module):
  """FLGo's CIFAR-10 CNN (WwZzz/easyFL ``flgo/benchmark/cifar10_classification/model/cnn.py``, the
  "CNN" of FLGo-Bench's CIFAR-10 tables): ``conv 5x5 64 VALID ReLU - maxpool 2x2 - conv 5x5 64
  VALID ReLU - maxpool 2x2 - dense 384 ReLU - dense 192 ReLU - dense num_classes``.

  Parameters on 32x32x3 (a 5x5x64 map before the dense layers): ``4,864 + 102,464 + 614,784 +
  73,920 + 193 num_classes``: 797,962 for 10 classes.
  """

  num_classes: int
  conv_impl: str = "auto"

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = _channels_last(x)
    for i in range(2):
      x = max_pool(nn.relu(Conv(64, (5, 5), impl=self.conv_impl, name=f"Conv_{i}")(x)), (2, 2))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(384, name="Dense_0")(x))
    x = nn.relu(nn.Dense(192, name="Dense_1")(x))
    return nn.Dense(self.num_classes, name="Dense_2")(x)


NORMS = ("group", "batch")
RESNET_STEMS = ("cifar", "imagenet")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def batch_mask(mask: jax.Array | None, x: jax.Array) -> jax.Array | None:
  """The real rows of a padded batch (``bool[B]``) shaped to broadcast against ``x`` (``[B, 1, ...]``),
  for ``nn.BatchNorm(...)(x, mask=...)``: padding never enters a statistic."""
  return None if mask is None else mask.reshape(mask.shape + (1,) * (x.ndim - 1))


class ResNet18(nn.Module):
  """ResNet-18 for 32x32 inputs (He et al. 2016, "Deep residual learning for image recognition",
  Table 1's 18-layer column with the CIFAR stem of its Sec. 4.2), laid out as the common CIFAR
  code does (kuangliu/pytorch-cifar ``models/resnet.py:ResNet18``):

  ``conv 3x3 64 - norm - ReLU``, then four stages of two basic blocks with ``64, 128, 256, 512``
  channels (x ``width / 64``), the first block of stages 2-4 with stride 2; a basic block is
  ``conv 3x3 - norm - ReLU - conv 3x3 - norm``, added to its input (through ``conv 1x1 - norm``
  where the shape changes) and ReLU; global average pooling; ``dense num_classes``. Convolutions
  have no bias and PyTorch's padding of 1 (:func:`pad_symmetric`).

  ``norm="group"``: GroupNorm with ``groups`` groups (Hsieh et al. 2020, "The non-IID data quagmire
  of decentralized machine learning", replace BatchNorm by GroupNorm for federated training; 2
  groups as in Reddi et al. 2021); ``"batch"``: BatchNorm, whose running statistics are the
  model's state (the variables' ``batch_stats`` collection; ``mask`` keeps padded rows out of
  every batch statistic; ``running_var="unbiased"``: PyTorch's running variance,
  :class:`~fedtree.models.classifiers.UnbiasedBatchNorm`). Both have the same parameters: 11,173,962
  for 10 classes, 11,220,132 for 100 (``width=64``).

  ``stem="imagenet"``: torchvision's ``resnet18`` (ImageNet inputs, pfl-research's FLAIR model):
  ``conv 7x7 64 stride 2 (padding 3) - norm - ReLU - maxpool 3x3 stride 2 (padding 1)`` in place of
  the CIFAR stem; 11,185,233 parameters for FLAIR's 17 labels. Images stored as ``uint8`` pixels
  (FLAIR's store) are scaled to ``[0, 1]``; ``standardize="imagenet"`` then subtracts ImageNet's
  channel means and divides by its standard deviations (:data:`IMAGENET_MEAN`, :data:`IMAGENET_STD`:
  pfl-research's ``get_channel_mean_stddevs`` default).
  """

  num_classes: int
  norm: str = "group"
  groups: int = 2
  width: int = 64
  conv_impl: str = "auto"
  running_var: str = "biased"
  stem: str = "cifar"
  standardize: str | None = None

  def _norm(self, x, train, mask, name):
    if self.norm == "group":
      return nn.GroupNorm(num_groups=self.groups, epsilon=1e-5, name=name)(x)
    if self.running_var == "unbiased":
      return UnbiasedBatchNorm(momentum=0.9, epsilon=1e-5, name=name)(x, train=train,
                                                                      mask=batch_mask(mask, x))
    return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, name=name)(
      x, mask=batch_mask(mask, x))

  def _conv(self, x, features, kernel, stride, name):
    x = pad_symmetric(x, kernel // 2) if kernel > 1 else x
    return Conv(features, (kernel, kernel), impl=self.conv_impl, strides=(stride, stride), use_bias=False,
                kernel_init=nn.initializers.he_normal(), name=name)(x)

  @nn.compact
  def __call__(self, x, train: bool = False, mask=None):
    if self.norm not in NORMS:
      raise ValueError(f"ResNet18 norm={self.norm!r}; choose one of {NORMS}")
    check_running_var(self.running_var, self.norm, "ResNet18")
    if self.stem not in RESNET_STEMS:
      raise ValueError(f"ResNet18 stem={self.stem!r}; choose one of {RESNET_STEMS}")
    if self.standardize not in (None, "imagenet"):
      raise ValueError(f"ResNet18 standardize={self.standardize!r}; choose None or 'imagenet'")
    x = _channels_last(x)
    if x.dtype == jnp.uint8:   # pixels as stored
      x = x.astype(jnp.float32) / 255.0
    if self.standardize == "imagenet":
      shape = (1,) * (x.ndim - 1) + (3,)
      mean, std = (jnp.asarray(v, x.dtype).reshape(shape) for v in (IMAGENET_MEAN, IMAGENET_STD))
      x = (x - mean) / std
    if self.stem == "imagenet":
      x = nn.relu(self._norm(self._conv(x, self.width, 7, 2, "stem"), train, mask, "stem_norm"))
      x = max_pool_strided(jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-jnp.inf), 3, 2)
    else:
      x = nn.relu(self._norm(self._conv(x, self.width, 3, 1, "stem"), train, mask, "stem_norm"))
    for s, mult in enumerate((1, 2, 4, 8)):
      f = self.width * mult
      for b in range(2):
        stride = 2 if (s > 0 and b == 0) else 1
        name = f"stage{s}_block{b}"
        y = nn.relu(self._norm(self._conv(x, f, 3, stride, f"{name}_conv0"), train, mask, f"{name}_norm0"))
        y = self._norm(self._conv(y, f, 3, 1, f"{name}_conv1"), train, mask, f"{name}_norm1")
        if stride != 1 or x.shape[-1] != f:
          x = self._conv(x, f, 1, stride, f"{name}_shortcut")
          x = self._norm(x, train, mask, f"{name}_shortcut_norm")
        x = nn.relu(x + y)
    return nn.Dense(self.num_classes, name="head")(jnp.mean(x, axis=(1, 2)))


class ResNet18AFO(nn.Module):
  """The ResNet-18 of Reddi et al. 2021 ("Adaptive federated optimization", the CIFAR-10/100
  tasks), exactly as google-research/federated ``utils/models/resnet_models.py:create_resnet18``
  builds it (``create_resnet(input_shape, num_classes, "basic", repetitions=[2, 2, 2, 2],
  norm="group")``), a pre-activation ResNet (He et al. 2016, "Identity mappings in deep residual
  networks"):

  stem ``conv 7x7 64 stride 2 "same" - GroupNorm - ReLU - maxpool 3x3 stride 2 "same"``; four
  stages of two basic blocks with ``64, 128, 256, 512`` channels (x ``width / 64``), every
  convolution with stride 1 (the reference passes no stride to its stages, so the map keeps the
  stem's resolution: 6x6 for 24x24 crops); a block is ``[GroupNorm - ReLU -] conv 3x3 - GroupNorm -
  ReLU - conv 3x3`` (the very first block skips the leading norm) added to its input, through
  ``conv 1x1 - GroupNorm`` where the channels change; then ``GroupNorm - ReLU``, global average
  pooling, ``dense num_classes``. Convolutions have no bias and Keras' "same" padding
  (:func:`pad_same`); GroupNorm is tensorflow_addons' default (2 groups, epsilon 1e-3).

  Parameters (``width=64``, 3 channels): 11,227,812 for CIFAR-100's 100 classes.
  """

  num_classes: int
  groups: int = 2
  width: int = 64
  conv_impl: str = "auto"

  def _norm(self, x, name):
    return nn.GroupNorm(num_groups=self.groups, epsilon=1e-3, name=name)(x)

  def _conv(self, x, features, kernel, stride, name):
    return Conv(features, (kernel, kernel), impl=self.conv_impl, strides=(stride, stride), use_bias=False,
                kernel_init=nn.initializers.he_normal(), name=name)(pad_same(x, kernel, stride))

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = _channels_last(x)
    x = nn.relu(self._norm(self._conv(x, self.width, 7, 2, "stem"), "stem_norm"))
    x = max_pool_strided(pad_same(x, 3, 2, -jnp.inf), 3, 2)
    for s, mult in enumerate((1, 2, 4, 8)):
      f = self.width * mult
      for b in range(2):
        name = f"stage{s}_block{b}"
        y = x if (s == 0 and b == 0) else nn.relu(self._norm(x, f"{name}_norm0"))
        y = self._conv(y, f, 3, 1, f"{name}_conv0")
        y = self._conv(nn.relu(self._norm(y, f"{name}_norm1")), f, 3, 1, f"{name}_conv1")
        if x.shape[-1] != f:
          x = self._norm(self._conv(x, f, 1, 1, f"{name}_shortcut"), f"{name}_shortcut_norm")
        x = x + y
    x = nn.relu(self._norm(x, "final_norm"))
    return nn.Dense(self.num_classes, kernel_init=nn.initializers.normal(0.01), name="head")(
      jnp.mean(x, axis=(1, 2)))


VGG11_LAYERS = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
"""VGG's configuration "A" (Simonyan and Zisserman 2015, Table 1): 3x3 convolutions and 2x2 max
pooling ("M")."""


class VGG11(nn.Module):
  """VGG-11 for 32x32 inputs as FedNova (Wang et al. 2020, "Tackling the objective inconsistency
  problem in heterogeneous federated optimization") trains it on CIFAR-10 (JYWa/FedNova
  ``models/vgg.py:vgg11``): configuration "A" (:data:`VGG11_LAYERS`; ``conv 3x3`` with padding 1,
  bias and ReLU, no batch norm) down to a 1x1x512 map, then ``dropout 0.5 - dense 512 ReLU -
  dropout 0.5 - dense 512 ReLU - dense num_classes``. Takes 32x32 inputs (the five poolings must
  end on one pixel; :func:`image_shape`).

  Parameters (``width=64``, 3 channels): ``9,220,480`` in the convolutions, ``525,312`` in the two
  hidden dense layers and ``513 num_classes``: 9,750,922 for 10 classes.
  """

  num_classes: int
  width: int = 64
  dropout: float = 0.5
  conv_impl: str = "auto"

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = _channels_last(x)
    i = 0
    for v in VGG11_LAYERS:
      if v == "M":
        x = max_pool(x, (2, 2))
        continue
      x = nn.relu(Conv(int(v) * self.width // 64, (3, 3), impl=self.conv_impl,
                       kernel_init=nn.initializers.variance_scaling(2.0, "fan_out", "normal"),
                       name=f"Conv_{i}")(pad_symmetric(x, 1)))
      i += 1
    x = x.reshape((x.shape[0], -1))
    hidden = 8 * self.width
    for j in range(2):
      x = nn.Dropout(self.dropout, deterministic=not train)(x)
      x = nn.relu(nn.Dense(hidden, name=f"Dense_{j}")(x))
    return nn.Dense(self.num_classes, name="Dense_2")(x)
