r"""Quickstart: FedAvg vs FedAdam vs HierFAVG vs per-group FedAvg on the grouped synthetic task.

  python -m fedtree.main --config=configs/quickstart.py --workdir=/tmp/fedtree_quickstart

48 clients in 4 groups of very different sizes (24, 12, 8, 4), each group with its own
distribution; a 3-level tree root -> 4 edge servers -> clients. 27 s wall, 36 s of CPU time
(measured on 2026-12-07 on the project's quiet 2-core machine).
Runs: ``fedavg`` and ``fedadam`` (one server over all clients), ``hierfavg`` (edges aggregate
every round, the cloud every 10), ``edges_only`` (the same tree whose cloud never aggregates:
one FedAvg per group). Expected: the per-group models (``level1`` of ``edges_only``) beat the
global models on their own groups, since the groups' distributions differ.
"""

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  """``variant``: ``None`` (the four runs once) or ``"seeds"`` (every run over 8 seeds in one
  compiled program per run, mean ± std table; ``configs/quickstart.py:seeds``)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = 200
  c.eval_every = 25
  c.rounds_per_call = 25      # rounds fused into one compiled call between reports
  c.chunk_size = "auto"       # clients trained at once: an int, None (whole cohort), "auto", "tune"
  c.progress = True
  c.checkpoint_every = 100    # rounds between orbax checkpoints in <workdir>/checkpoints (0: off)

  c.data = ml_collections.ConfigDict(dict(
    name="grouped_synthetic", group_sizes=(24, 12, 8, 4), dim=32, num_classes=10,
    group_spread=1.5, client_spread=0.25, feature_shift=1.0, mean_examples=40.0,
    min_examples=8, max_examples=160, test_examples=40, seed=0,
    layout="padded",   # or "ragged": the train split flat with offsets (no padding rows)
  ))
  c.topology = ml_collections.ConfigDict(dict(kind="groups"))   # root -> data groups -> clients
  c.model = ml_collections.ConfigDict(dict(name="mlp", hidden=(64,)))
  c.local = ml_collections.ConfigDict(dict(
    optimizer="sgd", learning_rate=0.05, batch_size=16, epochs=1, steps=None,
  ))

  c.runs = ml_collections.ConfigDict()
  c.runs.fedavg = ml_collections.ConfigDict(dict(algorithm="fedavg", cohort_size=16))
  c.runs.hierfavg = ml_collections.ConfigDict(dict(
    algorithm="hierfavg", cohort_size=4, periods=(10,),   # cloud every 10 edge rounds
  ))
  c.runs.edges_only = ml_collections.ConfigDict(dict(
    algorithm="hierfavg", cohort_size=4, periods=(1_000_000,),   # the cloud never aggregates
  ))
  c.runs.fedadam = ml_collections.ConfigDict(dict(
    algorithm="fedopt", cohort_size=16,
    server=ml_collections.ConfigDict(dict(name="fedadam", learning_rate=0.01, tau=1e-3)),
  ))
  c.run_order = ("fedavg", "fedadam", "hierfavg", "edges_only")
  # Experiments as an array axis (fedtree.experiment.sweep): seeds x settings of every run in
  # one compiled program, e.g. --config.sweep.seeds=4 --config.sweep.params="local.learning_rate=0.02,0.05"
  c.mesh_shape = ml_collections.config_dict.placeholder(int)  # clients over devices: -1 = all
  c.sweep = default_sweep()
  if variant == "seeds":
    c.sweep.seeds = 8
  elif variant is not None:
    raise ValueError(f"configs/quickstart.py:{variant}; choose no variant or 'seeds'")
  return declare_runner_fields(c)   # every runner field settable from the command line
