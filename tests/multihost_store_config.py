"""tests/multihost_config.py's problem read from a store (``get_config("STORE")``: its path) and streamed,
for tests/test_multihost.py: under ``--multihost`` each process reads, pages and scores the clients it
owns, and the run must end as the one-process streamed run does."""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # loaded by path, from fedtree.main
from multihost_config import get_config as resident  # noqa: E402


def get_config(path: str = "") -> ml_collections.ConfigDict:
  """``path``: the store (``python -m fedtree.convert --config=tests/multihost_config.py:fedavg``)."""
  c = resident("fedavg,scaffold,ditto")
  c.data = ml_collections.ConfigDict(dict(name="store", path=path, dataset="grouped_synthetic"))
  c.population = ml_collections.ConfigDict(dict(mode="streamed", eval_clients=0, eval_chunk=3))
  for run in c.runs.values():
    run.cohort_size = 3
  return c
