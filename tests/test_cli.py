"""The command line and the config checks before anything runs: numbers or names from flags,
zero counts refused, one-line refusals with the results on stdout."""

import os
import subprocess
import sys

import pytest
from helpers import hierfavg_config

from fedtree import experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}


def test_number_or_name_fields_from_the_command_line():
  from fedtree.experiment.context import number_or_name

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
