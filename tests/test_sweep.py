"""Sweeps (fedtree.experiment.sweep): settings x seeds of a run as one compiled program equal
the same runs done alone; clear errors for what cannot be an experiment axis."""

import json
import os
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest
from config_files import load_config

from fedtree import experiment
from fedtree.core import loop
from fedtree.core import sweep as stacked
from fedtree.experiment import runner, sweep
from fedtree.experiment.registry import build_algorithm
from fedtree.experiment.reporting import Reporter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny(runs=("fedavg",), rounds=3):
  c = load_config("quickstart")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress = rounds, rounds, 1, False
  c.data.group_sizes = (3, 2)
  c.data.max_examples = 24
  c.model.hidden = (8,)
  c.checkpoint_every = 0
  c.runs.fedavg.cohort_size = c.runs.fedadam.cohort_size = 3
  c.runs.hierfavg.cohort_size = c.runs.edges_only.cohort_size = 2
  for label in list(c.runs):
    if label not in runs:
      del c.runs[label]
  c.run_order = tuple(runs)
  return c


def alone(config, label, seed, setting=()):
  """The run ``label`` done alone with ``config.seed = seed`` and ``setting`` applied: its
  final state."""
  c = config.copy_and_resolve_references()
  c.seed = seed
  for path, value in dict(setting).items():
    sweep._set_path(c, path, value)
  ctx = runner.make_context(c)
  alg = build_algorithm(label, c.runs[label], ctx)
  return loop.run(alg, ctx.data, num_rounds=int(c.rounds), key=jax.random.key(seed), cache=None)


def swept(config, label):
  """``(settings x seeds experiments, final SweepState)`` through the same path as the runner."""
  ctx = runner.make_context(config)
  settings = sweep.settings_of(config, label)
  seeds = int(config.sweep.seeds)
  exps = [(s, config.seed + j) for s in settings for j in range(seeds)]
  paths = sorted(settings[0])
  build = sweep.config_builder(config, label, ctx, build_algorithm)
  alg = stacked.sweep(build, {p: [s[p] for s, _ in exps] for p in paths}, [j for _, j in exps])
  state = loop.run(alg, ctx.data, num_rounds=int(config.rounds), key=jax.random.key(0), cache=None)
  return exps, state


def assert_same(a, b, rtol=2e-5, atol=2e-6):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb, strict=True):
    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
      continue
    np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=rtol, atol=atol)


@pytest.mark.parametrize("label", ["fedavg", pytest.param("fedadam", marks=pytest.mark.slow),
                                   pytest.param("hierfavg", marks=pytest.mark.slow)])
def test_seeds_equal_separate_runs(label):
  c = tiny(runs=(label,))
  c.sweep.seeds = 2
  exps, st = swept(c, label)
  finals = [stacked.experiment(st, e) for e in range(len(exps))]
  for e, (_, seed) in enumerate(exps):
    assert_same(finals[e], alone(c, label, seed))
  a, b = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(f.params)]) for f in finals)
  assert not np.allclose(a, b)  # different seeds, different results


@pytest.mark.parametrize("label,params", [
  ("fedavg", "local.learning_rate=0.02,0.1"),
  pytest.param("fedadam", "runs.fedadam.server.learning_rate=0.003,0.03", marks=pytest.mark.slow),
])
def test_hyperparameter_sweep_equals_separate_runs(label, params):
  c = tiny(runs=(label,))
  c.sweep.params = params
  exps, st = swept(c, label)
  assert len(exps) == 2
  for e, (setting, seed) in enumerate(exps):
    assert_same(stacked.experiment(st, e), alone(c, label, seed, setting))


def test_compiles_once():
  c = tiny()
  c.sweep.seeds = 3
  ctx = runner.make_context(c)
  build = sweep.config_builder(c, "fedavg", ctx, build_algorithm)
  traces = []

  def counting(hp):
    traces.append(1)
    return build(hp)

  alg = stacked.sweep(counting, {}, [0, 1, 2])
  state = alg.init(None)
  traces.clear()  # the rounds' traces only
  cache = loop.CompileCache()
  state = loop.run(alg, ctx.data, num_rounds=4, key=jax.random.key(0), state=state, cache=cache)
  assert int(state.round) == 4 and len(traces) == 1


def test_runner_table_rows_summary_and_resume(tmp_path, capsys):
  c = tiny(rounds=4)
  c.eval_every, c.checkpoint_every = 2, 2
  c.sweep.seeds = 2
  c.sweep.params = "local.learning_rate=0.02,0.1"
  results = experiment.train_and_evaluate(c, str(tmp_path))
  out = capsys.readouterr().out
  assert "mean ± std" in out and "learning_rate=0.02" in out and "learning_rate=0.1" in out
  rows = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
  assert {(r["setting"]["local.learning_rate"], r["seed"]) for r in rows} == {
    (0.02, 0), (0.02, 1), (0.1, 0), (0.1, 1)}
  summary = json.load(open(tmp_path / "summary.json"))
  entry = summary["fedavg"]["sweep"]
  assert entry["best"]["name"] in ("learning_rate=0.02", "learning_rate=0.1")
  assert len(entry["settings"]) == 2 and entry["settings"][0]["seeds"] == 2
  assert (tmp_path / "sweep_fedavg.png").exists()
  # resume: a finished sweep restores its checkpoint and gives the same table
  again = experiment.train_and_evaluate(c, str(tmp_path))
  assert again["fedavg"]["sweep"]["settings"] == results["fedavg"]["sweep"]["settings"]


@pytest.mark.slow
def test_chunks_give_the_same_results(tmp_path):
  c = tiny()
  c.sweep.seeds = 3
  whole = experiment.train_and_evaluate(c, None)["fedavg"]["sweep"]["settings"]
  c.sweep.chunk = "2"  # a string field: "all", "auto" or a number
  chunked = experiment.train_and_evaluate(c, None)["fedavg"]["sweep"]["settings"]
  np.testing.assert_allclose(whole[0]["mean"]["global/accuracy"], chunked[0]["mean"]["global/accuracy"])
  np.testing.assert_allclose(whole[0]["std"]["global/loss"], chunked[0]["std"]["global/loss"], rtol=1e-5)


@pytest.mark.parametrize("params,mode,match", [
  ("local.bogus=0.1,0.2", "product", "not a config field"),
  ("runs.fedavg.cohort_size=2,3", "product", "changes array shapes"),
  ("model.hidden=2,3", "product", "changes array shapes"),
  ("local.optimizer=1,2", "product", "not a number"),
  ("local.learning_rate=", "product", "is empty"),
  ("local.learning_rate=0.1,0.2;runs.fedadam.server.learning_rate=0.1", "zip", "lists of one length"),
  ("local.learning_rate=0.1", "grid", "sweep.mode='grid'"),
  ("local.learning_rate=a,b", "product", "non-numeric"),
])
def test_clear_errors(params, mode, match):
  c = tiny(runs=("fedavg", "fedadam"))
  c.sweep.params, c.sweep.mode = params, mode
  with pytest.raises(ValueError, match=match):
    runner.validate_config(c)


@pytest.mark.slow
def test_quickstart_seeds_variant_and_command_line(tmp_path):
  assert load_config("quickstart", "seeds").sweep.seeds == 8
  cmd = [sys.executable, "-m", "fedtree.main", "--config=configs/quickstart.py",
         f"--workdir={tmp_path}", "--config.rounds=2", "--config.eval_every=2",
         "--config.rounds_per_call=2", "--config.progress=False", "--config.checkpoint_every=0",
         "--config.data.group_sizes=(3,2)", "--config.runs.fedavg.cohort_size=3",
         "--config.runs.fedadam.cohort_size=3", "--config.runs.hierfavg.cohort_size=2",
         "--config.runs.edges_only.cohort_size=2", "--config.model.hidden=(8,)",
         "--config.sweep.seeds=2", "--config.sweep.params=local.learning_rate=0.02,0.05"]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.count("(mean ± std over seeds)") == 4   # a table per run, then all of them in one
  assert "every swept run (mean ± std over 2 seeds" in out.stdout   # (since 37ab7f5, issue 37)
  rows = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
  assert {r["seed"] for r in rows} == {0, 1}
  assert {r["setting"]["local.learning_rate"] for r in rows} == {0.02, 0.05}


def test_reporter_keeps_setting_dicts(tmp_path):
  r = Reporter(str(tmp_path), show_progress=False)
  r.log("x", 1, {"setting": {"a.b": np.float32(0.5)}, "seed": 3})
  r.close()
  row = json.loads(open(tmp_path / "metrics.jsonl").read())
  assert row["setting"] == {"a.b": 0.5} and row["seed"] == 3 and isinstance(row["seed"], int)


EVERY_ALGORITHM = {
  "fedprox": dict(mu=0.1), "ditto": dict(lam=0.1), "perfedavg": dict(alpha=0.01, beta=0.01),
  "pfedme": dict(lam=15.0, inner_steps=2, personal_lr=0.01), "pfedmt": dict(team_iters=2),
  "bhfl": dict(), "cfl": dict(), "ifca": dict(num_clusters=2),
  "awcfl": dict(num_clusters=2, cluster_start_round=1, kmeans_iters=2),
  "mcfl": dict(num_clusters=2, cluster_start_round=1, kmeans_iters=2),
  "grouppfl": dict(group_rounds=1, global_rounds=2), "fedkws": dict(),
}
REFUSED = {"grouppfl": "fixed-length composition of stages"}


@pytest.mark.parametrize("algorithm", [  # a refusal is quick (~2 s) and stays in the default run
  pytest.param(a, marks=() if a in REFUSED else pytest.mark.slow) for a in sorted(EVERY_ALGORITHM)])
def test_every_algorithm_sweeps_seeds_or_is_refused(algorithm):
  import ml_collections

  c = tiny(rounds=2)
  c.runs = ml_collections.ConfigDict({"x": dict(algorithm=algorithm, cohort_size=2,
                                               **EVERY_ALGORITHM[algorithm])})
  c.run_order = ("x",)
  c.sweep.seeds = 2
  if algorithm == "fedkws":
    c.local.steps = 2  # ALT needs a fixed local step count
  if algorithm in REFUSED:
    with pytest.raises(ValueError, match=REFUSED[algorithm]):
      experiment.train_and_evaluate(c, None)
    return
  exps, st = swept(c, "x")
  assert_same(stacked.experiment(st, 1), alone(c, "x", 1), rtol=1e-4, atol=1e-5)


def test_awcfl_beta_sweep_equals_separate_runs():
  c = load_config("clustered", "beta_sweep")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress = 3, 3, 3, False
  c.data.num_examples, c.data.num_clients, c.data.transform.num_transformed = 200, 4, 2
  c.model.hidden = (8,)
  c.runs.awcfl.cluster_start_round = 1
  c.sweep.params, c.sweep.seeds = "runs.awcfl.beta=0,0.5", 1   # the variant's 3 seeds: slower, same check
  exps, st = swept(c, "awcfl")
  for e, (setting, seed) in enumerate(exps):
    assert_same(stacked.experiment(st, e), alone(c, "awcfl", seed, setting), rtol=1e-4, atol=1e-5)


def test_builder_needing_a_concrete_value_is_refused_by_name():
  def build(hp):
    if hp["runs.x.eps1"] > 0.15:  # Python control flow on a swept value
      raise AssertionError("unreachable under a trace")

  with pytest.raises(ValueError, match=r"run 'x' \(algorithm 'cfl'\) cannot sweep \['runs.x.eps1'\]"):
    stacked.sweep(build, {"runs.x.eps1": np.array([0.1, 0.2])}, [0, 1],
                  explain=sweep.explain("x", "cfl", ["runs.x.eps1"])).init(None)


def test_settings_product_and_zip():
  c = tiny(runs=("fedavg", "fedadam"))
  c.sweep.params = "local.learning_rate=0.1,0.2;runs.fedadam.server.learning_rate=1,2"
  assert len(sweep.settings_of(c, "fedadam")) == 4 and len(sweep.settings_of(c, "fedavg")) == 2
  c.sweep.mode = "zip"
  assert sweep.settings_of(c, "fedadam") == [
    {"local.learning_rate": 0.1, "runs.fedadam.server.learning_rate": 1.0},
    {"local.learning_rate": 0.2, "runs.fedadam.server.learning_rate": 2.0}]
  name = sweep.setting_name(sweep.settings_of(c, "fedadam")[0])  # shared leaf names: full paths
  assert name == "local.learning_rate=0.1,runs.fedadam.server.learning_rate=1"


@pytest.mark.slow
def test_resume_after_a_stop_mid_sweep_gives_the_same_table(tmp_path):
  c = tiny(rounds=4)
  c.eval_every, c.rounds_per_call, c.checkpoint_every = 2, 2, 2
  c.sweep.seeds = 2
  full = experiment.train_and_evaluate(c, str(tmp_path / "a"))["fedavg"]["sweep"]["settings"]
  with pytest.raises(runner.RunStopped):  # stops after round 1 (the call asks between its rounds)
    experiment.train_and_evaluate(c, str(tmp_path / "b"), should_stop=lambda: True)
  resumed = experiment.train_and_evaluate(c, str(tmp_path / "b"))["fedavg"]["sweep"]["settings"]
  assert resumed == full
  rows = [json.loads(x) for x in open(tmp_path / "b" / "metrics.jsonl")]
  # the round the stop reached has its row (the resumed run's byte totals go on from it), then the
  # evaluation rounds
  assert sorted((r["round"], r["seed"]) for r in rows) == [(1, 0), (1, 1), (2, 0), (2, 1), (4, 0), (4, 1)]


def trace_sweep(c, label):
  """Traces (``jax.eval_shape``, no compile) the init and one round of run ``label``'s sweep
  with its swept fields as tracers: a builder that needs a concrete value fails here."""
  runner.validate_config(c)
  ctx = runner.make_context(c)
  settings = sweep.settings_of(c, label)
  paths = sorted(settings[0])
  build = sweep.config_builder(c, label, ctx, build_algorithm)
  for s in settings:  # concrete values: checked by the ordinary builder, as run_sweep does
    build(s)
  hp = {p: np.asarray([s[p] for s in settings], np.float32) for p in paths}
  alg = stacked.sweep(build, hp, list(range(len(settings))),
                      explain=sweep.explain(label, str(c.runs[label].algorithm), paths))
  kd = np.stack([jax.random.key_data(jax.random.key(i)) for i in range(len(settings))])

  def go(hp, kd):
    inner = jax.vmap(lambda h, k: build(h).init(jax.random.wrap_key_data(k)))(hp, kd)
    st = stacked.SweepState(round=jax.numpy.zeros((), jax.numpy.int32), inner=inner, keys=kd, hparams=hp)
    return alg.round(st, ctx.data, None)

  return jax.eval_shape(go, hp, kd)


TRACED_PATHS = [
  ("fedprox", dict(mu=0.1), "runs.x.mu=0,0.1"),
  ("ditto", dict(lam=0.1), "runs.x.lam=0,0.1"),
  ("ditto", dict(lam=0.1, personal_learning_rate=0.05), "runs.x.personal_learning_rate=0.01,0.1"),
  ("fedkws", dict(private_learning_rate=0.05), "runs.x.private_learning_rate=0.01,0.1"),
  ("fedkws", dict(mu=0.1), "runs.x.mu=0,0.1"),
  ("bhfl", dict(eta_down=0.5), "runs.x.eta_down=0.5,1"),
  ("bhfl", dict(staleness_exponent=0.5, latency="exponential"), "runs.x.staleness_exponent=0,0.5"),
  ("cfl", dict(eps1=0.1, eps2=0.5), "runs.x.eps1=0.1,0.2;runs.x.eps2=0.5,1"),
  ("awcfl", dict(num_clusters=2, clustering="cfl", eps1=0.1, eps2=0.5), "runs.x.eps1=0.1,0.2"),
]


@pytest.mark.parametrize("algorithm,fields,params", TRACED_PATHS,
                         ids=[f"{a}-{p.split('=')[0]}" for a, _, p in TRACED_PATHS])
def test_swept_hyperparameters_trace(algorithm, fields, params):
  c = tiny(rounds=1)
  c.runs = ml_collections.ConfigDict({"x": dict(algorithm=algorithm, cohort_size=2, **fields)})
  c.run_order = ("x",)
  c.sweep.params = params
  if algorithm == "fedkws":
    c.local.steps = 2  # ALT needs a fixed local step count
  _, metrics = trace_sweep(c, "x")
  assert metrics["train_loss"].shape == ()


def test_swept_negative_value_is_still_refused():
  c = tiny(rounds=1)
  c.runs = ml_collections.ConfigDict({"x": dict(algorithm="fedprox", mu=0.1, cohort_size=2)})
  c.run_order = ("x",)
  c.sweep.params = "runs.x.mu=0.1,-1"
  with pytest.raises(ValueError, match="mu=-1"):
    trace_sweep(c, "x")


def test_fedkws_ablation_config_traces():
  c = load_config("fedkws", "ablation")
  c.data.num_speakers, c.data.test_speakers, c.data.max_examples = 4, 2, 16
  c.data.frames, c.data.features = 8, 8
  c.model = ml_collections.ConfigDict(dict(name="mlp", hidden=(4,)))  # DS-CNN traces for ~15 s
  c.runs.fedkws_ui.cohort_size = 2
  c.sweep.params = "runs.fedkws_ui.mu=0,0.5;runs.fedkws_ui.lam=0.01"  # the variant's paths, fewer values
  _, metrics = trace_sweep(c, "fedkws_ui")
  assert metrics["train_loss"].shape == ()


@pytest.mark.parametrize("variant", ["mlr+grid", "dnn+grid"])
def test_pfedmt_grid_config_traces(variant):
  c = load_config("pfedmt_synthetic", variant)
  c.data.num_clients, c.data.team_size, c.data.max_examples = 4, 2, 16
  c.runs.pfedmt.team_iters = 2
  c.local.steps = 2
  _, metrics = trace_sweep(c, "pfedmt")
  assert metrics["train_loss"].shape == ()


def test_factory_parameter_left_at_its_default_can_be_swept():
  c = tiny(rounds=1)
  c.runs = ml_collections.ConfigDict({"x": dict(algorithm="pfedme", lam=15.0, inner_steps=2,
                                               personal_lr=0.01, cohort_size=2)})
  c.run_order = ("x",)
  c.sweep.params = "runs.x.beta=1,2"  # pfedme's beta: a factory parameter the run does not set
  runner.validate_config(c)
  _, metrics = trace_sweep(c, "x")
  assert metrics["train_loss"].shape == ()
  c.sweep.params = "runs.x.weighting=1,2"  # a factory parameter, but not a number
  with pytest.raises(ValueError, match="'weighting' of algorithm 'pfedme' is a .*not a number"):
    runner.validate_config(c)
  c.sweep.params = "runs.x.betta=1,2"
  with pytest.raises(ValueError, match=r"not a config field nor a numeric parameter.*'beta'"):
    runner.validate_config(c)


CONFIGS = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py")
                 and not f.startswith("_"))


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_accepts_sweep_seeds(name):
  c = load_config(name)
  c.lock()  # as config_flags gives it: an absent field is refused
  c.sweep.seeds = 4
  c.sweep.params = "local.learning_rate=0.01,0.02"
  runner.validate_config(c)
  assert sweep.sweep_config(c) is not None


def test_a_diverging_experiment_is_named_by_setting_and_seed():
  c = tiny(rounds=1)
  c.sweep.seeds = 2
  c.sweep.params = "local.learning_rate=0.02,1e30"
  with pytest.raises(loop.NonFiniteLossError,
                     match=r"in experiment 2 \(setting learning_rate=1e\+30, seed 0\)"):
    experiment.train_and_evaluate(c, None)


def test_sweep_rows_keep_ints_and_tensorboard_runs_per_experiment(tmp_path):
  pytest.importorskip("tensorboardX")
  from helpers import tensorboard_steps

  c = tiny(rounds=2)
  c.eval_every = 1
  c.sweep.seeds = 2
  c.sweep.params = "local.learning_rate=0.02,0.1"
  experiment.train_and_evaluate(c, str(tmp_path))
  rows = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
  assert all(isinstance(r[k], int) for r in rows for k in ("seed", "round", "experiment", "clients_trained"))
  tb = tmp_path / "tensorboard" / "fedavg"
  runs = sorted(str(p.relative_to(tb)) for p in tb.glob("*/*"))
  assert runs == ["learning_rate=0.02/seed0", "learning_rate=0.02/seed1", "learning_rate=0.1/seed0",
                  "learning_rate=0.1/seed1"]
  for run in runs:  # one curve per experiment: each step once
    steps = tensorboard_steps(tb / run)
    assert steps["train_loss"] == [1, 2] and steps["global/accuracy"] == [1, 2]
    assert "seed" not in steps and "round" not in steps


def test_shape_fields_are_read_from_signatures_and_values():
  c = tiny(runs=("fedavg",))
  c.runs.fedavg.weighting = "uniform"
  for params, match in [
    ("runs.fedavg.cohort_size=2,3", r"'cohort_size' \(annotated int"),  # the factory's annotation
    ("local.steps=1,2", r"'steps' \(a field of the static LocalSchedule\) changes"),
    ("rounds=1,2", r"'rounds' \(the int 3\) changes array shapes"),  # an int config value
    ("seed=1,2", "'seed'.*changes array shapes"),
    ("runs.fedavg.weighting=1,2", "'weighting' of algorithm 'fedavg' is a str, not a number"),
  ]:
    c.sweep.params = params
    with pytest.raises(ValueError, match=match):
      sweep.validate(c)


def test_a_nested_float_field_of_a_run_reaches_the_builder_traced():
  """``runs.<label>.<dict>.<float>`` (e.g. a privacy block's noise multiplier) is an experiment
  axis: validated by its value, set in the config copy the builder reads, traced in the round."""
  c = tiny(rounds=1)
  c.runs.fedavg.privacy = ml_collections.ConfigDict(dict(noise_multiplier=1.0, clients=4))
  c.sweep.params = "runs.fedavg.privacy.noise_multiplier=0.5,2"
  sweep.validate(c)  # a float: sweepable
  c.sweep.params = "runs.fedavg.privacy.clients=2,3"
  with pytest.raises(ValueError, match=r"'clients' \(the int 4\) changes array shapes"):
    sweep.validate(c)
  c.sweep.params = "runs.fedavg.privacy.noise_multiplier=0.5,2"
  ctx = runner.make_context(c)
  seen = []

  plain = c.copy_and_resolve_references()
  del plain.runs.fedavg.privacy  # no factory takes it yet: the plain run builds the algorithm

  def build_with_privacy(label, run, ctx):  # a builder whose factory would read the field
    seen.append(run.privacy.noise_multiplier)
    return build_algorithm(label, plain.runs[label], ctx)

  build = sweep.config_builder(c, "fedavg", ctx, build_with_privacy)
  alg = stacked.sweep(build, {"runs.fedavg.privacy.noise_multiplier": [0.5, 2.0]}, [0, 0])
  loop.run(alg, ctx.data, num_rounds=1, key=jax.random.key(0), cache=None)
  assert any(isinstance(v, jax.core.Tracer) for v in seen)
  build({"runs.fedavg.privacy.noise_multiplier": 2.0})
  assert seen[-1] == 2.0 and c.runs.fedavg.privacy.noise_multiplier == 1.0  # the config is not changed


def test_core_sweep_pads_names_and_splits_experiments():
  c = tiny(rounds=1)
  ctx = runner.make_context(c)
  alg = build_algorithm("fedavg", c.runs.fedavg, ctx)
  swept_alg = stacked.sweep(lambda hp: alg, {}, [3, 4], pad_to=3)
  st = swept_alg.init(None)
  assert st.keys.shape[0] == 3  # the last experiment repeated
  st, metrics = jax.jit(swept_alg.round)(st, ctx.data, None)
  per = stacked.by_experiment(metrics, 2)
  assert len(per) == 2 and set(per[0]) == set(per[1]) and "train_loss" in per[0]
  assert float(metrics["train_loss@1"]) == float(metrics["train_loss@2"])  # the pad repeats seed 4
  assert sorted(swept_alg.models(st)) == ["global@0", "global@1"]  # the pad is not named
  assert stacked.by_experiment({"global@1": 1, "train_loss": 2, "x@9": 3}, 2) == [{}, {"global": 1}]
  for bad, match in [(dict(seeds=[]), "at least one experiment"),
                     (dict(seeds=[0], hparams={"a": [1.0, 2.0]}), "2 values for 1 seeds"),
                     (dict(seeds=[0, 1], pad_to=1), "pad_to=1 is fewer")]:
    with pytest.raises(ValueError, match=match):
      stacked.sweep(lambda hp: alg, bad.pop("hparams", {}), **bad)


def test_an_int_inside_a_runs_update_section_is_an_axis():
  """The ints of a run's update sections that their builders take traced (compression
  ``bits``, Krum's ``f``: their factories' annotations, read by each capability's hint) are
  experiment axes; other ints stay refused: a run's ``cohort_size``, a section's other counts
  (``privacy.clients``,
  ``tests/test_sweep.py::test_a_nested_float_field_of_a_run_reaches_the_builder_traced``)."""
  c = tiny()
  c.runs.fedavg.compression = ml_collections.ConfigDict(dict(uplink=dict(name="qsgd", bits=2)))
  c.runs.fedavg.aggregator = ml_collections.ConfigDict(dict(name="krum", f=1))
  c.sweep.params = "runs.fedavg.compression.uplink.bits=1,4;runs.fedavg.aggregator.f=1,2"
  sweep.validate(c)
  c.sweep.params = "runs.fedavg.cohort_size=2,3"
  with pytest.raises(ValueError, match=r"'cohort_size' \(annotated int"):
    sweep.validate(c)


def test_a_one_seed_table_has_no_spread_and_a_model_that_never_trained_is_left_out(tmp_path, capsys):
  """Issue 42 items 4 and 7: one seed prints each value alone (not "± 0.0000"), and the root of
  edges_only, which never aggregates, is neither a column of the table nor the sweep's pick."""
  c = tiny(runs=("edges_only",), rounds=2)
  c.sweep.params = "local.learning_rate=0.02,0.1"
  results = experiment.train_and_evaluate(c, str(tmp_path))
  out = capsys.readouterr().out
  assert "sweep of run 'edges_only' (one seed)" in out and "± " not in out
  assert "level1/accuracy" in out and "global/accuracy" not in out
  assert ("(left out, never trained within the run: its parameters are still the initial ones: "
          "edges_only global)") in out
  entry = results["edges_only"]["sweep"]
  assert entry["untrained"] == ["global"] and entry["best"] is None
  assert all("global/accuracy" not in row["mean"] for row in entry["settings"])
  assert not (tmp_path / "sweep_edges_only.png").exists()


def test_the_table_of_several_seeds_keeps_its_spread():
  rows = sweep.aggregate([{"a": 1.0}], [[{"m": 0.5}, {"m": 0.7}]])
  table = sweep.format_table("r", rows)
  assert "(mean ± std over seeds)" in table and "0.6000 ± 0.1000" in table
  one = sweep.format_table("r", sweep.aggregate([{"a": 1.0}], [[{"m": 0.5}]]))
  assert "(one seed)" in one and "| 0.5000 |" in one and "±" not in one.split("\n", 1)[1]
