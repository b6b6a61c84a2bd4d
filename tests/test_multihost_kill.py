"""A ``--multihost`` run killed mid-run (issue 27 item 8): both processes SIGKILLed after a few
rounds, relaunched with the same command, end with the rows and ``summary.json`` of an
uninterrupted one-process run (to the float tolerance of a cross-process reduction, see
docs/scaling.md), no row twice. (A sweep killed mid-run: tests/test_reliability.py's
``test_sigkill_mid_sweep_resumes_bit_equal``.)"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
ENV.pop("XLA_FLAGS", None)  # one CPU device per process
ROUNDS = 40


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(workdir, process_id=None, port=None):
  cmd = [sys.executable, "-m", "fedtree.main", "--config=tests/multihost_config.py:fedavg,hierfavg",
         f"--workdir={workdir}", f"--config.rounds={ROUNDS}", "--config.eval_every=5"]
  if port is not None:
    cmd += ["--multihost", f"--coordinator=127.0.0.1:{port}", "--num_processes=2",
            f"--process_id={process_id}"]
  return subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _two(workdir):
  port = _free_port()
  return [_launch(workdir, i, port) for i in range(2)]


def _finish(procs):
  outs = []
  for p in procs:
    try:
      outs.append(p.communicate(timeout=900)[0])
    finally:
      p.kill()
  for p, out in zip(procs, outs, strict=True):
    assert p.returncode == 0, out[-3000:]
  return outs


def _rows(workdir):
  with open(workdir / "metrics.jsonl") as f:
    return [(r["run"], r["round"]) for r in map(json.loads, f)]


@pytest.mark.slow
def test_a_killed_multihost_run_resumes_as_one_process_runs(tmp_path):
  one, two = tmp_path / "one", tmp_path / "two"
  reference = [_launch(one)]
  procs = _two(two)
  rows = two / "metrics.jsonl"
  deadline = time.time() + 600
  while time.time() < deadline and not (rows.exists() and rows.read_text().count("\n") >= 3):
    assert all(p.poll() is None for p in procs), procs[0].communicate()[0][-3000:]
    time.sleep(0.1)
  assert all(p.poll() is None for p in procs), "the run finished before it could be killed"
  for p in procs:
    p.send_signal(signal.SIGKILL)
  for p in procs:
    p.wait(timeout=60)
  killed_at = len(_rows(two))
  assert 3 <= killed_at < 2 * ROUNDS / 5
  outs = _finish(_two(two))
  assert "resumed from the checkpoint of round" in outs[0], outs[0][-3000:]
  _finish(reference)
  assert sorted(_rows(two)) == sorted(_rows(one)) and len(_rows(two)) == len(set(_rows(two)))
  a, b = json.load(open(two / "summary.json")), json.load(open(one / "summary.json"))
  assert set(a) == set(b) == {"fedavg", "hierfavg"}
  for run in a:
    for model in a[run]:
      for k in ("accuracy", "loss"):
        np.testing.assert_allclose(a[run][model][k], b[run][model][k], rtol=1e-4, atol=1e-5,
                                   err_msg=f"{run}/{model}/{k}")
