"""The launch path: configs, absl flag overrides, metrics files, and early config errors."""

import json
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest
from config_files import load_config

from fedtree import experiment
from fedtree.core.loop import NonFiniteLossError
from fedtree.core.metrics import FAIRNESS_STATS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def quickstart(rounds=4):
  c = load_config("quickstart")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress = rounds, 2, 2, False
  c.data.group_sizes = (4, 2, 2)
  c.runs.fedavg.cohort_size = c.runs.fedadam.cohort_size = 4
  c.runs.hierfavg.cohort_size = c.runs.edges_only.cohort_size = 2
  return c


def test_quickstart_end_to_end(tmp_path, capsys):
  results = experiment.train_and_evaluate(quickstart(), str(tmp_path))
  out, err = capsys.readouterr()
  assert set(results) == {"fedavg", "hierfavg", "fedadam", "edges_only"}
  assert {"global", "level1"} <= set(results["hierfavg"])
  lines = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
  assert {ln["run"] for ln in lines} == set(results)
  assert all(np.isfinite(ln["train_loss"]) for ln in lines)
  assert any("global/accuracy" in ln for ln in lines)
  summary = json.load(open(tmp_path / "summary.json"))
  assert 0.0 <= summary["fedavg"]["global"]["accuracy"] <= 1.0
  assert len(summary["hierfavg"]["level1"]["group_accuracy"]) == 3
  assert list((tmp_path / "tensorboard" / "fedavg").glob("events.out.tfevents.*"))
  # 4 rounds: the root of hierfavg (every 10 edge rounds) and of edges_only never aggregated
  assert summary["fedavg"]["global"]["trained"] and summary["hierfavg"]["level1"]["trained"]
  assert summary["hierfavg"]["global"]["trained"] is False
  assert summary["edges_only"]["global"]["trained"] is False
  # fairness over rounds: every evaluation row carries the spread of per-client accuracy, the
  # last one equal to the summary's
  last = [ln for ln in lines if ln["run"] == "fedavg"][-1]
  fair = summary["fedavg"]["global"]["fairness"]
  for stat in FAIRNESS_STATS:
    assert last[f"global/accuracy_{stat}"] == fair[stat], stat
  assert all("global/accuracy_worst10_mean" in ln for ln in lines if "global/accuracy" in ln)
  table = out[out.index("Final evaluation"):]
  rows = [ln.split()[:2] for ln in table.splitlines()[3:] if ln and not ln.startswith("(")]
  assert ["fedavg", "global"] in rows and ["hierfavg", "level1"] in rows
  assert ["hierfavg", "global"] not in rows and ["edges_only", "global"] not in rows
  assert "never trained" in table and "hierfavg global, edges_only global" in table
  # where everything is: the workdir first, every file it holds at the end, with full paths
  assert f"fedtree: workdir {tmp_path}" in err.splitlines()[0]
  listing = out[out.index(f"the workdir {tmp_path} holds:"):]   # stdout, after the table (issue 57)
  for name in ("summary.json", "metrics.jsonl", "config.json", "plot_accuracy.png",
               "plot_fairness_rounds.png"):
    assert f"  {tmp_path / name}\n" in listing, name
  assert f"plots: {tmp_path / 'plot_accuracy.png'}" in err


def test_final_table_in_percent_with_group_names():
  from fedtree.experiment.reporting import format_summary

  results = {"kws": {"global": {"accuracy": 0.5, "false_accept_rate": 0.0123, "false_reject_rate": 0.25,
                                "group_accuracy": [0.4, 0.6]}}}
  text = format_summary(results, group_names=("wiki", "news"))
  header, _, row = text.strip().splitlines()[1:4]
  assert header.split()[-2:] == ["wiki", "news"] and "FA %" in header and "FR %" in header
  assert row.split()[-4:] == ["1.23", "25.00", "0.400", "0.600"]
  assert "in %" in text


def test_main_flag_overrides(tmp_path):
  cmd = [sys.executable, "-m", "fedtree.main", "--config=configs/quickstart.py",
         f"--workdir={tmp_path}", "--config.rounds=2", "--config.eval_every=1",
         "--config.rounds_per_call=1", "--config.progress=False",
         "--config.data.group_sizes=(3,2)", "--config.runs.fedavg.cohort_size=3",
         "--config.runs.fedadam.cohort_size=3", "--config.runs.hierfavg.cohort_size=2",
         "--config.runs.edges_only.cohort_size=2"]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-3000:]
  assert "Final evaluation" in out.stdout and "Final evaluation" not in out.stderr
  rounds = {json.loads(x)["round"] for x in open(tmp_path / "metrics.jsonl")}
  assert rounds == {1, 2}


@pytest.mark.parametrize("mutate,match", [
  (lambda c: c.runs.fedavg.__setattr__("algorithm", "fedbogus"), r"algorithm='fedbogus' is unknown"),
  (lambda c: c.__delattr__("model"), "config has no field 'model'"),
  (lambda c: c.topology.__setattr__("kind", "ring"), "topology.kind='ring'"),
  (lambda c: c.model.__setattr__("name", "vgg"), "model name 'vgg' is unknown"),
  (lambda c: c.runs.fedavg.__setattr__("cohort_size", 99), "cohort_size=99 exceeds group 0"),
  (lambda c: c.runs.hierfavg.__setattr__("periods", (0,)), r"periods\[0\]=0 must be >= 1"),
  (lambda c: c.data.__setattr__("name", "imagenet22k"), "data.name='imagenet22k' is unknown"),
  (lambda c: c.local.__setattr__("learning_rate", -0.1), "learning_rate=-0.1 must be > 0"),
  (lambda c: c.topology.__setattr__("kind", "sizes") or c.topology.__setattr__("sizes", [3, 3]),
   "describes 6 clients but the data has 8"),
])
def test_bad_config_raises_a_clear_error(tmp_path, mutate, match):
  c = quickstart()
  c.unlock() if hasattr(c, "unlock") else None
  mutate(c)
  with pytest.raises(ValueError, match=match):
    experiment.train_and_evaluate(c, str(tmp_path))


def test_nan_loss_stops_the_run_with_the_round(tmp_path):
  c = quickstart()
  c.local.learning_rate = 1e12
  c.runs = ml_collections.ConfigDict({"fedavg": c.runs.fedavg})
  c.run_order = ("fedavg",)
  with pytest.raises(NonFiniteLossError, match=r"run .fedavg. diverged at round \d+: .*training loss is nan"):
    experiment.train_and_evaluate(c, str(tmp_path))


def test_a_stopped_run_resumes_from_its_checkpoint(tmp_path):
  c = quickstart(rounds=4)
  c.checkpoint_every = 2
  c.runs = ml_collections.ConfigDict({"fedavg": c.runs.fedavg})
  c.run_order = ("fedavg",)
  full = experiment.train_and_evaluate(c, str(tmp_path / "full"))
  c.rounds = 2
  experiment.train_and_evaluate(c, str(tmp_path / "resumed"))       # "stops" after round 2
  c.rounds = 4
  resumed = experiment.train_and_evaluate(c, str(tmp_path / "resumed"))
  rounds = [json.loads(x)["round"] for x in open(tmp_path / "resumed" / "metrics.jsonl")]
  assert rounds == [2, 4], f"the resumed run must continue at round 3, logged {rounds}"
  np.testing.assert_allclose(resumed["fedavg"]["global"]["accuracy"], full["fedavg"]["global"]["accuracy"])
  np.testing.assert_allclose(resumed["fedavg"]["global"]["loss"], full["fedavg"]["global"]["loss"], rtol=1e-6)


def test_run_order_is_kept_and_checked(tmp_path):
  c = quickstart()
  assert [label for label, _ in experiment.ordered_runs(c)] == ["fedavg", "fedadam", "hierfavg", "edges_only"]
  c.run_order = ("fedavg", "typo")
  with pytest.raises(ValueError, match=r"run_order names \['typo'\]"):
    experiment.train_and_evaluate(c, str(tmp_path))


def test_main_cpu_devices_shards_the_clients(tmp_path):
  cmd = [sys.executable, "-m", "fedtree.main", "--config=configs/quickstart.py", f"--workdir={tmp_path}",
         "--cpu_devices=2", "--config.rounds=1", "--config.eval_every=1", "--config.rounds_per_call=1",
         "--config.progress=False", "--config.data.group_sizes=(4,2)", "--config.runs.fedavg.cohort_size=4",
         "--config.runs.fedadam.cohort_size=4", "--config.runs.hierfavg.cohort_size=2",
         "--config.runs.edges_only.cohort_size=2"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "CpuDevice(id=1)" in out.stderr
  assert json.load(open(tmp_path / "config.json"))["mesh_shape"] == 2
  bad = subprocess.run(cmd[:4] + ["--cpu_devices=-1"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=env)
  assert bad.returncode != 0 and "--cpu_devices=-1 must be >= 0" in bad.stderr


def test_check_workdir_only_reads_and_a_silent_reporter_writes_nothing(tmp_path, capsys):
  """What the processes other than 0 of a multi-process run do with the workdir: check it
  (refusing another config's run) without creating or writing anything, and report nothing."""
  from fedtree.experiment.reporting import Reporter
  from fedtree.experiment.workdir import check_workdir, prepare_workdir

  c = quickstart()
  fresh = tmp_path / "fresh"
  check_workdir(str(fresh), c, overwrite=False)
  assert not fresh.exists()
  prepare_workdir(str(fresh), c, overwrite=False)
  other = quickstart()
  other.local.learning_rate = 0.5
  with pytest.raises(ValueError, match="holds a run of a different config"):
    check_workdir(str(fresh), other, overwrite=False)
  check_workdir(str(fresh), other, overwrite=True)   # overwrite: no refusal, nothing removed yet
  assert (fresh / "fingerprint.json").exists()
  r = Reporter.silent()
  r.start_run("x", 2)
  r.log("x", 1, {"loss": 1.0})
  r.print("hello")
  r.result("table")
  r.close()
  out, err = capsys.readouterr()
  assert (out, err) == ("", "")
