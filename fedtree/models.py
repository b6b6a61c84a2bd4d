"""Flax models and the :class:`Model` pair every algorithm trains.

A :class:`Model` is ``init(key) -> params`` plus ``apply(params, x, *, train, rng) -> logits``:
pure functions, so a whole tier of clients is ``vmap(apply)`` over stacked params.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

Params = Any


class Model(NamedTuple):
  """A pure model: ``init(key) -> params`` and ``apply(params, x, train=, rng=) -> logits``."""

  init: Callable[[jax.Array], Params]
  apply: Callable[..., jax.Array]
  num_classes: int


class LogisticRegression(nn.Module):
  """Multinomial logistic regression (MLR) on flattened inputs."""

  num_classes: int

  @nn.compact
  def __call__(self, x, train: bool = False):
    return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))


class MLP(nn.Module):
  """ReLU MLP on flattened inputs."""

  num_classes: int
  hidden: Sequence[int] = (200, 200)

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = x.reshape((x.shape[0], -1))
    for h in self.hidden:
      x = nn.relu(nn.Dense(h)(x))
    return nn.Dense(self.num_classes)(x)


CONV_IMPLS = ("auto", "xla", "matmul")


def im2col_conv(x: jax.Array, kernel: jax.Array, bias: jax.Array,
                strides: tuple[int, int] = (1, 1)) -> jax.Array:
  """A VALID convolution as one matmul over shifted (strided) slices (im2col by slicing).

  ``x: [B, H, W, C]``, ``kernel: [kh, kw, C, F]`` (flax's ``nn.Conv`` layout), ``bias: [F]``.
  Its gradients are pads, adds and matmuls, with no convolution op.
  """
  kh, kw, cin, cout = kernel.shape
  sh, sw = strides
  h, w = (x.shape[1] - kh) // sh + 1, (x.shape[2] - kw) // sw + 1
  cols = jnp.concatenate(
    [x[:, i:i + (h - 1) * sh + 1:sh, j:j + (w - 1) * sw + 1:sw, :] for i in range(kh) for j in range(kw)],
    axis=-1,
  )
  return cols @ kernel.reshape(kh * kw * cin, cout) + bias.reshape((1, 1, 1, cout))


class Conv(nn.Module):
  """A VALID 2-D convolution (stride 1 unless ``strides``) with ``nn.Conv``'s parameters
  (``kernel``, ``bias``).

  ``impl="xla"`` is ``lax.conv``; ``"matmul"`` is :func:`im2col_conv`; ``"auto"`` picks
  ``"matmul"`` on CPU, where XLA compiles the weight gradient of a convolution inside a loop
  (our local-step ``scan``) into a slow generic loop (jax-ml/jax#12868: 33x slower for the
  benchmark CNN, measured), and ``"xla"`` elsewhere. Both give the same function.
  """

  features: int
  kernel_size: tuple[int, int] = (3, 3)
  impl: str = "auto"
  strides: tuple[int, int] = (1, 1)

  @nn.compact
  def __call__(self, x):
    if self.impl not in CONV_IMPLS:
      raise ValueError(f"conv impl={self.impl!r}; choose one of {CONV_IMPLS}")
    kernel = self.param("kernel", nn.initializers.lecun_normal(),
                        tuple(self.kernel_size) + (x.shape[-1], self.features))
    bias = self.param("bias", nn.initializers.zeros, (self.features,))
    impl = self.impl if self.impl != "auto" else ("matmul" if jax.default_backend() == "cpu" else "xla")
    if impl == "matmul":
      return im2col_conv(x, kernel.astype(x.dtype), bias.astype(x.dtype), tuple(self.strides))
    y = jax.lax.conv_general_dilated(x, kernel.astype(x.dtype), tuple(self.strides), "VALID",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + bias.astype(x.dtype).reshape((1, 1, 1, -1))


def max_pool(x: jax.Array, window: tuple[int, int] = (2, 2)) -> jax.Array:
  """Non-overlapping VALID max pooling of ``[B, H, W, C]`` (stride = window), as a reshape
  and a max; trailing rows and columns that fill no window are dropped, as ``nn.max_pool``
  does.

  Same values as ``nn.max_pool(x, window, strides=window)``; its gradient is an elementwise
  mask, where ``reduce_window``'s is a ``select_and_scatter`` that XLA:CPU runs 5x slower
  (measured on the benchmark CNN). Where a window has tied maxima the gradient is shared
  between them (a valid subgradient; after a ReLU the usual tie is at 0, whose gradient the
  ReLU zeroes anyway).
  """
  (wh, ww), (b, h, w, c) = window, x.shape
  x = x[:, : h // wh * wh, : w // ww * ww, :]
  return x.reshape(b, h // wh, wh, w // ww, ww, c).max(axis=(2, 4))


class CNN(nn.Module):
  """A small CNN: [conv3x3 - ReLU]* - maxpool2 - dropout - dense - ReLU - dropout - dense.

  With the defaults ``features=(32, 64)``, ``dense=128``, ``dropout=(0.25, 0.5)`` this is the
  CNN of the pfl-research cross-framework benchmark (and of the Keras MNIST example).
  ``conv_impl`` chooses how convolutions are computed (:class:`Conv`).
  """

  num_classes: int
  features: Sequence[int] = (32, 64)
  dense: int = 128
  dropout: tuple[float, float] = (0.25, 0.5)
  pool_every_conv: bool = False
  conv_impl: str = "auto"

  @nn.compact
  def __call__(self, x, train: bool = False):
    if x.ndim == 3:  # [B, H, W] grey images
      x = x[..., None]
    for i, f in enumerate(self.features):
      x = nn.relu(Conv(f, (3, 3), impl=self.conv_impl, name=f"Conv_{i}")(x))
      if self.pool_every_conv:
        x = max_pool(x, (2, 2))
    if not self.pool_every_conv:
      x = max_pool(x, (2, 2))
    x = nn.Dropout(self.dropout[0], deterministic=not train)(x)
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(self.dense)(x))
    x = nn.Dropout(self.dropout[1], deterministic=not train)(x)
    return nn.Dense(self.num_classes)(x)


def same_padding(x: jax.Array, kernel_size: Sequence[int]) -> jax.Array:
  """Zero-pads the two spatial axes of ``x: [B, H, W, C]`` so that a stride-1 VALID
  convolution with ``kernel_size`` keeps ``H, W`` ("SAME" padding, extra row/column at the end)."""
  pads = [((k - 1) // 2, k // 2) for k in kernel_size]
  return jnp.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))


def depthwise_conv(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """A VALID, stride-1 depthwise convolution as a sum of shifted elementwise products (no
  convolution op, for the reason :class:`Conv` gives). ``x: [B, H, W, C]``, ``kernel: [kh, kw, C]``."""
  kh, kw, _ = kernel.shape
  h, w = x.shape[1] - kh + 1, x.shape[2] - kw + 1
  k = kernel.reshape((kh, kw, 1, 1, 1, -1))
  out = x[:, :h, :w, :] * k[0, 0]
  for i in range(kh):
    for j in range(kw):
      if i or j:
        out = out + x[:, i:i + h, j:j + w, :] * k[i, j]
  return out


class DSCNN(nn.Module):
  """Depthwise-separable CNN for keyword spotting (Zhang et al. 2017, "Hello edge"), as used by
  FedKWS-UI (paper 002) on ``[T, F]`` MFCC inputs.

  A ``first_kernel`` convolution with stride ``first_stride`` and "SAME" padding, then
  ``blocks`` depthwise-separable blocks (3x3 depthwise, 1x1 pointwise, each followed by a
  normalization and ReLU), global average pooling and a dense classifier. With ``width=172``
  and ``blocks=5`` it has about 0.17M parameters for 12 classes (the paper's 169K).
  Normalization (choice): the original's batch norm keeps batch statistics, which a pure
  ``apply`` has no place for; ``norm="layer"`` normalizes each position over the channels
  (LayerNorm), ``norm="none"`` skips it. Convolutions avoid XLA's conv op on CPU like
  :class:`Conv` (strided im2col, and depthwise as shifted products).
  """

  num_classes: int
  width: int = 172
  blocks: int = 5
  first_kernel: tuple[int, int] = (10, 4)
  first_stride: tuple[int, int] = (2, 2)
  norm: str = "layer"
  conv_impl: str = "auto"

  def _norm(self, x, name):
    if self.norm == "layer":
      return nn.LayerNorm(name=name)(x)
    if self.norm == "none":
      return x
    raise ValueError(f"DSCNN norm={self.norm!r}; choose 'layer' or 'none'")

  @nn.compact
  def __call__(self, x, train: bool = False):
    if x.ndim == 3:  # [B, T, F] features
      x = x[..., None]
    x = same_padding(x, self.first_kernel)
    x = Conv(self.width, tuple(self.first_kernel), impl=self.conv_impl, strides=tuple(self.first_stride),
             name="Conv_0")(x)
    x = nn.relu(self._norm(x, "Norm_0"))
    for b in range(self.blocks):
      kernel = self.param(f"Depthwise_{b}", nn.initializers.lecun_normal(in_axis=(0, 1), out_axis=2),
                          (3, 3, self.width))
      x = depthwise_conv(same_padding(x, (3, 3)), kernel.astype(x.dtype))
      x = nn.relu(self._norm(x, f"DepthwiseNorm_{b}"))
      x = nn.Dense(self.width, name=f"Pointwise_{b}")(x)
      x = nn.relu(self._norm(x, f"PointwiseNorm_{b}"))
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes)(x)


class KWT(nn.Module):
  """Keyword Transformer (Berg et al. 2021, "Keyword transformer"), small, as FedKWS-UI
  (paper 002) uses it: every time frame of a ``[T, F]`` MFCC map is a token (a linear
  embedding to ``dim``), a learned class token and position embeddings, ``depth`` pre-norm
  encoder blocks (``heads``-head self-attention, GELU MLP of width ``mlp_dim``), and a dense
  classifier on the class token. The defaults (``dim=96, depth=4``) give about 0.25M
  parameters for ``[98, 40]`` inputs (the paper's 4-layer, 96-wide model has 232K).
  """

  num_classes: int
  dim: int = 96
  depth: int = 4
  heads: int = 4
  mlp_dim: int = 128
  dropout: float = 0.0

  @nn.compact
  def __call__(self, x, train: bool = False):
    if x.ndim == 4:  # [B, T, F, 1]
      x = x[..., 0]
    b, t = x.shape[0], x.shape[1]
    x = nn.Dense(self.dim, name="Embed")(x)
    cls = self.param("cls", nn.initializers.zeros, (1, 1, self.dim))
    x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, self.dim)).astype(x.dtype), x], axis=1)
    pos = self.param("pos", nn.initializers.normal(0.02), (1, t + 1, self.dim))
    x = x + pos.astype(x.dtype)
    for i in range(self.depth):
      h = nn.LayerNorm(name=f"Norm1_{i}")(x)
      h = nn.MultiHeadDotProductAttention(num_heads=self.heads, name=f"Attention_{i}")(h, h)
      x = x + nn.Dropout(self.dropout, deterministic=not train)(h)
      h = nn.LayerNorm(name=f"Norm2_{i}")(x)
      h = nn.Dense(self.dim, name=f"Mlp2_{i}")(nn.gelu(nn.Dense(self.mlp_dim, name=f"Mlp1_{i}")(h)))
      x = x + nn.Dropout(self.dropout, deterministic=not train)(h)
    return nn.Dense(self.num_classes)(nn.LayerNorm(name="NormOut")(x[:, 0]))


def from_flax(module: nn.Module, example_shape: Sequence[int], num_classes: int) -> Model:
  """Wraps a flax module taking ``[B, *example_shape]`` into a :class:`Model`."""
  example_shape = tuple(int(s) for s in example_shape)

  def init(key):
    return module.init(key, jnp.zeros((1,) + example_shape, jnp.float32), train=False)["params"]

  def apply(params, x, *, train: bool = False, rng: jax.Array | None = None):
    rngs = {"dropout": rng} if (train and rng is not None) else None
    return module.apply({"params": params}, x, train=train, rngs=rngs)

  return Model(init=init, apply=apply, num_classes=int(num_classes))


MODELS = ("logreg", "mlp", "cnn", "dscnn", "kwt")


def build_model(name: str, *, example_shape: Sequence[int], num_classes: int, **kwargs) -> Model:
  """A model by name: ``logreg``, ``mlp`` (``hidden=``) or ``cnn`` (``features=``, ``dense=``,
  ``dropout=``, ``pool_every_conv=``) or ``dscnn`` (``width=``, ``blocks=``, ``first_kernel=``,
  ``first_stride=``, ``norm=``; :class:`DSCNN`) or ``kwt`` (``dim=``, ``depth=``, ``heads=``,
  ``mlp_dim=``, ``dropout=``; :class:`KWT`)."""
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
  else:
    raise ValueError(f"model name {name!r} is unknown; choose one of {MODELS}")
  return from_flax(module, example_shape, num_classes)


def masked_cross_entropy(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy over the entries where ``mask`` is true (0 if none)."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
  nll = -jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
  m = mask.astype(jnp.float32)
  return jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)
