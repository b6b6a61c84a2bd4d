r"""CIFAR-10 over 100 clients as FLGo-Bench (Wang et al. 2023, "FLGo: a fully customizable federated
learning platform"; WwZzz/FLGo-Bench) runs FedAvg: label skew Dirichlet(0.1), or IID.

  python -m fedtree.main --config=configs/benchmarks/flgo_cifar10.py --workdir=/tmp/flgo_dir01
  python -m fedtree.main --config=configs/benchmarks/flgo_cifar10.py:iid --workdir=/tmp/flgo_iid
  python -m fedtree.main --config=configs/benchmarks/flgo_cifar10.py:offline --workdir=/tmp/flgo_off
  python -m fedtree.main --config=configs/benchmarks/flgo_cifar10.py:offline,quick --workdir=/tmp/flgo_quick

Source: WwZzz/FLGo-Bench ``README.md`` (CIFAR10, 100 clients; tasks ``cifar10_dir0.1_c100`` and
``cifar10_iid_c100``): 100 clients of equal size, each drawing its class mix from Dirichlet(0.1 x the
class shares) (``dir0.1``) or IID; 20 % of the clients per round (``proportion: 0.2``), 5 local
epochs of SGD with batch size 50 at FedAvg's tuned learning rate 0.1 (both partitions), 2,000
rounds; 20 % of every client's data held out (``train_holdout: 0.2``, ``local_test: True``). Model:
FLGo's CIFAR-10 CNN (``flgo_cnn``: two 5x5 convolutions of 64, dense 384 and 192, 797,962
parameters). The server averages the clients' models uniformly (FLGo's default aggregation). FLGo
reports "Global Test" (CIFAR-10's test split: ``central_accuracy``) and "Local Test" (the clients'
held-out data, pooled: ``accuracy``).

Published figures (**FLGo-Bench's, not fedtree's**; mean ± std over 5 seeds, FedAvg, CNN): Global
Test 69.87 ± 0.50 % (dir0.1) and 81.54 ± 0.14 % (IID); Local Test 70.02 ± 0.70 % (dir0.1) and 80.98 ±
0.39 % (IID).

Data: TFDS ``cifar10``. Prepare once where internet is available: ``tfds build cifar10
--data_dir=DIR`` (or ``python -c "import tensorflow_datasets as tfds;
tfds.builder('cifar10', data_dir='DIR').download_and_prepare()"``) and set
``--config.data.data_dir=DIR`` (default: TFDS' ``~/tensorflow_datasets``). Without it the run stops
before anything compiles, naming that command and the ``:offline`` variant that runs without them.

Differences from FLGo-Bench: FLGo also decays the learning rate by 0.9998 per round, adds weight
decay 1e-3 and clips gradients at norm 10, stops early after 500 rounds without progress on the
validation data and normalizes with its own constants; fedtree runs the learning rate constant,
without weight decay, clipping or early stop, standardizes each channel by the training images'
statistics and reports the final round.

``:offline``: the same run on generated 32x32x3 images of 10 classes
(:func:`fedtree.datasets.prototypes.prototype_images`; ``:iid,offline`` with an IID split), no file
needed: a check that the setup runs, not the benchmark.

``quick`` (added to any variant; ``:offline,quick`` above) runs the first run, FedAvg, for 3 rounds
scored once at the end, no checkpoint: the setup checked end to end. Measured (``:offline,quick``,
seed 0): 138 s CPU, 23 min 24 s wall on the shared 2-core CPU under a load of about 20. The whole
``:offline`` runs 2,000 rounds of its one run; its cost is not measured here.
"""

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.standard_tasks import finish_variant, variant_flags
from fedtree.experiment.sweep import default_sweep

FLGO_CIFAR10 = {"num_clients": 100, "alpha": 0.1, "proportion": 0.2, "batch_size": 50, "epochs": 5,
                "learning_rate": 0.1, "rounds": 2000, "holdout": 0.2}
"""FLGo-Bench's CIFAR-10 configuration (README, 100 clients; FedAvg's tuned learning rate)."""


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  """``variant``: comma-separated ``iid`` (IID clients; default Dirichlet(0.1)) and ``offline``
  (generated images), and ``quick`` (3 rounds of the first run: module docstring)."""
  flags = variant_flags(variant, ("iid", "offline", "quick"), "flgo_cifar10")
  s = FLGO_CIFAR10
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = s["rounds"]
  c.eval_every = 100
  c.rounds_per_call = 25
  c.chunk_size = "auto"
  c.eval_chunk_size = "10"
  c.progress = True
  c.checkpoint_every = 500
  partition = "iid" if "iid" in flags else "dirichlet_balanced"
  if "offline" in flags:
    c.data = ml_collections.ConfigDict(dict(
      name="prototype_images", num_clients=s["num_clients"], num_examples=10_000, num_classes=10,
      image_size=32, channels=3, partition="iid" if "iid" in flags else "dirichlet", alpha=s["alpha"],
      test_fraction=s["holdout"], seed=0))
  else:
    c.data = ml_collections.ConfigDict(dict(
      name="tfds", dataset="cifar10", num_clients=s["num_clients"], partition=partition, alpha=s["alpha"],
      test_fraction=s["holdout"], normalize="per_channel", data_dir=None, seed=0))
  c.topology = ml_collections.ConfigDict(dict(kind="flat"))
  c.model = ml_collections.ConfigDict(dict(name="flgo_cnn"))
  c.local = ml_collections.ConfigDict(dict(
    optimizer="sgd", learning_rate=s["learning_rate"], batch_size=s["batch_size"], epochs=s["epochs"],
    steps=None))
  cohort = int(round(s["proportion"] * s["num_clients"]))
  c.runs = ml_collections.ConfigDict(dict(
    fedavg=ml_collections.ConfigDict(dict(algorithm="fedavg", cohort_size=cohort, weighting="uniform"))))
  c.run_order = ("fedavg",)
  c.metrics = ml_collections.ConfigDict(dict(central="offline" not in flags))
  c.sweep = default_sweep()
  return declare_runner_fields(finish_variant(c, "flgo_cifar10", flags))
