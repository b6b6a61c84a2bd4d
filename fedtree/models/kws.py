"""Keyword-spotting models of FedKWS-UI (paper 002): DS-CNN and a small Keyword Transformer."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedtree.models.classifiers import Conv


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
