r"""Tuning: 81 settings of FedAvg and of FedProx as a grid, by successive halving, and by random search.

  python -m fedtree.main --config=configs/tuning.py --workdir=/tmp/fedtree_tuning            # the grid
  python -m fedtree.main --config=configs/tuning.py:halving --workdir=/tmp/fedtree_halving   # rungs 10, 30
  python -m fedtree.main --config=configs/tuning.py:random --workdir=/tmp/fedtree_random     # 81 draws
  python -m fedtree.main --config=configs/tuning.py:pbt --workdir=/tmp/fedtree_pbt           # PBT, every 10
  python -m fedtree.main --config=configs/tuning.py:fedex --workdir=/tmp/fedtree_fedex       # FedEx
  python -m fedtree.main --config=configs/tuning.py:hyperband --workdir=/tmp/fedtree_hb      # Hyperband

The quickstart's task (48 clients in 4 groups of different distributions, a 64-unit MLP), 90 rounds
of 10 clients. FedAvg with a server learning rate (FedOpt with the plain server step, Reddi et al.
2021): 9 client x 9 server learning rates; FedProx: 9 client learning rates x 3 server learning
rates x 3 values of mu. Every run's 81 settings train as one compiled program
(:mod:`fedtree.experiment.sweep`); ``halving`` stops the worse two thirds at rounds 10 and 30
(:mod:`fedtree.experiment.search`); ``random`` draws 81 settings from log-uniform ranges that cover
the grid's. Each prints a table of every setting, the best by global accuracy, and the client updates
it took; the workdir keeps ``tuning_<run>.csv`` (every setting, seed and round: a tabular benchmark)
and ``best_<run>.py`` (the best setting's config, ready to run).

What the variants print today (one seed; each run's best setting by global accuracy after 90 rounds,
as the command names it without the ``runs.<run>.`` of the run's own fields, and the client updates
of the whole study; each table is checked by the command that heads it). The grid costs 38 s wall
and 50 s of CPU time (measured on 2026-12-07 on the project's quiet 2-core machine); halving 49 s
and 69 s, random 45 s and 57 s, PBT 58 s and 70 s, FedEx 24 s and 33 s, Hyperband 41 s and 60 s.

The grid (``python -m benchmarks.config_figures --config=configs/tuning.py``):

  run      best setting                                           accuracy  updates
  fedavg   local.learning_rate=0.05,server.learning_rate=2        0.7625    72900
  fedprox  local.learning_rate=0.1,mu=0.1,server.learning_rate=2  0.7635    72900

Successive halving (``python -m benchmarks.config_figures --config=configs/tuning.py:halving``):

  run      best setting                                           accuracy  updates
  fedavg   local.learning_rate=0.05,server.learning_rate=2        0.7625    18900
  fedprox  local.learning_rate=0.1,mu=0.1,server.learning_rate=2  0.7635    18900

Random search (``python -m benchmarks.config_figures --config=configs/tuning.py:random``):

  run      best setting                                                             accuracy  updates
  fedavg   local.learning_rate=0.0547391,server.learning_rate=1.56237               0.7604    72900
  fedprox  local.learning_rate=0.160939,mu=0.00244489,server.learning_rate=1.62873  0.7656    72900

PBT, the best member and the values it ends at (``python -m benchmarks.config_figures
--config=configs/tuning.py:pbt``):

  run      best setting                                                          accuracy  updates
  fedavg   #75 local.learning_rate=0.073728,server.learning_rate=0.98304         0.7818    72900
  fedprox  #26 local.learning_rate=0.08192,mu=0.0012,server.learning_rate=1.536  0.7797    72900

FedEx, which tunes the client learning rate itself (``python -m benchmarks.config_figures
--config=configs/tuning.py:fedex``):

  run         best setting              accuracy  updates
  fedex       learning_rate=2           0.7583    8100
  fedex_prox  mu=0.001,learning_rate=2  0.7505    8100

Hyperband, the bracket in brackets (``python -m benchmarks.config_figures
--config=configs/tuning.py:hyperband``):

  run      best setting                                                                accuracy  updates
  fedavg   [2] local.learning_rate=0.097972,server.learning_rate=1.37125               0.7568    6900
  fedprox  [0] local.learning_rate=0.121366,mu=0.0163407,server.learning_rate=1.82785  0.7641    6900

Successive halving finds the grid's best setting of both runs for a quarter of the client updates;
on this small task its wall time is not lower (each rung compiles the compacted program anew: three
compiles in place of one, ``benchmarks/tuning.py``). PBT's members change their values every 10
rounds (a schedule, in ``pbt_<run>.json``), and its best member beats every fixed setting of the
grid by 2 points. FedEx tunes the client learning rate inside each run while it trains (9 runs
of it, one per server learning rate, 33 s wall): within 0.4 point of the grid's best at 11 % of its
client updates, each client holding a fifth of its examples out for FedEx's validation loss.
Hyperband's three brackets (17 random settings) come within 0.6 point (FedAvg) and to the grid's
level (FedProx) for under a tenth of the grid's client updates.
"""

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep

LOCAL = "0.003,0.01,0.02,0.03,0.05,0.1,0.2,0.3,1.0"
SERVER = "0.1,0.3,0.5,0.7,1.0,1.5,2.0,3.0,5.0"
VARIANTS = (None, "halving", "random", "pbt", "fedex", "hyperband")
FIGURES_TABLE = "best"   # each run's best setting, its global accuracy, the study's client updates
FIGURES = (("accuracy", "global/accuracy", 1, 4, 0.005), ("updates", "client_updates", 1, 0, 0))
FIGURE_VARIANTS = VARIANTS[1:]


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  """``variant``: ``None`` (the grid), ``"halving"`` (successive halving over the grid),
  ``"random"`` (81 settings drawn at random), ``"pbt"`` (population-based training of the grid's
  81 settings, an exploit step every 10 rounds) or ``"fedex"`` (FedEx tunes the 9 client learning
  rates while it trains: 9 server learning rates of it inside FedAvg, 3 x 3 of server learning rate
  and mu inside FedProx) or ``"hyperband"`` (Hyperband's three brackets over the random ranges:
  9, 5 and 3 settings, halved from rounds 10, 30 and 90)."""
  if variant not in VARIANTS:
    raise ValueError(f"configs/tuning.py:{variant}; choose one of {VARIANTS[1:]} or no variant")
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = 90
  c.eval_every = 10
  c.rounds_per_call = 10
  c.chunk_size = None
  c.progress = True
  c.checkpoint_every = 0
  c.data = ml_collections.ConfigDict(dict(
    name="grouped_synthetic", group_sizes=(24, 12, 8, 4), dim=32, num_classes=10,
    group_spread=1.5, client_spread=0.25, feature_shift=1.0, mean_examples=40.0,
    min_examples=8, max_examples=160, test_examples=40, seed=0, layout="padded",
  ))
  c.topology = ml_collections.ConfigDict(dict(kind="flat"))
  c.model = ml_collections.ConfigDict(dict(name="mlp", hidden=(64,)))
  c.local = ml_collections.ConfigDict(dict(optimizer="sgd", learning_rate=0.05, batch_size=16, epochs=1,
                                           steps=None))
  server = lambda: ml_collections.ConfigDict(dict(name="fedavg", learning_rate=1.0))  # noqa: E731
  c.runs = ml_collections.ConfigDict()
  c.runs.fedavg = ml_collections.ConfigDict(dict(algorithm="fedopt", cohort_size=10, server=server()))
  c.runs.fedprox = ml_collections.ConfigDict(dict(algorithm="fedprox", mu=0.01, cohort_size=10,
                                                  server=server()))
  c.run_order = ("fedavg", "fedprox")
  c.mesh_shape = ml_collections.config_dict.placeholder(int)
  c.sweep = default_sweep()
  grid = (f"local.learning_rate={LOCAL};runs.fedavg.server.learning_rate={SERVER};"
          "runs.fedprox.server.learning_rate=0.5,1.0,2.0;runs.fedprox.mu=0.001,0.01,0.1")
  c.sweep.params = grid
  if variant == "halving":
    c.sweep.rungs, c.sweep.halving_rate = "10,30", 3.0
  elif variant in ("random", "hyperband"):
    c.sweep.params = ("local.learning_rate=loguniform(0.003,1);"
                      "runs.fedavg.server.learning_rate=loguniform(0.1,5);"
                      "runs.fedprox.server.learning_rate=loguniform(0.5,2);"
                      "runs.fedprox.mu=loguniform(0.001,0.1)")
    if variant == "random":
      c.sweep.samples = 81
    else:
      c.sweep.hyperband_min_rounds, c.sweep.halving_rate = 10, 3.0
  elif variant == "pbt":
    c.sweep.pbt_interval, c.sweep.pbt_fraction, c.sweep.pbt_perturb = 10, 0.25, 0.2
  elif variant == "fedex":   # the client learning rate is FedEx's to tune: LOCAL as multiples of 0.05
    scales = tuple(round(float(v) / 0.05, 6) for v in LOCAL.split(","))
    c.runs = ml_collections.ConfigDict()
    c.runs.fedex = ml_collections.ConfigDict(dict(algorithm="fedex", lr_scales=scales, cohort_size=10,
                                                  server=server()))
    c.runs.fedex_prox = ml_collections.ConfigDict(dict(algorithm="fedex", lr_scales=scales, mu=0.01,
                                                       cohort_size=10, server=server()))
    c.run_order = ("fedex", "fedex_prox")
    c.sweep.params = (f"runs.fedex.server.learning_rate={SERVER};"
                      "runs.fedex_prox.server.learning_rate=0.5,1.0,2.0;runs.fedex_prox.mu=0.001,0.01,0.1")
  return declare_runner_fields(c)
