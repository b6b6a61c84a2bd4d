"""MHAttRNN and ResNet-15 (paper 002's keyword-spotting models): parameter counts by hand at
the paper's size, output shapes vectorized over clients, the dilated convolution against
XLA's, and a few SGD steps that lower the loss."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedtree.core.model import masked_cross_entropy
from fedtree.models import build_model
from fedtree.models.kws import dilated_conv


def _count(model):
  return sum(p.size for p in jax.tree.leaves(jax.eval_shape(model.init, jax.random.key(0))))


def _gru(inp, h):
  """flax's GRUCell: input kernels with bias (r, z, n), recurrent kernels, ``hn`` with bias."""
  return 3 * inp * h + 3 * h + 3 * h * h + h


def _lstm(inp, h):
  """flax's LSTM cells: input kernels without bias, recurrent kernels with bias (i, f, g, o)."""
  return 4 * inp * h + 4 * (h * h + h)


def _mhattrnn_count(f, c, hidden=80, layers=2, conv=10, cell=_gru):
  d = 2 * hidden
  front = (5 * conv + conv) + (5 * conv + 1) + 2 * f          # two convs, LayerNorm over F
  rnn = sum(2 * cell(f if i == 0 else d, hidden) for i in range(layers))
  return front + rnn + 2 * d * d + d * c + c                  # query, key, classifier


def _resnet_count(c, width=45, blocks=6):
  return 9 * width + (2 * blocks + 1) * 9 * width * width + width * c + c


@pytest.mark.parametrize("classes", [12, 35])
def test_paper_size_parameter_counts(classes):
  att = _count(build_model("mhattrnn", example_shape=(98, 40), num_classes=classes))
  res = _count(build_model("resnet15", example_shape=(98, 40), num_classes=classes))
  assert att == _mhattrnn_count(40, classes)
  assert res == _resnet_count(classes)
  assert 150_000 < att < 300_000 and 150_000 < res < 300_000     # the paper's 228K and 238K
  assert res == {12: 237_882, 35: 238_940}[classes]


def test_small_counts_by_hand():
  small = dict(hidden=6, heads=2, layers=1, conv_channels=3)
  assert _count(build_model("mhattrnn", example_shape=(12, 8), num_classes=5, **small)) == \
    _mhattrnn_count(8, 5, hidden=6, layers=1, conv=3)
  assert _count(build_model("mhattrnn", example_shape=(12, 8), num_classes=5, cell="lstm", **small)) == \
    _mhattrnn_count(8, 5, hidden=6, layers=1, conv=3, cell=_lstm)
  assert _count(build_model("resnet15", example_shape=(12, 8), num_classes=5, width=4, blocks=2)) == \
    _resnet_count(5, width=4, blocks=2)


SMALL = {
  "mhattrnn": dict(hidden=6, heads=2, layers=1, conv_channels=3),
  "mhattrnn_lstm": dict(hidden=6, heads=3, layers=2, conv_channels=2, cell="lstm"),
  "resnet15": dict(width=4, blocks=2),
}


# Compiling a vmapped, differentiated bidirectional RNN scan takes over 5 s on the shared CPU:
# the MHAttRNN runs are slow tests (its structure is traced by the count tests by default).
LABELS = [pytest.param("mhattrnn", marks=pytest.mark.slow),
          pytest.param("mhattrnn_lstm", marks=pytest.mark.slow), "resnet15"]


def _small(label):
  name = label.split("_")[0]
  return build_model(name, example_shape=(12, 8), num_classes=5, **SMALL[label])


@pytest.mark.parametrize("label", LABELS)
def test_vmapped_over_clients(label):
  model = _small(label)
  c, b = 3, 4
  params = jax.vmap(model.init)(jax.random.split(jax.random.key(0), c))
  x = jax.random.normal(jax.random.key(1), (c, b, 12, 8))
  out = jax.jit(jax.vmap(model.apply))(params, x)
  assert out.shape == (c, b, 5) and bool(jnp.all(jnp.isfinite(out)))
  apply = jax.jit(model.apply)
  for i in (0, c - 1):    # each client's own model on its own batch
    one = jax.tree.map(lambda a, i=i: a[i], params)
    np.testing.assert_allclose(out[i], apply(one, x[i]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("label", LABELS)
def test_a_few_sgd_steps_lower_the_loss(label):
  model = _small(label)
  params = model.init(jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (8, 12, 8))
  y = jnp.arange(8) % 5
  mask = jnp.ones(8, bool)
  opt = optax.sgd(0.1)

  @jax.jit
  def loss(p):
    return masked_cross_entropy(model.apply(p, x, train=True), y, mask)

  @jax.jit
  def step(p, s):
    g = jax.grad(loss)(p)
    u, s = opt.update(g, s, p)
    return optax.apply_updates(p, u), s

  first, state = float(loss(params)), opt.init(params)
  for _ in range(5):
    params, state = step(params, state)
  assert float(loss(params)) < first


@pytest.mark.parametrize("dilation", [1, 2, 4])
def test_dilated_conv_matches_xla(dilation):
  x = jax.random.normal(jax.random.key(0), (2, 9, 7, 3))
  k = jax.random.normal(jax.random.key(1), (3, 3, 3, 4))
  a = dilated_conv(x, k, dilation, "matmul")
  b = dilated_conv(x, k, dilation, "xla")
  assert a.shape == (2, 9, 7, 4)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  # Output pixel (4, 3) by hand: Σ_ij x[4 + (i-1)d, 3 + (j-1)d] k[i, j] over in-range pixels.
  want = sum(np.asarray(x)[0, 4 + (i - 1) * dilation, 3 + (j - 1) * dilation] @ np.asarray(k)[i, j]
             for i in range(3) for j in range(3)
             if 0 <= 4 + (i - 1) * dilation < 9 and 0 <= 3 + (j - 1) * dilation < 7)
  np.testing.assert_allclose(a[0, 4, 3], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,kw,match", [
  ("mhattrnn", dict(cell="rnn"), "cell='rnn'"), ("mhattrnn", dict(heads=3), "heads=3"),
  ("mhattrnn", dict(norm="batch"), "norm='batch'"), ("resnet15", dict(norm="batch"), "norm='batch'"),
  ("resnet15", dict(conv_impl="fft"), "impl='fft'"),
])
def test_bad_options_raise(name, kw, match):
  with pytest.raises(ValueError, match=match):
    _count(build_model(name, example_shape=(12, 8), num_classes=5, **kw))
