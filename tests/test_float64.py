"""float64 under ``jax_enable_x64`` (issue 14 item 12, issue 15 item 7): FedAvg, FedAdam and
pFedMe match their reference loops to 1e-12 (float32 anywhere in the round would show as
~1e-8), the x64 round compiles once, and every other algorithm runs a round in float64.

x64 is process-global, so each test runs ``tests/x64_driver.py`` in a subprocess.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent
OTHERS = ("hierfavg", "fedprox", "ditto", "perfedavg", "perfedavg_hf", "pfedmt", "fedkws", "ifca",
          "cfl", "mcfl", "awcfl", "bhfl", "scaffold", "feddyn", "fednova", "mime", "mimelite")


def _x64(*names: str) -> dict:
  env = dict(os.environ, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run([sys.executable, str(HERE / "x64_driver.py"), *names], env=env, cwd=HERE,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a fresh process (import + compile) takes over 10 s here
def test_fedavg_float64_matches_reference_loop_and_compiles_once():
  out = _x64("fedavg", "compiles")
  assert out["fedavg"]["dtypes"] == ["float64"]
  assert out["fedavg"]["maxdiff"] < 1e-12, out["fedavg"]
  assert out["compiles"] == 1


@pytest.mark.slow
def test_fedadam_and_pfedme_float64_match_reference_loops():
  out = _x64("fedadam", "pfedme")
  for name in ("fedadam", "pfedme"):
    assert out[name]["dtypes"] == ["float64"], out[name]
    assert out[name]["maxdiff"] < 1e-12, (name, out[name])


@pytest.mark.slow
def test_a_swept_float_is_traced_in_float64_under_x64():
  out = _x64("sweep")
  assert out["sweep"] == {"hparams": "float64", "dtypes": ["float64"]}, out


@pytest.fixture(scope="module")
def others():
  return _x64(*OTHERS)


@pytest.mark.slow
@pytest.mark.parametrize("name", OTHERS)
def test_every_other_algorithm_runs_a_float64_round(others, name):
  got = others[name]
  assert "error" not in got, got.get("error")
  assert got["dtypes"] == ["float64"] and got["finite"], got
  assert got["loss_dtype"] == "float64", got
