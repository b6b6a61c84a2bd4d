r"""B-HFL (paper 001) on a 4-level tree, with its ablations, against HierFAVG.

  python -m fedtree.main --config=configs/bhfl.py --workdir=/tmp/fedtree_bhfl

Data: the grouped synthetic task of the quickstart (48 clients in 4 groups of 24, 12, 8 and 4
clients with distinct distributions). Tree: root -> 2 regions -> 5 edge servers -> 48
clients (``sizes [[12, 12], [12, 8, 4]]``: region 0 splits group 0 over two edges, region 1
holds groups 1-3, one edge each). Every edge samples 4 clients a round; regions aggregate every
2 rounds, the root every 4.

Runs (one ablation each; all share data, tree, seed and initial model):

* ``hierfavg``: the baseline (full replacement downwards, FedAvg upwards);
* ``bhfl``: partial merges downwards (η↓ = 0.5 at every level), FedAvg upwards, proxy data
  at the root (200 examples, 5 SGD steps after each root aggregation);
* ``bhfl_eta_down_02``: η↓ = 0.2 (more personal lower tiers);
* ``bhfl_adaptive``: FedAdam (η↑ = 0.03) at the root and regions instead of FedAvg;
* ``bhfl_residual``: + residual links (top-2 clients of every edge straight to the root,
  ``sgd(0.2)`` per link) and direct root->edge links (η = 0.3);
* ``bhfl_async``: buffered asynchronous aggregation (edges aggregate the first 3 of their 4
  sampled clients, regions the first child to arrive), exponential client latencies of mean
  0.6 rounds, uniform server latencies in [0, 0.8), staleness weight ``(1+s)^-0.5``.

Each B-HFL run prints a table by level: every node's model on the test data of the clients
of its subtree, and on the central test set (the union of the clients' test data). The
paper's expectation: the first grows towards the clients, the second towards the root.
Also written to ``<workdir>/bhfl_levels_<run>.{json,md}``. 68 s wall, 98 s of CPU time (measured
on 2026-12-07 on the project's quiet 2-core machine); shrink with ``--config.rounds=8``.
"""

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep

CD = ml_collections.ConfigDict


def get_config() -> ml_collections.ConfigDict:
  c = CD()
  c.seed = 0
  c.rounds = 80
  c.eval_every = 20
  c.rounds_per_call = 20
  c.chunk_size = None
  c.progress = True

  c.data = CD(dict(
    name="grouped_synthetic", group_sizes=(24, 12, 8, 4), dim=32, num_classes=10,
    group_spread=1.5, client_spread=0.25, feature_shift=1.0, mean_examples=40.0,
    min_examples=8, max_examples=160, test_examples=40, seed=0,
  ))
  c.topology = CD(dict(kind="sizes", sizes=((12, 12), (12, 8, 4))))
  c.model = CD(dict(name="mlp", hidden=(64,)))
  c.local = CD(dict(optimizer="sgd", learning_rate=0.05, batch_size=16, epochs=1, steps=None))

  base = dict(algorithm="bhfl", cohort_size=4, periods=(4, 2, 1), eta_down=0.5,
              proxy_examples=200, proxy_levels=(0,), proxy_steps=5)
  c.runs = CD()
  c.runs.hierfavg = CD(dict(algorithm="hierfavg", cohort_size=4, periods=(4, 2)))
  c.runs.bhfl = CD(dict(base))
  c.runs["bhfl_eta_down_02"] = CD(dict(base, eta_down=0.2))
  c.runs.bhfl_adaptive = CD(dict(base, ups=[
    CD(dict(name="fedadam", learning_rate=0.03)), CD(dict(name="fedadam", learning_rate=0.03)),
    CD(dict(name="fedavg")),
  ]))
  c.runs.bhfl_residual = CD(dict(
    base, residual_k=2, residual=CD(dict(name="sgd", learning_rate=0.2)), residual_down=True,
    residual_down_eta=0.3,
  ))
  c.runs.bhfl_async = CD(dict(
    base, buffer_sizes=(None, 1, 3), staleness_exponent=0.5,
    latency=[CD(dict(kind="uniform", low=0.0, high=0.8)),      # regions -> root
             CD(dict(kind="uniform", low=0.0, high=0.8)),      # edges -> regions
             CD(dict(kind="exponential", mean=0.6))],          # clients -> edges
  ))
  c.mesh_shape = ml_collections.config_dict.placeholder(int)  # clients over devices: -1 = all
  c.sweep = default_sweep()
  return declare_runner_fields(c)   # every runner field settable from the command line
