"""Issue 51, depth-scaled sub-models: DepthFL (Kim et al. 2023) against a per-client loop that builds each
sampled client's truncated network (its first blocks and their exits, nothing deeper), trains it on the
paper's loss written out (the exits' cross-entropies plus, for each exit, the mean KL divergence from the
other exits' fixed predictions) and averages every block and exit over its holders in numpy; the exits'
forward against the MLP's own; the evaluation's views; the refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from reference_baselines import close, run_jit, small_problem, start
from reference_heterogeneous import depthfl_reference

from fedtree.algorithms import depthfl
from fedtree.algorithms.heterogeneous.depthfl import exit_forward, exit_model
from fedtree.core.local import LocalSchedule
from fedtree.models import build_model

LR, STEPS, BS, SHARES = 0.1, 3, 4, (0.3, 0.3, 0.4)


@pytest.fixture(scope="module")
def problem():
  data, _, _ = small_problem()
  return data, build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(6, 4))


def test_depthfl_is_the_per_client_loop_of_truncated_networks(problem):
  data, model = problem
  alg = depthfl(model=model, data=data, local_optimizer=optax.sgd(LR), proportions=SHARES, cohort_size=5,
                schedule=LocalSchedule(batch_size=BS, steps=STEPS))
  key = jax.random.key(1)
  state, metrics = run_jit(alg, data, 3, key)
  got = jax.tree.map(lambda p: p[0], state.params[0])
  want = depthfl_reference(data, start(alg), 3, key, cohort_size=5, shares=SHARES, lr=LR, steps=STEPS,
                           batch_size=BS)
  close({**got["body"], **got["exits"]}, want, atol=5e-5)
  models = alg.models(state)
  assert sorted(models) == ["depth_1", "depth_2", "depth_3", "global", "own_depth"]
  assert float(metrics["uplink_bytes"]) > 0


def test_central_privacy_divides_each_block_by_its_expected_holders(problem):
  """Differential privacy's clipping and central noise (without noise) as the width methods take them:
  the loop of truncated networks whose clipped updates are summed and each block divided by its expected
  reporting holders; local noise is refused."""
  from fedtree.core.updates import UpdatePath, chain
  from fedtree.toolbox import privacy as dp

  data, model = problem
  path = UpdatePath(client=dp.clip(0.05), node=dp.central(0.0, 0.05, normalize="fixed", expected_weight=5.0))
  kw = dict(model=model, data=data, local_optimizer=optax.sgd(LR), proportions=SHARES, cohort_size=5,
            schedule=LocalSchedule(batch_size=BS, steps=STEPS), weighting="uniform")
  alg = depthfl(update_paths=path, **kw)
  key = jax.random.key(1)
  state, _ = run_jit(alg, data, 3, key)
  got = jax.tree.map(lambda p: p[0], state.params[0])
  want = depthfl_reference(data, start(alg), 3, key, cohort_size=5, shares=SHARES, lr=LR, steps=STEPS,
                           batch_size=BS, clip=0.05, expected_weight=5.0)
  close({**got["body"], **got["exits"]}, want, atol=5e-5)
  # local noise stays on the blocks a client holds: with no training the last block moves exactly in the
  # rounds that drew a client deep enough to hold it
  from fedtree.algorithms.heterogeneous.width import client_levels
  from fedtree.core.rng import stream
  from fedtree.core.sampling import cohort_sampler

  noisy = UpdatePath(client=chain(dp.clip(0.5), dp.local_noise(2.0, 0.5)))
  alg = depthfl(update_paths=noisy, **{**kw, "local_optimizer": optax.sgd(0.0), "cohort_size": 2})
  deep = client_levels(np.asarray(SHARES), data.num_clients, 0) == 2
  sampler = cohort_sampler(np.zeros(data.num_clients, np.int32), 2)
  state, step, seen = alg.init(jax.random.key(0)), jax.jit(alg.round), set()
  for r in range(10):
    new, _ = step(state, data, jax.random.key(r))
    moved = bool(np.any(np.asarray(new.params[0]["body"]["Dense_2"]["kernel"] !=
                                   state.params[0]["body"]["Dense_2"]["kernel"])))
    drew = bool(deep[np.asarray(sampler(stream(jax.random.key(r), "cohort")).clients)].any())
    assert moved == drew, r
    seen.add(drew)
    state = new
  assert seen == {True, False}


def test_the_exits_and_the_evaluation_views(problem):
  data, model = problem
  wrapped = exit_model(model, 3)
  p = wrapped.init(jax.random.key(0))
  x = jnp.asarray(data.x_train[0])
  np.testing.assert_array_equal(exit_forward(p, x, 3)[-1], model.apply(p["body"], x))   # the last exit
  z = exit_forward(p, x, 3)
  np.testing.assert_allclose(wrapped.apply(p, x), z.mean(0), rtol=1e-6, atol=1e-6)   # the ensemble
  one = {**p, "ensemble": jnp.asarray([0.0, 1.0, 0.0])}
  np.testing.assert_allclose(wrapped.apply(one, x), z[1], rtol=1e-6, atol=1e-6)      # one exit
  with pytest.raises(ValueError, match=r"depthfl: depths=\[0, 2\] must be distinct block counts in 1..3"):
    depthfl(model=model, data=data, local_optimizer=optax.sgd(LR), depths=(0, 2),
            schedule=LocalSchedule(batch_size=BS, steps=1))
  cnn = build_model("cnn", example_shape=(8, 8), num_classes=3, features=(4,), dense=6)
  from fedtree.datasets.synthetic import grouped_synthetic

  images, _ = grouped_synthetic(group_sizes=(2,), dim=64, num_classes=3, seed=0)
  images = images.replace(x_train=images.x_train.reshape(images.x_train.shape[:2] + (8, 8)),
                          x_test=images.x_test.reshape(images.x_test.shape[:2] + (8, 8)))
  with pytest.raises(ValueError, match="depthfl needs an mlp model"):
    depthfl(model=cnn, data=images, local_optimizer=optax.sgd(LR), schedule=LocalSchedule(batch_size=BS,
                                                                                           steps=1))
