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
ENV.pop("XLA_FLAGS", None)  # one CPU device per process


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
