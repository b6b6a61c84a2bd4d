"""FedKWS-UI (paper 002): ALO vs a per-client loop, ALT step counts, false accept/reject
rates, MFCC, the Speech Commands directory loader, the DS-CNN, compile-once, bad
hyperparameters, and configs/fedkws.py end to end (shrunk)."""

import math
import os
import wave

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference_fedkws as ref
from config_files import load_config
from helpers import client_data, close, count_traces, one_server_tier, row, tier_kw, tiny_mlp_problem

from fedtree.algorithms.optimization.fedkws.alt import alt_schedule, alt_steps, client_utility
from fedtree.algorithms.optimization.fedkws.fedkws import fedkws
from fedtree.core import loop
from fedtree.core.data import FederatedData
from fedtree.core.local import ClientData, LocalSchedule, sgd_client_update
from fedtree.core.metrics import evaluate, keyword_rates, keyword_split, summarize
from fedtree.core.sampling import cohort_sampler
from fedtree.datasets import speech_commands as sc
from fedtree.datasets.mfcc import MFCC
from fedtree.datasets.synthetic_kws import synthetic_kws
from fedtree.experiment.runner import train_and_evaluate
from fedtree.models import build_model
from fedtree.objectives.alo import alo_loss, alo_update

B = 4
LR = 0.1


@pytest.fixture(scope="module")
def setup():
  return tiny_mlp_problem(B)


# ------------------------------------------------------------------------ ALO
def test_alo_update_matches_per_client_loop(setup):
  data, model, schedule = setup
  start = model.init(jax.random.key(0))
  mu, lam = 0.3, 0.5            # a large λ so that the adversarial term shows
  upd = alo_update(model, optax.sgd(LR), mu=mu, lam=lam, batch_size=B,
                   max_steps=schedule.max_steps(data.max_train))
  state0 = upd.init_state(model.init(jax.random.key(7)), data.num_clients)   # private != global
  key = jax.random.key(3)
  res = one_server_tier(upd, data, start, key, schedule, client_state=state0)
  steps = schedule.num_steps(np.asarray(data.n_train))
  sampled = cohort_sampler(np.zeros(data.num_clients, np.int32), None)(key).clients
  for slot, c in enumerate(np.asarray(sampled)):
    cd = client_data(data, c)
    sent, private = ref.alo_client(model, start, row(state0.private, c), cd, steps[c],
                                   jax.random.fold_in(key, c), lr=LR, mu=mu, lam=lam, batch_size=B)
    close(row(res.client_params, slot), sent)
    close(row(res.client_state.private, c), private)


def test_alo_with_zero_mu_and_lambda_is_plain_local_training(setup):
  data, model, schedule = setup
  start = model.init(jax.random.key(1))
  max_steps = schedule.max_steps(data.max_train)
  upd = alo_update(model, optax.sgd(LR), mu=0.0, lam=0.0, batch_size=B, max_steps=max_steps)
  plain = sgd_client_update(model, optax.sgd(LR), batch_size=B, max_steps=max_steps)
  key = jax.random.key(5)
  a = one_server_tier(upd, data, start, key, schedule, upd.init_state(start, data.num_clients))
  b = one_server_tier(plain, data, start, key, schedule)
  close(a.client_params, b.client_params, tol=1e-6)
  close(a.delta_sum, b.delta_sum, tol=1e-6)


def test_alo_loss_terms():
  logits = jnp.array([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]])
  private = jnp.array([[0.0, 3.0, 0.0], [1.0, 0.0, 0.0]])
  y, mask = jnp.array([0, 2]), jnp.array([True, False])
  logp = np.asarray(jax.nn.log_softmax(logits))[0]
  q = np.asarray(jax.nn.softmax(private))[0]
  mu, lam = 0.2, 0.01
  want = -((1 - mu) * logp[0] + mu / 3 * logp.sum()) + lam * np.sum(q * logp)
  np.testing.assert_allclose(float(alo_loss(logits, private, y, mask, mu=mu, lam=lam)), want, rtol=1e-6)
  # The private model gets no gradient.
  g = jax.grad(lambda p: alo_loss(logits, p, y, mask, mu=mu, lam=lam))(private)
  assert float(jnp.abs(g).max()) == 0.0


def test_alo_private_models_of_unsampled_clients_are_untouched(setup):
  data, model, schedule = setup
  start = model.init(jax.random.key(0))
  upd = alo_update(model, optax.sgd(LR), mu=0.2, lam=0.1, batch_size=B,
                   max_steps=schedule.max_steps(data.max_train))
  state0 = upd.init_state(start, data.num_clients)
  sampler = cohort_sampler(np.zeros(data.num_clients, np.int32), 2)
  cohort = sampler(jax.random.key(2))
  res = tier_kw(upd, jax.tree.map(lambda a: a[None], start), cohort, data,
                     num_steps=schedule.num_steps(data.n_train),
                     weights=data.n_train.astype(jnp.float32), key=jax.random.key(2),
                     client_state=state0)
  trained = set(np.asarray(cohort.clients)[np.asarray(cohort.valid)].tolist())
  for c in range(data.num_clients):
    moved = any(float(jnp.abs(a[c] - b[c]).max()) > 0 for a, b in
                zip(jax.tree.leaves(res.client_state.private), jax.tree.leaves(state0.private), strict=True))
    assert moved == (c in trained), c


# ------------------------------------------------------------------------ ALT
def _label_data(labels, num_classes):
  m = max(len(y) for y in labels)
  y = np.zeros((len(labels), m), np.int32)
  for i, lab in enumerate(labels):
    y[i, : len(lab)] = lab
  n = np.asarray([len(lab) for lab in labels], np.int32)
  x = np.zeros((len(labels), m, 1), np.float32)
  return FederatedData(x_train=x, y_train=y, n_train=n, x_test=x[:, :1], y_test=y[:, :1],
                       n_test=np.ones(len(labels), np.int32), num_classes=num_classes)


def test_alt_steps_match_hand_computation():
  # Client 0: 4 examples, labels {0,0,1,1}: n̄ = 1, ē = log2/log4 = 1/2, r̄ = 2/3.
  # Client 1: 2 examples, labels {2,2}: n̄ = 1/2, ē = 0, r̄ = 0.
  # Client 2: 4 examples, labels {0,1,2,3}: n̄ = 1, ē = 1, r̄ = 1.
  data = _label_data([[0, 0, 1, 1], [2, 2], [0, 1, 2, 3]], 4)
  np.testing.assert_allclose(client_utility(data.n_train, data.y_train, 4), [2 / 3, 0.0, 1.0])
  # r_0 = 3 / (5/3) = 9/5; E = 10: 9/5 · 2/3 · 10 = 12, 0 -> floor 1, 9/5 · 10 = 18.
  assert alt_steps(data, 10) == (12, 1, 18)
  assert alt_steps(data, 10, r0=3.5) == (23, 1, 35)
  assert alt_steps(data, 10, min_steps=0) == (12, 0, 18)
  assert sum(alt_steps(data, 10, min_steps=0)) == 3 * 10        # work conserved


def test_alt_steps_match_loop_and_conserve_work():
  data = synthetic_kws(num_speakers=30, frames=4, features=4, test_speakers=1, test_examples=2, seed=3)
  want, exact = ref.alt_steps(np.asarray(data.n_train), np.asarray(data.y_train), 12, 50)
  got = alt_steps(data, 50)
  assert list(got) == want
  np.testing.assert_allclose(sum(exact), 30 * 50, rtol=1e-9)
  assert abs(sum(got) - 30 * 50) <= 30 / 2 + sum(1 for e in exact if e < 0.5)
  sched = alt_schedule(LocalSchedule(batch_size=8, steps=50), data)
  assert sched.steps == got and sched.max_steps(data.max_train) == max(got)


# ------------------------------------------------------------------------ FA / FR
def test_false_accept_reject_match_direct_count():
  rng = np.random.default_rng(0)
  k, n = 5, 60
  y = rng.integers(k, size=n)
  pred = np.where(rng.random(n) < 0.6, y, rng.integers(k, size=n))
  conf = np.zeros((k, k))
  np.add.at(conf, (y, pred), 1)
  positive = [0, 1, 2]
  rates = keyword_rates(conf, positive)
  fa, fr = ref.fa_fr(y.tolist(), pred.tolist(), positive)
  assert rates["false_accept_rate"] == pytest.approx(fa)
  assert rates["false_reject_rate"] == pytest.approx(fr)
  neg = ~np.isin(y, positive)
  assert rates["binary_false_accept_rate"] == pytest.approx(np.mean(np.isin(pred[neg], positive)))
  assert rates["binary_false_reject_rate"] == pytest.approx(np.mean(~np.isin(pred[~neg], positive)))
  mask = keyword_split(["a", "b", "c", "_silence_", "_unknown_"], ["_silence_", "_unknown_"])
  assert keyword_rates(conf, mask) == rates


def test_evaluator_confusion_matches_per_example_predictions(setup):
  data, model, _ = setup
  params = jax.tree.map(lambda a: a[None], model.init(jax.random.key(4)))
  stats = evaluate(model, params, data.x_test, data.y_test, data.n_test,
                   model_of_client=jnp.zeros(data.num_clients, jnp.int32), confusion=True)
  plain = evaluate(model, params, data.x_test, data.y_test, data.n_test,
                   model_of_client=jnp.zeros(data.num_clients, jnp.int32))
  np.testing.assert_allclose(stats.correct, plain.correct)
  ys, preds = [], []
  for c in range(data.num_clients):
    n = int(data.n_test[c])
    logits = model.apply(row(params, 0), data.x_test[c, :n])
    ys += np.asarray(data.y_test[c, :n]).tolist()
    preds += np.asarray(jnp.argmax(logits, -1)).tolist()
    want = np.zeros((3, 3))
    np.add.at(want, (np.asarray(data.y_test[c, :n]), np.asarray(jnp.argmax(logits, -1))), 1)
    np.testing.assert_allclose(stats.confusion[c], want)
  s = summarize(stats, positive_classes=[0, 1])
  fa, fr = ref.fa_fr(ys, preds, [0, 1])
  assert s["false_accept_rate"] == pytest.approx(fa) and s["false_reject_rate"] == pytest.approx(fr)
  assert "false_accept_rate" not in summarize(plain)


# ------------------------------------------------------------------------ MFCC and the loader
def test_mfcc_matches_direct_computation_on_a_sine():
  t = np.arange(4000) / 16000.0
  signal = 0.5 * np.sin(2 * np.pi * 1000.0 * t) + 0.1 * np.sin(2 * np.pi * 300.0 * t)
  mfcc = MFCC()
  got = mfcc(signal)
  assert got.shape == (1 + (4000 - 480) // 160, 40)
  want = ref.mfcc_direct(signal[:480 + 160 * 2])              # the first 3 frames
  np.testing.assert_allclose(got[:3], want, rtol=1e-4, atol=1e-3)
  # The power spectrum of a 1 kHz tone peaks at bin 1000 / (16000 / 512) = 32.
  frame = mfcc.frames(signal)[0] * (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(480) / 480))
  assert int(np.argmax(np.abs(np.fft.rfft(0.5 * frame / 0.5, 512)))) == 32


def _write_wav(path, signal):
  pcm = (np.clip(signal, -1, 1 - 1 / 32768) * 32768).astype("<i2")
  with wave.open(str(path), "wb") as f:
    f.setnchannels(1)
    f.setsampwidth(2)
    f.setframerate(16000)
    f.writeframes(pcm.tobytes())


@pytest.fixture(scope="module")
def speech_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("speech_commands")
  rng = np.random.default_rng(0)
  words = {"yes": 440.0, "no": 660.0, "cat": 880.0, "dog": 1200.0}
  tests = []
  for w, freq in words.items():
    os.makedirs(root / w)
    for spk in ("aaa111", "bbb222", "ccc333"):
      for i in range(2):
        n = int(rng.integers(8000, 16001))                 # 0.5 - 1 s clips
        sig = 0.3 * np.sin(2 * np.pi * freq * np.arange(n) / 16000) + 0.01 * rng.normal(size=n)
        _write_wav(root / w / f"{spk}_nohash_{i}.wav", sig)
        if spk == "ccc333":
          tests.append(f"{w}/{spk}_nohash_{i}.wav")
  os.makedirs(root / sc.BACKGROUND)
  for j in range(2):
    _write_wav(root / sc.BACKGROUND / f"noise{j}.wav", 0.2 * rng.normal(size=32000))
  (root / "testing_list.txt").write_text("\n".join(tests) + "\n")
  return str(root)


def test_loader_one_client_per_speaker(speech_dir):
  data, groups, (xc, yc) = sc.load_speech_commands(speech_dir, task=12, seed=1)
  data.validate()
  assert data.num_clients == 2 and groups.shape == (2,)          # aaa111, bbb222 (ccc333 is test)
  assert data.example_shape == (98, 40) and data.num_classes == 12
  # 8 word clips each (2 per word) + ceil(0.1 · 8) = 1 silence clip.
  np.testing.assert_array_equal(data.n_train, [9, 9])
  yes, no, unk, sil = 0, 1, sc.CLASSES_12.index(sc.UNKNOWN), sc.CLASSES_12.index(sc.SILENCE)
  for c in range(2):
    want = sorted([yes] * 2 + [no] * 2 + [unk] * 4 + [sil])
    assert sorted(np.asarray(data.y_train[c, :9]).tolist()) == want
  # Global test set: 8 clips + 1 silence, dealt round-robin over the 2 client rows.
  assert len(yc) == 9 and xc.shape == (9, 98, 40)
  np.testing.assert_array_equal(data.n_test, [5, 4])
  # Deterministic from the seed; augmentation changes the training features only.
  again, _, (xc2, _) = sc.load_speech_commands(speech_dir, task=12, seed=1)
  np.testing.assert_array_equal(again.x_train, data.x_train)
  plain, _, (xc3, _) = sc.load_speech_commands(speech_dir, task=12, seed=1, augmentation=False)
  assert not np.allclose(plain.x_train[:, :8], data.x_train[:, :8])
  np.testing.assert_array_equal(xc3[:8], xc[:8])
  capped, _, _ = sc.load_speech_commands(speech_dir, task=12, max_examples=3, augmentation=False)
  np.testing.assert_array_equal(capped.n_train, [4, 4])          # 3 clips + 1 silence
  # The 35-class option: every word is a class, no silence.
  d35, _, _ = sc.load_speech_commands(speech_dir, task=35, augmentation=False)
  assert d35.num_classes == 4 and np.asarray(d35.n_train).tolist() == [8, 8]


def test_loader_pieces():
  assert sc.speaker_of("abc123_nohash_4.wav") == "abc123"
  splits = {sc.which_set(f"spk{i}_nohash_{j}.wav") for i in range(3) for j in range(5)}
  assert splits <= {"training", "validation", "testing"}
  for i in range(20):
    assert len({sc.which_set(f"spk{i}_nohash_{j}.wav") for j in range(5)}) == 1   # by speaker
  rng = np.random.default_rng(0)
  sig = np.arange(1, 16001, dtype=np.float32) / 16000
  out = sc.augment(sig, rng, [], shift_ms=100.0, noise_volume=0.1, noise_prob=0.8)
  shift = int(np.argmax(out > 0)) if out[0] == 0 else -int(round(out[0] * 16000 - 1))
  assert abs(shift) <= 1600
  np.testing.assert_allclose(np.roll(out, -shift)[1600:-1600], sig[1600:-1600])


# ------------------------------------------------------------------------ model, rounds, errors
def test_dscnn_paper_size_and_shapes():
  model = build_model("dscnn", example_shape=(98, 40), num_classes=12)
  params = jax.eval_shape(model.init, jax.random.key(0))
  assert 160_000 < sum(p.size for p in jax.tree.leaves(params)) < 180_000     # the paper's 169K
  small = build_model("dscnn", example_shape=(16, 10), num_classes=5, width=8, blocks=1)
  p = jax.jit(small.init)(jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (3, 16, 10))
  out = jax.jit(small.apply)(p, x)
  assert out.shape == (3, 5)
  xla = build_model("dscnn", example_shape=(16, 10), num_classes=5, width=8, blocks=1, conv_impl="xla")
  np.testing.assert_allclose(out, jax.jit(xla.apply)(p, x), rtol=1e-4, atol=1e-5)


def test_kwt_size_and_shapes():
  model = build_model("kwt", example_shape=(98, 40), num_classes=12)
  params = jax.eval_shape(model.init, jax.random.key(0))
  assert 200_000 < sum(p.size for p in jax.tree.leaves(params)) < 300_000
  small = build_model("kwt", example_shape=(12, 8), num_classes=5, dim=8, depth=1, heads=2, mlp_dim=8)
  p = jax.jit(small.init)(jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (3, 12, 8))
  assert jax.jit(small.apply)(p, x).shape == (3, 5)
  # Each example is classified on its own (no mixing across the batch).
  np.testing.assert_allclose(jax.jit(small.apply)(p, x[:1]), jax.jit(small.apply)(p, x)[:1], rtol=1e-5,
                             atol=1e-6)


def _kws_kw(data, model):
  return dict(model=model, data=data, local_optimizer=optax.sgd(0.05),
              schedule=LocalSchedule(batch_size=4, steps=3), cohort_size=3)


def test_fedkws_round_compiles_once(setup):
  data, model, _ = setup
  alg, traces = count_traces(fedkws(mu=0.2, lam=0.001, **_kws_kw(data, model)))
  state = loop.run(alg, data, num_rounds=4, key=jax.random.key(0), rounds_per_call=2)
  assert len(traces) == 1 and int(state.round) == 4


def test_fedkws_without_alo_and_alt_is_fedavg(setup):
  from fedtree.algorithms import fedavg

  data, model, _ = setup
  a = loop.run(fedkws(alo=False, alt=False, **_kws_kw(data, model)), data, num_rounds=2,
                     key=jax.random.key(1))
  b = loop.run(fedavg(**_kws_kw(data, model)), data, num_rounds=2, key=jax.random.key(1))
  close(a.params, b.params, tol=1e-6)


@pytest.mark.parametrize("kw,match", [
  (dict(mu=1.0), "mu=1.0"), (dict(mu=-0.1), "mu=-0.1"), (dict(lam=-1.0), "lam=-1.0"),
  (dict(lam=float("nan")), "lam=nan"), (dict(r0=-2.0), "r0=-2.0"),
])
def test_bad_hyperparameters_raise(setup, kw, match):
  data, model, _ = setup
  with pytest.raises(ValueError, match=match):
    fedkws(**kw, **_kws_kw(data, model))


def test_bad_settings_raise(setup, speech_dir):
  data, model, _ = setup
  with pytest.raises(ValueError, match="'_noise_'"):
    keyword_split(sc.CLASSES_12, ["_silence_", "_noise_"])
  with pytest.raises(ValueError, match="task=13"):
    sc.load_speech_commands(speech_dir, task=13)
  with pytest.raises(ValueError, match="unknown_keep=1.5"):
    sc.load_speech_commands(speech_dir, unknown_keep=1.5)
  with pytest.raises(ValueError, match="fixed local step count"):
    fedkws(**{**_kws_kw(data, model), "schedule": LocalSchedule(batch_size=4, epochs=1)})
  from fedtree.experiment.runner import positive_classes_from_config

  c = load_config("fedkws")
  with pytest.raises(ValueError, match="12 names but the data has 35"):
    positive_classes_from_config(c, 35)
  c.metrics.negative_classes = ("_silence_", "silence")
  with pytest.raises(ValueError, match="'silence'"):
    positive_classes_from_config(c, 12)
  with pytest.raises(ValueError, match="norm='batch'"):
    jax.eval_shape(build_model("dscnn", example_shape=(16, 10), num_classes=3, norm="batch").init,
                   jax.random.key(0))


# ------------------------------------------------------------------------ the config
def _small_config():
  c = load_config("fedkws")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress = 2, 2, 2, False
  c.data.update(dict(num_speakers=6, test_speakers=2, test_examples=6, frames=12, features=8,
                     max_examples=16))
  c.model.update(dict(width=4, blocks=1, first_kernel=(3, 3)))
  c.local.steps = 2
  for run in c.runs.values():
    run.cohort_size = 3
  return c


def _check_results(c, results, tmp_path):
  assert list(results) == list(c.run_order)
  for label in c.run_order:
    s = results[label]["global"]
    assert 0.0 <= s["accuracy"] <= 1.0
    assert 0.0 <= s["false_accept_rate"] <= 1.0 and 0.0 <= s["false_reject_rate"] <= 1.0
  assert (tmp_path / "summary.json").exists()


@pytest.mark.slow
def test_fedkws_config_end_to_end(tmp_path):
  c = _small_config()
  _check_results(c, train_and_evaluate(c, str(tmp_path)), tmp_path)


def test_fedkws_config_fedkws_ui_run(tmp_path):
  """Fast variant: the config's FedKWS-UI run alone."""
  import ml_collections

  c = _small_config()
  c.runs = ml_collections.ConfigDict({"fedkws_ui": c.runs.fedkws_ui})
  c.run_order = ("fedkws_ui",)
  results = train_and_evaluate(c, str(tmp_path))
  _check_results(c, results, tmp_path)
  assert math.isfinite(results["fedkws_ui"]["global"]["loss"])


def test_fedkws_config_on_a_speech_commands_directory(tmp_path, speech_dir):
  """The config's FedKWS-UI run on the raw-directory loader (the generated tiny directory),
  with two augmented views per clip."""
  import ml_collections

  c = _small_config()
  c.data = ml_collections.ConfigDict(dict(name="speech_commands", root=speech_dir, task=12, seed=0, views=2))
  c.model.views = 2                                   # augmentation redrawn every epoch
  c.runs = ml_collections.ConfigDict({"fedkws_ui": c.runs.fedkws_ui})
  c.run_order = ("fedkws_ui",)
  c.runs.fedkws_ui.cohort_size = 2
  results = train_and_evaluate(c, str(tmp_path))
  s = results["fedkws_ui"]["global"]
  assert 0.0 <= s["accuracy"] <= 1.0 and 0.0 <= s["false_reject_rate"] <= 1.0


def test_alo_loss_float64_without_smoothing_or_adversary_is_cross_entropy():
  """Under x64 the loss keeps float64 logits' precision (float32 inside would show as ~1e-8)."""
  from fedtree.core.model import masked_cross_entropy

  with jax.enable_x64(True):
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(6, 5)) * 3, jnp.float64)
    private = jnp.asarray(rng.normal(size=(6, 5)), jnp.float64)
    y, mask = jnp.asarray([0, 4, 2, 2, 1, 3]), jnp.asarray([True] * 5 + [False])
    got = alo_loss(logits, private, y, mask, mu=0.0, lam=0.0)
    want = masked_cross_entropy(logits, y, mask)
    assert got.dtype == jnp.float64
    assert abs(float(got) - float(want)) < 1e-12
    # and with μ, λ against a float64 numpy computation
    lp = np.asarray(jax.nn.log_softmax(logits))
    q = np.asarray(jax.nn.softmax(private))
    t = 0.8 * np.eye(5)[np.asarray(y)] + 0.2 / 5
    per = -(t * lp).sum(-1) + 0.01 * (q * lp).sum(-1)
    assert abs(float(alo_loss(logits, private, y, mask, mu=0.2, lam=0.01)) - per[:5].mean()) < 1e-12


def test_check_alo_skips_traced_mu():
  from fedtree.objectives.alo import check_alo

  def traced(mu):
    check_alo(mu, 0.001)
    return mu

  np.testing.assert_allclose(jax.vmap(traced)(jnp.asarray([0.0, 0.2])), [0.0, 0.2])
  with pytest.raises(ValueError, match="mu=1.5"):
    check_alo(1.5, 0.001)


# ------------------------------------------------------------------------ augmentation views
def test_loader_views_are_independent_augmentations(speech_dir):
  data, _, (xc, _) = sc.load_speech_commands(speech_dir, task=12, seed=1, views=3)
  assert data.example_shape == (3, 98, 40) and xc.shape == (9, 3, 98, 40)
  n = int(data.n_train[0])
  x = np.asarray(data.x_train[0, :n])
  for v in range(1, 3):
    assert not np.allclose(x[:, 0], x[:, v])                   # each view its own augmentation
  np.testing.assert_array_equal(xc[:, 0], xc[:, 2])             # test clips: clean in every view
  again, _, _ = sc.load_speech_commands(speech_dir, task=12, seed=1, views=3)
  np.testing.assert_array_equal(again.x_train, data.x_train)    # same seed, same views
  one, _, _ = sc.load_speech_commands(speech_dir, task=12, seed=1)
  np.testing.assert_array_equal(one.x_train[0], data.x_train[0, :, 0])   # first draws: view 0
  np.testing.assert_array_equal(one.y_train, data.y_train)
  with pytest.raises(ValueError, match="views=0"):
    sc.load_speech_commands(speech_dir, views=0)


def test_views_are_redrawn_every_epoch_inside_the_local_loop():
  """A client with one batch per epoch: step t is epoch t. The views each epoch reads (as
  :func:`with_views` picks them from the step's key) change with the epoch; the same key
  reads the same views, another key others."""
  from fedtree.core.local import run_local_steps
  from fedtree.models.kws import view_indices

  views, n, epochs = 4, 3, 8
  x = jnp.broadcast_to(jnp.arange(views, dtype=jnp.float32)[None, :, None], (n, views, 1))  # x[m, v] = v
  data = ClientData(x, jnp.zeros(n, jnp.int32), jnp.asarray(n))

  def step(carry, batch, rng):
    t, record = carry
    picked = batch.x[jnp.arange(batch.x.shape[0]), view_indices(rng, batch.x.shape[0], views), 0]
    return (t + 1, record.at[t].set(jnp.where(batch.mask, picked, -1.0))), jnp.zeros(())

  @jax.jit
  def read(key):
    carry = (jnp.zeros((), jnp.int32), jnp.zeros((epochs, 4)))
    (_, record), _ = run_local_steps(step, carry, data, jnp.asarray(epochs), key, batch_size=4,
                                    max_steps=epochs)
    return record

  a, b, c = read(jax.random.key(1)), read(jax.random.key(1)), read(jax.random.key(2))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  per_epoch = {tuple(np.sort(row[row >= 0]).tolist()) for row in np.asarray(a)}
  assert len(per_epoch) > 2, a                                   # epochs read different views


def test_with_views_model_picks_per_example_views():
  from fedtree.models.kws import view_indices

  views = 3
  model = build_model("mlp", example_shape=(views, 4), num_classes=2, views=views, hidden=(3,))
  inner = build_model("mlp", example_shape=(4,), num_classes=2, hidden=(3,))
  p = model.init(jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (5, views, 4))
  np.testing.assert_allclose(model.apply(p, x), inner.apply(p, x[:, 0]), rtol=1e-6)     # evaluation: view 0
  rng = jax.random.key(7)
  idx = view_indices(rng, 5, views)
  np.testing.assert_allclose(model.apply(p, x, train=True, rng=rng),
                             inner.apply(p, x[jnp.arange(5), idx]), rtol=1e-6)
  with pytest.raises(ValueError, match="views=3"):
    build_model("mlp", example_shape=(2, 4), num_classes=2, views=3)


# ------------------------------------------------------------------------ ALO: the authors' options
def test_client_utility_with_a_fixed_n_max_by_hand():
  data = _label_data([[0, 0, 1, 1], [2, 2], [0, 1, 2, 3]], 4)
  # n_max = 8: n̄ = 1/2, 1/4, 1/2; ē = 1/2, 0, 1; r̄ = 1/2, 0, 2/3.
  np.testing.assert_allclose(client_utility(data.n_train, data.y_train, 4, n_max=8), [0.5, 0.0, 2 / 3])
  # n_max below a client's size: n̄ capped at 1 (as the paper's max_j n_j would give).
  np.testing.assert_allclose(client_utility(data.n_train, data.y_train, 4, n_max=2), [2 / 3, 0.0, 1.0])
  # r0 = 3.5 as the authors (12 classes): round(3.5 · r̄ · 10) = 18, 0 -> floor 1, 23.
  assert alt_steps(data, 10, r0=3.5, n_max=8) == (18, 1, 23)
  with pytest.raises(ValueError, match="n_max=0"):
    client_utility(data.n_train, data.y_train, 4, n_max=0)


def test_alo_per_client_mu_is_mu_times_one_minus_utility(setup):
  data, model, _ = setup
  from fedtree.objectives.alo import ALOState

  start, private = model.init(jax.random.key(0)), model.init(jax.random.key(7))
  kw = dict(lam=0.5, batch_size=B, max_steps=4)
  weighted = alo_update(model, optax.sgd(LR), mu=0.4, client_utility=np.array([0.25, 1.0, 0.0, 0.5, 0.5]),
                        **kw)
  state = weighted.init_state(private, data.num_clients)
  np.testing.assert_allclose(state.utility, [0.25, 1.0, 0.0, 0.5, 0.5])
  key = jax.random.key(4)
  run = jax.jit(weighted.apply)
  for c, mu_c in ((0, 0.4 * 0.75), (1, 0.0)):
    got, _, _ = run(start, row(state, c), client_data(data, c), jnp.asarray(3), key)
    plain = alo_update(model, optax.sgd(LR), mu=mu_c, **kw)
    want, _, _ = jax.jit(plain.apply)(start, ALOState(private=private), client_data(data, c), jnp.asarray(3),
                                      key)
    close(got, want, tol=1e-6)
  with pytest.raises(ValueError, match="client_utility"):
    alo_update(model, optax.sgd(LR), mu=0.2, client_utility=np.array([1.5]), **kw)
  with pytest.raises(ValueError, match="3 entries for 5 clients"):
    alo_update(model, optax.sgd(LR), mu=0.2, client_utility=np.zeros(3), **kw).init_state(start, 5)


def test_alo_gradient_clipping_by_hand(setup):
  data, model, _ = setup
  from fedtree.objectives.alo import ALOState

  start, private = model.init(jax.random.key(0)), model.init(jax.random.key(7))
  kw = dict(mu=0.2, lam=0.5, batch_size=B, max_steps=1, private_steps=0)
  state, cd, key = ALOState(private=private), client_data(data, 0), jax.random.key(2)
  free, _, _ = jax.jit(alo_update(model, optax.sgd(LR), **kw).apply)(start, state, cd, jnp.asarray(1), key)
  delta = jax.tree.map(jnp.subtract, free, start)                      # -lr · g
  gnorm = float(jnp.sqrt(sum(jnp.sum(d**2) for d in jax.tree.leaves(delta)))) / LR
  c = 0.1 * gnorm                                                      # clipping active
  clip, _, _ = jax.jit(alo_update(model, optax.sgd(LR), max_grad_norm=c, **kw).apply)(
    start, state, cd, jnp.asarray(1), key)
  close(clip, jax.tree.map(lambda s, d: s + d * (c / gnorm), start, delta), tol=1e-6)
  loose, _, _ = jax.jit(alo_update(model, optax.sgd(LR), max_grad_norm=10 * gnorm, **kw).apply)(
    start, state, cd, jnp.asarray(1), key)
  close(loose, free, tol=1e-7)                                        # below the norm: untouched
  with pytest.raises(ValueError, match="max_grad_norm=0"):
    alo_update(model, optax.sgd(LR), max_grad_norm=0.0, **kw)


def test_fedkws_authors_options_run(setup):
  data, model, _ = setup
  alg = fedkws(mu=0.2, lam=0.001, mu_weighting=True, utility_n_max=8, max_grad_norm=1.0, r0=3.5,
               **_kws_kw(data, model))
  state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
  assert state.client_state.utility.shape == (data.num_clients,)
  assert all(bool(jnp.all(jnp.isfinite(p))) for p in jax.tree.leaves(state.params))
  with pytest.raises(ValueError, match="ALO options"):
    fedkws(alo=False, max_grad_norm=1.0, **_kws_kw(data, model))


@pytest.mark.slow  # a swept ALO round compiles in ~15 s here
def test_fedkws_seeds_variants_and_a_traced_mu_sweep(tmp_path):
  """The ``seeds`` variants load; the shrunk ALO run sweeps seeds x a traced μ in one program."""
  import ml_collections

  for variant in ("seeds", "seeds_skewed"):
    v = load_config("fedkws", variant)
    assert v.sweep.seeds == 4 and list(v.run_order) == ["fedavg", "fedavg_alt", "fedavg_alo", "fedkws_ui"]
  assert load_config("fedkws", "seeds_skewed").data.label_alpha == 0.1
  with pytest.raises(ValueError, match="'seed'"):
    load_config("fedkws", "seed")
  c = _small_config()
  c.rounds, c.eval_every, c.rounds_per_call = 1, 1, 1
  c.runs = ml_collections.ConfigDict({"fedavg_alo": c.runs.fedavg_alo})
  c.run_order = ("fedavg_alo",)
  c.sweep = ml_collections.ConfigDict(dict(seeds=2, params="runs.fedavg_alo.mu=0,0.2", mode="product",
                                           select="global/accuracy", chunk="all"))
  results = train_and_evaluate(c, str(tmp_path))
  assert "fedavg_alo" in results
