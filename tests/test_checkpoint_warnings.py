"""A damaged checkpoint (issue 27 item 5): one warning line naming the bad checkpoint and the
one restored, none of orbax's error logs or of the "Event loop is closed" tracebacks its aborted
reads leave (hundreds of lines before)."""

import gc
import os
import time

import ml_collections
import pytest
from config_files import load_config

from fedtree import experiment


def tiny(rounds):
  c = load_config("quickstart")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress, c.plots = rounds, 10, 1, False, False
  c.checkpoint_every, c.keep_checkpoints = 1, 3
  c.data.group_sizes, c.data.dim, c.data.max_examples, c.data.test_examples = (3, 2), 6, 16, 4
  c.model.hidden = (4,)
  c.runs = ml_collections.ConfigDict({"fedavg": c.runs.fedavg})
  c.runs.fedavg.cohort_size, c.run_order = 2, ("fedavg",)
  return c


@pytest.mark.slow  # two runs (~15 s): tests/test_reliability.py's fallback test runs by default
def test_a_zeroed_checkpoint_gives_one_warning_line(tmp_path, capfd):
  experiment.train_and_evaluate(tiny(2), str(tmp_path))
  bad = tmp_path / "checkpoints" / "fedavg" / "2"
  for d, _, files in os.walk(bad):
    for f in files:
      p = os.path.join(d, f)
      with open(p, "r+b") as fh:
        fh.write(b"\0" * os.path.getsize(p))
  capfd.readouterr()
  experiment.train_and_evaluate(tiny(3), str(tmp_path))
  gc.collect()
  time.sleep(0.5)   # orbax's aborted reads report from their threads after the restore returns
  err = capfd.readouterr().err
  warnings = [line for line in err.splitlines() if line.startswith("warning:")]
  assert len(warnings) == 1, err
  assert f"checkpoint {bad} does not restore (" in warnings[0]
  assert f"restored {bad.parent / '1'} instead (the bad one is deleted)" in warnings[0]
  assert "Event loop is closed" not in err and "Traceback" not in err and "E1" not in err, err
  assert "fedavg: resumed from the checkpoint of round 1" in err
