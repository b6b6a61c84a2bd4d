"""fedtree.models: names, and the matmul convolution and reshape max-pool against flax's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedtree.core.data import (
  FederatedData,
)
from fedtree.models import build_model


def test_model_names():
  with pytest.raises(ValueError, match="unknown; choose one of"):
    build_model("resnet9000", example_shape=(3,), num_classes=2)
  cnn = build_model("cnn", example_shape=(8, 8, 3), num_classes=4, features=(4,), dense=8)
  logits = cnn.apply(cnn.init(jax.random.key(0)), jnp.zeros((2, 8, 8, 3)), train=True, rng=jax.random.key(1))
  assert logits.shape == (2, 4)
  assert isinstance(FederatedData, type)


def test_matmul_conv_equals_xla_conv_in_value_and_gradient():
  from fedtree.models import CNN

  x = jax.random.normal(jax.random.key(0), (2, 10, 10, 3))
  a = CNN(num_classes=4, features=(5, 6), dense=8, conv_impl="matmul")
  b = CNN(num_classes=4, features=(5, 6), dense=8, conv_impl="xla")
  params = a.init(jax.random.key(1), x)["params"]
  assert jax.tree.structure(params) == jax.tree.structure(b.init(jax.random.key(1), x)["params"])
  np.testing.assert_allclose(a.apply({"params": params}, x), b.apply({"params": params}, x),
                             rtol=1e-4, atol=1e-5)
  ga = jax.grad(lambda p: jnp.sum(a.apply({"params": p}, x) ** 2))(params)
  gb = jax.grad(lambda p: jnp.sum(b.apply({"params": p}, x) ** 2))(params)
  jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-3, atol=1e-4), ga, gb)
  with pytest.raises(ValueError, match="conv impl='fft'"):
    CNN(num_classes=4, conv_impl="fft").init(jax.random.key(1), x)


@pytest.mark.parametrize("shape", [(2, 8, 6, 3), (2, 7, 9, 4)])
def test_reshape_max_pool_equals_flax_max_pool_in_value_and_gradient(shape):
  import flax.linen as nn

  from fedtree.models import max_pool

  x = jax.random.normal(jax.random.key(0), shape)  # continuous: no tied maxima
  np.testing.assert_array_equal(max_pool(x), nn.max_pool(x, (2, 2), strides=(2, 2)))
  ga = jax.grad(lambda v: jnp.sum(jnp.sin(max_pool(v))))(x)
  gb = jax.grad(lambda v: jnp.sum(jnp.sin(nn.max_pool(v, (2, 2), strides=(2, 2)))))(x)
  np.testing.assert_allclose(ga, gb, rtol=1e-6)
  assert int(jnp.sum(ga != 0)) == x.shape[0] * (shape[1] // 2) * (shape[2] // 2) * shape[3]
