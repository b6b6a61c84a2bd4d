r"""The personalized-FL table: local training, FedAvg, FedAvg + FT, Ditto, pFedMe, Per-FedAvg, FedPer,
FedRep, LG-FedAvg, FedBN, FedRoD, FedBABU, APFL, FedALA, FedEM, kNN-Per, FedFomo, FedAMP, pFedHN and
FedProto on a pathological and a Dirichlet split of the real 8x8 digits, 3 seeds each, every client
scored with its own model on its own test data.

  python -m fedtree.main --config=configs/personalized.py --workdir=/tmp/personalized
  python -m fedtree.main --config=configs/personalized.py:quick --workdir=/tmp/personalized_quick

``:quick``, a first look in half a minute: six methods (:data:`QUICK_METHODS`: local training, FedAvg and
FedAvg + FT, Ditto, FedPer, FedRep, FedBN) on the pathological split only, one seed, 30 rounds.
The table it prints last (``python -m benchmarks.config_figures --config=configs/personalized.py:quick``
checks it):

  run          model      accuracy  up MB
  local_path   personal   0.9864    0.000
  fedavg_path  global     0.8591    11.544
  fedavg_path  global_ft  0.9864    11.544
  ditto_path   global     0.8477    11.544
  ditto_path   personal   0.9795    11.544
  fedper_path  personal   0.9795    9.984
  fedrep_path  personal   0.9955    9.984
  fedbn_path   personal   0.9591    11.544

Measured: 29 s wall and 41 s of CPU time (on 2026-12-07 on the project's quiet 2-core machine).

Setup: scikit-learn's 1,797 digits (:mod:`fedtree.datasets.digits`, no download) over 20 clients,
a quarter of every client's examples kept as its test data, split two ways (the runs' own
``data``, :func:`fedtree.experiment.context.run_context`): ``path``, McMahan et al.'s pathological
split (the examples sorted by label and cut into 40 shards, 2 per client: about two classes per
client), and ``dir``, a Dirichlet(0.3) label skew. An MLP (64 hidden units; FedBN's run adds a
BatchNorm, its own ``model``), one local epoch of SGD (rate 0.05, batches of 10) per round, every
client in every round, 100 rounds; ``--config.sweep.seeds`` seeds per run (default 3) stacked in
one compiled program (:mod:`fedtree.experiment.sweep`). Hyperparameters: the papers' where they
transfer (FedRep: 10 head epochs then the local epoch for the body; FedBABU and FedAvg + FT: 5
epochs of fine-tuning at the local rate; pFedMe: K = 5, λ = 15; Ditto: λ = 1; APFL: adaptive α from
0.5 at the local rate; FedALA: the last layer adapted, η = 1, s = 0.8 (PFLlib's defaults); FedEM: K = 3
components; kNN-Per: k = 10 neighbours, λ = 0.5, T = 1; FedFomo: M = 5 models a round, ε = 0.3
decaying by 0.05, a 20 % validation split; FedAMP: the distance attention with σ = 1, α_k = σ / 20
(so that ξ_ii >= 0 for 20 clients: PFLlib's α_k = 1 makes it negative) and λ / α_k = 1; pFedHN: the
authors' hypernetwork and its optimizer, one step a round over the 20 clients' averaged gradients;
FedProto: λ = 1), untuned.

Every model a run reports is a row of the final table (mean ± std over the seeds of the accuracy
over all its clients' test examples, and of the mean over its worst 10 % of clients; megabytes
sent each way per experiment, all rounds): ``global`` is a method's generic model (FedAvg; FedRoD's
and FedBABU's before fine-tuning), ``global_ft`` the same fine-tuned by every client (FedAvg + FT,
FedBABU), ``personal`` each client's own model (APFL's mixture of its local and the global model,
FedEM's mixture of the components by its own weights, kNN-Per's global model interpolated with its
memory), ``adapted`` Per-FedAvg's one-step adaptation. APFL's and kNN-Per's ``global`` is FedAvg's
model (uniform weights for APFL, the paper's), FedEM's the components mixed by the clients' mean
weights.

Adding a method is one entry of :data:`METHODS` (its run fields; it then runs on both splits).

MEASURED (the command above, seed 0 and the sweep's seeds 1, 2; the 38 runs of the 19 methods, each
compiled once for its 3 seeds): 6 min 4 s wall and 8 min 47 s of CPU time (measured on 2026-12-07 on
the project's quiet 2-core machine, without the plots). The table it prints last (``python -m
benchmarks.config_figures --config=configs/personalized.py`` checks it):

  every swept run (mean ± std over 3 seeds; worst 10 %: the mean over a model's worst tenth of clients)
  run             setting  model      metric    mean ± std       worst 10 % mean ± std  up MB    down MB
  local_path      default  personal   accuracy  0.9955 ± 0.0019  0.9621 ± 0.0107        0.000    0.000
  fedavg_path     default  global     accuracy  0.9174 ± 0.0011  0.7273 ± 0.0000        38.480   38.480
  fedavg_path     default  global_ft  accuracy  0.9902 ± 0.0021  0.9394 ± 0.0107        38.480   38.480
  ditto_path      default  global     accuracy  0.9189 ± 0.0028  0.7348 ± 0.0107        38.480   38.480
  ditto_path      default  personal   accuracy  0.9879 ± 0.0021  0.9394 ± 0.0107        38.480   38.480
  pfedme_path     default  global     accuracy  0.9136 ± 0.0032  0.7273 ± 0.0000        38.480   38.480
  pfedme_path     default  personal   accuracy  0.9788 ± 0.0065  0.8561 ± 0.0467        38.480   38.480
  perfedavg_path  default  adapted    accuracy  0.9682 ± 0.0056  0.8258 ± 0.0214        38.480   38.480
  perfedavg_path  default  global     accuracy  0.8341 ± 0.0056  0.4848 ± 0.0107        38.480   38.480
  fedper_path     default  personal   accuracy  0.9924 ± 0.0011  0.9470 ± 0.0107        33.280   33.280
  fedrep_path     default  personal   accuracy  0.9955 ± 0.0019  0.9621 ± 0.0107        33.280   33.280
  lgfedavg_path   default  personal   accuracy  0.9947 ± 0.0011  0.9545 ± 0.0000        5.200    5.200
  fedbn_path      default  personal   accuracy  0.9909 ± 0.0000  0.9394 ± 0.0107        38.480   38.480
  fedrod_path     default  global     accuracy  0.7841 ± 0.0170  0.3712 ± 0.1405        38.480   38.480
  fedrod_path     default  personal   accuracy  0.9962 ± 0.0011  0.9621 ± 0.0107        38.480   38.480
  fedbabu_path    default  global     accuracy  0.8924 ± 0.0088  0.6439 ± 0.0214        33.280   33.280
  fedbabu_path    default  global_ft  accuracy  0.9902 ± 0.0011  0.9470 ± 0.0107        33.280   33.280
  apfl_path       default  global     accuracy  0.9174 ± 0.0011  0.7273 ± 0.0000        38.480   38.480
  apfl_path       default  personal   accuracy  0.9955 ± 0.0019  0.9621 ± 0.0107        38.480   38.480
  fedala_path     default  global     accuracy  0.8561 ± 0.0039  0.6288 ± 0.0597        38.480   38.480
  fedala_path     default  personal   accuracy  0.9886 ± 0.0019  0.9394 ± 0.0107        38.480   38.480
  fedem_path      default  global     accuracy  0.7758 ± 0.0200  0.3788 ± 0.0652        115.440  115.440
  fedem_path      default  personal   accuracy  0.9189 ± 0.0060  0.6667 ± 0.0703        115.440  115.440
  knnper_path     default  global     accuracy  0.9174 ± 0.0011  0.7273 ± 0.0000        38.480   38.480
  knnper_path     default  personal   accuracy  0.9977 ± 0.0000  0.9773 ± 0.0000        38.480   38.480
  fedfomo_path    default  personal   accuracy  0.9955 ± 0.0000  0.9545 ± 0.0000        38.480   192.440
  fedamp_path     default  personal   accuracy  0.9947 ± 0.0021  0.9621 ± 0.0107        38.480   38.480
  pfedhn_path     default  personal   accuracy  0.9500 ± 0.0067  0.8106 ± 0.0107        38.480   38.480
  fedproto_path   default  personal   accuracy  0.9947 ± 0.0021  0.9621 ± 0.0107        5.200    5.140
  local_dir       default  personal   accuracy  0.9170 ± 0.0038  0.7024 ± 0.0000        0.000    0.000
  fedavg_dir      default  global     accuracy  0.9525 ± 0.0037  0.8668 ± 0.0181        38.480   38.480
  fedavg_dir      default  global_ft  accuracy  0.9706 ± 0.0032  0.8968 ± 0.0205        38.480   38.480
  ditto_dir       default  global     accuracy  0.9532 ± 0.0011  0.8693 ± 0.0000        38.480   38.480
  ditto_dir       default  personal   accuracy  0.9698 ± 0.0046  0.8958 ± 0.0231        38.480   38.480
  pfedme_dir      default  global     accuracy  0.9510 ± 0.0028  0.8561 ± 0.0094        38.480   38.480
  pfedme_dir      default  personal   accuracy  0.9623 ± 0.0083  0.8194 ± 0.0569        38.480   38.480
  perfedavg_dir   default  adapted    accuracy  0.9540 ± 0.0038  0.8419 ± 0.0226        38.480   38.480
  perfedavg_dir   default  global     accuracy  0.9314 ± 0.0046  0.8006 ± 0.0197        38.480   38.480
  fedper_dir      default  personal   accuracy  0.9306 ± 0.0038  0.7160 ± 0.0108        33.280   33.280
  fedrep_dir      default  personal   accuracy  0.9231 ± 0.0037  0.7233 ± 0.0092        33.280   33.280
  lgfedavg_dir    default  personal   accuracy  0.9208 ± 0.0032  0.7112 ± 0.0124        5.200    5.200
  fedbn_dir       default  personal   accuracy  0.9766 ± 0.0021  0.9134 ± 0.0119        38.480   38.480
  fedrod_dir      default  global     accuracy  0.9389 ± 0.0018  0.8491 ± 0.0005        38.480   38.480
  fedrod_dir      default  personal   accuracy  0.9465 ± 0.0028  0.7970 ± 0.0258        38.480   38.480
  fedbabu_dir     default  global     accuracy  0.9284 ± 0.0120  0.8100 ± 0.0300        33.280   33.280
  fedbabu_dir     default  global_ft  accuracy  0.9261 ± 0.0038  0.7537 ± 0.0181        33.280   33.280
  apfl_dir        default  global     accuracy  0.9540 ± 0.0053  0.8863 ± 0.0133        38.480   38.480
  apfl_dir        default  personal   accuracy  0.9284 ± 0.0011  0.8183 ± 0.0035        38.480   38.480
  fedala_dir      default  global     accuracy  0.9472 ± 0.0028  0.8645 ± 0.0148        38.480   38.480
  fedala_dir      default  personal   accuracy  0.9638 ± 0.0032  0.8764 ± 0.0064        38.480   38.480
  fedem_dir       default  global     accuracy  0.8914 ± 0.0290  0.7222 ± 0.0971        115.440  115.440
  fedem_dir       default  personal   accuracy  0.8688 ± 0.0333  0.6818 ± 0.0969        115.440  115.440
  knnper_dir      default  global     accuracy  0.9525 ± 0.0037  0.8668 ± 0.0181        38.480   38.480
  knnper_dir      default  personal   accuracy  0.9563 ± 0.0046  0.7616 ± 0.0345        38.480   38.480
  fedfomo_dir     default  personal   accuracy  0.9155 ± 0.0021  0.7018 ± 0.0181        38.480   192.440
  fedamp_dir      default  personal   accuracy  0.9155 ± 0.0028  0.7024 ± 0.0000        38.480   38.480
  pfedhn_dir      default  personal   accuracy  0.9532 ± 0.0105  0.8731 ± 0.0027        38.480   38.480
  fedproto_dir    default  personal   accuracy  0.9118 ± 0.0018  0.7024 ± 0.0000        5.200    5.140

On the pathological split every personalized model scores 0.968-0.996 (worst tenth of clients
0.83-0.96) where one global model scores 0.92 (worst tenth 0.73), and fine-tuning FedAvg's model
for 5 epochs (FedAvg + FT: 0.990) does as well as the dedicated methods; FedRoD's generic model,
trained on the balanced loss by clients that each hold two classes, is the weakest generic one
(0.78). On the milder Dirichlet split the global model is strong (0.953), FedAvg + FT and Ditto add
about 2 points, and the methods that keep a head or a representation per client are near local
training (0.92-0.93). FedBN's row uses the MLP with BatchNorm (the other rows have none), so it
also measures the normalization. Bytes: all clients, all 100 rounds, per experiment; FedPer, FedRep
and FedBABU send the body (4,160 of the 4,810 parameters), LG-FedAvg the head (650), FedEM its 3
components each way.

Of the mixtures (issue 38), kNN-Per's memory gives the best personal model on the pathological split
(0.998, worst tenth 0.977) from FedAvg's global model, and little on the Dirichlet split (0.956 against
the global model's 0.953, with a weaker worst tenth); APFL's learned α moves the clients towards their
local models, which is local training's accuracy on the pathological split (0.996) and below the global
model on the Dirichlet one (0.928 against 0.954); FedALA's local models score 0.989 and 0.964. FedEM,
untuned (3 components, each trained on its share of every client's examples), is the weakest here
(personal 0.919 and 0.869, with a large spread over seeds).

FedFomo, FedAMP and FedProto stay within half a point of local training on both splits (local:
0.9955 and 0.9170); FedAMP's distance attention at σ = 1 leaves each client's cloud model almost its
own model (its ``fedamp_self_weight`` metric in round 100: 0.996 on the pathological split, 1.000 on
the Dirichlet one), so it is local training with a proximal term. pFedHN, whose every model is made
by one hypernetwork, is below local training on the pathological split (0.950, worst tenth 0.81) and
above it on the Dirichlet split (0.953, worst tenth 0.87; level with FedAvg's global model, 0.9525).
FedFomo receives 5 models a round (192 MB down); FedProto sends 10 prototypes of 64 entries and
their counts (5.2 MB up), and receives the 10 global prototypes and a flag each (5.14 MB down).
"""

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep

FINETUNE_EPOCHS = 5.0
FIGURES_TABLE = "swept"   # the docstring's tables are the one the command prints last (sweep.runs_table)
FIGURES = (   # the tolerances of its columns mean ± std, worst 10 % mean ± std, up MB, down MB
  ("accuracy", "accuracy", 1, 4, 0.01),
  ("worst 10 %", "accuracy_worst10_mean", 1, 4, 0.03),
  ("up MB", "uplink_MB", 1, 3, 0.0),
  ("down MB", "downlink_MB", 1, 3, 0.0),
)
FIGURE_VARIANTS = ("quick",)
VARIANT_FIGURES = {   # the quick variant's one seed is not swept: its table is the final table's rows
  "quick": ("models", (("accuracy", "accuracy", 1, 4, 0.01), ("up MB", "uplink_MB", 1, 3, 0.0))),
}

METHODS = {
  "local": dict(algorithm="local"),
  "fedavg": dict(algorithm="fedavg", finetune_epochs=FINETUNE_EPOCHS),   # FedAvg and FedAvg + FT
  "ditto": dict(algorithm="ditto", lam=1.0),
  "pfedme": dict(algorithm="pfedme", lam=15.0, inner_steps=5, personal_lr=0.05, learning_rate=0.05, beta=1.0),
  "perfedavg": dict(algorithm="perfedavg", alpha=0.05, beta=0.02, variant="fo"),
  "fedper": dict(algorithm="fedper"),
  "fedrep": dict(algorithm="fedrep", head_epochs=10.0),
  "lgfedavg": dict(algorithm="lgfedavg"),
  "fedbn": dict(algorithm="fedbn", model=dict(norm="batch")),
  "fedrod": dict(algorithm="fedrod"),
  "fedbabu": dict(algorithm="fedbabu", finetune_epochs=FINETUNE_EPOCHS),
  # personalized aggregation and mixtures (issue 38)
  "apfl": dict(algorithm="apfl", alpha=0.5, adaptive=True),
  "fedala": dict(algorithm="fedala", layers=1, eta=1.0, sample_fraction=0.8),
  "fedem": dict(algorithm="fedem", num_components=3),
  "knnper": dict(algorithm="knnper", k=10, lam=0.5),
  "fedfomo": dict(algorithm="fedfomo", num_candidates=5),
  "fedamp": dict(algorithm="fedamp", alpha=0.05, lam=0.05),   # α_k = σ / 20: ξ_ii >= 0; λ / α_k = 1
  "pfedhn": dict(algorithm="pfedhn"),
  "fedproto": dict(algorithm="fedproto", lam=1.0),
}
"""One entry per method: its run fields (``algorithm`` and its hyperparameters; a ``model`` of its
own where it needs one). Every method runs on every split of :data:`SPLITS`."""

SPLITS = {
  "path": dict(partition="shards", shards_per_client=2),
  "dir": dict(partition="dirichlet", alpha=0.3),
}
"""The data splits (fields over ``config.data``), each a suffix of the runs' labels."""


QUICK_METHODS = ("local", "fedavg", "ditto", "fedper", "fedrep", "fedbn")
"""The methods of the ``quick`` variant: local training, FedAvg (+ FT), a regularized, two partial
personalizations and FedBN, on the pathological split, one seed, 30 rounds."""


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  """``variant``: ``None`` (the whole table) or ``"quick"`` (:data:`QUICK_METHODS`)."""
  if variant not in (None, "quick"):
    raise ValueError(f"configs/personalized.py:{variant}: unknown variant; choose 'quick' (or none)")
  quick = variant == "quick"
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = 100
  c.eval_every = 100
  c.rounds_per_call = 25
  c.chunk_size = None
  c.progress = True
  c.plots = False
  c.data = ml_collections.ConfigDict(dict(
    name="sklearn_digits", num_clients=20, partition="dirichlet", alpha=0.3, shards_per_client=2,
    test_fraction=0.25, seed=0,
  ))
  c.topology = ml_collections.ConfigDict(dict(kind="flat"))
  c.model = ml_collections.ConfigDict(dict(name="mlp", hidden=(64,)))
  c.local = ml_collections.ConfigDict(dict(
    optimizer="sgd", learning_rate=0.05, batch_size=10, epochs=1, steps=None,
  ))
  c.runs = ml_collections.ConfigDict()
  order = []
  for split, data in SPLITS.items():
    if quick and split != "path":
      continue
    for method, fields in METHODS.items():
      if quick and method not in QUICK_METHODS:
        continue
      label = f"{method}_{split}"
      c.runs[label] = ml_collections.ConfigDict(dict(fields, data=dict(data)))
      order.append(label)
  c.run_order = tuple(order)
  c.mesh_shape = ml_collections.config_dict.placeholder(int)  # clients over devices: -1 = all
  c.sweep = default_sweep(select="personal/accuracy")
  c.sweep.seeds = 3
  if quick:   # a few minutes: one split, six methods, one seed, 30 rounds
    c.rounds, c.eval_every, c.rounds_per_call, c.sweep.seeds = 30, 30, 10, 1
  return declare_runner_fields(c)   # every runner field settable from the command line
