r"""FEMNIST as the LEAF benchmark (Caldas et al. 2018, "LEAF: a benchmark for federated settings")
runs FedAvg on it: LEAF's CNN, 3 or 35 clients per round, 2,000 rounds.

  python -m fedtree.main --config=configs/benchmarks/leaf_femnist.py --workdir=/tmp/leaf_femnist \
      --config.data.root=/path/to/leaf/data/femnist/data
  python -m fedtree.main --config=configs/benchmarks/leaf_femnist.py --workdir=/tmp/leaf_femnist_e100 \
      --config.data.root=/path/to/leaf/data/femnist/data --config.only=fedavg_c3 --config.local.epochs=100
  python -m fedtree.convert --config=configs/benchmarks/leaf_femnist.py --out=/tmp/femnist_store \
      --config.data.root=/path/to/leaf/data/femnist/data
  python -m fedtree.main --config=configs/benchmarks/leaf_femnist.py:store --workdir=/tmp/leaf_store \
      --config.data.path=/tmp/femnist_store
  python -m fedtree.main --config=configs/benchmarks/leaf_femnist.py:offline --workdir=/tmp/leaf_off
  python -m fedtree.main --config=configs/benchmarks/leaf_femnist.py:offline,quick --workdir=/tmp/leaf_quick

Source: TalwalkarLab/leaf ``paper_experiments/femnist.sh``: the data of ``./preprocess.sh -s niid
--sf 0.05 -k 100 -t sample`` (5 % of FEMNIST sampled by writer, writers with at least 100 images,
each writer's images split 90/10 into train and test; the script's sampling and split seeds), FedAvg
with SGD at learning rate 0.004, batch size 10 (``models/utils/args.py``' default), 2,000 rounds,
(clients per round, local epochs) in {(3, 1), (3, 100), (35, 1)}: the runs ``fedavg_c3`` and
``fedavg_c35`` (1 epoch; the second command runs (3, 100)). The server averages the clients' models
weighted by their examples (``models/server.py``). Model: ``models/femnist/cnn.py`` (``leaf_cnn``:
two 5x5 convolutions of 32 and 64 with 2x2 max pooling, a dense layer of 2048, 6,603,710 parameters).
LEAF scores each writer's test images and reports the average weighted by the writers' samples with
its 10th, 50th and 90th percentiles: fedtree's ``accuracy`` (pooled over test images) and
``accuracy_p10/p50/p90`` (per-writer spread, in metrics.jsonl).

Published figure: LEAF publishes no table of these runs' accuracies (its paper plots them), so
fedtree quotes no number here.

Data: LEAF's FEMNIST JSON. Prepare once where internet is available: ``git clone
https://github.com/TalwalkarLab/leaf && cd leaf/data/femnist && ./preprocess.sh -s niid --sf 0.05 -k
100 -t sample --smplseed 1549786595 --spltseed 1549786796``; ``config.data.root`` is then
``leaf/data/femnist/data`` (its ``train/`` and ``test/``). Without them the run stops before anything
compiles, naming that command and the ``:offline`` variant that runs without them.

Differences from LEAF: fedtree reports the final round (LEAF: every ``eval_every`` rounds, as here);
LEAF's clients take their last, smaller batch like fedtree's.

``:store``: the same runs over LEAF's JSON converted once to a store (``python -m fedtree.convert``,
:mod:`fedtree.population`): the device holds the cohort, never the population, and the run streams
when the memory estimate says the population does not fit (``config.population``).

``:offline``: the same runs on generated 28x28x1 images of 62 classes (200 clients of
:func:`fedtree.datasets.prototypes.prototype_images`), no file needed: a check that the setup runs,
not the benchmark.

``quick`` (added to any variant; ``:offline,quick`` above) runs the first run, ``fedavg_c3``, for 3
rounds scored once at the end, no checkpoint: the setup checked end to end. Measured
(``:offline,quick``, seed 0): 51 s CPU, 34 s wall on the shared 2-core CPU under a load of about 2.
The whole ``:offline`` runs 2,000 rounds of each of its two runs; its cost is not measured here.
"""

import os

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.standard_tasks import finish_variant, variant_flags
from fedtree.experiment.sweep import default_sweep

LEAF_FEMNIST = {"learning_rate": 0.004, "batch_size": 10, "rounds": 2000, "clients_per_round": (3, 35)}
"""LEAF's FedAvg setup (``paper_experiments/femnist.sh``)."""


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  """``variant``: ``None`` (LEAF's JSON), ``"store"`` (the JSON converted to a store,
  ``config.data.path``) or ``"offline"`` (generated images); ``quick`` added to any: 3 rounds of the
  first run (module docstring)."""
  flags = variant_flags(variant, ("offline", "store", "quick"), "leaf_femnist")
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = LEAF_FEMNIST["rounds"]
  c.eval_every = 100
  c.rounds_per_call = 25
  c.chunk_size = "auto"
  c.eval_chunk_size = "64"
  c.progress = True
  c.checkpoint_every = 500
  if "offline" in flags:
    c.data = ml_collections.ConfigDict(dict(
      name="prototype_images", num_clients=200, num_examples=20_000, num_classes=62, image_size=28,
      partition="dirichlet", alpha=0.5, test_fraction=0.1, seed=0))
  elif "store" in flags:
    c.data = ml_collections.ConfigDict(dict(name="store", path="", dataset="leaf"))
  else:
    c.data = ml_collections.ConfigDict(dict(
      name="leaf", kind="femnist", root=os.path.expanduser("~/leaf/data/femnist/data"),
      cache_dir="/tmp/fedtree_cache"))
  c.topology = ml_collections.ConfigDict(dict(kind="flat"))
  c.model = ml_collections.ConfigDict(dict(name="leaf_cnn"))
  c.local = ml_collections.ConfigDict(dict(
    optimizer="sgd", learning_rate=LEAF_FEMNIST["learning_rate"], batch_size=LEAF_FEMNIST["batch_size"],
    epochs=1, steps=None))
  c.runs = ml_collections.ConfigDict({
    f"fedavg_c{k}": ml_collections.ConfigDict(dict(algorithm="fedavg", cohort_size=k, weighting="examples"))
    for k in LEAF_FEMNIST["clients_per_round"]})
  c.run_order = tuple(f"fedavg_c{k}" for k in LEAF_FEMNIST["clients_per_round"])
  c.metrics = ml_collections.ConfigDict(dict(central=False))
  c.sweep = default_sweep()
  return declare_runner_fields(finish_variant(c, "leaf_femnist", flags))
