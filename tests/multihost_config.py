"""A tiny config with a run of every registered algorithm, for tests/test_multihost.py: the
same command line under ``--multihost`` (two processes) and in one process must end with the
same ``summary.json``. 8 clients in two groups, so the client axis splits evenly over 2
processes."""

import ml_collections

# the smallest run of each algorithm (its required fields; short warm-ups), as in test_conformance
RUNS = {
  "fedavg": {}, "fedopt": {"server": {"name": "fedadam", "learning_rate": 0.01}},
  "hierfavg": {"periods": (2,)}, "fedprox": {"mu": 0.1}, "ditto": {"lam": 0.5},
  "pfedme": {"lam": 5.0, "inner_steps": 2, "personal_lr": 0.05},
  "perfedavg": {"alpha": 0.05, "beta": 0.05}, "pfedmt": {"team_iters": 2},
  "bhfl": {"eta_down": 0.5, "cohort_size": 2}, "cfl": {"max_clusters": 2, "eps1": 5.0, "eps2": 0.01},
  "ifca": {"num_clusters": 2}, "awcfl": {"num_clusters": 2, "cluster_start_round": 1},
  "mcfl": {"num_clusters": 2, "cluster_start_round": 1, "feature_examples": 3},
  "fedkws": {"cohort_size": 4}, "fedmmd": {"lam": 0.01},
  "grouppfl": {"global_rounds": 1, "group_rounds": 1},
}


def get_config(runs: str = "") -> ml_collections.ConfigDict:
  """``runs``: comma-separated algorithm names to keep (default: all)."""
  keep = [r for r in runs.split(",") if r] or list(RUNS)
  return ml_collections.ConfigDict(dict(
    seed=0, rounds=2, eval_every=1, rounds_per_call=1, progress=False, plots=False,
    checkpoint_every=1,
    data=dict(name="grouped_synthetic", group_sizes=(4, 4), dim=6, num_classes=3,
              mean_examples=8, min_examples=4, max_examples=12, test_examples=4),
    topology=dict(kind="groups"), model=dict(name="mlp", hidden=(5,)),
    local=dict(optimizer="sgd", learning_rate=0.05, batch_size=4, steps=2),
    runs={name: {"algorithm": name, "chunk_size": 2, **RUNS[name]} for name in keep},
  ))
