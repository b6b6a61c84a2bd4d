r"""Byzantine clients against robust aggregation: an attack x defence table of accuracy and attack
success rate, and a tree whose one edge server is captured by a local majority of attackers.

  python -m fedtree.main --config=configs/robust.py --workdir=/tmp/fedtree_robust
  python -m fedtree.main --config=configs/robust.py:tree --workdir=/tmp/fedtree_robust_tree

Data: scikit-learn's real 8x8 handwritten digits (:mod:`fedtree.datasets.digits`, shipped in
the package, no download) over 20 clients (Dirichlet(1.0) label skew), an MLP, FedAvg with all
clients every round.

``table`` (the default): every attack of ``ATTACKS`` (none, sign flip, ALIE, label flipping,
a backdoor with a 3x3 corner trigger and target class 0) against every defence of
``DEFENCES`` (the mean, coordinate median, trimmed mean β = 0.2, multi-Krum f = 6, RFA,
centered clipping τ = 1 from the median), at 30 % attackers (``:table10`` at 10 %). The
backdoor runs report ``attack_success_rate`` beside accuracy.

``tree``: 4 edge servers of 5 clients each; clients 0-3 (20 % of all, 4 of the 5 under edge 0)
flip their signs; the median at the edges, at the root, or nowhere (HierFAVG, the root every
2 edge rounds).

Measured (40 rounds, seed 0, CPU; global accuracy on every client's test data, ASR the backdoor's
attack success rate), a subset of ``table`` (30 % attackers) run as
``--config.runs`` restricted to these labels; the other cells and ``:table10`` are not measured:

  =========  =====  ======  ===========  =====  =======================
  attack     mean   median  multi-Krum   RFA    centered clip
  =========  =====  ======  ===========  =====  =======================
  none       0.916
  sign flip  0.640  0.738   0.688        0.738  0.631
  ALIE       0.921  0.891   0.891
  backdoor   0.921  0.885
  =========  =====  ======  ===========  =====  =======================

Backdoor ASR: 1.000 under the mean, 0.534 under the median. ``tree`` (sign flippers holding 4
of edge 0's 5 clients): the median nowhere 0.683, at the edges 0.575 (edge 0's median is then
the attackers' update), at the root 0.815.
"""

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep

ATTACKS = {
  "none": None,
  "signflip": {"name": "sign_flip", "scale": 1.0},
  "alie": {"name": "alie"},
  "labelflip": {"name": "label_flip", "permutation": (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)},
  "backdoor": {"name": "backdoor", "target": 0, "poison_fraction": 0.5,
               "trigger": {"corner": 3, "value": 1.0}},
}
DEFENCES = {
  "mean": None,
  "median": {"name": "median"},
  "trimmed": {"name": "trimmed_mean", "beta": 0.2},
  "mkrum": {"name": "multi_krum", "f": 6},
  "rfa": {"name": "geometric_median", "iterations": 8},
  "cclip": {"name": "centered_clip", "tau": 1.0, "iterations": 3, "center": "median"},
}


def _common(c: ml_collections.ConfigDict) -> None:
  c.seed = 0
  c.rounds = 40
  c.eval_every = 10
  c.rounds_per_call = 10
  c.chunk_size = None
  c.progress = True
  c.data = ml_collections.ConfigDict(dict(name="sklearn_digits", num_clients=20, partition="dirichlet",
                                          alpha=1.0, seed=0))
  c.model = ml_collections.ConfigDict(dict(name="mlp", hidden=(32,)))
  c.local = ml_collections.ConfigDict(dict(optimizer="sgd", learning_rate=0.1, batch_size=16, epochs=1,
                                           steps=None))


def _section(spec, **extra):
  return None if spec is None else ml_collections.ConfigDict({**spec, **extra})


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  """``variant``: ``None`` / ``"table"`` (30 % attackers), ``"table10"`` (10 %), ``"tree"``."""
  c = ml_collections.ConfigDict()
  _common(c)
  c.runs = ml_collections.ConfigDict()
  if variant in (None, "table", "table10"):
    fraction = 0.1 if variant == "table10" else 0.3
    c.topology = ml_collections.ConfigDict(dict(kind="flat"))
    for a, attack in ATTACKS.items():
      for d, defence in DEFENCES.items():
        run = {"algorithm": "fedavg"}
        if attack is not None:
          run["attack"] = _section(attack, fraction=fraction)
        if defence is not None:
          run["aggregator"] = _section(defence)
        c.runs[f"{a}_{d}"] = ml_collections.ConfigDict(run)
  elif variant == "tree":
    c.topology = ml_collections.ConfigDict(dict(kind="sizes", sizes=(5, 5, 5, 5)))
    attack = ml_collections.ConfigDict({"name": "sign_flip", "ids": (0, 1, 2, 3)})
    for where, levels in (("nowhere", None), ("edges", -1), ("root", 0)):
      run = {"algorithm": "hierfavg", "periods": (2,), "attack": attack}
      if levels is not None:
        run["aggregator"] = ml_collections.ConfigDict({"name": "median", "levels": levels})
      c.runs[f"median_at_{where}"] = ml_collections.ConfigDict(run)
  else:
    raise ValueError(f"configs/robust.py:{variant}; choose no variant, 'table', 'table10' or 'tree'")
  c.mesh_shape = ml_collections.config_dict.placeholder(int)  # clients over devices: -1 = all
  c.sweep = default_sweep()
  return declare_runner_fields(c)
