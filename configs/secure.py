r"""Secure aggregation on a two-level tree: what SecAgg's field costs in accuracy and bytes, SecAgg
against SecAgg+ under dropouts, and distributed DP against central DP at equal ε (issue 52).

  python -m fedtree.main --config=configs/secure.py --workdir=/tmp/secure

1,797 real 8×8 digits (the ``digits`` extra; no download) over 300 clients (IID shares of about 5
examples) under a root -> 2 edge servers -> 150 clients each, HierFAVG with the edges and the root
aggregating every round (``periods=(1,)``, FedAvg servers), 30 clients per edge per round
(fixed-size, q = 0.2), 30 rounds, 5 local epochs of SGD (lr 0.1, batch 10) of an MLP (32 hidden:
2,410 parameters, 4,096 once padded for the rotation), uniform weights. Every secure run sums its
clients' updates at each edge modulo ``2^b`` (``secure.levels=-1``: an edge learns only its
clients' sum; the root aggregates the edges' models in the clear).

* ``plain``: no secure aggregation; ``secagg``: Flower's defaults (each coordinate clipped to
  [-8, 8], 2^22 levels, a 32-bit field, stochastic rounding): the same model, and 12,140 bytes a
  client sends a round instead of 9,640 (the vector at 32 bits and the keys and shares of a cohort of
  30: ``up MB``);
* ``bits<b>``: a field of ``b`` bits at a fixed grid of 2^-16 (``quant_bits = b``, clip range
  ``(2^(b-1) - 1) 2^-16``): each bit off halves the range a sum holds. At 18 and 20 bits no sum
  wraps and the model is the plain one; below, the sums of 30 clients wrap (``secagg_overflow`` in
  ``metrics.jsonl``, the fraction of coordinates: 1-2 % at 16 bits, about 23 % at 14) and the
  clipping bites: at 14 bits nothing is learnt;
* ``secagg_drop`` and ``secagg_plus_drop``: 20 % of the sampled clients drop each round after
  masking (``systems.policy.dropout``; 12 of the 60 a round on average), threshold 0.5. SecAgg+
  shares keys with 8 neighbours instead of 29: fewer bytes each way, but a round fails at an edge
  whenever a client keeps fewer than 5 of its 9 shareholders, where SecAgg, needing 15 survivors of
  30, practically never fails. ``secagg_failed`` (``metrics.jsonl``; every round with
  ``--config.eval_every=1 --config.rounds_per_call=1``): 0 for SecAgg, 1/6 of the edge-rounds for
  SecAgg+ (the rate ``secagg.harary_failures`` predicts), hence its higher loss;
* ``central_eps10``: central DP (``privacy``: clip C = 0.5, Gaussian noise added by every edge,
  ε = 10 at δ = 1e-5, z = 1.3733); ``ddg16_eps10``, ``ddg12_eps10``, ``skellam16_eps10``: the same ε
  by distributed DP, each client adding a thirtieth of the noise in the integers (z = 1.3737 at 16
  bits, 1.3992 at 12: the coarser grid raises the sensitivity). At this ε they land within the
  seed-to-seed spread of central DP (a few points: with ``--config.seed=1`` central, ddg16 and
  skellam16 reach 76.7 %, 82.7 % and 86.0 %).

Cost: 12 runs, 4 min of CPU time (12 min wall on the 2-core CPU machine, shared, at a load average
of 12).

Figures (seed 0; ``up MB``/``down MB``: every edge's bytes over the run; checked within the FIGURES
tolerances by ``python -m benchmarks.config_figures --config=configs/secure.py``):

  run               model   accuracy%  loss   epsilon  up MB   down MB
  bits14            global  3.7        2.303  -        12.671  25.238
  bits14            level1  3.7        2.303  -        12.671  25.238
  bits16            global  80.0       1.039  -        13.754  25.238
  bits16            level1  80.0       1.039  -        13.754  25.238
  bits18            global  88.7       0.634  -        14.840  25.238
  bits18            level1  88.7       0.634  -        14.840  25.238
  bits20            global  88.7       0.634  -        15.923  25.238
  bits20            level1  88.7       0.634  -        15.923  25.238
  central_eps10     global  80.3       0.826  10.000   17.930  17.930
  central_eps10     level1  80.3       0.826  10.000   17.930  17.930
  ddg12_eps10       global  79.0       0.853  10.000   16.138  25.238
  ddg12_eps10       level1  79.0       0.853  10.000   16.138  25.238
  ddg16_eps10       global  82.0       0.777  10.000   19.824  25.238
  ddg16_eps10       level1  82.0       0.777  10.000   19.824  25.238
  plain             global  88.7       0.634  -        17.930  17.930
  plain             level1  88.7       0.634  -        17.930  17.930
  secagg            global  88.7       0.634  -        22.430  25.238
  secagg            level1  88.7       0.634  -        22.430  25.238
  secagg_drop       global  90.7       0.637  -        17.999  20.238
  secagg_drop       level1  90.7       0.637  -        17.999  20.238
  secagg_plus_drop  global  89.0       0.752  -        15.468  16.019
  secagg_plus_drop  level1  89.0       0.752  -        15.468  16.019
  skellam16_eps10   global  79.7       0.837  10.000   19.824  25.238
  skellam16_eps10   level1  79.7       0.837  10.000   19.824  25.238
"""

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep

GRID_BITS = 16
"""The fixed grid of the ``bits<b>`` runs: 2^-16."""

FIGURES = (
  ("accuracy%", "accuracy", 100, 1, 1.0),
  ("loss", "loss", 1, 3, 0.05),
  ("epsilon", "epsilon", 1, 3, 0.01),
  ("up MB", "uplink_MB", 1, 3, 0.001),
  ("down MB", "downlink_MB", 1, 3, 0.001),
)


def field_at_grid(bits: int) -> dict:
  """A ``secure`` section with a ``bits``-bit field at the grid 2^-GRID_BITS."""
  quant = min(bits, 24)
  return dict(bits=bits, quant_bits=quant, clip_range=((1 << (quant - 1)) - 1) * 2.0 ** -GRID_BITS)


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = 30
  c.eval_every = 10
  c.rounds_per_call = 10
  c.chunk_size = None
  c.progress = True
  c.data = ml_collections.ConfigDict(dict(name="sklearn_digits", num_clients=300, partition="iid",
                                          test_fraction=0.2, seed=0))
  c.model = ml_collections.ConfigDict(dict(name="mlp", hidden=(32,)))
  c.topology = ml_collections.ConfigDict(dict(kind="sizes", sizes=(150, 150)))
  c.local = ml_collections.ConfigDict(dict(optimizer="sgd", learning_rate=0.1, batch_size=10, epochs=5,
                                           steps=None))

  def run(**sections):
    return ml_collections.ConfigDict(dict(algorithm="hierfavg", weighting="uniform", cohort_size=30,
                                          periods=(1,), **sections))

  dp = dict(clip_norm=0.5, target_epsilon=10.0, delta=1e-5)
  dropouts = dict(policy=dict(kind="wait_for_all", dropout=0.2))
  c.runs = ml_collections.ConfigDict()
  c.runs.plain = run()
  c.runs.secagg = run(secure=dict(mechanism="none"))   # Flower's defaults: clip range 8, 2^22 levels, 32 bits
  for b in (14, 16, 18, 20):
    c.runs[f"bits{b}"] = run(secure=field_at_grid(b))
  c.runs.secagg_drop = run(secure=dict(mechanism="none", threshold=0.5), systems=dropouts)
  c.runs.secagg_plus_drop = run(secure=dict(mechanism="none", threshold=0.5, neighbours=8), systems=dropouts)
  c.runs.central_eps10 = run(privacy=dict(dp, noise_level=-1))
  c.runs.ddg16_eps10 = run(secure=dict(dp, mechanism="ddg", bits=16, threshold=1.0))
  c.runs.ddg12_eps10 = run(secure=dict(dp, mechanism="ddg", bits=12, threshold=1.0))
  c.runs.skellam16_eps10 = run(secure=dict(dp, mechanism="skellam", bits=16, threshold=1.0))
  c.mesh_shape = ml_collections.config_dict.placeholder(int)  # clients over devices: -1 = all
  c.sweep = default_sweep()
  return declare_runner_fields(c)
