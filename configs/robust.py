r"""Byzantine clients against robust aggregation: an attack x defence table of accuracy and attack
success rate, and a tree whose one edge server is captured by a local majority of attackers.

  python -m fedtree.main --config=configs/robust.py --workdir=/tmp/fedtree_robust
  python -m fedtree.main --config=configs/robust.py:tree --workdir=/tmp/fedtree_robust_tree

Data: scikit-learn's real 8x8 handwritten digits (:mod:`fedtree.datasets.digits`, shipped in
the package, no download) over 20 clients (Dirichlet(1.0) label skew), an MLP (32 hidden),
FedAvg with all clients every round, 40 rounds, seed 0.

The table (the default): every attack of ``ATTACKS`` (none; sign flip; ALIE; label flipping by
the permutation ``y -> 9 - y``; a backdoor: a 3x3 corner trigger on half of each attacker's
examples, target class 0) against every defence of :func:`defences` (the mean, coordinate
median, trimmed mean with β the attackers' fraction, multi-Krum with f the number of
attackers, RFA, centered clipping τ = 1 from the median, FLTrust with 2 root-data clients that
are never attackers) at 10 % and 30 % attackers (runs ``{attack}_{defence}_{percent}``; the
attackers are drawn by the seed, the 10 % among the 30 %; without attack the trimmed mean
uses β = 0.1 and multi-Krum f = 2). Measured cost: 4 min 57 s wall and 6 min 51 s of CPU time for
the 63 runs (about 5 s a run; on 2026-12-07 on the project's quiet 2-core machine, without the
plots).

Measured (the final table prints them; this table is written by ``python -m
benchmarks.config_figures --config=configs/robust.py --write`` and checked against a fresh run
by the slow ``tests/test_config_figures.py``). accuracy%: global accuracy on every client's
test data; ASR%: the backdoor's attack success rate (test examples of other classes, triggered,
classified as the target):

  run                   model   accuracy%  ASR%
  alie_cclip_10         global  92.1       -
  alie_cclip_30         global  92.1       -
  alie_fltrust_10       global  91.9       -
  alie_fltrust_30       global  91.2       -
  alie_mean_10          global  91.9       -
  alie_mean_30          global  92.1       -
  alie_median_10        global  91.9       -
  alie_median_30        global  89.1       -
  alie_mkrum_10         global  92.5       -
  alie_mkrum_30         global  89.1       -
  alie_rfa_10           global  92.3       -
  alie_rfa_30           global  89.8       -
  alie_trimmed_10       global  91.9       -
  alie_trimmed_30       global  90.0       -
  backdoor_cclip_10     global  91.6       67.8
  backdoor_cclip_30     global  91.4       100.0
  backdoor_fltrust_10   global  91.2       4.6
  backdoor_fltrust_30   global  90.7       75.2
  backdoor_mean_10      global  91.6       67.8
  backdoor_mean_30      global  92.1       100.0
  backdoor_median_10    global  89.4       3.0
  backdoor_median_30    global  88.5       53.4
  backdoor_mkrum_10     global  91.0       69.6
  backdoor_mkrum_30     global  88.0       100.0
  backdoor_rfa_10       global  91.2       52.2
  backdoor_rfa_30       global  91.0       100.0
  backdoor_trimmed_10   global  91.2       2.3
  backdoor_trimmed_30   global  89.1       64.8
  labelflip_cclip_10    global  90.7       -
  labelflip_cclip_30    global  80.5       -
  labelflip_fltrust_10  global  89.6       -
  labelflip_fltrust_30  global  85.3       -
  labelflip_mean_10     global  91.6       -
  labelflip_mean_30     global  78.1       -
  labelflip_median_10   global  90.5       -
  labelflip_median_30   global  85.5       -
  labelflip_mkrum_10    global  91.6       -
  labelflip_mkrum_30    global  90.5       -
  labelflip_rfa_10      global  91.2       -
  labelflip_rfa_30      global  86.7       -
  labelflip_trimmed_10  global  91.0       -
  labelflip_trimmed_30  global  84.4       -
  none_cclip            global  91.6       -
  none_fltrust          global  91.2       -
  none_mean             global  91.6       -
  none_median           global  89.6       -
  none_mkrum            global  90.7       -
  none_rfa              global  91.6       -
  none_trimmed          global  92.1       -
  signflip_cclip_10     global  91.0       -
  signflip_cclip_30     global  63.1       -
  signflip_fltrust_10   global  88.0       -
  signflip_fltrust_30   global  83.7       -
  signflip_mean_10      global  91.2       -
  signflip_mean_30      global  64.0       -
  signflip_median_10    global  89.1       -
  signflip_median_30    global  73.8       -
  signflip_mkrum_10     global  91.4       -
  signflip_mkrum_30     global  68.8       -
  signflip_rfa_10       global  91.2       -
  signflip_rfa_30       global  73.8       -
  signflip_trimmed_10   global  91.4       -
  signflip_trimmed_30   global  70.4       -

What it shows on this small task (20 clients, so one client is 5 % of the cohort): at 10 %
every defence holds accuracy within a point or two of the undefended run. At 30 %: sign flipping
costs the mean 28 points; the coordinate-wise defences (median, RFA) recover 10 of them,
FLTrust (whose reference update comes from 2 clients' data) 20; centered clipping (τ = 1,
from the median) and multi-Krum hardly help. Label flipping at
30 % is stopped best by multi-Krum (90.5 % against 78.1 %). The backdoor survives averaging
(ASR 68 % at 10 %, 100 % at 30 %); the coordinate-wise median, trimmed mean and FLTrust nearly
remove it at 10 % (2-5 %) but not at 30 % (53-75 %); multi-Krum and centered clipping do not
lower it, RFA a little at 10 % (52 %) and not at 30 %. ALIE stays within 3 points of the clean
run here: its updates lie inside the benign spread of a task this easy. The round metrics also
count the attackers among the updates multi-Krum and FLTrust kept (``kept_attackers``).

``tree``: 4 edge servers of 5 clients each; clients 0-3 (20 % of all, 4 of the 5 under edge 0)
flip their signs; the median at the edges, at the root, at both or nowhere (HierFAVG, the root
every 2 edge rounds). Measured (the final table's global accuracy, 40 rounds, seed 0):

  =============  ========
  median at      accuracy
  =============  ========
  nowhere        0.6833
  edges          0.5747
  root           0.8145
  both           0.7647
  =============  ========

The median at the captured edge returns the attackers' update (they are its majority), which
the root's mean then weighs like an honest edge's: worse than no defence. At the root, the
three honest edges outvote edge 0; with the median at both levels the result (0.765) lies
below the root's alone.
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
FRACTIONS = (0.1, 0.3)


def defences(fraction: float) -> dict:
  """The defences at ``fraction`` attackers (of 20 clients): trimmed mean with β the fraction,
  multi-Krum with f the number of attackers."""
  return {
    "mean": None,
    "median": {"name": "median"},
    "trimmed": {"name": "trimmed_mean", "beta": fraction},
    "mkrum": {"name": "multi_krum", "f": round(fraction * 20)},
    "rfa": {"name": "geometric_median", "iterations": 8},
    "cclip": {"name": "centered_clip", "tau": 1.0, "iterations": 3, "center": "median"},
    "fltrust": {"name": "fltrust", "root_fraction": 0.1},
  }


def _asr(models, model) -> float:
  return models[model].get("attack_success_rate", float("nan"))


FIGURES = (
  ("accuracy%", "accuracy", 100, 1, 1.0),
  ("ASR%", _asr, 100, 1, 3.0),
)


def _common(c: ml_collections.ConfigDict) -> None:
  c.seed = 0
  c.rounds = 40
  c.eval_every = 40
  c.rounds_per_call = 20
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
  """``variant``: ``None`` (the attack x defence table) or ``"tree"``."""
  c = ml_collections.ConfigDict()
  _common(c)
  c.runs = ml_collections.ConfigDict()
  if variant is None:
    c.topology = ml_collections.ConfigDict(dict(kind="flat"))
    for a, attack in ATTACKS.items():
      for fraction in FRACTIONS if attack is not None else (0.0,):
        for d, defence in defences(max(fraction, 0.1)).items():
          run = {"algorithm": "fedavg"}
          if attack is not None:
            run["attack"] = _section(attack, fraction=fraction)
          if defence is not None:
            run["aggregator"] = _section(defence)
          label = f"{a}_{d}" if attack is None else f"{a}_{d}_{round(100 * fraction)}"
          c.runs[label] = ml_collections.ConfigDict(run)
  elif variant == "tree":
    c.topology = ml_collections.ConfigDict(dict(kind="sizes", sizes=(5, 5, 5, 5)))
    attack = ml_collections.ConfigDict({"name": "sign_flip", "ids": (0, 1, 2, 3)})
    for where, levels in (("nowhere", None), ("edges", -1), ("root", 0), ("both", [0, -1])):
      run = {"algorithm": "hierfavg", "periods": (2,), "attack": attack}
      if levels is not None:
        run["aggregator"] = ml_collections.ConfigDict({"name": "median", "levels": levels})
      c.runs[f"median_at_{where}"] = ml_collections.ConfigDict(run)
  else:
    raise ValueError(f"configs/robust.py:{variant}; choose no variant (the table) or 'tree'")
  c.mesh_shape = ml_collections.config_dict.placeholder(int)  # clients over devices: -1 = all
  c.sweep = default_sweep()
  return declare_runner_fields(c)
