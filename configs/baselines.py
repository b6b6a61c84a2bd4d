r"""The related-work table: every optimization baseline on one non-IID split of real data.

  python -m fedtree.main --config=configs/baselines.py --workdir=/tmp/baselines

(draft: the figures and the cost are measured below.)
"""

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep

COHORT = 10
ROUNDS = 40

RUNS = {
  # label: the run's fields (every run samples COHORT of the 20 clients a round, but FedAsync)
  "fedavg": {"algorithm": "fedavg"},
  "fedprox": {"algorithm": "fedprox", "mu": 0.01},
  "fedavgm": {"algorithm": "fedopt", "server": {"name": "fedavgm", "learning_rate": 1.0, "momentum": 0.9}},
  "fedadam": {"algorithm": "fedopt", "server": {"name": "fedadam", "learning_rate": 0.01}},
  "scaffold": {"algorithm": "scaffold"},
  "moon": {"algorithm": "moon", "mu": 1.0, "temperature": 0.5},
  "qffl": {"algorithm": "qffl", "q": 1.0},
  "afl": {"algorithm": "afl", "domain_learning_rate": 0.1},
  # FedAsync applies one client's model a server update: as many client updates as the others'
  "fedasync": {"algorithm": "fedasync", "concurrency": COHORT, "rounds": ROUNDS * COHORT,
               "systems": {"speed": {"dist": "lognormal", "median": 1.0, "sigma": 0.5}, "up": 1e9,
                           "down": 1e9}},
}
COLUMNS = ("global/accuracy", "global/accuracy_worst10_mean", "global/accuracy_gini", "uplink_MB",
           "global/rounds_to_target")


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = ROUNDS
  c.eval_every = 2
  c.rounds_per_call = 2
  c.chunk_size = None
  c.progress = True
  c.target_accuracy = 0.8
  c.data = ml_collections.ConfigDict(dict(name="sklearn_digits", num_clients=20, partition="dirichlet",
                                          alpha=0.3, seed=0))
  c.topology = ml_collections.ConfigDict(dict(kind="flat"))
  c.model = ml_collections.ConfigDict(dict(name="mlp", hidden=(32,)))
  c.local = ml_collections.ConfigDict(dict(optimizer="sgd", learning_rate=0.1, batch_size=16, epochs=1,
                                           steps=None))
  c.runs = ml_collections.ConfigDict()
  for label, fields in RUNS.items():
    run = dict(fields)
    if run["algorithm"] != "fedasync":
      run["cohort_size"] = COHORT
    c.runs[label] = ml_collections.ConfigDict(run)
  c.run_order = tuple(RUNS)
  c.sweep = default_sweep()
  c.sweep.seeds = 3
  c.sweep.columns = COLUMNS
  return declare_runner_fields(c)
