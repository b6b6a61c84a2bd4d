"""Reliability (issue 15): exact resume after SIGKILL, corrupted checkpoints, reused
workdirs, in-jit divergence, the compiled-function cache, command-line refusals."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from config_files import load_config

from fedtree import experiment
from fedtree.core import loop
from fedtree.core.algorithm import FederatedAlgorithm, NodeModels, TreeState

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(ROOT, "tests", "kill_resume_driver.py")
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}


def hierfavg_config(rounds=4):
  c = load_config("quickstart")
  c.rounds, c.eval_every, c.rounds_per_call, c.checkpoint_every, c.progress = rounds, 2, 1, 2, False
  c.data.group_sizes = (4, 2, 2)
  c.data.dim, c.data.max_examples, c.data.test_examples = 8, 20, 8
  c.model.hidden = (8,)
  c.runs = ml_collections.ConfigDict({"hierfavg": c.runs.hierfavg})
  c.run_order = ("hierfavg",)
  c.runs.hierfavg.cohort_size, c.runs.hierfavg.periods = 2, (2,)
  return c


def _rows(workdir):
  out = []
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      row.pop("elapsed_s", None)
      out.append(row)
  return out


def tensorboard_steps(folder) -> dict[str, list[int]]:
  """``{tag: [step, ...]}`` of the scalars in every TensorBoard event file directly in ``folder``
  (TFRecord framing read by hand, events decoded with tensorboardX's protos), in file order."""
  import struct

  from tensorboardX.proto import event_pb2

  out: dict[str, list[int]] = {}
  for path in sorted(folder.glob("events.out.tfevents.*")):
    data = path.read_bytes()
    pos = 0
    while pos + 12 <= len(data):
      (n,) = struct.unpack("<Q", data[pos:pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
      pos += 12 + n + 4
      if event.file_version and event.step:  # a resumed writer's purge_step: TensorBoard drops
        out = {t: [s for s in steps if s < event.step] for t, steps in out.items()}  # steps >= it
      for v in event.summary.value:
        out.setdefault(v.tag, []).append(int(event.step))
  return out


def _drive(config_path, workdir, *kill):
  return subprocess.run([sys.executable, DRIVER, str(config_path), str(workdir), *map(str, kill)],
                        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)


def _kill_and_resume(tmp_path, config, kill_round, where):
  path = tmp_path / "config.json"
  path.write_text(config.to_json())
  full = _drive(path, tmp_path / "full")
  assert full.returncode == 0, full.stderr[-3000:]
  killed = _drive(path, tmp_path / "resumed", kill_round, where)
  assert killed.returncode == -9, killed.stderr[-3000:]
  resumed = _drive(path, tmp_path / "resumed")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert _rows(tmp_path / "resumed") == _rows(tmp_path / "full")
  assert (json.loads((tmp_path / "resumed" / "summary.json").read_text())
          == json.loads((tmp_path / "full" / "summary.json").read_text()))
  return resumed


def test_sigkill_between_checkpoints_resumes_bit_equal_without_duplicate_rows(tmp_path):
  """Killed after round 3's row (checkpoint at 2): the rerun drops row 3, redoes 3 and 4."""
  resumed = _kill_and_resume(tmp_path, hierfavg_config(), 3, "after_log")
  assert "resumed from the checkpoint of round 2" in resumed.stderr


@pytest.mark.slow
def test_sigkill_during_a_checkpoint_write_resumes_bit_equal(tmp_path):
  _kill_and_resume(tmp_path, hierfavg_config(), 4, "during_save")


@pytest.mark.slow
def test_sigkill_grouppfl_across_its_stages(tmp_path):
  from test_grouppfl import tiny_config

  c = tiny_config()
  c.checkpoint_every, c.eval_every, c.rounds_per_call = 1, 1, 1
  _kill_and_resume(tmp_path, c, 3, "after_log")  # round 3 = the group stage's first


# ------------------------------------------------------------------------ in process
def _one_run(c, workdir):
  return experiment.train_and_evaluate(c, str(workdir))


def test_resumed_rows_are_not_duplicated_in_process(tmp_path):
  c = hierfavg_config(rounds=4)
  c.rounds = 3
  _one_run(c, tmp_path)                       # checkpoint at 2 and (final) 3, rows 2 and 3
  import shutil

  shutil.rmtree(tmp_path / "checkpoints" / "hierfavg" / "3")   # as if killed before saving 3
  c.rounds = 4
  _one_run(c, tmp_path)
  assert [r["round"] for r in _rows(tmp_path)] == [1, 2, 3, 4]


def _corrupt(step_dir):
  files = [os.path.join(d, f) for d, _, fs in os.walk(step_dir) for f in fs]
  data = [f for f in files if "ocdbt" in f or f.endswith(".data") or "/d/" in f]
  assert data, files
  for f in data:
    with open(f, "r+b") as fh:
      fh.truncate(max(0, os.path.getsize(f) // 2))


def test_a_corrupted_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
  c = hierfavg_config(rounds=4)
  c.checkpoint_every, c.keep_checkpoints = 1, 3
  full = _one_run(c, tmp_path / "full")
  c.rounds = 3
  _one_run(c, tmp_path / "w")
  _corrupt(tmp_path / "w" / "checkpoints" / "hierfavg" / "3")
  c.rounds = 4
  capsys.readouterr()
  got = _one_run(c, tmp_path / "w")
  err = capsys.readouterr().err
  assert "checkpoints/hierfavg/3 does not restore" in err
  assert "resumed from the checkpoint of round 2" in err
  assert got["hierfavg"]["global"]["loss"] == full["hierfavg"]["global"]["loss"]
  assert [r["round"] for r in _rows(tmp_path / "w")] == [1, 2, 3, 4]
  kept = sorted(int(d) for d in os.listdir(tmp_path / "w" / "checkpoints" / "hierfavg") if d.isdigit())
  assert kept == [2, 3, 4]  # keep_checkpoints=3


def test_no_restorable_checkpoint_is_a_clear_error(tmp_path):
  from fedtree.experiment.checkpoint import CheckpointError

  c = hierfavg_config(rounds=2)
  c.checkpoint_every, c.keep_checkpoints = 1, 1
  _one_run(c, tmp_path)
  _corrupt(tmp_path / "checkpoints" / "hierfavg" / "2")
  c.rounds = 3
  with pytest.raises(CheckpointError, match=r"no checkpoint .* restores: .*/2 .*--overwrite"):
    _one_run(c, tmp_path)


def test_a_workdir_of_another_config_is_refused_unless_overwrite(tmp_path):
  c = hierfavg_config(rounds=2)
  _one_run(c, tmp_path)
  c.local.learning_rate = 0.5
  with pytest.raises(ValueError, match="holds a run of a different config.*--overwrite"):
    _one_run(c, tmp_path)
  out = experiment.train_and_evaluate(c, str(tmp_path), overwrite=True)
  assert [r["round"] for r in _rows(tmp_path)] == [1, 2]
  assert np.isfinite(out["hierfavg"]["global"]["loss"])
  c.rounds = 3  # more rounds: the same run, extended
  _one_run(c, tmp_path)


def test_a_server_diverging_in_the_last_round_is_not_written(tmp_path):
  c = hierfavg_config(rounds=1)
  c.runs = ml_collections.ConfigDict({"fedadam": ml_collections.ConfigDict(dict(
    algorithm="fedavg", cohort_size=4, server=dict(name="fedadam", learning_rate=1e30)))})
  c.run_order = ("fedadam",)
  with pytest.raises(FloatingPointError, match="run 'fedadam' diverged at round 1"):
    _one_run(c, tmp_path)
  assert not (tmp_path / "summary.json").exists()
  assert _rows(tmp_path) == []


def test_stop_request_keeps_the_last_checkpoint(tmp_path):
  c = hierfavg_config(rounds=4)
  c.checkpoint_every = 1
  calls = []

  def stop():
    calls.append(1)
    return len(calls) >= 2

  with pytest.raises(experiment.runner.RunStopped, match="stopped at round 2 of 4"):
    experiment.train_and_evaluate(c, str(tmp_path), should_stop=stop)
  assert sorted(os.listdir(tmp_path / "checkpoints" / "hierfavg"))[-1] == "2"


# ------------------------------------------------------------------------ the loop itself
def _toy(bad_round=None, bad_level=1, bad_node=2):
  """A model-free algorithm on a 2-level state; puts a NaN at ``bad_node`` of ``bad_level``
  in round ``bad_round``."""
  traces = []

  def init(key):
    del key
    return TreeState(round=jnp.zeros((), jnp.int32), params=(jnp.zeros((1, 3)), jnp.zeros((4, 3))),
                     opt_state=((), ()))

  def round_fn(state, data, key):
    traces.append(1)
    params = [p + jax.random.normal(key, p.shape) for p in state.params]
    if bad_round is not None:
      hit = state.round + 1 == bad_round
      params[bad_level] = params[bad_level].at[bad_node, 1].set(
        jnp.where(hit, jnp.nan, params[bad_level][bad_node, 1]))
    return state.replace(round=state.round + 1, params=tuple(params)), {"train_loss": jnp.float32(1.0)}

  alg = FederatedAlgorithm(init=init, round=round_fn,
                           models=lambda s: {"root": NodeModels(s.params[0], np.zeros(1, np.int32))},
                           name="toy")
  return alg, traces


def test_repeated_runs_with_state_compile_once():
  alg, traces = _toy()
  state = loop.run(alg, None, num_rounds=2, key=jax.random.key(0), rounds_per_call=2)
  for target in (4, 6, 8):
    state = loop.run(alg, None, num_rounds=target, key=jax.random.key(0), rounds_per_call=2, state=state)
  assert int(state.round) == 8 and len(traces) == 1
  ref = loop.run(alg, None, num_rounds=8, key=jax.random.key(0), rounds_per_call=4)
  np.testing.assert_allclose(np.asarray(state.params[1]), np.asarray(ref.params[1]), rtol=1e-6)


def test_eval_cadence_cuts_fused_calls_and_each_length_compiles_once():
  alg, traces = _toy()
  seen = []
  loop.run(alg, None, num_rounds=10, key=jax.random.key(0), rounds_per_call=4, eval_every=3,
           on_eval=lambda s, r: seen.append(r) or {"x": 1.0})
  assert seen == [3, 6, 9, 10]
  assert len(traces) == 2  # calls of 3, 3, 3, 1 rounds: two distinct lengths


@pytest.mark.parametrize("level,node,where", [(1, 2, "server level 1, node 2"),
                                              (0, 0, "server level 0, node 0")])
def test_divergence_in_a_fused_call_names_round_level_and_node(level, node, where):
  alg, _ = _toy(bad_round=3, bad_level=level, bad_node=node)
  with pytest.raises(loop.NonFiniteLossError, match=f"run 'toy' diverged at round 3: .*{where}"):
    loop.run(alg, None, num_rounds=4, key=jax.random.key(0), rounds_per_call=4)


def test_number_or_name_fields_from_the_command_line():
  from fedtree.experiment.runner import number_or_name

  assert number_or_name("8") == 8 and number_or_name("None") is None
  assert number_or_name("auto") == "auto" and number_or_name(4) == 4


@pytest.mark.parametrize("field,value", [("rounds_per_call", 0), ("eval_every", 0),
                                         ("keep_checkpoints", 0)])
def test_zero_counts_are_refused(tmp_path, field, value):
  c = hierfavg_config()
  c[field] = value
  with pytest.raises(ValueError, match=f"config.{field}={value}"):
    experiment.validate_config(c)


def test_cli_refusal_is_one_line_and_results_go_to_stdout(tmp_path):
  base = [sys.executable, "-m", "fedtree.main", "--config=configs/quickstart.py",
          "--config.rounds=1", "--config.eval_every=1", "--config.rounds_per_call=1",
          "--config.progress=False", "--config.data.group_sizes=(3,2)", "--config.chunk_size=8",
          "--config.runs.fedavg.cohort_size=3", "--config.runs.fedadam.cohort_size=3",
          "--config.runs.hierfavg.cohort_size=2", "--config.runs.edges_only.cohort_size=2"]
  bad = subprocess.run(base + ["--config.local.learning_rate=-1"], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=300)
  assert bad.returncode == 1
  assert "Traceback" not in bad.stderr
  assert "fedtree: error: config.local.learning_rate=-1" in bad.stderr
  typo = subprocess.run(base + ["--config.rnds=3"], cwd=ROOT, env=ENV, capture_output=True,
                        text=True, timeout=300)
  assert typo.returncode == 1 and "Traceback" not in typo.stderr
  assert 'Did you mean "rounds"' in typo.stderr.splitlines()[0]
  ok = subprocess.run(base, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
  assert ok.returncode == 0, ok.stderr[-3000:]
  assert "Final evaluation" in ok.stdout
  assert "no workdir given" in ok.stderr
  assert "orbax" not in ok.stderr.lower()


# ------------------------------------------------------------------------ skipping bad clients
def _poisoned_problem():
  from fedtree.core.data import as_device
  from fedtree.datasets.synthetic import grouped_synthetic
  from fedtree.models import build_model

  data, _ = grouped_synthetic(group_sizes=(3, 3), dim=4, num_classes=3, mean_examples=6,
                              min_examples=3, max_examples=8, test_examples=3, seed=1)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(4,))
  data = as_device(data)
  bad = data.replace(x_train=data.x_train.at[1].set(jnp.nan))  # client 1 diverges
  return model, data, bad


def test_skip_nonfinite_gives_a_bad_client_weight_zero():
  """train_cohort(skip_nonfinite=True) on data where client 1 is NaN = the weighted mean of
  the other clients' deltas from a clean run (clients are keyed by index, so they match)."""
  import optax

  from fedtree.core.algorithm import local_training
  from fedtree.core.local import LocalSchedule
  from fedtree.core.sampling import cohort_sampler
  from fedtree.core.tier import train_cohort

  model, data, bad = _poisoned_problem()
  sched = LocalSchedule(batch_size=2, epochs=1)
  update = local_training(None, model, optax.sgd(0.1), sched, data)
  theta = jax.tree.map(lambda p: p[None], model.init(jax.random.key(0)))
  cohort = cohort_sampler(np.zeros(data.num_clients, np.int32), None)(jax.random.key(1))
  kw = dict(num_steps=sched.num_steps(data.n_train), weights=data.n_train.astype(jnp.float32),
            key=jax.random.key(2), chunk_size=2)
  clean = train_cohort(update, theta, cohort, data, keep_client_params=True, **kw)
  skipped = train_cohort(update, theta, cohort, bad, skip_nonfinite=True, **kw)
  assert int(skipped.num_skipped) == 1 and int(skipped.num_trained) == data.num_clients - 1
  slot = {int(c): i for i, c in enumerate(np.asarray(cohort.clients))}
  w = np.asarray(data.n_train, np.float64)
  w[1] = 0.0
  expect = jax.tree.map(
    lambda t, cp: sum(w[c] * (np.asarray(t[0]) - np.asarray(cp[slot[c]])) for c in range(len(w)))
    / w.sum(), theta, clean.client_params)
  for a, b in zip(jax.tree.leaves(skipped.pseudo_gradient()), jax.tree.leaves(expect), strict=True):
    np.testing.assert_allclose(np.asarray(a)[0], b, atol=1e-6)
  unskipped = train_cohort(update, theta, cohort, bad, **kw)
  assert not all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(unskipped.pseudo_gradient()))


def test_fedavg_skip_nonfinite_counts_skipped_clients_and_stays_finite():
  import optax

  from fedtree.algorithms.hierfavg import fedavg
  from fedtree.core.local import LocalSchedule

  model, _, bad = _poisoned_problem()
  kw = dict(model=model, data=bad, local_optimizer=optax.sgd(0.1),
            schedule=LocalSchedule(batch_size=2, epochs=1))
  rows = []
  state = loop.run(fedavg(skip_nonfinite=True, **kw), bad, num_rounds=2, key=jax.random.key(0),
                   on_metrics=lambda r, m: rows.append(m))
  assert [m["clients_skipped"] for m in rows] == [1, 1]
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.params))
  with pytest.raises(loop.NonFiniteLossError, match="diverged at round 1"):
    loop.run(fedavg(**kw), bad, num_rounds=2, key=jax.random.key(0))


# ------------------------------------------------------------------------ stop and resume, per family
def _family_config(family):
  """A tiny config with one run of ``family``'s state kind (persistent per-client state,
  team models, async buffers, cluster assignments, private models)."""
  if family in ("pfedme", "pfedmt"):
    c = load_config("pfedmt_synthetic", "mlr")
    c.data.num_clients, c.data.team_size, c.data.max_examples = 6, 3, 60
    c.local.steps = 2
    c.runs.pfedmt.team_iters = 2
    c.runs.pfedme.inner_steps = 2
  elif family == "bhfl_async":
    from test_multi_configs import _small_bhfl

    c = _small_bhfl()
  elif family in ("ifca", "awcfl_b050"):
    from test_clustering import _small_config

    c = _small_config()
  elif family == "fedkws_ui":
    from test_fedkws import _small_config

    c = _small_config()
  elif family == "ditto":
    c = load_config("personalization")
    c.data.group_sizes, c.data.dim, c.data.max_examples, c.data.test_examples = (3, 3), 6, 20, 6
    c.model.hidden = (8,)
    c.runs.ditto.cohort_size = 2
  else:
    raise ValueError(family)
  c.runs = ml_collections.ConfigDict({family: c.runs[family]})
  c.run_order = (family,)
  c.rounds, c.eval_every, c.rounds_per_call, c.checkpoint_every, c.progress = 4, 2, 1, 1, False
  return c


@pytest.mark.parametrize("family", [
  "pfedme",
  pytest.param("ditto", marks=pytest.mark.slow),
  pytest.param("pfedmt", marks=pytest.mark.slow),
  pytest.param("bhfl_async", marks=pytest.mark.slow),
  pytest.param("ifca", marks=pytest.mark.slow),
  pytest.param("awcfl_b050", marks=pytest.mark.slow),
  pytest.param("fedkws_ui", marks=pytest.mark.slow),
])
def test_stopped_and_resumed_run_equals_an_uninterrupted_one(tmp_path, family):
  """Stopped after round 3 (between evaluations, a checkpoint every round), then rerun: the
  rows and the summary equal an uninterrupted run's bit for bit."""
  c = _family_config(family)
  _one_run(c, tmp_path / "full")
  calls = []
  with pytest.raises(experiment.runner.RunStopped, match="stopped at round 3 of 4"):
    experiment.train_and_evaluate(c, str(tmp_path / "w"),
                                  should_stop=lambda: calls.append(1) or len(calls) >= 3)
  _one_run(c, tmp_path / "w")
  assert _rows(tmp_path / "w") == _rows(tmp_path / "full")
  assert (json.loads((tmp_path / "w" / "summary.json").read_text())
          == json.loads((tmp_path / "full" / "summary.json").read_text()))


def test_divergence_names_the_client_whose_update_is_not_finite():
  """Client 1's data are NaN: its update is averaged into the server model, yet the error
  names client 1 (train_cohort's ``first_nonfinite``), not only the server node."""
  import optax

  from fedtree.algorithms.hierfavg import fedavg
  from fedtree.core.local import LocalSchedule

  model, _, bad = _poisoned_problem()
  alg = fedavg(model=model, data=bad, local_optimizer=optax.sgd(0.1),
               schedule=LocalSchedule(batch_size=2, epochs=1), chunk_size=2)
  with pytest.raises(loop.NonFiniteLossError, match=r"round 1: client 1 sent a non-finite update"):
    loop.run(alg, bad, num_rounds=2, key=jax.random.key(0), cache=None)
  good = bad.replace(x_train=jnp.nan_to_num(bad.x_train))
  rows = []
  loop.run(alg, good, num_rounds=1, key=jax.random.key(0), cache=None,
           on_metrics=lambda r, m: rows.append(m))
  assert "nonfinite_client" not in rows[0]  # read by the check, not logged


# ------------------------------------------------------------------------ memory stated before compiling
def test_a_run_that_cannot_fit_fails_before_compiling_with_the_largest_chunk_that_fits(capsys):
  from fedtree.experiment import memory, runner

  c = hierfavg_config(rounds=2)
  c.checkpoint_every = 0
  c.runs.hierfavg.chunk_size = 6
  ctx = runner.make_context(c)
  alg = experiment.registry.build_algorithm("hierfavg", c.runs.hierfavg, ctx)
  budget = memory.Budget.of(ctx)
  state = memory.tree_bytes(jax.eval_shape(alg.init, loop.init_key(jax.random.key(0))))
  step = budget.step_bytes()
  assert state > 0 and step > 0
  c.memory_limit_bytes = state + int(2.5 * step)  # the state and 2 clients' steps fit, not 6
  with pytest.raises(ValueError, match=rf"run 'hierfavg' does not fit in memory: state {state} bytes "
                                       rf"\+ chunk working set {6 * step} bytes \(chunk_size=6\).*"
                                       r"config.memory_limit_bytes\); set chunk_size <= 2"):
    experiment.train_and_evaluate(c, None)
  c.memory_limit_bytes = state // 2
  with pytest.raises(ValueError, match="even the smallest chunk does not fit"):
    experiment.train_and_evaluate(c, None)
  line = memory.check_memory("x", state_bytes=state, step_bytes=step, chunk=2, limit=state + 3 * step,
                             source="test")
  assert line.startswith("x: memory estimate ") and "chunk working set 2 x" in line


def test_a_sweep_that_cannot_fit_names_the_experiments_per_chunk_that_fit():
  from fedtree.experiment import memory, runner

  c = hierfavg_config(rounds=2)
  c.checkpoint_every = 0
  c.runs.hierfavg.chunk_size = 3
  c.sweep.seeds = 4
  ctx = runner.make_context(c)
  alg = experiment.registry.build_algorithm("hierfavg", c.runs.hierfavg, ctx)
  one = (memory.tree_bytes(jax.eval_shape(alg.init, loop.init_key(jax.random.key(0))))
         + 3 * memory.Budget.of(ctx).step_bytes())
  c.memory_limit_bytes = int(2.5 * one)  # 2 experiments of the 4 fit
  with pytest.raises(ValueError, match=r"\(chunk_size=3, 4 experiments at once\).*; set sweep.chunk <= 2"):
    experiment.train_and_evaluate(c, None)


# ------------------------------------------------------------------------ SIGKILL, per family
def _assert_tensorboard_steps_once(workdir, rounds):
  """Every TensorBoard scalar of every run folder has each step once, as TensorBoard reads the
  files (a resumed writer purges the steps after its checkpoint)."""
  folders = {p.parent for p in (workdir / "tensorboard").rglob("events.out.tfevents.*")}
  assert folders
  for folder in folders:
    for tag, steps in tensorboard_steps(folder).items():
      assert steps == sorted(set(steps)) and steps[-1] == rounds, (folder, tag, steps)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["pfedme", "pfedmt", "bhfl_async", "ifca", "fedkws_ui", "ditto"])
def test_sigkill_resumes_every_state_family_bit_equal(tmp_path, family):
  """Killed right after round 3's row (a checkpoint every 2 rounds): the rerun resumes round 2's
  checkpoint and its rows, summary and TensorBoard steps equal an uninterrupted run's."""
  pytest.importorskip("tensorboardX")
  c = _family_config(family)
  c.checkpoint_every = 2
  resumed = _kill_and_resume(tmp_path, c, 3, "after_log")
  assert "resumed from the checkpoint of round 2" in resumed.stderr
  _assert_tensorboard_steps_once(tmp_path / "resumed", 4)


@pytest.mark.slow
def test_sigkill_mid_sweep_resumes_bit_equal(tmp_path):
  from test_sweep import tiny

  c = tiny(rounds=4)
  c.eval_every, c.rounds_per_call, c.checkpoint_every = 2, 1, 2
  c.sweep.seeds = 2
  c.sweep.params = "local.learning_rate=0.02,0.1"
  resumed = _kill_and_resume(tmp_path, c, 3, "after_log")
  assert "resumed from the checkpoint of round 2" in resumed.stderr
  _assert_tensorboard_steps_once(tmp_path / "resumed", 4)


@pytest.mark.slow
def test_sigterm_stops_main_with_its_exit_code_one_line_and_the_checkpoint_kept(tmp_path):
  import signal
  import time

  from fedtree.main import EXIT_STOPPED

  cmd = [sys.executable, "-m", "fedtree.main", "--config=configs/quickstart.py", f"--workdir={tmp_path}",
         "--config.rounds=100000", "--config.eval_every=100000", "--config.rounds_per_call=1",
         "--config.checkpoint_every=1", "--config.progress=False", "--config.data.group_sizes=(3,2)",
         "--config.runs.fedavg.cohort_size=3", "--config.runs.fedadam.cohort_size=3",
         "--config.runs.hierfavg.cohort_size=2", "--config.runs.edges_only.cohort_size=2",
         "--config.model.hidden=(8,)", "--config.run_order=('fedavg',)"]
  proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  try:
    rows = tmp_path / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (rows.exists() and rows.read_text().count("\n") >= 2):
      assert proc.poll() is None, proc.communicate()[1][-3000:]
      time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
  finally:
    proc.kill()
  assert proc.returncode == EXIT_STOPPED, err[-3000:]
  stopped = [line for line in err.splitlines() if line.startswith("fedtree: stopped:")]
  assert len(stopped) == 1 and "stopped at round" in stopped[0] and "checkpoints are kept" in stopped[0], err
  assert "Traceback" not in err
  assert any((tmp_path / "checkpoints" / "fedavg").iterdir())
