r"""The related-work table: the optimization baselines every FL paper compares against, on one
non-IID split of real data, each over 3 seeds in one compiled program (issue 36).

  python -m fedtree.main --config=configs/baselines.py --workdir=/tmp/baselines

Data: scikit-learn's real 8x8 handwritten digits (:mod:`fedtree.datasets.digits`, shipped, no
download) over 20 clients with Dirichlet(0.3) label skew (the split fixed by ``data.seed``), an MLP
(32 hidden), one local epoch of SGD (lr 0.1, batch 16), 10 of the 20 clients a round, 40 rounds;
seeds 0-2 (the sweep's seed axis: the initial model and the sampling) of every run. 14 runs, one
compile each: 1 min 55 s wall and 2 min 53 s of CPU time (measured on 2026-12-07 on the project's
quiet 2-core machine).

The runs (the client updates are the same for all: FedAsync applies one client's model a server
update, so it runs 400 of them, 10 times the others' rounds):

* ``fedavg``; ``fedprox`` (μ = 0.1); ``fedavgm`` (server momentum 0.9, lr 1); ``fedadam`` (server
  lr 0.01); ``scaffold`` (option II, uniform weights as the paper);
* ``moon`` (μ = 1, τ = 0.5); ``qffl`` (q = 1 with the paper's L = 1/η) and ``qffl_l1`` (q = 1, L = 1:
  see below); ``afl`` (every client its own domain, projected ascent with γ_λ = 0.01, FLGo's);
* ``fedasync`` (α = 0.6, polynomial staleness (t − τ + 1)^-½, 10 clients in flight on devices of
  lognormal speeds, median 1 step/s, σ = 0.5);
* ``feddyn`` (α = 0.01); ``fednova`` (the paper's weights by data size over the clients that
  answered; plain local SGD, so ``‖a_i‖₁`` is each client's step count); ``mime`` and ``mimelite``
  (the paper's uniform weights; their base optimizer is the config's local SGD, whose statistics
  are empty: MimeLite is then FedAvg with uniform weights, and Mime adds SVRG's correction to every
  local step).

Columns: the global model's accuracy on every client's test data, the mean accuracy of the worst
10 % of the clients and the Gini coefficient of the clients' accuracies (the fairness statistics of
every evaluation), the megabytes every client sent up in the run, and the first round whose
accuracy reached 0.85 (``target_accuracy``; evaluations every 2 rounds; FedAsync's rounds are server
updates of one client each). Measured (the table the command prints last, mean ± std over the 3
seeds; ``python -m benchmarks.config_figures --config=configs/baselines.py`` checks it):

  run       seeds  accuracy       worst 10%      gini           up MB        rounds to target
  --------  -----  -------------  -------------  -------------  -----------  -----------------------
  fedavg    3      0.919 ± 0.008  0.764 ± 0.033  0.044 ± 0.007  3.86 ± 0.00  22.0 ± 5.9
  fedprox   3      0.918 ± 0.006  0.764 ± 0.022  0.043 ± 0.004  3.86 ± 0.00  22.0 ± 5.9
  fedavgm   3      0.961 ± 0.004  0.875 ± 0.006  0.023 ± 0.000  3.86 ± 0.00  12.0 ± 1.6
  fedadam   3      0.940 ± 0.002  0.832 ± 0.000  0.035 ± 0.001  3.86 ± 0.00  20.7 ± 2.5
  scaffold  3      0.928 ± 0.004  0.829 ± 0.030  0.034 ± 0.004  7.71 ± 0.00  22.0 ± 3.3
  moon      3      0.916 ± 0.006  0.764 ± 0.022  0.044 ± 0.005  3.86 ± 0.00  22.0 ± 5.9
  qffl      3      0.796 ± 0.025  0.592 ± 0.025  0.084 ± 0.008  3.86 ± 0.00  -
  qffl_l1   3      0.903 ± 0.012  0.767 ± 0.073  0.044 ± 0.011  3.86 ± 0.00  25.3 ± 5.0
  afl       3      0.916 ± 0.012  0.798 ± 0.059  0.039 ± 0.008  3.86 ± 0.00  27.3 ± 3.4
  fedasync  3      0.806 ± 0.029  0.562 ± 0.065  0.081 ± 0.012  3.86 ± 0.00  372.0 ± 0.0 (1/3 seeds)
  feddyn    3      0.949 ± 0.002  0.857 ± 0.014  0.030 ± 0.004  3.86 ± 0.00  11.3 ± 0.9
  fednova   3      0.913 ± 0.007  0.779 ± 0.044  0.044 ± 0.007  3.86 ± 0.00  19.3 ± 2.5
  mime      3      0.910 ± 0.017  0.788 ± 0.069  0.041 ± 0.011  7.71 ± 0.00  25.3 ± 4.7
  mimelite  3      0.910 ± 0.006  0.773 ± 0.040  0.042 ± 0.008  7.71 ± 0.00  23.3 ± 4.7

(``-``: no seed reached 0.85 within the run; ``(1/3 seeds)``: the mean over the seeds that did.)

What it shows, on a task this small (20 clients: the worst 10 % are 2 clients, so that column moves
by several points from seed to seed): the server optimizers help most, FedAvgM (momentum 0.9)
reaching 0.85 in 12 rounds and lifting the worst clients to 0.875, FedAdam next. FedDyn (α = 0.01)
is the best of the client-side corrections: 0.949, the worst clients at 0.857 and the target in 11
rounds, for FedAvg's bytes. SCAFFOLD's variates lift the worst clients (0.829) for twice the bytes
(it sends ``Δy_i`` and ``Δc_i``). FedNova, Mime and MimeLite stay within FedAvg's spread here (with
plain SGD as the base optimizer Mime has no statistics to mimic), Mime and MimeLite for twice
FedAvg's bytes (the full-batch gradient beside the model). With one local epoch the clients drift
little: FedProx's proximal term (μ = 0.1) and MOON's contrastive term (μ = 1) leave FedAvg's figures
within their seeds' spread. q-FFL with the paper's L = 1/η = 10 takes steps
too short for 40 rounds (the ``‖L Δw‖²`` term of ``h_k`` dominates); with L = 1 it trains nearly as
fast as FedAvg (0.903, 25 rounds to 0.85) but its fairness gain here is within the seeds' spread
(q = 0.5, 2, 5 give worst-10 % figures of 0.770, 0.758, 0.705:
``--config.only=qffl_l1 --config.sweep.params="runs.qffl_l1.q=0.5,2,5"``).
AFL raises the worst 10 % by 3 points (0.798 against 0.764) and lowers the Gini coefficient (0.039
against 0.044), also within one standard deviation (γ_λ = 0.1 gives 0.782). FedAsync, updating one
stale client at a time (α = 0.6), needs more client updates than the synchronous methods for the
same accuracy: one seed of three reaches 0.85 within the 400. Every client sends one model a round
(q-FFL's and AFL's extra 4 and 8 bytes a message, and FedNova's 4, vanish in the rounding),
SCAFFOLD, Mime and MimeLite two.
"""

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep

COHORT = 10
ROUNDS = 40
SYSTEMS = {"speed": {"dist": "lognormal", "median": 1.0, "sigma": 0.5}, "up": 1e9, "down": 1e9}

RUNS = {
  # label: the run's fields (every run but FedAsync samples COHORT of the 20 clients a round)
  "fedavg": {"algorithm": "fedavg"},
  "fedprox": {"algorithm": "fedprox", "mu": 0.1},
  "fedavgm": {"algorithm": "fedopt", "server": {"name": "fedavgm", "learning_rate": 1.0, "momentum": 0.9}},
  "fedadam": {"algorithm": "fedopt", "server": {"name": "fedadam", "learning_rate": 0.01}},
  "scaffold": {"algorithm": "scaffold"},
  "moon": {"algorithm": "moon", "mu": 1.0, "temperature": 0.5},
  "qffl": {"algorithm": "qffl", "q": 1.0},
  "qffl_l1": {"algorithm": "qffl", "q": 1.0, "lipschitz": 1.0},
  "afl": {"algorithm": "afl", "domain_learning_rate": 0.01},
  # one client's model a server update: as many client updates as the others' rounds
  "fedasync": {"algorithm": "fedasync", "concurrency": COHORT, "rounds": ROUNDS * COHORT, "systems": SYSTEMS},
  "feddyn": {"algorithm": "feddyn", "alpha": 0.01},
  "fednova": {"algorithm": "fednova"},
  "mime": {"algorithm": "mime"},
  "mimelite": {"algorithm": "mimelite"},
}
COLUMNS = ("global/accuracy", "global/accuracy_worst10_mean", "global/accuracy_gini", "uplink_MB",
           "global/rounds_to_target")
FIGURES_TABLE = "runs"   # the docstring states the table of swept runs the command prints last
FIGURES = (   # the runs table's columns, each with its tolerance on the mean and the std (config_figures)
  ("accuracy", "global/accuracy", 1, 3, 0.01),
  ("worst 10%", "global/accuracy_worst10_mean", 1, 3, 0.03),
  ("gini", "global/accuracy_gini", 1, 3, 0.01),
  ("up MB", "uplink_MB", 1, 2, 0.0),
  ("rounds to target", "global/rounds_to_target", 1, 1, 2.0),
)


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = ROUNDS
  c.eval_every = 2
  c.rounds_per_call = 2
  c.chunk_size = None
  c.progress = True
  c.target_accuracy = 0.85
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
  c.run_order = tuple(RUNS)   # the table's order (a ConfigDict sorts its keys)
  c.mesh_shape = ml_collections.config_dict.placeholder(int)  # clients over devices: -1 = all
  c.sweep = default_sweep()
  c.sweep.seeds = 3
  c.sweep.columns = COLUMNS
  return declare_runner_fields(c)
