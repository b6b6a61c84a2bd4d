"""Keyword-spotting models of FedKWS-UI (paper 002): DS-CNN, MHAttRNN, ResNet-15 and a small
Keyword Transformer, each of about 0.2M parameters at the paper's size (its Table 2)."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedtree.core.model import Model
from fedtree.core.rng import stream
from fedtree.models.classifiers import CONV_IMPLS, Conv, auto_conv_impl


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


NORMS = ("layer", "none")


def _check_norm(model: str, norm: str) -> None:
  if norm not in NORMS:
    raise ValueError(f"{model} norm={norm!r}; choose one of {NORMS}")


class MHAttRNN(nn.Module):
  """Attention RNN for keyword spotting (de Andrade et al. 2018, "A neural attention model for
  speech command recognition"; multi-head as in Rybakov et al. 2020), at FedKWS-UI's size
  (paper 002: 4 heads, 80 hidden units; 228K parameters for 12 classes).

  On ``[B, T, F]`` features: a convolutional front-end of two ``(5, 1)`` convolutions along
  time (``conv_channels`` then 1 channel, "SAME" padding, ReLU), a per-frame normalization
  over the ``F`` features (``norm="layer"``: LayerNorm; ``"none"``), ``layers`` bidirectional
  recurrent layers (``cell="gru"`` or ``"lstm"``, ``hidden`` units each way, so ``d = 2 *
  hidden``), then multi-head attention whose query comes from the middle frame: head ``h``
  projects the middle state ``q_h = W_q^h s_{T//2}`` and every state ``k_{h,t} = W_k^h s_t``
  (``d -> d / heads``, no bias), weights ``a_{h,t} = softmax_t(k_{h,t} · q_h)`` and returns
  ``Σ_t a_{h,t} k_{h,t}``; the heads are concatenated (``[B, d]``, the representation the
  dense classifier reads).

  Choices: the sizes of the paper's version (its authors' code, read not copied: 2 layers of
  bidirectional GRUs, per-head projections of width ``d / heads`` used as both keys and
  values, one dense classifier); de Andrade's and Rybakov's versions use full-width queries,
  the raw states as values and two more dense layers (64, 32), which at 4 heads gives about
  twice the parameters. The front-end's batch norm (the original's) is replaced by the
  per-frame LayerNorm, batch statistics having no place in a pure ``apply``.
  """

  num_classes: int
  hidden: int = 80
  heads: int = 4
  layers: int = 2
  cell: str = "gru"
  conv_channels: int = 10
  norm: str = "layer"

  @nn.compact
  def __call__(self, x, train: bool = False):
    if self.cell not in ("gru", "lstm"):
      raise ValueError(f"MHAttRNN cell={self.cell!r}; choose 'gru' or 'lstm'")
    _check_norm("MHAttRNN", self.norm)
    d = 2 * self.hidden
    if d % self.heads:
      raise ValueError(f"MHAttRNN heads={self.heads} must divide 2 * hidden = {d}")
    if x.ndim == 4:  # [B, T, F, 1]
      x = x[..., 0]
    h = x[..., None]
    h = nn.relu(Conv(self.conv_channels, (5, 1), name="Conv_0")(same_padding(h, (5, 1))))
    h = nn.relu(Conv(1, (5, 1), name="Conv_1")(same_padding(h, (5, 1))))[..., 0]    # [B, T, F]
    if self.norm == "layer":
      h = nn.LayerNorm(name="Norm")(h)
    cell = nn.GRUCell if self.cell == "gru" else nn.OptimizedLSTMCell
    for i in range(self.layers):
      h = nn.Bidirectional(nn.RNN(cell(self.hidden, name=f"Forward_{i}")),
                           nn.RNN(cell(self.hidden, name=f"Backward_{i}")))(h)
    b, t = h.shape[0], h.shape[1]
    q = nn.Dense(d, use_bias=False, name="Query")(h[:, t // 2]).reshape(b, self.heads, d // self.heads)
    k = nn.Dense(d, use_bias=False, name="Key")(h).reshape(b, t, self.heads, d // self.heads)
    weights = jax.nn.softmax(jnp.einsum("bthd,bhd->bht", k, q), axis=-1)
    att = jnp.einsum("bht,bthd->bhd", weights, k).reshape(b, d)
    return nn.Dense(self.num_classes)(att)


def dilated_conv(x: jax.Array, kernel: jax.Array, dilation: int, impl: str = "auto") -> jax.Array:
  """A "SAME", stride-1, bias-free convolution with a ``(k, k)`` kernel dilated by
  ``dilation`` (``k`` odd): ``x: [B, H, W, C]``, ``kernel: [k, k, C, F]``.

  ``impl="matmul"``: one matmul over the ``k²`` dilated shifts of the zero-padded input (no
  convolution op, for the reason :class:`~fedtree.models.classifiers.Conv` gives); ``"xla"``:
  ``lax.conv_general_dilated`` with ``rhs_dilation``; ``"auto"``: as ``Conv``. Same function.
  """
  if impl not in CONV_IMPLS:
    raise ValueError(f"conv impl={impl!r}; choose one of {CONV_IMPLS}")
  k, d = kernel.shape[0], int(dilation)
  pad = d * (k - 1) // 2
  impl = auto_conv_impl() if impl == "auto" else impl
  if impl == "xla":
    return jax.lax.conv_general_dilated(x, kernel, (1, 1), ((pad, pad), (pad, pad)), rhs_dilation=(d, d),
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))
  h, w = x.shape[1], x.shape[2]
  xp = jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  cols = jnp.concatenate([xp[:, i * d:i * d + h, j * d:j * d + w, :] for i in range(k) for j in range(k)],
                         axis=-1)
  return cols @ kernel.reshape(-1, kernel.shape[-1])


class ResNet15(nn.Module):
  """``res15`` (Tang & Lin 2018, "Deep residual learning for small-footprint keyword
  spotting"), as FedKWS-UI uses it (paper 002: 15 layers, 45 channels; 238K parameters for
  12 classes).

  On ``[B, T, F]`` features at full resolution: a 3x3 convolution to ``width`` channels, ReLU
  and normalization; ``blocks`` residual blocks of two 3x3 convolutions (``relu(norm(conv))``,
  then ``relu(norm(conv) + input)``); a last 3x3 convolution; global average pooling (the
  ``[B, width]`` representation) and a dense classifier. Convolutions have no bias and are
  dilated, conv layer ``i`` (0-based, after the first) by ``2^floor(i / 3)`` (1, 1, 1, 2, 2, 2,
  4, ...; 16 for the last of res15), with "SAME" zero padding. ``2 * blocks + 3`` layers:
  ``blocks=6`` is res15. Parameters: ``9 w + (2 blocks + 1) 9 w² + (w + 1) C``.

  Normalization: the original's batch norm has no affine parameters; ``norm="layer"`` is a
  LayerNorm over the channels without scale or offset (no parameters either), ``"none"``
  skips it (batch statistics have no place in a pure ``apply``).
  """

  num_classes: int
  width: int = 45
  blocks: int = 6
  norm: str = "layer"
  conv_impl: str = "auto"

  def _norm(self, x):
    return nn.LayerNorm(use_scale=False, use_bias=False)(x) if self.norm == "layer" else x

  def _conv(self, x, i, dilation):
    kernel = self.param(f"Conv_{i}", nn.initializers.lecun_normal(), (3, 3, x.shape[-1], self.width))
    return dilated_conv(x, kernel.astype(x.dtype), dilation, self.conv_impl)

  @nn.compact
  def __call__(self, x, train: bool = False):
    _check_norm("ResNet15", self.norm)
    if x.ndim == 3:  # [B, T, F] features
      x = x[..., None]
    h = nn.relu(self._norm(self._conv(x, 0, 1)))
    for b in range(self.blocks):
      i = 2 * b
      y = nn.relu(self._norm(self._conv(h, i + 1, 2 ** (i // 3))))
      h = nn.relu(self._norm(self._conv(y, i + 2, 2 ** ((i + 1) // 3))) + h)
    h = self._conv(h, 2 * self.blocks + 1, 2 ** (2 * self.blocks // 3))
    return nn.Dense(self.num_classes)(jnp.mean(h, axis=(1, 2)))


def view_indices(rng: jax.Array, batch_size: int, views: int) -> jax.Array:
  """``int32[B]``: the augmented view each example of a training batch reads, uniform over
  ``views``, drawn from the step's key (its ``"views"`` stream)."""
  return jax.random.randint(stream(rng, "views"), (batch_size,), 0, views)


def with_views(model: Model, views: int) -> Model:
  """``model`` on inputs ``[B, views, ...]`` that hold ``views`` pre-drawn augmentations of each
  example (:func:`fedtree.datasets.speech_commands.load_speech_commands` with ``views``).

  Given a key (``rng``, which every local step passes: the step's own key, a fresh one at
  every step, so every epoch), each example reads one view drawn uniformly with
  :func:`view_indices`; without one (evaluation), view 0. The augmentation is thus redrawn
  every time an example is read, from a pool of ``views`` per clip, inside jit. Objectives
  that run a second forward pass on the same batch (ALO's private model, FedMMD's global
  features) pass the same key, so both passes see the same views.
  """
  if int(views) < 1:
    raise ValueError(f"views={views} must be >= 1")

  def apply(params, x, *, train: bool = False, rng: jax.Array | None = None):
    if x.shape[1] != views:
      raise ValueError(f"input of shape {x.shape} has no views axis of {views} after the batch axis")
    if rng is None:
      picked = x[:, 0]
    else:
      picked = x[jnp.arange(x.shape[0]), view_indices(rng, x.shape[0], views)]
    model_rng = None if rng is None else stream(rng, "model")
    return model.apply(params, picked, train=train, rng=model_rng)

  return model._replace(apply=apply)
