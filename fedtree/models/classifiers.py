"""Image and tabular classifiers: multinomial logistic regression, MLP, CNN (flax)."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class LogisticRegression(nn.Module):
  """Multinomial logistic regression (MLR) on flattened inputs."""

  num_classes: int

  @nn.compact
  def __call__(self, x, train: bool = False):
    return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))


NORMS = ("none", "batch")
RUNNING_VARS = ("biased", "unbiased")
"""What a BatchNorm's running variance averages: the batches' biased variance (flax's) or their
unbiased one, ``n / (n - 1)`` times it (PyTorch's ``running_var``, which every PyTorch peer evaluates
with)."""


def _row(v: jax.Array, x: jax.Array) -> jax.Array:
  """A per-feature ``[F]`` vector shaped to broadcast against ``x [..., F]``."""
  return v.reshape((1,) * (x.ndim - 1) + v.shape)


class UnbiasedBatchNorm(nn.Module):
  """BatchNorm as PyTorch's ``nn.BatchNorm1d/2d`` keeps it: a batch is normalized by its biased
  variance, and the running variance averages the unbiased one (``n / (n − 1)`` times it, ``n`` the
  real entries per feature); otherwise flax's ``BatchNorm`` (momentum 0.9, as PyTorch's 0.1; the
  same ``batch_stats`` mean and var, ``params`` scale and bias), statistics from the rows of
  ``mask`` only."""

  momentum: float = 0.9
  epsilon: float = 1e-5

  @nn.compact
  def __call__(self, x, *, train: bool, mask=None):
    features, axes = x.shape[-1], tuple(range(x.ndim - 1))
    ra_mean = self.variable("batch_stats", "mean", lambda: jnp.zeros((features,), jnp.float32))
    ra_var = self.variable("batch_stats", "var", lambda: jnp.ones((features,), jnp.float32))
    scale = self.param("scale", nn.initializers.ones, (features,), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros, (features,), jnp.float32)
    dtype = jnp.promote_types(x.dtype, jnp.float32)
    if train:
      w = jnp.ones(x.shape, dtype) if mask is None else jnp.broadcast_to(mask, x.shape).astype(dtype)
      n = jnp.sum(w, axis=axes)
      xf = x.astype(dtype)
      mean = jnp.sum(xf * w, axis=axes) / jnp.maximum(n, 1.0)
      var = jnp.sum(w * jnp.square(xf - _row(mean, x)), axis=axes) / jnp.maximum(n, 1.0)
      if not self.is_initializing():
        m = self.momentum
        unbiased = var * n / jnp.maximum(n - 1.0, 1.0)
        ra_mean.value = m * ra_mean.value + (1 - m) * mean.astype(ra_mean.value.dtype)
        ra_var.value = m * ra_var.value + (1 - m) * unbiased.astype(ra_var.value.dtype)
    else:
      mean, var = ra_mean.value, ra_var.value
    y = (x.astype(dtype) - _row(mean, x)) * jax.lax.rsqrt(_row(var, x).astype(dtype) + self.epsilon)
    y = y * _row(scale, x).astype(dtype) + _row(bias, x).astype(dtype)
    return y.astype(x.dtype)


def batch_norm(x: jax.Array, *, train: bool, mask: jax.Array | None, name: str | None = None,
               running_var: str = "biased") -> jax.Array:
  """A BatchNorm (momentum 0.9, as PyTorch's 0.1; statistics in the ``batch_stats`` collection)
  whose training statistics come from the rows of ``mask`` (``bool[B]``, the real examples of a
  padded batch) only; evaluation uses the running averages. ``running_var``: ``"biased"`` (flax's
  ``BatchNorm``) or ``"unbiased"`` (PyTorch's running variance, :class:`UnbiasedBatchNorm`)."""
  m = None if mask is None else mask.reshape((mask.shape[0],) + (1,) * (x.ndim - 1))
  if running_var == "unbiased":
    return UnbiasedBatchNorm(momentum=0.9, epsilon=1e-5, name=name)(x, train=train, mask=m)
  return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, name=name)(x, mask=m)


def check_running_var(running_var: str, norm: str, model: str) -> None:
  """``running_var`` is one of :data:`RUNNING_VARS`, and ``"unbiased"`` only with ``norm="batch"``."""
  if running_var not in RUNNING_VARS:
    raise ValueError(f"{model} running_var={running_var!r}; choose one of {RUNNING_VARS}")
  if running_var == "unbiased" and norm != "batch":
    raise ValueError(f"{model} running_var='unbiased' is a BatchNorm's: it needs norm='batch' (got "
                     f"norm={norm!r}; from the command line --config.model.norm=batch)")


def _check_classifier_norm(norm: str) -> None:
  if norm not in NORMS:
    raise ValueError(f"norm={norm!r}; choose one of {NORMS}")


class MLP(nn.Module):
  """ReLU MLP on flattened inputs; ``norm="batch"`` puts a BatchNorm before every hidden ReLU (a
  model with state, :mod:`fedtree.core.model`), whose running variance is ``running_var``'s
  (:data:`RUNNING_VARS`)."""

  num_classes: int
  hidden: Sequence[int] = (200, 200)
  norm: str = "none"
  running_var: str = "biased"

  @nn.compact
  def __call__(self, x, train: bool = False, mask=None):
    _check_classifier_norm(self.norm)
    check_running_var(self.running_var, self.norm, "mlp")
    x = x.reshape((x.shape[0], -1))
    for i, h in enumerate(self.hidden):
      x = nn.Dense(h)(x)
      if self.norm == "batch":
        x = batch_norm(x, train=train, mask=mask, name=f"BatchNorm_{i}", running_var=self.running_var)
      x = nn.relu(x)
    return nn.Dense(self.num_classes)(x)


CONV_IMPLS = ("auto", "xla", "matmul")


def im2col_conv(x: jax.Array, kernel: jax.Array, bias: jax.Array | None,
                strides: tuple[int, int] = (1, 1)) -> jax.Array:
  """A VALID convolution as one matmul over shifted (strided) slices (im2col by slicing).

  ``x: [B, H, W, C]``, ``kernel: [kh, kw, C, F]`` (flax's ``nn.Conv`` layout), ``bias: [F]``
  or ``None`` (no bias). Its gradients are pads, adds and matmuls, with no convolution op.
  """
  kh, kw, cin, cout = kernel.shape
  sh, sw = strides
  h, w = (x.shape[1] - kh) // sh + 1, (x.shape[2] - kw) // sw + 1
  cols = jnp.concatenate(
    [x[:, i:i + (h - 1) * sh + 1:sh, j:j + (w - 1) * sw + 1:sw, :] for i in range(kh) for j in range(kw)],
    axis=-1,
  )
  y = cols @ kernel.reshape(kh * kw * cin, cout)
  return y if bias is None else y + bias.reshape((1, 1, 1, cout))


AUTO_CONV_IMPL = {"cpu": "matmul", "gpu": "matmul", "cuda": "matmul", "rocm": "matmul", "tpu": "xla"}


def auto_conv_impl(backend: str | None = None) -> str:
  """The convolution path of ``impl="auto"`` on ``backend`` (default: JAX's default backend):
  ``"matmul"`` (im2col) on CPU and GPU, where it was measured faster for per-client training,
  ``"xla"`` (``lax.conv``) on TPU and any other backend (not measured)."""
  return AUTO_CONV_IMPL.get(backend or jax.default_backend(), "xla")


class Conv(nn.Module):
  """A VALID 2-D convolution (stride 1 unless ``strides``) with ``nn.Conv``'s parameters
  (``kernel``, and ``bias`` unless ``use_bias=False``; pad the input for other paddings, e.g.
  :func:`fedtree.models.kws.same_padding`).

  ``impl="xla"`` is ``lax.conv``; ``"matmul"`` is :func:`im2col_conv`; ``"auto"``
  (:func:`auto_conv_impl`) picks ``"matmul"`` on CPU and GPU and ``"xla"`` on TPU. On CPU,
  XLA compiles the weight gradient of a convolution inside a loop (our local-step ``scan``)
  into a slow generic loop (jax-ml/jax#12868: 33x slower for the benchmark CNN, measured).
  On a GPU, a convolution vmapped over clients (each with its own kernel) becomes a grouped
  convolution, which cuDNN ran 2.1x slower than the batched im2col matmuls (workload (b) on
  an H100: 1,732 vs 3,713 client-updates/s; benchmarks/README.md). Both give the same
  function.
  """

  features: int
  kernel_size: tuple[int, int] = (3, 3)
  impl: str = "auto"
  strides: tuple[int, int] = (1, 1)
  use_bias: bool = True
  kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()

  @nn.compact
  def __call__(self, x):
    if self.impl not in CONV_IMPLS:
      raise ValueError(f"conv impl={self.impl!r}; choose one of {CONV_IMPLS}")
    kernel = self.param("kernel", self.kernel_init, tuple(self.kernel_size) + (x.shape[-1], self.features))
    bias = None
    if self.use_bias:
      bias = self.param("bias", nn.initializers.zeros, (self.features,)).astype(x.dtype)
    impl = self.impl if self.impl != "auto" else auto_conv_impl()
    if impl == "matmul":
      return im2col_conv(x, kernel.astype(x.dtype), bias, tuple(self.strides))
    y = jax.lax.conv_general_dilated(x, kernel.astype(x.dtype), tuple(self.strides), "VALID",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y if bias is None else y + bias.reshape((1, 1, 1, -1))


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
  ``conv_impl`` chooses how convolutions are computed (:class:`Conv`); ``norm="batch"`` puts a
  BatchNorm after every convolution (a model with state, :mod:`fedtree.core.model`), whose running
  variance is ``running_var``'s (:data:`RUNNING_VARS`).
  """

  num_classes: int
  features: Sequence[int] = (32, 64)
  dense: int = 128
  dropout: tuple[float, float] = (0.25, 0.5)
  pool_every_conv: bool = False
  conv_impl: str = "auto"
  norm: str = "none"
  running_var: str = "biased"

  @nn.compact
  def __call__(self, x, train: bool = False, mask=None):
    _check_classifier_norm(self.norm)
    check_running_var(self.running_var, self.norm, "cnn")
    if x.ndim == 3:  # [B, H, W] grey images
      x = x[..., None]
    for i, f in enumerate(self.features):
      x = Conv(f, (3, 3), impl=self.conv_impl, name=f"Conv_{i}")(x)
      if self.norm == "batch":
        x = batch_norm(x, train=train, mask=mask, name=f"BatchNorm_{i}", running_var=self.running_var)
      x = nn.relu(x)
      if self.pool_every_conv:
        x = max_pool(x, (2, 2))
    if not self.pool_every_conv:
      x = max_pool(x, (2, 2))
    x = nn.Dropout(self.dropout[0], deterministic=not train)(x)
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(self.dense)(x))
    x = nn.Dropout(self.dropout[1], deterministic=not train)(x)
    return nn.Dense(self.num_classes)(x)
