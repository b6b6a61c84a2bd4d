r"""Personalization baselines on the grouped synthetic task: FedAvg, FedProx, Ditto, pFedMe,
Per-FedAvg (first-order and Hessian-free), each with its personal models evaluated.

  python -m fedtree.main --config=configs/personalization.py --workdir=/tmp/pers

48 clients in 4 groups of very different sizes (24, 12, 8, 4), most with few examples; one
server over all clients (``tree="flat"``, as in the original papers; set ``tree="config"``
on a run to put the same local objective under the root -> groups -> clients tree). Models
reported per run: ``global`` (and ``personal`` for Ditto/pFedMe, ``adapted`` for Per-FedAvg:
one step of rate α on the client's own data). 38 s wall, 51 s of CPU time (measured on 2026-12-07
on the project's quiet 2-core machine).

Measured (seed 0, 100 rounds; overall test accuracy of every model; the table written by ``python -m
benchmarks.config_figures --config=configs/personalization.py --write`` and checked against a fresh
run, within the tolerances of ``FIGURES``, by the slow ``tests/test_config_figures.py``):

  run           model     accuracy
  ditto         global    0.5576
  ditto         personal  0.5833
  fedavg        global    0.5618
  fedprox       global    0.5625
  perfedavg_fo  global    0.5437
  perfedavg_fo  adapted   0.5590
  perfedavg_hf  global    0.4229
  perfedavg_hf  adapted   0.5632
  pfedme        global    0.5521
  pfedme        personal  0.5563

Clients differ strongly (``client_spread=1``) but have few examples, so personal models gain little
over the global one at this scale.

Hyperparameters follow the papers' defaults where they transfer (pFedMe: K = 5 inner steps,
λ = 15, β = 1; Per-FedAvg: α ≈ local rate, β smaller; FedProx: μ = 0.01; Ditto: λ = 1),
with the local rate of the task.
"""

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep

# The docstring's figures (benchmarks/config_figures.py): (header, summary field, scale, decimals,
# tolerance in the printed unit); accuracy moves with another CPU's summation order.
FIGURES = (("accuracy", "accuracy", 1, 4, 0.02),)


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = 100
  c.eval_every = 50
  c.rounds_per_call = 25
  c.chunk_size = None
  c.progress = True

  c.data = ml_collections.ConfigDict(dict(
    name="grouped_synthetic", group_sizes=(24, 12, 8, 4), dim=32, num_classes=10,
    group_spread=1.5, client_spread=1.0, feature_shift=1.0, mean_examples=30.0,
    min_examples=6, max_examples=120, test_examples=30, seed=0,
  ))
  c.topology = ml_collections.ConfigDict(dict(kind="groups"))
  c.model = ml_collections.ConfigDict(dict(name="mlp", hidden=(64,)))
  c.local = ml_collections.ConfigDict(dict(
    optimizer="sgd", learning_rate=0.05, batch_size=8, epochs=1, steps=None,
  ))

  def run(**kw):
    return ml_collections.ConfigDict(dict(cohort_size=16, **kw))

  c.runs = ml_collections.ConfigDict()
  c.runs.fedavg = run(algorithm="fedavg")
  c.runs.fedprox = run(algorithm="fedprox", mu=0.01)
  c.runs.ditto = run(algorithm="ditto", lam=1.0)
  c.runs.pfedme = run(algorithm="pfedme", lam=15.0, inner_steps=5, personal_lr=0.05,
                      learning_rate=0.05, beta=1.0)
  c.runs.perfedavg_fo = run(algorithm="perfedavg", alpha=0.05, beta=0.02, variant="fo")
  c.runs.perfedavg_hf = run(algorithm="perfedavg", alpha=0.05, beta=0.02, variant="hf")
  c.mesh_shape = ml_collections.config_dict.placeholder(int)  # clients over devices: -1 = all
  c.sweep = default_sweep()
  return declare_runner_fields(c)   # every runner field settable from the command line
