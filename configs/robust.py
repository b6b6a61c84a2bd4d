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
attackers are drawn by the seed, the 10 % among the 30 %). Expected cost: about 10 s a run, 10
min in all on a 2-core CPU.

Measured (the final table prints them; this table is written by ``python -m
benchmarks.config_figures --config=configs/robust.py --write`` and checked against a fresh run
by the slow ``tests/test_config_figures.py``). accuracy%: global accuracy on every client's
test data; ASR%: the backdoor's attack success rate (test examples of other classes, triggered,
classified as the target):

  run  model  accuracy%  ASR%

TREE

``tree``: 4 edge servers of 5 clients each; clients 0-3 (20 % of all, 4 of the 5 under edge 0)
flip their signs; the median at the edges, at the root, at both or nowhere (HierFAVG, the root
every 2 edge rounds).
"""

import ml_collections

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
  return c
