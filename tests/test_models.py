"""fedtree.models: names, and the matmul convolution and reshape max-pool against flax's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedtree.core.data import FederatedData
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


@pytest.mark.parametrize("shape", [(6, 3), (6, 4, 4, 3)])
def test_unbiased_running_variance_is_pytorchs_batchnorm(shape):
  """Issue 57 item 7: ``running_var="unbiased"`` keeps PyTorch's running variance (the batch's
  variance times ``n / (n − 1)``) and normalizes a training batch by the biased one, padded rows
  left out: two training batches, then evaluation, against ``torch.nn.BatchNorm1d/2d``; flax's
  (the default, ``"biased"``) misses its running variance by that factor."""
  import torch

  from fedtree.models.classifiers import batch_norm

  rng = np.random.default_rng(0)
  real = 4                                               # the last two rows are padding
  mask = jnp.arange(shape[0]) < real
  batches = [rng.normal(size=shape).astype(np.float32) * 3 + 1 for _ in range(2)]
  test = rng.normal(size=shape).astype(np.float32)

  def run(running_var):
    import flax.linen as nn

    class Net(nn.Module):
      @nn.compact
      def __call__(self, x, train):
        return batch_norm(x, train=train, mask=mask, name="BatchNorm_0", running_var=running_var)

    net = Net()
    v = net.init(jax.random.key(0), jnp.asarray(batches[0]), train=False)
    v = {**v, "params": {"BatchNorm_0": {"scale": jnp.asarray([0.5, 2.0, 1.5]),
                                         "bias": jnp.asarray([0.1, -0.2, 0.3])}}}
    outs = []
    for b in batches:
      y, upd = net.apply(v, jnp.asarray(b), train=True, mutable=["batch_stats"])
      v = {**v, **upd}
      outs.append(np.asarray(y)[:real])
    return v["batch_stats"]["BatchNorm_0"], outs, np.asarray(net.apply(v, jnp.asarray(test), train=False))

  def to_torch(a):   # channels first
    return torch.tensor(a) if len(shape) == 2 else torch.tensor(a).permute(0, 3, 1, 2)

  def from_torch(t):
    return t.detach().numpy() if len(shape) == 2 else t.detach().permute(0, 2, 3, 1).numpy()

  bn = (torch.nn.BatchNorm1d if len(shape) == 2 else torch.nn.BatchNorm2d)(3, momentum=0.1, eps=1e-5)
  with torch.no_grad():
    bn.weight.copy_(torch.tensor([0.5, 2.0, 1.5]))
    bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
  bn.train()
  want_train = [from_torch(bn(to_torch(b[:real]))) for b in batches]
  bn.eval()
  want_test = from_torch(bn(to_torch(test)))

  stats, got_train, got_test = run("unbiased")
  np.testing.assert_allclose(np.asarray(stats["var"]), bn.running_var.numpy(), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(stats["mean"]), bn.running_mean.numpy(), rtol=1e-5, atol=1e-6)
  for g, w in zip(got_train, want_train, strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got_test, want_test, rtol=1e-4, atol=1e-5)
  biased, _, _ = run("biased")                           # flax's: the batches' biased variance
  assert not np.allclose(np.asarray(biased["var"]), bn.running_var.numpy(), rtol=1e-3)


def test_running_var_is_a_model_field_and_refused_where_it_cannot_apply():
  from fedtree.models import model_fields

  for name in ("mlp", "cnn", "resnet18"):
    assert "running_var" in model_fields(name), name
  mlp = build_model("mlp", example_shape=(3,), num_classes=2, hidden=(4,), norm="batch",
                    running_var="unbiased")
  params = mlp.init(jax.random.key(0))
  assert set(params["batch_stats"]["BatchNorm_0"]) == {"mean", "var"}
  with pytest.raises(ValueError, match=r"mlp running_var='unbiased' is a BatchNorm's: it needs "
                                       r"norm='batch' \(got norm='none'; from the command line "
                                       r"--config.model.norm=batch\)"):
    build_model("mlp", example_shape=(3,), num_classes=2, hidden=(4,), running_var="unbiased").init(
      jax.random.key(0))
  with pytest.raises(ValueError, match=r"running_var='torch'; choose one of \('biased', 'unbiased'\)"):
    build_model("mlp", example_shape=(3,), num_classes=2, norm="batch", running_var="torch").init(
      jax.random.key(0))
