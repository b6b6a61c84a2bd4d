r"""Compressed uplinks: accuracy against the megabytes the clients send (issue 23).

  python -m fedtree.main --config=configs/compression.py --workdir=/tmp/fedtree_compression
  python -m fedtree.main --config=configs/compression.py:tree --workdir=/tmp/fedtree_compression_tree

The quickstart's task (48 clients in 4 groups, an MLP of 2,762 float32 parameters = 11,048
bytes), 16 clients a round. Runs: FedAvg with no compression (``none``), 8-bit and 2-bit
stochastic uniform quantization (``qsgd8``, ``qsgd2``), 1-bit quantization after a random
Hadamard rotation (``rotated1``), top-1 % (28 coordinates) without and with error feedback
(``top1``, ``top1_ef``), and EF-signSGD (``ef_sign``: the scaled sign with error feedback). The
``tree`` variant runs the same compressors under HierFAVG on the 3-level tree (root -> 4 group
servers -> clients, the root every 10 rounds, 4 clients per group a round), compressing only
between the clients and their group servers. Every run reports ``uplink_MB`` (the final table's
``up MB`` column, metrics.jsonl per round) and ``plot_accuracy_uplink.png`` draws accuracy
against it.

Measured with the commands above (100 rounds, seed 0; test accuracy of every model, the cumulative
uplink and downlink megabytes over every edge; the downlink is not compressed; the tables written by
``python -m benchmarks.config_figures --config=configs/compression.py --write`` and checked against a
fresh run, within the tolerances of ``FIGURES``, by the slow ``tests/test_config_figures.py``). One
server:

  run       model   accuracy  up MB   down MB
  none      global  0.7578    17.677  17.677
  qsgd8     global  0.7578    4.470   17.677
  qsgd2     global  0.7562    1.156   17.677
  rotated1  global  0.7552    0.682   17.677
  top1      global  0.6818    0.238   17.677
  top1_ef   global  0.7375    0.238   17.677
  ef_sign   global  0.7458    0.559   17.677

The tree (``python -m benchmarks.config_figures --config=configs/compression.py:tree``; ``level1``
the group servers' models, equal to the root's after its last aggregation in round 100):

  run       model   accuracy  up MB   down MB
  none      global  0.7255    18.119  18.119
  none      level1  0.7255    18.119  18.119
  qsgd8     global  0.7255    4.912   18.119
  qsgd8     level1  0.7255    4.912   18.119
  qsgd2     global  0.7276    1.598   18.119
  qsgd2     level1  0.7276    1.598   18.119
  rotated1  global  0.7151    1.124   18.119
  rotated1  level1  0.7151    1.124   18.119
  top1      global  0.6776    0.680   18.119
  top1      level1  0.6776    0.680   18.119
  top1_ef   global  0.7188    0.680   18.119
  top1_ef   level1  0.7188    0.680   18.119
  ef_sign   global  0.7245    1.001   18.119
  ef_sign   level1  0.7245    1.001   18.119

The clients send the same in both variants (16 a round), a client's uplink a round: 11,048 bytes
uncompressed, 2,794 (``qsgd8``), 722.5 (``qsgd2``), 426 (``rotated1``), 148.5 (``top1``,
``top1_ef``), 349.25 (``ef_sign``); the tree adds its edge -> root edge, uncompressed: 4 group
servers x 10 root rounds x 11,048 bytes = 0.442 MB each way (``level0_uplink_MB``;
``clients_uplink_MB`` is the clients' share).

Error feedback recovers most of what top-1 % loses (0.68 -> 0.74 flat); 2-bit quantization
costs nothing measurable here at 1/15 of the bytes. The flat command took 47 s wall, 67 s of CPU time
(measured on 2026-12-07 on the project's quiet 2-core machine).
"""

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep

# The docstring's figures (benchmarks/config_figures.py): (header, summary field, scale, decimals,
# tolerance in the printed unit). Bytes are exact; accuracy moves with another CPU's summation order.
FIGURES = (
  ("accuracy", "accuracy", 1, 4, 0.02),
  ("up MB", "uplink_MB", 1, 3, 0.001),
  ("down MB", "downlink_MB", 1, 3, 0.001),
)
FIGURE_VARIANTS = ("tree",)

COMPRESSORS = {
  "none": None,
  "qsgd8": {"uplink": {"name": "qsgd", "bits": 8}},
  "qsgd2": {"uplink": {"name": "qsgd", "bits": 2}},
  "rotated1": {"uplink": {"name": "rotated", "bits": 1}},
  "top1": {"uplink": {"name": "topk", "fraction": 0.01}},
  "top1_ef": {"uplink": {"name": "topk", "fraction": 0.01, "error_feedback": True}},
  "ef_sign": {"uplink": {"name": "scaled_sign", "error_feedback": True}},
}
"""Run label -> its ``compression`` section (at the clients' parents, level -1)."""


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  """``variant``: ``None`` (FedAvg, one server) or ``"tree"`` (HierFAVG on root -> groups ->
  clients, compressing only from the clients to the group servers)."""
  if variant not in (None, "tree"):
    raise ValueError(f"configs/compression.py:{variant}; choose no variant or 'tree'")
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
  c.topology = ml_collections.ConfigDict(dict(kind="groups"))
  c.model = ml_collections.ConfigDict(dict(name="mlp", hidden=(64,)))
  c.local = ml_collections.ConfigDict(dict(
    optimizer="sgd", learning_rate=0.05, batch_size=16, epochs=1, steps=None,
  ))
  c.runs = ml_collections.ConfigDict()
  for label, section in COMPRESSORS.items():
    run = (dict(algorithm="fedavg", cohort_size=16) if variant is None
           else dict(algorithm="hierfavg", cohort_size=4, periods=(10,)))
    if section is not None:
      run["compression"] = section
    c.runs[label] = ml_collections.ConfigDict(run)
  c.run_order = tuple(COMPRESSORS)
  # bits are sweepable (e.g. --config.sweep.params="runs.qsgd2.compression.uplink.bits=1,2,4");
  # k / fraction change shapes and are refused as a sweep axis
  c.mesh_shape = ml_collections.config_dict.placeholder(int)  # clients over devices: -1 = all
  c.sweep = default_sweep()
  return declare_runner_fields(c)
