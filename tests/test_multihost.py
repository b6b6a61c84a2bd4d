"""Several hosts (issue 15): two processes on localhost joined by ``jax.distributed`` (CPU
backend, gloo collectives, coordinator on 127.0.0.1) shard the clients over both and end
with the final model of a one-process run (tests/multihost_driver.py)."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(ROOT, "tests", "multihost_driver.py")
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
# one CPU device per process: a fake device count goes; the conftest's fast-compile flags stay
ENV["XLA_FLAGS"] = " ".join(f for f in ENV.get("XLA_FLAGS", "").split()
                            if not f.startswith("--xla_force_host_platform_device_count"))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start(*args):
  return subprocess.Popen([sys.executable, DRIVER, *map(str, args)], cwd=ROOT, env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_two_processes_give_the_final_model_of_one(tmp_path):
  port = _free_port()
  procs = [_start(2, i, port, tmp_path / "two.npz") for i in range(2)]
  outs = []
  for p in procs:
    try:
      outs.append(p.communicate(timeout=300)[0])
    finally:
      p.kill()
  for p, out in zip(procs, outs, strict=True):
    assert p.returncode == 0, out[-3000:]
    assert "2 devices, 2 processes" in out, out[-3000:]
  one = _start(1, 0, 0, tmp_path / "one.npz")
  out = one.communicate(timeout=300)[0]
  assert one.returncode == 0, out[-3000:]
  two, ref = np.load(tmp_path / "two.npz"), np.load(tmp_path / "one.npz")
  assert list(two) == list(ref) and len(ref) == 4
  for k in ref:
    np.testing.assert_allclose(two[k], ref[k], rtol=1e-5, atol=1e-6)


def _main(tmp, workdir, *flags, process_id=None, port=None, config="tests/multihost_config.py"):
  cmd = [sys.executable, "-m", "fedtree.main", f"--config={config}", f"--workdir={workdir}", *flags]
  if port is not None:
    cmd += ["--multihost", f"--coordinator=127.0.0.1:{port}", "--num_processes=2",
            f"--process_id={process_id}"]
  return subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def _finish(procs, timeout=900):
  outs = []
  for p in procs:
    try:
      outs.append(p.communicate(timeout=timeout)[0])
    finally:
      p.kill()
  for p, out in zip(procs, outs, strict=True):
    assert p.returncode == 0, out[-3000:]
  return outs


def _close_summaries(a, b):
  assert set(a) == set(b)
  for run in a:
    assert set(a[run]) == set(b[run]), run
    for model in a[run]:
      for k in ("accuracy", "loss", "client_mean_accuracy"):
        x, y = a[run][model].get(k), b[run][model].get(k)   # None: not finite (summary.json)
        assert (x is None) == (y is None), (run, model, k, x, y)
        if y is not None:
          np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5, err_msg=f"{run}/{model}/{k}")


def _rows(workdir):
  """The ``(run, round)`` of every row of a workdir's ``metrics.jsonl``, sorted."""
  import json

  with open(workdir / "metrics.jsonl") as f:
    return sorted((r["run"], r["round"]) for r in map(json.loads, f))


def _two_and_one(tmp_path, config, rounds):
  """``config`` for ``rounds`` rounds as two ``--multihost`` processes (workdir ``two``) and as one
  process (``one``), side by side: their outputs (process 0's, process 1's, the one process's)."""
  port = _free_port()
  procs = [_main(tmp_path, tmp_path / "two", f"--config.rounds={rounds}", process_id=i, port=port,
                 config=config) for i in range(2)]
  procs.append(_main(tmp_path, tmp_path / "one", f"--config.rounds={rounds}", config=config))
  return _finish(procs)


GROUPS = 4
"""The registered algorithms in this many launches (47 in one ran past the 900-s limit under load)."""


@pytest.mark.slow
@pytest.mark.parametrize("group", range(GROUPS))
def test_main_multihost_runs_every_algorithm_as_one_process_does(tmp_path, group):
  """``python -m fedtree.main --multihost`` with two processes: a run of every registered
  algorithm (a quarter of them per case; checkpoints every round) ends with the one-process
  ``summary.json``; process 0 alone writes the rows and prints the table; a second launch with
  one more round resumes every run from the checkpoints both processes wrote, again as one
  process does."""
  import json

  from helpers import ALGORITHM_CASES

  names = sorted(ALGORITHM_CASES)[group::GROUPS]
  config = f"tests/multihost_config.py:{','.join(names)}"

  one, two = tmp_path / "one", tmp_path / "two"
  for rounds in (2, 3):
    outs = _two_and_one(tmp_path, config, rounds)
    assert "Final evaluation" in outs[0] and "Final evaluation" not in outs[1], outs[1][-2000:]
    if rounds == 3:
      assert "resumed from the checkpoint of round 2" in outs[0], outs[0][-3000:]
    _close_summaries(json.load(open(two / "summary.json")), json.load(open(one / "summary.json")))
    assert {run for run, _ in _rows(one)} == set(names)
    assert _rows(two) == _rows(one)
    assert len(_rows(two)) == len(set(_rows(two)))  # no row twice


@pytest.mark.slow
def test_a_signal_to_one_process_stops_every_process_at_the_same_round(tmp_path):
  """SIGTERM sent to process 1 alone (a scheduler signalling one host): every process learns of
  it at the next call (fedtree.core.sharding.agreed), all stop at the same round with the
  checkpoint written, none is left waiting in a collective; the next launch resumes there."""
  import re
  import signal
  import time

  workdir = tmp_path / "w"
  flags = ["--config.eval_every=100000", "--config.checkpoint_every=20"]
  config = "tests/multihost_config.py:fedavg"
  port = _free_port()
  procs = [_main(tmp_path, workdir, "--config.rounds=100000", *flags, process_id=i, port=port, config=config)
           for i in range(2)]
  deadline = time.time() + 300
  while not list(workdir.glob("checkpoints/fedavg/*")) and time.time() < deadline:
    assert all(p.poll() is None for p in procs), [p.communicate()[0][-2000:] for p in procs]
    time.sleep(0.5)
  time.sleep(2)
  procs[1].send_signal(signal.SIGTERM)
  outs = []
  for p in procs:
    try:
      outs.append(p.communicate(timeout=120)[0])
    finally:
      p.kill()
  stopped = []
  for p, out in zip(procs, outs, strict=True):
    assert p.returncode == 130, out[-3000:]
    m = re.search(r"fedtree: stopped: run 'fedavg' stopped at round (\d+) of 100000", out)
    assert m, out[-3000:]
    stopped.append(int(m.group(1)))
  assert stopped[0] == stopped[1] and "SIGTERM received" in outs[1] and "SIGTERM" not in outs[0]
  port = _free_port()
  again = [_main(tmp_path, workdir, f"--config.rounds={stopped[0] + 1}", *flags, process_id=i, port=port,
                 config=config) for i in range(2)]
  outs = _finish(again)
  assert f"resumed from the checkpoint of round {stopped[0]}" in outs[0], outs[0][-3000:]


@pytest.mark.slow
def test_a_streamed_population_over_two_processes_is_the_one_process_run(tmp_path):
  """Issue 49 item 6: ``--multihost`` over a population streamed from a store (SCAFFOLD's control
  variates and Ditto's personal models paged, Ditto's scored from the pages): each process reads, pages
  (its own folder) and scores the clients it owns, and the run, and its resumption from the checkpoints
  both processes wrote, end with the one-process ``summary.json`` and rows."""
  import json

  store = tmp_path / "store"
  conv = subprocess.run([sys.executable, "-m", "fedtree.convert", "--config=tests/multihost_config.py:fedavg",
                         f"--out={store}"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
  assert conv.returncode == 0, conv.stdout[-2000:] + conv.stderr[-2000:]
  config = f"tests/multihost_store_config.py:{store}"

  one, two = tmp_path / "one", tmp_path / "two"
  for rounds in (2, 3):
    outs = _two_and_one(tmp_path, config, rounds)
    assert "each of 2 processes reads its own clients" in outs[0], outs[0][-3000:]
    if rounds == 3:
      assert "scaffold: resumed from the checkpoint of round 2" in outs[0], outs[0][-3000:]
    _close_summaries(json.load(open(two / "summary.json")), json.load(open(one / "summary.json")))
    assert _rows(two) == _rows(one) and {run for run, _ in _rows(one)} == {"fedavg", "scaffold", "ditto"}
  assert sorted(os.listdir(two / "checkpoints" / "scaffold" / "paged")) == ["process_0", "process_1"]
