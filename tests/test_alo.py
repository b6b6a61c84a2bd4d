"""ALO's options from the authors' code (lxcnju/FedKWS-UI): the private model as a second
classifier head of the global model (``private="head"``, difference (a) in
:mod:`fedtree.objectives.alo`) and the private step count ``int(ratio · E) + 1``
(``private_steps_ratio``, difference (b)), against hand-written per-client loops."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference_fedkws as ref
from helpers import client_data, close, row, tier_kw, tiny_mlp_problem

from fedtree.algorithms import fedavg
from fedtree.algorithms.optimization.fedkws.fedkws import fedkws
from fedtree.core import loop
from fedtree.core.local import LocalSchedule
from fedtree.core.metrics import make_evaluator
from fedtree.core.model import Model, from_flax
from fedtree.core.sampling import cohort_sampler
from fedtree.evaluation import evaluate_models
from fedtree.objectives.alo import PRIVATE, alo_update, ratio_steps, with_private_head

B = 4
LR = 0.1


@pytest.fixture(scope="module")
def setup():
  return tiny_mlp_problem(B)


def _differs(a, b):
  return any(float(jnp.abs(x - y).max()) > 1e-6 for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b),
                                                                  strict=True))


def test_head_mode_matches_per_client_loop(setup):
  """Clients' rounds (private head, then model) against the hand loop, one client at a time."""
  data, model, schedule = setup
  anchor = with_private_head(model, data.example_shape).init(jax.random.key(0))
  mu, lam, ratio = 0.3, 0.5, 0.5                   # a large λ so that the adversarial term shows
  upd = alo_update(model, optax.sgd(LR), mu=mu, lam=lam, batch_size=B, private="head",
                   private_steps_ratio=ratio, max_steps=schedule.max_steps(data.max_train))
  run = jax.jit(upd.apply)
  steps = schedule.num_steps(np.asarray(data.n_train))
  for c in (1, 2):                                 # 3 and 2 steps: 2 private steps each
    key = jax.random.key(10 + c)
    sent, _, _ = run(anchor, (), client_data(data, c), jnp.asarray(steps[c]), key)
    want = ref.alo_head_client(anchor, client_data(data, c), steps[c], int(ratio * int(steps[c])) + 1, key,
                               lr=LR, mu=mu, lam=lam, batch_size=B, num_classes=3)
    close(sent, want)


@pytest.mark.slow  # the vmapped cohort compiled: ~12 s of CPU here
def test_head_mode_cohort_matches_per_client_loop(setup):
  data, model, schedule = setup
  anchor = with_private_head(model, data.example_shape).init(jax.random.key(0))
  assert set(anchor) == {"model", "private_head"}
  shapes = jax.tree.map(jnp.shape, anchor)
  assert shapes["private_head"] == shapes["model"]["Dense_1"]
  assert _differs(anchor["private_head"], anchor["model"]["Dense_1"])         # initialized on its own
  mu, lam, ratio = 0.3, 0.5, 0.5                   # a large λ so that the adversarial term shows
  upd = alo_update(model, optax.sgd(LR), mu=mu, lam=lam, batch_size=B, private="head",
                   private_steps_ratio=ratio, max_steps=schedule.max_steps(data.max_train))
  assert upd.init_state is None                    # no per-client state: the head is in the model
  key = jax.random.key(3)
  sampler = cohort_sampler(np.zeros(data.num_clients, np.int32), None)
  res = tier_kw(upd, jax.tree.map(lambda a: a[None], anchor), sampler(key), data,
                     num_steps=schedule.num_steps(data.n_train), weights=data.n_train.astype(jnp.float32),
                     key=key, keep_client_params=True)
  steps = schedule.num_steps(np.asarray(data.n_train))
  for slot, c in enumerate(np.asarray(sampler(key).clients)):
    sent = ref.alo_head_client(anchor, client_data(data, c), steps[c], int(ratio * int(steps[c])) + 1,
                               jax.random.fold_in(key, c), lr=LR, mu=mu, lam=lam, batch_size=B,
                               num_classes=3)
    close(row(res.client_params, slot), sent)


def test_private_steps_ratio_counts_by_hand():
  # int(0.2 n) + 1 as the authors' code; 0 for a client that does not train.
  np.testing.assert_array_equal(ratio_steps(0.2, 12), [0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3])
  assert ratio_steps(0.7, 10)[10] == 8             # Python's 0.7 * 10 = 7.000000000000001
  assert ratio_steps(0.0, 3).tolist() == [0, 1, 1, 1]


def test_head_steps_freeze_the_encoder_and_count_int_ratio_steps_plus_one(setup):
  """With the model's optimizer at lr 0 only the private head moves, and it is the hand loop's
  head after exactly int(ratio · n) + 1 steps on the frozen encoder's features."""
  data, model, _ = setup
  anchor = with_private_head(model, data.example_shape).init(jax.random.key(1))
  ratio, n = 0.4, 5                                 # int(0.4 · 5) + 1 = 3 private steps
  upd = alo_update(model, optax.sgd(0.0), private_optimizer=optax.sgd(LR), mu=0.2, lam=0.5, batch_size=B,
                   max_steps=n, private="head", private_steps_ratio=ratio)
  key, cd = jax.random.key(2), client_data(data, 0)
  sent, state, _ = jax.jit(upd.apply)(anchor, (), cd, jnp.asarray(n), key)
  assert state == ()
  for a, b in zip(jax.tree.leaves(sent["model"]), jax.tree.leaves(anchor["model"]), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  def hand(k):
    return ref.alo_head_client(anchor, cd, 0, k, key, lr=LR, mu=0.2, lam=0.5, batch_size=B,
                               num_classes=3)["private_head"]

  close(sent["private_head"], hand(3))
  assert _differs(sent["private_head"], hand(2)) and _differs(sent["private_head"], hand(4))


@pytest.mark.slow  # two algorithms compiled: ~13 s of CPU here
def test_head_mode_without_smoothing_or_adversary_is_fedavg(setup):
  data, model, _ = setup
  kw = dict(model=model, data=data, local_optimizer=optax.sgd(0.05), cohort_size=3,
            schedule=LocalSchedule(batch_size=4, steps=3))
  alg = fedkws(alo=True, alt=False, mu=0.0, lam=0.0, private="head", private_steps_ratio=0.2, **kw)
  a = loop.run(alg, data, num_rounds=2, key=jax.random.key(1))
  plain = fedavg(**kw)
  b = loop.run(plain, data, num_rounds=2, key=jax.random.key(1))
  close(a.params[0]["model"], b.params[0], tol=1e-6)
  start = with_private_head(model, data.example_shape).init(jax.random.key(1))   # loop.run's init key
  assert _differs(row(a.params[0]["private_head"], 0), start["private_head"])   # the head was averaged in
  # models() and evaluation see the main head only, as the plain model.
  close(alg.models(a)["global"].params, plain.models(b)["global"].params, tol=1e-6)
  evaluator = make_evaluator(model)
  ea = evaluate_models(alg, a, model, data, evaluator=evaluator)
  eb = evaluate_models(plain, b, model, data, evaluator=evaluator)
  np.testing.assert_allclose(ea["global"]["accuracy"], eb["global"]["accuracy"])
  p, x = row(a.params[0], 0), data.x_test[0]
  np.testing.assert_array_equal(np.asarray(with_private_head(model, data.example_shape).apply(p, x)),
                                np.asarray(model.apply(p["model"], x)))


def test_head_mode_models_are_the_main_head_and_init_params_the_start(setup):
  data, model, _ = setup
  start = model.init(jax.random.key(9))
  alg = fedkws(model=model, data=data, local_optimizer=optax.sgd(LR), private="head",
               schedule=LocalSchedule(batch_size=4, steps=2), init_params=start)
  state = alg.init(jax.random.key(0))
  assert set(state.params[0]) == {"model", "private_head"}
  close(row(state.params[0]["model"], 0), start, tol=0)
  nm = alg.models(state)["global"]
  assert jax.tree.structure(nm.params) == jax.tree.structure(jax.tree.map(lambda a: a[None], start))
  summary = evaluate_models(alg, state, model, data)["global"]       # the plain model scores it
  assert 0.0 <= summary["accuracy"] <= 1.0


def test_ratio_under_alt_counts_the_base_steps(setup, monkeypatch):
  """Under ALT the ratio applies to the base E (the authors' ``int(0.2 · local_steps) + 1``):
  E = 7, ratio 0.2 is a fixed int(1.4) + 1 = 2 private steps for every client, whatever ALT
  gives it; without ALT the ratio goes to the objective (the client's own count)."""
  import importlib

  fedkws_module = importlib.import_module("fedtree.algorithms.optimization.fedkws.fedkws")

  seen = {}

  def spy(*args, **kw):
    seen.update(kw)
    return alo_update(*args, **kw)

  monkeypatch.setattr(fedkws_module, "alo_update", spy)
  data, model, _ = setup
  kw = dict(model=model, data=data, local_optimizer=optax.sgd(0.05), private="head",
            schedule=LocalSchedule(batch_size=4, steps=7), private_steps_ratio=0.2)
  fedkws(alt=True, **kw)
  assert seen["private_steps"] == 2 and seen["private_steps_ratio"] is None
  fedkws(alt=False, **kw)
  assert seen["private_steps"] is None and seen["private_steps_ratio"] == 0.2


class _Scaled(nn.Module):
  """Logits that are not an nn.Dense's output."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    return 2.0 * nn.Dense(3)(x)


@pytest.mark.parametrize("kw,match", [
  (dict(private="shared"), r"private='shared'; choose one of \('persistent', 'head'\)"),
  (dict(private_steps_ratio=-0.1), "private_steps_ratio=-0.1"),
  (dict(private_steps_ratio=float("nan")), "private_steps_ratio=nan"),
  (dict(private_steps=2, private_steps_ratio=0.2), "private_steps=2 and private_steps_ratio=0.2"),
])
def test_bad_options_raise(setup, kw, match):
  data, model, _ = setup
  assert PRIVATE == ("persistent", "head")
  with pytest.raises(ValueError, match=match):
    alo_update(model, optax.sgd(LR), mu=0.2, lam=0.1, batch_size=B, max_steps=2, **kw)
  with pytest.raises(ValueError, match=match):
    fedkws(model=model, data=data, local_optimizer=optax.sgd(LR),
           schedule=LocalSchedule(batch_size=4, steps=2), **kw)


def test_models_that_cannot_carry_a_second_head_are_refused(setup):
  data, model, _ = setup
  common = dict(data=data, local_optimizer=optax.sgd(LR), schedule=LocalSchedule(batch_size=4, steps=2))
  with pytest.raises(ValueError, match="ALO options"):
    fedkws(model=model, alo=False, private="head", **common)
  scaled = from_flax(_Scaled(), data.example_shape, 3)
  with pytest.raises(ValueError, match="nn.Dense"):
    fedkws(model=scaled, private="head", **common)
  lm = Model(init=model.init, apply=model.apply, num_classes=3, label_shape=(5,))
  with pytest.raises(ValueError, match=r"labels have shape \(5,\)"):
    with_private_head(lm, data.example_shape)
  # Head mode on a host whose params carry no private head (e.g. a plain FedAvg's).
  upd = alo_update(model, optax.sgd(LR), mu=0.2, lam=0.1, batch_size=B, max_steps=2, private="head")
  with pytest.raises(ValueError, match="with_private_head"):
    upd.apply(model.init(jax.random.key(0)), (), client_data(data, 0), jnp.asarray(2), jax.random.key(0))


@pytest.mark.slow  # a DS-CNN run compiled end to end
def test_fedkws_config_authors_run(tmp_path):
  """The config's run of the authors' code (differences (a)-(d) on), shrunk."""
  import math

  import ml_collections
  from config_files import load_config

  from fedtree.experiment.runner import train_and_evaluate

  c = load_config("fedkws")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress = 2, 2, 2, False
  c.data.update(dict(num_speakers=6, test_speakers=2, test_examples=6, frames=12, features=8,
                     max_examples=16))
  c.model.update(dict(width=4, blocks=1, first_kernel=(3, 3)))
  c.local.steps = 2
  c.runs = ml_collections.ConfigDict({"fedkws_ui_authors": c.runs.fedkws_ui_authors})
  c.runs.fedkws_ui_authors.cohort_size = 3
  c.run_order = ("fedkws_ui_authors",)
  s = train_and_evaluate(c, str(tmp_path))["fedkws_ui_authors"]["global"]
  assert 0.0 <= s["accuracy"] <= 1.0 and math.isfinite(s["loss"])
