r"""Clients of five widths in one vmapped tier (issue 51): HeteroFL, FedRolex and FjORD (with and without
its self-distillation) against FedAvg on
the smallest model every client can train, and FedAvg on the full model (which the weak clients could
not run: the upper bound), beside it FedDF (the full model, every round's mean distilled from the
clients' ensemble: 50 Adam steps on 256 stand-in public inputs drawn from the clients' own) and FedMD
(every client its own model, all 48 each round as in its paper, digesting the consensus of scores on 64
of those inputs a round). DepthFL cuts the same MLP by depth instead (1, 2 or 3 of its 3 blocks, a third
of the clients each, an exit after every hidden layer).

  python -m fedtree.main --config=configs/heterogeneous.py --workdir=/tmp/fedtree_heterogeneous

The quickstart's task (48 clients in 4 groups, one server over all), an MLP of two hidden layers of 64.
Every client has one of HeteroFL's levels a-e (width rates 1, 1/2, 1/4, 1/8, 1/16: hidden layers of
64, 32, 16, 8 or 4 units), about a fifth of the clients each, fixed for the run; 16 clients a round.
``heterofl_dynamic`` is HeteroFL's dynamic mode: every sampled client's level drawn anew every round
(``capacities="dynamic"``), in the same proportions.
Models reported: ``global`` (the full width), ``width_1`` ... ``width_1_16`` (every level's sub-model
of the global model, as it trained) and ``own_width`` (each client at its own level) for HeteroFL and
FjORD (every local step a width drawn up to the client's own; ``fjord_kd`` with the paper's
self-distillation from the client's widest sub-model, ``distill=True``); ``global`` for FedRolex (its paper's
evaluation); ``width_1_16`` for the smallest model's FedAvg (``rates=(1/16,)``, no scaler; its
``global`` is the full-shaped model of which only that sub-model trained, the other coordinates at
their start). The three methods run with the papers' count mean over each coordinate's holders
(``weighting="uniform"``), HeteroFL and FedRolex without the scaler: these models have no BatchNorm
after it to absorb the 1/rate scale. With it (the methods' default, the paper's,
``--config.runs.heterofl.scaler=True``) HeteroFL's global model reached 67.6 % and FedRolex's collapsed
to 31.0 % (a rate-1/16 client's window scales every channel it rolls over by 16). The command took
83 s wall, 111 s of CPU time (measured on 2026-12-08 on the project's quiet 2-core machine).

Figures (seed 0; ``up MB``/``down MB``: the clients' bytes over the run, each client its own
sub-model; checked within the FIGURES tolerances by
``python -m benchmarks.config_figures --config=configs/heterogeneous.py``):

  run               model       accuracy%  loss   up MB   down MB
  heterofl          global      70.6       0.989  14.420  14.420
  heterofl          width_1     70.6       0.989  14.420  14.420
  heterofl          width_1_2   68.1       1.084  14.420  14.420
  heterofl          width_1_4   66.1       1.165  14.420  14.420
  heterofl          width_1_8   58.1       1.313  14.420  14.420
  heterofl          width_1_16  53.9       1.497  14.420  14.420
  heterofl          own_width   64.7       1.163  14.420  14.420
  heterofl_dynamic  global      73.3       0.891  14.251  14.251
  heterofl_dynamic  width_1     73.3       0.891  14.251  14.251
  heterofl_dynamic  width_1_2   68.3       1.048  14.251  14.251
  heterofl_dynamic  width_1_4   66.8       1.152  14.251  14.251
  heterofl_dynamic  width_1_8   65.9       1.214  14.251  14.251
  heterofl_dynamic  width_1_16  64.4       1.424  14.251  14.251
  fedrolex          global      71.2       1.041  14.420  14.420
  fjord             global      67.4       1.111  14.420  14.420
  fjord             width_1     67.4       1.111  14.420  14.420
  fjord             width_1_2   66.7       1.138  14.420  14.420
  fjord             width_1_4   66.5       1.160  14.420  14.420
  fjord             width_1_8   66.7       1.168  14.420  14.420
  fjord             width_1_16  65.9       1.204  14.420  14.420
  fjord             own_width   67.0       1.154  14.420  14.420
  fjord_kd          global      70.4       1.002  14.420  14.420
  fjord_kd          width_1     70.4       1.002  14.420  14.420
  fjord_kd          width_1_2   68.6       1.044  14.420  14.420
  fjord_kd          width_1_4   66.8       1.113  14.420  14.420
  fjord_kd          width_1_8   66.6       1.142  14.420  14.420
  fjord_kd          width_1_16  66.1       1.211  14.420  14.420
  fjord_kd          own_width   68.0       1.083  14.420  14.420
  depthfl           global      74.8       0.818  39.586  39.586
  depthfl           depth_1     74.3       0.826  39.586  39.586
  depthfl           depth_2     74.6       0.834  39.586  39.586
  depthfl           depth_3     74.2       0.838  39.586  39.586
  depthfl           own_depth   74.5       0.818  39.586  39.586
  smallest          global      61.0       1.335  1.293   1.293
  smallest          width_1_16  66.5       1.114  1.293   1.293
  smallest          own_width   66.5       1.114  1.293   1.293
  fedavg            global      75.5       0.804  44.301  44.301
  feddf             global      73.4       0.885  44.301  44.301
  fedmd             personal    71.1       1.066  12.288  12.288

HeteroFL's full-width model is 4.9 points under FedAvg on the full model, which the weak clients could
not train, at a third of its bytes, and 4.1 points over the smallest model every client can train;
each narrower level loses more, and a client scored at its own width (``own_width``) sits in between.
Drawing the levels every round (``heterofl_dynamic``) lets every client's data reach every width: the full
width gains 2.7 points (73.3 %) and the narrowest 10.5 (64.4 % at 1/16), for slightly fewer bytes (the
draws' sub-models happened to be smaller).
FjORD trades 3.2 points of the full width for sub-models that hold up: its narrowest (1/16) scores
65.9 % where HeteroFL's scores 53.9 %, the fairness across devices its paper claims. Its
self-distillation (``fjord_kd``, each step also training the client's widest sub-model as the teacher)
gains back 3.0 of those points at the full width (70.4 %) and 1.1 on a client's own (68.0 %), its
narrowest width unchanged within 0.2 (66.1 %). FedDF's
distillation costs FedAvg 2.1 points here: its public inputs are the clients' own training inputs (a
stand-in), where its paper distills on a separate unlabeled set. FedMD's own models reach 71.1 % on
average over the clients sending only scores (12.3 MB each way over the run for 48 clients a round,
against FedAvg's 44.3 MB for 16). DepthFL's ensemble of exits reaches 74.8 %, 0.7 points under FedAvg
on the full model, at 39.6 MB each way: cut by depth, the weak clients still hold the first layer, most
of this MLP's parameters; its exits alone score 74.2-74.6 %.
"""

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep

RATES = (1.0, 0.5, 0.25, 0.125, 0.0625)
FIGURES = (
  ("accuracy%", "accuracy", 100, 1, 1.0),
  ("loss", "loss", 1, 3, 0.05),
  ("up MB", "uplink_MB", 1, 3, 0.001),
  ("down MB", "downlink_MB", 1, 3, 0.001),
)


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = 100
  c.eval_every = 25
  c.rounds_per_call = 25
  c.chunk_size = "auto"
  c.progress = True
  c.data = ml_collections.ConfigDict(dict(
    name="grouped_synthetic", group_sizes=(24, 12, 8, 4), dim=32, num_classes=10,
    group_spread=1.5, client_spread=0.25, feature_shift=1.0, mean_examples=40.0,
    min_examples=8, max_examples=160, test_examples=40, seed=0,
  ))
  c.topology = ml_collections.ConfigDict(dict(kind="flat"))
  c.model = ml_collections.ConfigDict(dict(name="mlp", hidden=(64, 64)))
  c.local = ml_collections.ConfigDict(dict(
    optimizer="sgd", learning_rate=0.05, batch_size=16, epochs=1, steps=None,
  ))
  c.runs = ml_collections.ConfigDict()
  # the papers' count mean over each coordinate's holders; no scaler: these models have no BatchNorm
  # after it to absorb the 1/rate scale (the scaler, the methods' default, is measured in the docstring)
  width = dict(cohort_size=16, rates=RATES, weighting="uniform", scaler=False)
  c.runs.heterofl = ml_collections.ConfigDict(dict(algorithm="heterofl", **width))
  c.runs.heterofl_dynamic = ml_collections.ConfigDict(dict(algorithm="heterofl", capacities="dynamic",
                                                           **width))
  c.runs.fedrolex = ml_collections.ConfigDict(dict(algorithm="fedrolex", **width))
  c.runs.fjord = ml_collections.ConfigDict(dict(algorithm="fjord", cohort_size=16, rates=RATES,
                                                weighting="uniform"))
  c.runs.fjord_kd = ml_collections.ConfigDict(dict(algorithm="fjord", cohort_size=16, rates=RATES,
                                                   weighting="uniform", distill=True))
  c.runs.smallest = ml_collections.ConfigDict(dict(algorithm="heterofl", cohort_size=16, rates=(RATES[-1],),
                                                   scaler=False))
  c.runs.fedavg = ml_collections.ConfigDict(dict(algorithm="fedavg", cohort_size=16))
  c.runs.feddf = ml_collections.ConfigDict(dict(algorithm="feddf", cohort_size=16, public_examples=256,
                                                distill_steps=50))
  c.runs.fedmd = ml_collections.ConfigDict(dict(algorithm="fedmd", cohort_size=None, public_examples=256,
                                                public_subset=64, digest_steps=10))
  c.runs.depthfl = ml_collections.ConfigDict(dict(algorithm="depthfl", cohort_size=16, weighting="uniform"))
  c.run_order = ("heterofl", "heterofl_dynamic", "fedrolex", "fjord", "fjord_kd", "depthfl", "smallest",
                 "fedavg", "feddf", "fedmd")
  c.mesh_shape = ml_collections.config_dict.placeholder(int)  # clients over devices: -1 = all
  c.sweep = default_sweep()
  return declare_runner_fields(c)
