"""A tiny config with a run of every registered algorithm, for tests/test_multihost.py: the
same command line under ``--multihost`` (two processes) and in one process must end with the
same ``summary.json``. 8 clients in two groups, so the client axis splits evenly over 2
processes."""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # loaded by path, from fedtree.main
from helpers import ALGORITHM_CASES as RUNS  # noqa: E402

from fedtree.experiment.fields import declare_runner_fields  # noqa: E402


def get_config(runs: str = "") -> ml_collections.ConfigDict:
  """``runs``: comma-separated algorithm names to keep (default: all)."""
  keep = [r for r in runs.split(",") if r] or list(RUNS)
  return declare_runner_fields(ml_collections.ConfigDict(dict(
    seed=0, rounds=2, eval_every=1, rounds_per_call=1, progress=False, plots=False,
    checkpoint_every=1,
    data=dict(name="grouped_synthetic", group_sizes=(4, 4), dim=6, num_classes=3,
              mean_examples=8, min_examples=4, max_examples=12, test_examples=4),
    topology=dict(kind="groups"), model=dict(name="mlp", hidden=(5,)),
    local=dict(optimizer="sgd", learning_rate=0.05, batch_size=4, steps=2),
    runs={name: {"algorithm": name, "chunk_size": 2, **RUNS[name]} for name in keep},
  )))
