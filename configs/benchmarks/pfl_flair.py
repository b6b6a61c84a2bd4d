r"""FLAIR (Song et al. 2022, "FLAIR: federated learning annotated image repository") as pfl-research
benchmarks it (Granqvist et al. 2024; apple/pfl-research ``benchmarks/flair``): 41,131 Flickr users'
photos, 17 coarse labels per image as multi-hot labels, FedAvg with a ResNet-18 and a central Adam.

  python -m fedtree.convert --config=configs/benchmarks/pfl_flair.py --out=/tmp/flair_store \
      --config.data.path=DIR/flair_federated.hdf5
  python -m fedtree.main --config=configs/benchmarks/pfl_flair.py:store --workdir=/tmp/pfl_flair \
      --config.data.path=/tmp/flair_store
  python -m fedtree.main --config=configs/benchmarks/pfl_flair.py:offline --workdir=/tmp/flair_off
  python -m fedtree.main --config=configs/benchmarks/pfl_flair.py:offline,quick --workdir=/tmp/flair_quick

Source: apple/pfl-research ``benchmarks/flair/configs/baseline.yaml`` (the README's "FLAIR non-IID no
DP" command) and ``benchmarks/flair/train.py``: 200 users per round (``cohort_size``), 2 local epochs
of SGD at 0.01 with batch size 16, the server's Adam at 0.1 (``central_optimizer: adam``:
``AdamW(betas=(0.9, 0.99), eps=0.01)``, weight decay 0), users weighted alike (``weight_by_samples``'s
default, false), 5,000 central iterations, the server's model scored on the ``val`` users every 20
(``make_central_datasets(data_path, 'val')``). Model: ``multi_label_cnn`` with ``model_type: resnet18``
(``benchmarks/model/pytorch/cnn.py``): torchvision's ResNet-18, 17 outputs, trained with
``BCEWithLogitsLoss`` (the sigmoid binary cross-entropy of each label, averaged), images scaled to
[0, 1] and standardized with ImageNet's channel statistics: fedtree's ``resnet18`` with
``stem="imagenet"``, ``standardize="imagenet"`` (11,185,233 parameters, torchvision's count). Metrics
as its ``metrics()``: per label, precision and recall of the predictions at score 0.5 and the averaged
precision over 200 thresholds, averaged over labels (``macro_ap``, ``macro_precision``,
``macro_recall``) or over every (image, label) pair (``micro_*``); ``accuracy`` and ``loss`` are the
mean over labels. The central scores are ``central_macro_ap``, ``central_micro_ap``, ... in the final
summary and metrics.jsonl.

Published figure: pfl-research keeps its benchmark results in a Weights & Biases report that could
not be read from the machine this config was written on; fedtree quotes no number here.

Data: FLAIR in pfl-research's HDF5 layout (:func:`fedtree.population.convert.convert_flair`).
Prepare once where internet is available: in apple/pfl-research's ``benchmarks`` folder, ``python -m
dataset.flair.download_preprocess --output_file data/flair/flair_federated.hdf5``; then convert it
to a store (the first command above) and run ``:store`` over it. The whole population (345,879
images of 256x256x3) never fits in memory: the run streams its cohorts from the store
(``config.population``). Without the store the run stops before anything compiles, naming the
conversion and the ``:offline`` variant that runs without them.

Differences from pfl-research: its baseline starts from ImageNet weights (``pretrained: true``, the
BatchNorm statistics frozen) and fedtree has none: the model starts from scratch with GroupNorm of
32 groups (``min(32, channels)``), what pfl-research's ``pretrained=False`` builds; its server
learning rate warms up over 30 iterations and decays linearly to 0.02 (``CentralLRDecay``), fedtree's
stays 0.1; it clips every local gradient to norm 10, fedtree does not; it trains on random 224x224
crops (flipped at random) and scores 224x224 resizes, fedtree on the stored 256x256 images as they
are; it keeps at most 512 images of a user (``max_num_user_images``), fedtree keeps all. Its
precision-recall curve is cut at the scores 0, 1/199, ..., 1 and a label predicted at score > 0.5;
fedtree's at t/200 (t = 0..199, :data:`fedtree.core.metrics.SCORE_BUCKETS`) and at score >= 0.5.
Its IID variant (``flair_iid``) and central-DP runs are not here.

``:store``: the run above over the converted HDF5 file (``config.data.path``, the store's folder).

``:offline``: the same run on generated 32x32x3 images of 17 labels, 1 to 3 per image (1,000 users
of :func:`fedtree.datasets.prototypes.prototype_images` with ``max_labels=3``, 8,400 images dealt
IID, as FLAIR has about 8.4 per user, 20 % of each user held out and scored), no file needed: a
check that the setup runs, not the benchmark.

``quick`` (added to any variant; ``:offline,quick`` above) runs the first run, FedAvg, for 3 rounds
scored once at the end, no checkpoint: the setup checked end to end. Measured (``:offline,quick``,
seed 0): 2 min 46 s wall and 4 min 24 s of CPU time (on 2026-12-07 on the project's quiet 2-core
machine); it prints the accuracy (labels predicted right) and the macro and micro AP (about the
share of positive labels: 3 rounds learn little; ``python -m benchmarks.config_figures
--config=configs/benchmarks/pfl_flair.py:offline,quick`` checks them):

  run     model   accuracy  macro AP  micro AP
  fedavg  global  0.8811    0.1354    0.1228

The whole ``:offline`` runs 5,000 rounds; its cost is not measured here.
"""

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.standard_tasks import finish_variant, variant_flags
from fedtree.experiment.sweep import default_sweep

PFL_FLAIR = {"cohort_size": 200, "local_lr": 0.01, "batch_size": 16, "epochs": 2, "central_lr": 0.1,
             "adam_b1": 0.9, "adam_b2": 0.99, "adam_eps": 0.01, "iterations": 5000, "eval_every": 20,
             "labels": 17, "gn_groups": 32}
"""pfl-research's FLAIR baseline (``benchmarks/flair/configs/baseline.yaml``, ``train.py``)."""


FIGURES = (("accuracy", "accuracy", 1, 4, 0.01), ("macro AP", "macro_ap", 1, 4, 0.01),
           ("micro AP", "micro_ap", 1, 4, 0.01))
PLAIN_FIGURES = False   # the benchmark needs FLAIR's data; the offline check states the figures
FIGURE_VARIANTS = ("offline,quick",)


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  """``variant``: ``None`` (pfl-research's HDF5 file: what ``python -m fedtree.convert`` reads),
  ``"store"`` (that file converted, ``config.data.path``) or ``"offline"`` (generated images);
  ``quick`` added to any: 3 rounds of the first run (module docstring)."""
  flags = variant_flags(variant, ("store", "offline", "quick"), "pfl_flair")
  s = PFL_FLAIR
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = s["iterations"]
  c.eval_every = s["eval_every"]
  c.rounds_per_call = s["eval_every"]
  c.chunk_size = "auto"
  c.eval_chunk_size = "4"
  c.progress = True
  c.checkpoint_every = 500
  if "offline" in flags:
    c.data = ml_collections.ConfigDict(dict(
      name="prototype_images", num_clients=1000, num_examples=8400, num_classes=s["labels"], image_size=32,
      channels=3, max_labels=3, partition="iid", test_fraction=0.2, seed=0))
  elif "store" in flags:
    c.data = ml_collections.ConfigDict(dict(name="store", path="", dataset="flair"))
  else:
    c.data = ml_collections.ConfigDict(dict(name="flair", path="", labels="coarse", central="val"))
  c.topology = ml_collections.ConfigDict(dict(kind="flat"))
  c.model = ml_collections.ConfigDict(dict(name="resnet18", stem="imagenet", groups=s["gn_groups"],
                                           standardize="imagenet"))
  c.local = ml_collections.ConfigDict(dict(
    optimizer="sgd", learning_rate=s["local_lr"], batch_size=s["batch_size"], epochs=s["epochs"], steps=None))
  c.runs = ml_collections.ConfigDict(dict(fedavg=ml_collections.ConfigDict(dict(
    algorithm="fedavg", cohort_size=s["cohort_size"], weighting="uniform",
    server=dict(name="adam", learning_rate=s["central_lr"], b1=s["adam_b1"], b2=s["adam_b2"],
                eps=s["adam_eps"])))))
  c.run_order = ("fedavg",)
  c.metrics = ml_collections.ConfigDict(dict(central="offline" not in flags))
  c.sweep = default_sweep()
  return declare_runner_fields(finish_variant(c, "pfl_flair", flags))
