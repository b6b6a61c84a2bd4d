"""FedMMD (Yao et al. 2018; paper 002's baseline): MMD² against numpy, the features of every
model, the vectorized client update against a per-client loop, λ = 0 is FedAvg, refusals."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference_fedkws as ref
from helpers import tier_kw, tiny_mlp_problem

from fedtree.algorithms import fedavg
from fedtree.algorithms.optimization.fedmmd import fedmmd
from fedtree.core import loop
from fedtree.core.local import ClientData, LocalSchedule
from fedtree.core.model import from_flax
from fedtree.core.sampling import cohort_sampler
from fedtree.models import build_model
from fedtree.objectives.fedmmd import check_features, fedmmd_update, mmd2, penultimate

B, LR = 4, 0.1


@pytest.fixture(scope="module")
def setup():
  return tiny_mlp_problem(B)


def _np_mmd2(a, b, kernel, num=5, mul=2.0, h=None):
  z = np.concatenate([a, b]).astype(np.float64)
  n = len(a)
  if kernel == "linear":
    k = z @ z.T
  else:
    d2 = ((z[:, None] - z[None]) ** 2).sum(-1)
    h0 = d2.sum() / (len(z) ** 2 - len(z)) if h is None else h
    k = sum(np.exp(-d2 / (h0 * mul ** (j - num // 2))) for j in range(num))
  return k[:n, :n].mean() + k[n:, n:].mean() - k[:n, n:].mean() - k[n:, :n].mean()


@pytest.mark.parametrize("kernel,kw", [("gaussian", {}), ("gaussian", dict(num_kernels=1, bandwidth=3.0)),
                                       ("gaussian", dict(num_kernels=3, kernel_mul=1.5)), ("linear", {})])
def test_mmd2_matches_numpy(kernel, kw):
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(5, 3)), rng.normal(0.5, 1.2, size=(5, 3))
  want = _np_mmd2(a, b, kernel, kw.get("num_kernels", 5), kw.get("kernel_mul", 2.0), kw.get("bandwidth"))
  mask = jnp.ones(5, bool)
  got = mmd2(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32), mask, kernel=kernel, **kw)
  np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-7)
  # Masked rows take no part: padding = the first 3 rows alone.
  pad = jnp.asarray([True, True, True, False, False])
  got3 = mmd2(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32), pad, kernel=kernel, **kw)
  want3 = _np_mmd2(a[:3], b[:3], kernel, kw.get("num_kernels", 5), kw.get("kernel_mul", 2.0),
                   kw.get("bandwidth"))
  np.testing.assert_allclose(float(got3), want3, rtol=1e-5, atol=1e-7)
  assert float(mmd2(jnp.asarray(a), jnp.asarray(a), mask, kernel=kernel, **kw)) == pytest.approx(0, abs=1e-6)
  assert float(mmd2(jnp.asarray(a), jnp.asarray(b), jnp.zeros(5, bool), kernel=kernel, **kw)) == 0.0


def test_linear_mmd2_is_the_distance_of_means():
  a, b = jnp.array([[0.0, 1.0], [2.0, 3.0]]), jnp.array([[1.0, 1.0], [1.0, 1.0]])
  # means (1, 2) and (1, 1): squared distance 1.
  assert float(mmd2(a, b, jnp.ones(2, bool), kernel="linear")) == pytest.approx(1.0)


def test_features_are_the_input_of_the_last_dense(setup):
  data, model, _ = setup
  params = model.init(jax.random.key(0))
  x = data.x_train[0, :5]
  feats, logits = penultimate(model, params, x)
  np.testing.assert_allclose(feats, ref.mlp_features(params, x), rtol=1e-6)
  np.testing.assert_allclose(logits, model.apply(params, x), rtol=1e-6)
  widths = {"dscnn": (dict(width=4, blocks=1), 4), "kwt": (dict(dim=8, depth=1, heads=2, mlp_dim=8), 8),
            "cnn": (dict(features=(2,), dense=7), 7), "resnet15": (dict(width=3, blocks=1), 3)}
  for name, (kw, d) in widths.items():
    assert check_features(build_model(name, example_shape=(8, 6), num_classes=5, **kw), (8, 6)) == d, name


class _Scaled(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    return 2.0 * nn.Dense(3)(x)


def test_models_without_features_are_refused(setup):
  data, _, _ = setup
  odd = from_flax(_Scaled(), data.example_shape, 3)
  with pytest.raises(ValueError, match="nn.Dense"):
    check_features(odd, data.example_shape)
  with pytest.raises(ValueError, match="sequence model"):
    check_features(build_model("lstm_lm", example_shape=(6,), num_classes=20), (6,))
  with pytest.raises(ValueError, match="nn.Dense"):
    fedmmd(model=odd, data=data, local_optimizer=optax.sgd(LR), schedule=LocalSchedule(batch_size=B),
           lam=0.1)


@pytest.mark.parametrize("kw,match", [
  (dict(lam=-1.0), "lam=-1.0"), (dict(lam=0.1, kernel="poly"), "kernel='poly'"),
  (dict(lam=0.1, num_kernels=0), "num_kernels=0"), (dict(lam=0.1, bandwidth=-1.0), "bandwidth=-1.0"),
  (dict(lam=0.1, kernel_mul=0.0), "kernel_mul=0.0"),
])
def test_bad_hyperparameters_raise(setup, kw, match):
  _, model, _ = setup
  with pytest.raises(ValueError, match=match):
    fedmmd_update(model, optax.sgd(LR), batch_size=B, max_steps=2, **kw)


@pytest.mark.slow  # the reference compiles a gradient per batch pattern: ~20 s on the shared CPU
def test_client_update_matches_per_client_loop(setup):
  data, model, _ = setup
  schedule = LocalSchedule(batch_size=B, steps=2)
  start = model.init(jax.random.key(0))
  lam = 2.0                       # large, so that the penalty shows
  upd = fedmmd_update(model, optax.sgd(LR), lam=lam, batch_size=B,
                      max_steps=schedule.max_steps(data.max_train))
  key = jax.random.key(3)
  sampler = cohort_sampler(np.zeros(data.num_clients, np.int32), None)
  res = tier_kw(upd, jax.tree.map(lambda a: a[None], start), sampler(key), data,
                     num_steps=schedule.num_steps(data.n_train), weights=data.n_train.astype(jnp.float32),
                     key=key, keep_client_params=True)
  steps = schedule.num_steps(np.asarray(data.n_train))
  plain = fedmmd_update(model, optax.sgd(LR), lam=0.0, batch_size=B,
                        max_steps=schedule.max_steps(data.max_train))
  res0 = tier_kw(plain, jax.tree.map(lambda a: a[None], start), sampler(key), data,
                      num_steps=schedule.num_steps(data.n_train), weights=data.n_train.astype(jnp.float32),
                      key=key, keep_client_params=True)
  cohort = [int(c) for c in np.asarray(sampler(key).clients)]
  wants = ref.fedmmd_clients(model, start, [ClientData(data.x_train[c], data.y_train[c], data.n_train[c])
                                            for c in cohort], [steps[c] for c in cohort],
                             [jax.random.fold_in(key, c) for c in cohort], lr=LR, lam=lam, batch_size=B)
  for slot, want in enumerate(wants):
    got = jax.tree.map(lambda a, slot=slot: a[slot], res.client_params)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
  moved = max(float(jnp.abs(a - b).max()) for a, b in
              zip(jax.tree.leaves(res.client_params), jax.tree.leaves(res0.client_params), strict=True))
  assert moved > 1e-4           # the penalty changed the update


def test_zero_lambda_is_fedavg(setup):
  data, model, _ = setup
  kw = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
            schedule=LocalSchedule(batch_size=B, steps=3), cohort_size=3)
  a = loop.run(fedmmd(lam=0.0, **kw), data, num_rounds=1, key=jax.random.key(1))
  b = loop.run(fedavg(**kw), data, num_rounds=1, key=jax.random.key(1))
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
