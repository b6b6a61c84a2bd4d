"""The pieces of ``benchmarks/gpu_session.sh issue41`` (issue 41's one prepared GPU run) on the CPU:
the stage's order, budget and outputs with stand-in commands, the benchmarks' budget and partial
results, the loss agreement, and the summary page. The stage end to end at its tiny size is the
slow test at the bottom (it needs torch and pfl)."""

import json
import os
import re
import stat
import subprocess
import sys
import tarfile

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_session.sh")


def test_gpu_session_script_parses():
  assert subprocess.run(["bash", "-n", SCRIPT], capture_output=True, text=True).returncode == 0


def _stand_ins(bin_dir, log):
  """``python3`` and ``timeout`` that log their arguments; ``python3 -m benchmarks.gpu_report`` runs."""
  os.makedirs(bin_dir)
  scripts = {
    "python3": f"""#!/bin/bash
echo "python3 $*" >> {log}
if [ "${{1:-}}" = -m ] && [ "${{2:-}}" = benchmarks.gpu_report ]; then exec {sys.executable} "$@"; fi
exit 0
""",
    "timeout": f"""#!/bin/bash
echo "timeout $1" >> {log}
shift; exec "$@"
""",
  }
  for name, text in scripts.items():
    path = os.path.join(bin_dir, name)
    with open(path, "w") as f:
      f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


def _stage(tmp_path, stage: str, budget: int):
  """``(process, $OUT, the logged calls, the benchmarks they ran)`` of ``stage`` run with stand-ins under
  ``budget`` seconds."""
  log, out = tmp_path / "log", tmp_path / "out"
  _stand_ins(str(tmp_path / "bin"), log)
  env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", GPU_SESSION_BUDGET=str(budget),
             JAX_PLATFORMS="cpu")
  env.pop("GPU_SESSION_TINY", None)
  proc = subprocess.run(["bash", SCRIPT, stage, str(out)], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  calls = [ln for ln in log.read_text().splitlines() if "-m pip" not in ln]
  return proc, out, calls, [re.search(r"-m (benchmarks\.\w+)", ln).group(1) for ln in calls
                            if "-m benchmarks." in ln]


@pytest.mark.parametrize("budget", [420, 300])
def test_issue41_stage_runs_its_steps_within_the_budget(tmp_path, budget):
  """The stage's commands in order, each under a timeout, the caps adding up to no more than the
  budget (the pfl command's own --budget under its cap), the data outside $OUT and removed, the
  summary page and results.tgz written (the summary names the files the stand-ins did not write)."""
  proc, out, calls, steps = _stage(tmp_path, "issue41", budget)
  assert steps == ["benchmarks.pfl_cifar10", "benchmarks.methods", "benchmarks.param_traffic",
                   "benchmarks.gpu_report"]
  caps = [int(ln.split()[1]) for ln in calls if ln.startswith("timeout ")]
  assert len(caps) == 3 and sum(caps) <= budget and caps[0] <= 225
  pfl = next(ln for ln in calls if "benchmarks.pfl_cifar10" in ln)
  assert int(re.search(r"--budget=(\d+)", pfl).group(1)) < caps[0]
  assert "--procs=1,3,5" in pfl and "--iterations=200" in pfl
  data = re.search(r"--data=(\S+)", pfl).group(1)
  assert not data.startswith(str(out)) and not os.path.exists(os.path.dirname(data))
  assert "--methods=fedavg,scaffold,feddyn,personal_head,dp,median,qsgd8" in next(
    ln for ln in calls if "benchmarks.methods" in ln)
  assert "--clients=10000" in next(ln for ln in calls if "benchmarks.param_traffic" in ln)
  summary = (out / "issue41_summary.md").read_text()
  assert summary.count("**missing**") == 3 and f"budget of {budget} s" in summary
  assert summary in proc.stdout
  with tarfile.open(out / "results.tgz") as tar:
    assert "results/issue41_env.log" in tar.getnames()
  assert not (out / "results").exists()       # packed, then removed: $OUT holds the files that come back


@pytest.mark.parametrize("budget", [450, 400])
def test_issue56_stage_runs_its_steps_within_the_budget(tmp_path, budget):
  """Issue 56 item 6: workload (a) against the central bound, the profile, the population's stall and the
  LLM round, in order, each under a timeout, the caps adding up to no more than the budget; the summary
  names each step whose log is missing, and results.tgz holds what ran."""
  proc, out, calls, steps = _stage(tmp_path, "issue56", budget)
  assert steps == ["benchmarks.throughput", "benchmarks.param_traffic", "benchmarks.population",
                   "benchmarks.llm"]
  caps = [int(ln.split()[1]) for ln in calls if ln.startswith("timeout ")]
  assert len(caps) == 4 and sum(caps) <= budget
  assert "--clients=10000" in next(ln for ln in calls if "benchmarks.throughput" in ln)
  assert "--frameworks=fedtree,central" in next(ln for ln in calls if "benchmarks.throughput" in ln)
  assert "--what=fits" in next(ln for ln in calls if "benchmarks.population" in ln)
  assert "--layers=22" in next(ln for ln in calls if "benchmarks.llm" in ln)   # TinyLlama's shape
  summary = (out / "issue56_summary.md").read_text()
  assert summary.count("**missing**") == 4 and f"budget of {budget} s" in summary
  assert summary in proc.stdout
  with tarfile.open(out / "results.tgz") as tar:
    assert "results/issue56_gpu.log" in tar.getnames()
  assert not (out / "results").exists()


def test_pfl_benchmark_skips_the_runs_its_budget_cannot_fit(tmp_path):
  """``--budget`` below a run's minimum: every run skipped with the reason, nothing launched, the
  data written where ``--data`` points, the JSON written and complete."""
  from benchmarks import pfl_cifar10

  data = tmp_path / "data"
  rows = pfl_cifar10.main(["--users=4", "--cohort=2", "--test=10", "--iterations=20", "--procs=1,2",
                           "--budget=1", f"--data={data}", "--tag=b", f"--out-dir={tmp_path}"])
  assert [r["label"] for r in rows] == ["pfl, 1 proc", "pfl, 2 procs", "fedtree"]
  assert all("out of the --budget" in r["skipped"] for r in rows)
  assert (data / "meta.json").exists()
  saved = json.load(open(tmp_path / "b.json"))
  assert saved["complete"] and saved["table"].count("skipped: out of the --budget") == 3


def test_loss_agreement_is_within_three_seed_deviations():
  from benchmarks.pfl_cifar10 import loss_agreement

  base = dict(runner="fedtree", iterations=40, seeds=[dict(train_loss=v) for v in (1.0, 1.1, 0.9)])
  row = dict(runner="pfl", label="pfl, 1 proc", iterations=40)
  assert "agrees with" in loss_agreement(dict(row, train_loss=1.25), base)           # +2.5 std
  assert "DIFFERS from" in loss_agreement(dict(row, train_loss=1.35), base)          # +3.5 std
  assert "not compared" in loss_agreement(dict(row, train_loss=1.0, iterations=30), base)
  assert loss_agreement(dict(row, skipped="x"), base) == "" and loss_agreement(base, base) == ""
  assert loss_agreement(dict(row, train_loss=1.0), dict(base, seeds=base["seeds"][:1])) == ""


def test_methods_benchmark_hands_over_every_turn_but_the_last(tmp_path):
  """The rows after each turn (what the JSON keeps if the run is killed), then the final rows."""
  from benchmarks import methods, workloads

  seen = []
  rows = methods.measure(workloads.mlp(4), ["fedavg"], rounds=1, repeats=3,
                         on_turn=lambda rows, turns: seen.append((turns, len(rows[0]["cpu"]))))
  assert seen == [(1, 1), (2, 2)]
  assert len(rows[0]["cpu"]) == 3 and rows[0]["cpu_vs_fedavg"] == 1.0


def _pfl_json(path):
  rows = [dict(runner="pfl", label="pfl, 1 proc", iterations=40, steady_s=0.5, steady_cpu_s=0.6,
               train_loss=1.2),
          dict(runner="pfl", label="pfl, 3 procs", iterations=40, steady_s=0.2, steady_cpu_s=0.9,
               train_loss=1.21),
          dict(runner="pfl", label="pfl, 5 procs", skipped="timed out after 60 s"),
          dict(runner="fedtree", label="fedtree", iterations=40, steady_s=0.01, steady_cpu_s=0.02,
               train_loss=1.19)]
  json.dump(dict(device="NVIDIA H100 80GB HBM3", complete=True, table="THE PFL TABLE", results=rows),
            open(path, "w"))


def _methods_json(path):
  rows = [dict(method="fedavg", wall_vs_fedavg=1.0, wall_vs_fedavg_range=(1.0, 1.0), cpu_vs_fedavg=1.0),
          dict(method="median", wall_vs_fedavg=3.5, wall_vs_fedavg_range=(3.25, 3.75), cpu_vs_fedavg=2.0)]
  json.dump(dict(workload="a: mlp, 10000 clients", rounds_per_call=5, repeats=2, complete=False,
                 device="NVIDIA H100 80GB HBM3", table="THE METHODS TABLE", results=rows), open(path, "w"))


def test_gpu_report_gives_each_items_ratios_and_tables(tmp_path):
  """The summary page from the stage's files: ratios against the same run's baseline, skipped
  runs and incomplete files named, a missing file named."""
  from benchmarks import gpu_report

  (tmp_path / "issue41_env.log").write_text("jax 0.11.2 [CudaDevice(id=0)] torch 2.11.0 cuda True\n")
  _pfl_json(tmp_path / "issue41_pfl_cifar10.json")
  _methods_json(tmp_path / "issue41_baselines.json")
  text = gpu_report.main(["issue41", str(tmp_path), "--seconds=301", "--budget=420"])
  assert text.startswith("# Issue 41 on NVIDIA H100 80GB HBM3: 301 s of the stage's budget of 420 s")
  assert "pfl, 1 proc: 50.00x fedtree's wall time per central iteration (CPU time 30.00x)" in text
  assert "fedtree is 20.00x as fast as pfl-research's best run (pfl, 3 procs)" in text
  assert "pfl, 5 procs: skipped (timed out after 60 s)" in text and "THE PFL TABLE" in text
  assert "median: 3.50x FedAvg's round (wall; 3.25-3.75), CPU time 2.00x" in text
  assert "**incomplete**" in text and "THE METHODS TABLE" in text
  assert "**missing**: param_traffic/analysis.json" in text and "CudaDevice" in text


def test_gpu_report_reads_a_real_profile(tmp_path):
  from benchmarks import gpu_report, param_traffic

  param_traffic.main(["--clients=8", "--rounds=1", "--calls=1", "--chunk-size=4", f"--out-dir={tmp_path}"])
  text = gpu_report.issue41(str(tmp_path))
  floor = re.search(r"traffic is \*\*([\d.]+)x the memory floor", text)
  assert floor and float(floor.group(1)) >= 1.0 and "local step loop body" in text


@pytest.mark.slow
def test_issue41_stage_end_to_end_at_its_tiny_size(tmp_path):
  """The whole stage as the GPU runs it, at CPU sizes (several minutes on 2 cores): every result
  file and the summary with its three items' ratios."""
  if subprocess.run(["python3", "-c", "import torch, pfl"], capture_output=True).returncode:
    pytest.skip("python3 on PATH lacks torch or pfl")
  out = tmp_path / "out"
  proc = subprocess.run(["bash", SCRIPT, "issue41", str(out), "tiny"], cwd=ROOT, capture_output=True,
                        text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=1800)
  assert proc.returncode == 0, proc.stderr[-2000:]
  summary = (out / "issue41_summary.md").read_text()
  assert "**missing**" not in summary and "skipped" not in summary, summary
  assert "fedtree's wall time per central iteration" in summary and "x FedAvg's round" in summary
  assert "the memory floor" in summary
  with tarfile.open(out / "results.tgz") as tar:
    names = tar.getnames()
    saved = json.load(tar.extractfile("results/issue41_pfl_cifar10.json"))
  assert {"results/issue41_pfl_cifar10.json", "results/issue41_baselines.json",
          "results/param_traffic/analysis.json"} <= set(names)
  assert (out / "issue41_trace.tgz").exists()
  assert saved["complete"] and all(np.isfinite(r["train_loss"]) for r in saved["results"])


@pytest.mark.slow
def test_issue56_stage_end_to_end_at_its_tiny_size(tmp_path):
  """Issue 56's stage as the GPU runs it, at CPU sizes (about 3 minutes on 2 cores): every step's lines in
  the summary, its results packed."""
  out = tmp_path / "out"
  proc = subprocess.run(["bash", SCRIPT, "issue56", str(out), "tiny"], cwd=ROOT, capture_output=True,
                        text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=1800)
  assert proc.returncode == 0, proc.stderr[-2000:]
  summary = (out / "issue56_summary.md").read_text()
  assert "**missing**" not in summary, summary
  assert "of the central bound" in summary and "the floor" in summary and '"what": "fits"' in summary
  with tarfile.open(out / "results.tgz") as tar:
    names = tar.getnames()
  assert {"results/issue56_a.json", "results/param_traffic/analysis.json"} <= set(names)


_RANK = r"""
import json, os, sys, time
rank, marker = int(os.environ["PFL_WORKER_RANK"]), sys.argv[1]
if rank:                                     # a chatty rank: 1 MB of output (a pipe holds 64 KB), then done
  sys.stderr.write("x" * (1 << 20)); sys.stderr.flush(); open(marker, "w").close()
else:                                        # rank 0 waits for it, as in pfl's next all-reduce
  while not os.path.exists(marker):
    time.sleep(0.05)
  print("RESULT " + json.dumps(dict(rank=0, cpu=[0.0, 1.0], wall=[0.0, 1.0])))
"""


def test_pfl_ranks_that_write_much_do_not_block_the_run(tmp_path):
  """issue 41 on the H100: the ranks' output went to pipes read one rank at a time, so a full run's
  ranks blocked on full pipes while rank 0 waited for them, until the timeout killed the run."""
  import argparse

  from benchmarks.pfl_cifar10 import launch

  script = tmp_path / "rank.py"
  script.write_text(_RANK)
  a = argparse.Namespace(timeout=20.0)
  r = launch(a, "pfl", procs=2, command=lambda rank: [sys.executable, str(script), str(tmp_path / "done")])
  assert "skipped" not in r, r
  assert r["rank"] == 0 and r["wall"] == [0.0, 1.0]
