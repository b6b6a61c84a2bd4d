"""The standard tasks' models (fedtree.models.vision, the named LSTMs): parameter counts against
counts made by hand from each reference's layer list, a cohort vmap equal to a per-client loop, the
two convolution paths equal, BatchNorm's state kept clear of padding (and the BatchNorm ResNet
trained under FedAvg), inputs refused by the model's name, and every model's client step measured
by the memory estimate."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedtree.core import tuning
from fedtree.experiment import memory
from fedtree.models import STANDARD_MODELS, build_model
from fedtree.models.vision import FedAvgCNN, ResNet18, ResNet18AFO, max_pool_strided, pad_same


# ------------------------------------------------------------ counts by hand from the layer lists
def conv(k, cin, cout, bias=True):
  return k * k * cin * cout + (cout if bias else 0)


def dense(i, o):
  return i * o + o


def norm(c):          # GroupNorm / BatchNorm: a scale and an offset per channel
  return 2 * c


def lstm(inp, hidden):   # Keras / TF LSTM: kernel, recurrent kernel, one bias of 4 hidden
  return 4 * hidden * (inp + hidden + 1)


def fedavg_cnn(k, hidden=512):   # emnist_models.create_original_fedavg_cnn_model / LEAF femnist/cnn.py
  return conv(5, 1, 32) + conv(5, 32, 64) + dense(7 * 7 * 64, hidden) + dense(hidden, k)


def afo_emnist_cnn(k):           # emnist_models.create_conv_dropout_model
  return conv(3, 1, 32) + conv(3, 32, 64) + dense(12 * 12 * 64, 128) + dense(128, k)


def lenet5(cin, k):              # C1, C3, C5 (dense from 5x5x16), F6, output
  return conv(5, cin, 6) + conv(5, 6, 16) + dense(400, 120) + dense(120, 84) + dense(84, k)


def flgo_cnn(k):                 # flgo/benchmark/cifar10_classification/model/cnn.py
  return conv(5, 3, 64) + conv(5, 64, 64) + dense(1600, 384) + dense(384, 192) + dense(192, k)


def resnet18_cifar(k):           # kuangliu/pytorch-cifar ResNet18: bias-free convs, a norm after each
  total = conv(3, 3, 64, False) + norm(64)
  cin = 64
  for f in (64, 128, 256, 512):
    for _ in range(2):
      total += conv(3, cin, f, False) + norm(f) + conv(3, f, f, False) + norm(f)
      if cin != f:
        total += conv(1, cin, f, False) + norm(f)
      cin = f
  return total + dense(512, k)


def resnet18_imagenet(k):        # torchvision resnet18 (pfl-research's FLAIR model): a 7x7 stem
  return resnet18_cifar(k) - conv(3, 3, 64, False) + conv(7, 3, 64, False)


def resnet18_afo(k):             # resnet_models.create_resnet18: v2 blocks, no stride in the stages
  total = conv(7, 3, 64, False) + norm(64)
  cin = 64
  for s, f in enumerate((64, 128, 256, 512)):
    for b in range(2):
      total += (0 if s == b == 0 else norm(cin)) + conv(3, cin, f, False) + norm(f) + conv(3, f, f, False)
      if cin != f:
        total += conv(1, cin, f, False) + norm(f)
      cin = f
  return total + norm(512) + dense(512, k)


def vgg11(k):                    # FedNova models/vgg.py: configuration A, 3 dense layers
  chans = [3, 64, 128, 256, 256, 512, 512, 512, 512]
  convs = sum(conv(3, a, b) for a, b in zip(chans[:-1], chans[1:], strict=True))
  return convs + 2 * dense(512, 512) + dense(512, k)


def char_lstm(v):                # shakespeare_models.create_recurrent_model / LEAF stacked_lstm.py
  return v * 8 + lstm(8, 256) + lstm(256, 256) + dense(256, v)


def so_lstm(v):                  # stackoverflow_models.create_recurrent_model (defaults)
  return v * 96 + lstm(96, 670) + dense(670, 96) + dense(96, v)


REFERENCE = [
  # (name, example shape, classes, kwargs, reference count, the reference's own statement if any)
  ("fedavg_cnn", (28, 28, 1), 10, {}, fedavg_cnn(10), 1_663_370),   # McMahan et al. 2017 / TFF's docstring
  ("fedavg_cnn", (28, 28, 1), 62, {}, fedavg_cnn(62), None),
  ("leaf_cnn", (28, 28, 1), 62, {}, fedavg_cnn(62, 2048), None),
  ("emnist_cnn", (28, 28, 1), 62, {}, afo_emnist_cnn(62), None),
  ("lenet5", (28, 28, 1), 10, {}, lenet5(1, 10), None),
  ("lenet5", (32, 32, 3), 10, {}, lenet5(3, 10), None),
  ("flgo_cnn", (32, 32, 3), 10, {}, flgo_cnn(10), None),
  ("resnet18", (32, 32, 3), 10, {}, resnet18_cifar(10), None),
  ("resnet18", (32, 32, 3), 100, {}, resnet18_cifar(100), None),
  ("resnet18", (64, 64, 3), 17, {"stem": "imagenet", "groups": 32}, resnet18_imagenet(17), None),
  ("resnet18", (64, 64, 3), 1000, {"stem": "imagenet"}, resnet18_imagenet(1000), 11_689_512),  # torchvision's
  ("resnet18_afo", (24, 24, 3), 100, {}, resnet18_afo(100), None),
  ("vgg11", (32, 32, 3), 10, {}, vgg11(10), None),
  ("shakespeare_lstm", (80,), 90, {}, char_lstm(90), None),
  ("shakespeare_lstm", (80,), 80, {}, char_lstm(80), None),
  ("stackoverflow_lstm", (20,), 10_004, {}, so_lstm(10_004), None),
]


def n_params(model):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(jax.eval_shape(model.init, jax.random.key(0))))


@pytest.mark.parametrize("name,shape,k,kwargs,want,stated", REFERENCE)
def test_parameter_count_is_the_references(name, shape, k, kwargs, want, stated):
  if stated is not None:
    assert want == stated          # the hand count agrees with the number the reference states
  assert n_params(build_model(name, example_shape=shape, num_classes=k, **kwargs)) == want


def test_the_counts_stated_in_the_docstrings():
  """The figures the docstrings state (a docstring figure is what the code gives)."""
  assert (fedavg_cnn(62), fedavg_cnn(62, 2048), afo_emnist_cnn(62), lenet5(1, 10), lenet5(3, 10)) == (
    1_690_046, 6_603_710, 1_206_590, 61_706, 62_006)
  assert (flgo_cnn(10), resnet18_cifar(10), resnet18_cifar(100), resnet18_afo(100), vgg11(10)) == (
    797_962, 11_173_962, 11_220_132, 11_227_812, 9_750_922)
  assert resnet18_imagenet(17) == 11_185_233
  assert (char_lstm(90), char_lstm(80), so_lstm(10_004)) == (820_522, 817_872, 4_050_748)


def test_every_standard_model_has_a_reference_count():
  assert {r[0] for r in REFERENCE} == set(STANDARD_MODELS)


# ------------------------------------------------------------ a cohort: vmap equals a loop
SMALL = {
  # small versions (same layers, fewer channels / units) for the numerical tests
  "fedavg_cnn": ((12, 12, 1), 5, {"dense": 16}),
  "leaf_cnn": ((12, 12, 1), 5, {"dense": 16}),
  "emnist_cnn": ((10, 10, 1), 5, {"features": (4, 8), "dense": 8}),
  "lenet5": ((28, 28, 1), 5, {}),
  "flgo_cnn": ((16, 16, 3), 5, {}),
  "resnet18": ((8, 8, 3), 5, {"width": 4}),
  "resnet18_afo": ((9, 9, 3), 5, {"width": 4}),
  "vgg11": ((32, 32, 3), 5, {"width": 4}),
  "shakespeare_lstm": ((7,), 11, {"hidden": 6}),
  "stackoverflow_lstm": ((6,), 13, {"hidden": 6, "embed": 5, "projection": 5}),
}


def small(name):
  shape, k, kwargs = SMALL[name]
  return build_model(name, example_shape=shape, num_classes=k, **kwargs), shape, k


def inputs(model, shape, k, key, batch=3):
  if model.input_dtype == "int32":
    return jax.random.randint(key, (batch,) + shape, 0, k)
  return jax.random.normal(key, (batch,) + shape)


# slow to compile on a CPU, or the same class as a fast case (leaf_cnn: FedAvgCNN; emnist_cnn: the
# CNN test_models covers; shakespeare_lstm: LSTMLM as stackoverflow_lstm): marked slow
HEAVY = ("resnet18", "resnet18_afo", "vgg11", "leaf_cnn", "emnist_cnn", "shakespeare_lstm")


@pytest.mark.parametrize("name", [n if n not in HEAVY else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(SMALL)])
def test_a_cohort_vmapped_equals_each_client_alone(name):
  model, shape, k = small(name)
  keys = jax.random.split(jax.random.key(1), 3)
  stacked = jax.vmap(model.init)(keys)                                   # 3 clients' parameters
  x = jnp.stack([inputs(model, shape, k, jax.random.key(i)) for i in range(3)])
  together = jax.jit(jax.vmap(lambda p, xc: model.apply(p, xc)))(stacked, x)
  for c in range(3):
    alone = model.apply(jax.tree.map(lambda a, c=c: a[c], stacked), x[c])
    np.testing.assert_allclose(np.asarray(together[c]), np.asarray(alone), rtol=2e-4, atol=2e-5)
  assert together.shape[-1] == k


@pytest.mark.parametrize("cls,kwargs,shape", [
  (FedAvgCNN, {"dense": 8}, (9, 9, 1)),               # "same" 5x5 convolutions, odd size pooled "same"
  pytest.param(ResNet18AFO, {"width": 4}, (9, 9, 3), marks=pytest.mark.slow),  # 7x7 stride-2 stem
  pytest.param(ResNet18, {"width": 4, "norm": "group"}, (7, 7, 2), marks=pytest.mark.slow),  # stride 2
])
def test_both_convolution_paths_give_the_same_function(cls, kwargs, shape):
  x = jax.random.normal(jax.random.key(0), (2,) + shape)
  ref = cls(num_classes=3, conv_impl="xla", **kwargs)
  params = ref.init(jax.random.key(1), x)
  want = ref.apply(params, x)
  got = cls(num_classes=3, conv_impl="matmul", **kwargs).apply(params, x)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


def test_same_padding_and_overlapping_pooling_match_xla():
  """Keras' "same" padding and a 3x3 / stride-2 max pool against lax's own."""
  x = jax.random.normal(jax.random.key(0), (2, 7, 6, 3))
  want = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
  np.testing.assert_array_equal(np.asarray(max_pool_strided(pad_same(x, 3, 2, -jnp.inf), 3, 2)),
                                np.asarray(want))
  k = jax.random.normal(jax.random.key(1), (5, 5, 3, 4))
  want = jax.lax.conv_general_dilated(x, k, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
  got = jax.lax.conv_general_dilated(pad_same(x, 5, 2), k, (2, 2), "VALID",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------ BatchNorm: the module, with its state
def test_batchnorm_resnet_variables_are_params_and_batch_stats():
  """The flax variables of the BatchNorm ResNet-18 (nothing compiled): ``{"params", "batch_stats"}``,
  the parameters those of the GroupNorm version, a mean and a variance per normalized channel."""
  x = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
  bn = jax.eval_shape(ResNet18(num_classes=10, norm="batch").init, jax.random.key(0), x)
  gn = jax.eval_shape(ResNet18(num_classes=10).init, jax.random.key(0), x)
  assert set(bn) == {"params", "batch_stats"} and set(gn) == {"params"}
  assert jax.tree.map(lambda a: a.shape, bn["params"]) == jax.tree.map(lambda a: a.shape, gn["params"])
  assert sum(int(np.prod(a.shape)) for a in jax.tree.leaves(bn["params"])) == resnet18_cifar(10)
  stats = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(bn["batch_stats"]))
  # a mean and a variance per channel of every norm: the stem, 4 in stage 1, 5 in stages 2-4
  assert stats == 2 * (64 + 4 * 64 + 5 * 128 + 5 * 256 + 5 * 512) == 9600


@pytest.mark.slow
def test_batchnorm_resnet_keeps_padding_out_of_its_statistics():
  """The flax module alone (models with state are the engine's next step): variables are
  ``{"params", "batch_stats"}``, training updates the running statistics from the real rows only,
  evaluation reads them, and the parameters are those of the GroupNorm version."""
  m = ResNet18(num_classes=4, norm="batch", width=4)
  x = jax.random.normal(jax.random.key(0), (4, 8, 8, 3))
  variables = m.init(jax.random.key(1), x, train=False)
  assert set(variables) == {"params", "batch_stats"}
  gn = ResNet18(num_classes=4, norm="group", width=4).init(jax.random.key(1), x)["params"]
  assert sum(a.size for a in jax.tree.leaves(variables["params"])) == sum(a.size for a in jax.tree.leaves(gn))
  mask = jnp.array([True, True, False, False])
  y, new = m.apply(variables, x, train=True, mask=mask, mutable=["batch_stats"])
  noisy = x.at[2:].set(1e3)                                   # garbage in the padded rows
  y2, new2 = m.apply(variables, noisy, train=True, mask=mask, mutable=["batch_stats"])
  np.testing.assert_allclose(np.asarray(y[:2]), np.asarray(y2[:2]), rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(new2), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), new["batch_stats"], variables["batch_stats"])
  assert max(jax.tree.leaves(moved)) > 0                      # the statistics did move
  out = m.apply({**variables, "batch_stats": new["batch_stats"]}, x, train=False)
  assert out.shape == (4, 4) and np.isfinite(np.asarray(out)).all()


def test_batchnorm_resnet_is_a_model_with_state():
  model = build_model("resnet18", example_shape=(32, 32, 3), num_classes=10, norm="batch", width=4)
  assert model.state == ("batch_stats",)
  shapes = jax.eval_shape(model.init, jax.random.key(0))
  assert set(shapes) == {"params", "batch_stats"}


@pytest.mark.slow   # compiles a vmapped ResNet-18 round
def test_batchnorm_resnet_trains_under_fedavg_and_moves_its_statistics():
  import optax

  from fedtree.algorithms import fedavg
  from fedtree.core.data import FederatedData, as_device
  from fedtree.core.local import LocalSchedule

  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 6, 32, 32, 3)).astype(np.float32)
  y = rng.integers(0, 4, size=(3, 6)).astype(np.int32)
  n = np.array([6, 4, 5], np.int32)
  data = as_device(FederatedData(x_train=x, y_train=y, n_train=n, x_test=x, y_test=y, n_test=n,
                                 num_classes=4))
  model = build_model("resnet18", example_shape=(32, 32, 3), num_classes=4, norm="batch", width=4)
  alg = fedavg(model=model, data=data, local_optimizer=optax.sgd(0.05),
               schedule=LocalSchedule(batch_size=4, steps=2))
  s0 = alg.init(jax.random.key(0))
  s1, m = jax.jit(alg.round)(s0, data, jax.random.key(1))
  assert np.isfinite(float(m["train_loss"]))
  moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), s1.params[0]["batch_stats"],
                       s0.params[0]["batch_stats"])
  assert max(jax.tree.leaves(moved)) > 0


# ------------------------------------------------------------ inputs refused by the model's name
@pytest.mark.parametrize("name,shape,match", [
  ("vgg11", (28, 28, 1), "'vgg11' takes images whose sides are between 32 and 63"),
  ("lenet5", (64, 64, 3), "'lenet5' takes images whose sides are between 1 and 32"),
  ("flgo_cnn", (8, 8, 1), "'flgo_cnn' takes images whose sides are at least 16"),
  ("fedavg_cnn", (20,), r"'fedavg_cnn' takes images \[H, W\] or \[H, W, C\].*\(20,\)"),
  ("resnet18_afo", (2, 3, 4, 5), "'resnet18_afo' takes images"),
  ("shakespeare_lstm", (28, 28, 1), r"'shakespeare_lstm' takes sentences of T token ids.*\(28, 28, 1\)"),
  ("stackoverflow_lstm", (8, 8), "'stackoverflow_lstm' takes sentences"),
])
def test_inputs_a_model_cannot_take_are_refused_by_name(name, shape, match):
  with pytest.raises(ValueError, match=match):
    build_model(name, example_shape=shape, num_classes=10)


# ------------------------------------------------------------ the memory estimate sees every model
@pytest.mark.parametrize("name", ["fedavg_cnn", "shakespeare_lstm"])
def test_a_client_step_of_the_model_is_in_the_memory_estimate(name):
  model, shape, _ = small(name)
  step = tuning.client_step_bytes(model, optax.sgd(0.1), shape, 4)
  assert step > 0
  line = memory.check_memory("run", state_bytes=1000, step_bytes=step, chunk=3, limit=None, source="test")
  assert f"3 x {memory._gib(step)} per client step" in line


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(SMALL) - {"fedavg_cnn", "shakespeare_lstm"}))
def test_every_standard_model_has_a_measured_client_step(name):
  model, shape, _ = small(name)
  assert tuning.client_step_bytes(model, optax.sgd(0.1), shape, 4) > 0
