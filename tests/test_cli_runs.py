"""The command line adds what a config file does not have (issue 40 item 6): a new run label
(``--config.runs.permfl.algorithm=pfedmt``: ml_collections cannot create the run's section, so
``fedtree.main`` adds it after the parse), another model than the file's
(``--config.model.name=logreg`` on a file whose ``mlp`` sets ``hidden``), and a keyed per-client
``.npz`` read as it is."""

import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from fedtree import main
from fedtree.experiment import runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}


def test_a_new_run_label_is_split_from_the_flags_and_added():
  argv = ["fedtree", "--config=configs/pfedmt_synthetic.py", "--config.rounds=2",
          "--config.runs.permfl.algorithm=pfedmt", "--config.runs.permfl.lam", "15",
          "--config.runs.permfl.server.name=fedavg", "--config.runs.pfedmt.team_iters=3"]
  cwd = os.getcwd()
  os.chdir(ROOT)
  try:
    kept, new = main.split_new_runs(argv)
  finally:
    os.chdir(cwd)
  assert kept == ["fedtree", "--config=configs/pfedmt_synthetic.py", "--config.rounds=2",
                  "--config.runs.pfedmt.team_iters=3"]   # pfedmt is a run of the file: ml_collections sets it
  assert new == [(["permfl", "algorithm"], "pfedmt"), (["permfl", "lam"], "15"),
                 (["permfl", "server", "name"], "fedavg")]
  config = ml_collections.ConfigDict(dict(runs=dict(pfedmt=dict(algorithm="pfedmt"))))
  main.add_new_runs(config, new)
  assert config.runs.permfl.to_dict() == {"algorithm": "pfedmt", "lam": 15, "server": {"name": "fedavg"}}


def test_a_new_run_with_a_mistyped_field_is_refused_by_the_registry():
  from helpers import hierfavg_config

  c = hierfavg_config()
  main.add_new_runs(c, [(["extra", "algorithm"], "fedprox"), (["extra", "muu"], "0.1")])
  with pytest.raises(ValueError, match=r"config.runs.extra .*'muu'.*did you mean 'mu'"):
    runner.validate_config(runner.prepare_config(c))


@pytest.mark.slow
def test_the_command_line_adds_a_run_switches_the_model_and_reads_a_keyed_npz(tmp_path):
  """One command: a keyed ``.npz`` (``x_train_0``, ...), ``model.name=logreg`` on
  ``configs/own_data.py`` (its ``mlp``'s ``hidden`` left out, one line on stderr), and a new run
  ``logreg_prox`` (fedprox) that only it runs."""
  rng = np.random.default_rng(0)
  arrays = {}
  for c in range(4):
    arrays |= {f"x_train_{c}": rng.normal(size=(12, 5)).astype(np.float32),
               f"y_train_{c}": rng.integers(0, 3, 12),
               f"x_test_{c}": rng.normal(size=(4, 5)).astype(np.float32),
               f"y_test_{c}": rng.integers(0, 3, 4)}
  np.savez(tmp_path / "clients.npz", **arrays)
  out = subprocess.run(
    [sys.executable, "-m", "fedtree.main", "--config=configs/own_data.py",
     f"--config.data.path={tmp_path}/clients.npz",
     "--config.model.name=logreg", "--config.rounds=1", "--config.eval_every=1", "--config.rounds_per_call=1",
     "--config.progress=False", "--config.plots=False", "--config.runs.logreg_prox.algorithm=fedprox",
     "--config.runs.logreg_prox.mu=0.1", "--config.only=logreg_prox"],
    cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  note = "model.name='logreg' replaces the config file's 'mlp': its model field(s) {'hidden': (64,)}"
  assert note in out.stderr
  rows = [line.split() for line in out.stdout.splitlines() if line.startswith("logreg_prox")]
  assert rows and rows[0][1] == "global"
