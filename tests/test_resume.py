"""Reliability (issue 15): exact resume after SIGKILL or a stop request, per state family and
mid-sweep; corrupted checkpoints; reused workdirs; a diverged run writes nothing. (The loop's
own checks are in test_loop.py, command-line refusals in test_cli.py, memory in test_memory.py,
skipped clients in test_skip_nonfinite.py.)"""

import json
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest
from config_files import load_config
from helpers import hierfavg_config, tensorboard_steps

from fedtree import experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(ROOT, "tests", "kill_resume_driver.py")
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}


def _rows(workdir):
  out = []
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      row.pop("elapsed_s", None)
      out.append(row)
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
