"""Server optimizers against hand-computed steps: FedAdam's bias-correction offset (Flower's
convention), learning-rate schedules, and optax chains built from a run config's dict."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from fedtree.core.server import fedopt, optimizer_from_config, schedule_from_config, server_optimizer

DELTAS = [np.array([0.5, -2.0]), np.array([-1.0, 0.25]), np.array([0.3, 0.3])]


def _steps(opt, deltas=DELTAS):
  """The params after applying ``opt`` to each pseudo-gradient in turn from zero."""
  params = jnp.zeros(2)
  state = opt.init(params)
  out = []
  for d in deltas:
    updates, state = opt.update(jnp.asarray(d, jnp.float32), state, params)
    params = optax.apply_updates(params, updates)
    out.append(np.asarray(params))
  return out


def _flower_fedadam(deltas, *, eta, b1, b2, tau):
  """Flower's FedAdam ``aggregate_fit``, written out: ``delta_t = aggregate - current``, which
  is minus fedtree's pseudo-gradient; ``server_round`` counts from 1."""
  x, m, v, out = np.zeros(2), np.zeros(2), np.zeros(2), []
  for server_round, d in enumerate(deltas, start=1):
    delta_t = -d
    m = b1 * m + (1 - b1) * delta_t
    v = b2 * v + (1 - b2) * delta_t * delta_t
    eta_norm = eta * np.sqrt(1 - b2 ** (server_round + 1.0)) / (1 - b1 ** (server_round + 1.0))
    x = x + eta_norm * m / (np.sqrt(v) + tau)
    out.append(x.copy())
  return out


def test_fedadam_with_flowers_offset_matches_flower():
  hp = dict(b1=0.9, b2=0.99, tau=1e-9)
  got = _steps(fedopt("adam", learning_rate=0.1, initial_accumulator=0.0, bias_correction=True,
                      bias_correction_offset=1, **hp))
  for g, want in zip(got, _flower_fedadam(DELTAS, eta=0.1, **hp), strict=True):
    np.testing.assert_allclose(g, want, rtol=1e-5)


def test_bias_correction_offset_zero_is_kingma_and_ba():
  b1, b2, tau, lr = 0.9, 0.99, 1e-3, 0.1
  got = _steps(fedopt("adam", learning_rate=lr, b1=b1, b2=b2, tau=tau, initial_accumulator=0.0,
                      bias_correction=True))
  x, m, v = np.zeros(2), np.zeros(2), np.zeros(2)
  for t, d in enumerate(DELTAS, start=1):
    m = b1 * m + (1 - b1) * d
    v = b2 * v + (1 - b2) * d * d
    x = x - lr * np.sqrt(1 - b2**t) / (1 - b1**t) * m / (np.sqrt(v) + tau)
    np.testing.assert_allclose(got[t - 1], x, rtol=1e-5)
  flower = _steps(fedopt("adam", learning_rate=lr, b1=b1, b2=b2, tau=tau, initial_accumulator=0.0,
                         bias_correction=True, bias_correction_offset=1))
  assert not np.allclose(flower[0], got[0])  # the offset matters at the first rounds


def test_fedopt_learning_rate_schedule():
  """FedAdagrad with ``η(count) = 0.2 · 0.5^count``, by hand (count = steps already taken)."""
  b1, tau = 0.9, 1e-3
  sched = optax.exponential_decay(0.2, transition_steps=1, decay_rate=0.5)
  got = _steps(fedopt("adagrad", learning_rate=sched, b1=b1, tau=tau))
  x, m, v = np.zeros(2), np.zeros(2), np.full(2, tau**2)
  for count, d in enumerate(DELTAS):
    m = b1 * m + (1 - b1) * d
    v = v + d * d
    x = x - 0.2 * 0.5**count * m / (np.sqrt(v) + tau)
    np.testing.assert_allclose(got[count], x, rtol=1e-5)
  # the same from a config, the schedule given as a dict
  cfg = {"name": "fedadagrad", "b1": b1, "tau": tau,
         "learning_rate": {"name": "exponential_decay", "init_value": 0.2, "transition_steps": 1,
                           "decay_rate": 0.5}}
  for a, b in zip(_steps(optimizer_from_config(cfg)), got, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_chain_from_config_clips_then_adams():
  cfg = {"name": "chain", "transforms": [{"name": "clip_by_global_norm", "max_norm": 1.0},
                                         {"name": "adam", "learning_rate": 0.01}]}
  deltas = [np.array([3.0, 4.0]), np.array([0.3, -0.4])]
  got = _steps(optimizer_from_config(cfg), deltas)
  x, m, v, b1, b2, eps = np.zeros(2), np.zeros(2), np.zeros(2), 0.9, 0.999, 1e-8
  for t, d in enumerate(deltas, start=1):
    g = d * min(1.0, 1.0 / np.linalg.norm(d))
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    x = x - 0.01 * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    np.testing.assert_allclose(got[t - 1], x, rtol=1e-5)
  np.testing.assert_allclose(got[0], [-0.01, -0.01], rtol=1e-5)  # Adam's first step: lr · sign


def test_config_dicts_from_ml_collections_and_fedavg_default():
  from fedtree.experiment.builders import server_from_config

  cfg = ml_collections.ConfigDict({"name": "chain", "transforms": [
    {"name": "clip_by_global_norm", "max_norm": 1.0}, {"name": "sgd", "learning_rate": 1.0}]})
  got = _steps(server_from_config(cfg), [np.array([3.0, 4.0])])
  np.testing.assert_allclose(got[0], [-0.6, -0.8], rtol=1e-6)
  np.testing.assert_allclose(_steps(optimizer_from_config(None))[0], -DELTAS[0], rtol=1e-6)


@pytest.mark.parametrize("cfg,match", [
  ({"name": "chain"}, "non-empty list 'transforms'"),
  ({"name": "chain", "transforms": [{"name": "adam", "learning_rate": 0.1}], "lr": 1},
   "non-empty list 'transforms'"),
  ({"name": "fedbogus"}, "neither one of"),
  ({"name": "sgd", "learning_rate": {"name": "bogus_schedule"}}, "schedule name='bogus_schedule'"),
  ("adam", "must be a dict"),
])
def test_bad_configs_name_the_allowed_values(cfg, match):
  with pytest.raises(ValueError, match=match):
    optimizer_from_config(cfg)


def test_bad_offset_and_schedule():
  with pytest.raises(ValueError, match="bias_correction_offset"):
    fedopt("adam", learning_rate=0.1, bias_correction_offset=-1)
  with pytest.raises(ValueError, match="choose one of"):
    schedule_from_config({"name": "_schedule"})


def test_server_optimizer_names():
  assert server_optimizer("fedavg") is not None and server_optimizer("adam", learning_rate=0.1)
  with pytest.raises(ValueError, match="neither one of"):
    server_optimizer("fedbogus")
  with pytest.raises(ValueError, match="needs a learning_rate"):
    server_optimizer("fedadam")
  with pytest.raises(ValueError, match="rejected hyperparameters"):
    server_optimizer("sgd", learning_rate=1.0, bogus=2)
