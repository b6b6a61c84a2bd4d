r"""Secure aggregation on a two-level tree: what SecAgg's field costs in accuracy and bytes, and
distributed DP against central DP at equal ε (issue 52).

  python -m fedtree.main --config=configs/secure.py --workdir=/tmp/secure

1,797 real 8×8 digits (the ``digits`` extra; no download) over 100 clients (IID shares) under a
root -> 4 edge servers -> 25 clients each, HierFAVG with the edges and the root aggregating every
round (``periods=(1,)``, FedAvg servers), 10 clients per edge per round (fixed-size, q = 0.4), 30
rounds, one local epoch of SGD (lr 0.1, batch 10) of an MLP (32 hidden: 2,410 parameters, 4,096
once padded for the rotation), uniform weights. Every secure run sums its clients' updates at each
edge modulo ``2^b`` (``secure.levels=-1``: the edge learns only the sum; the root aggregates the
edges' models in the clear).

* ``plain``: no secure aggregation; ``secagg``: Flower's defaults (each coordinate clipped to
  [-8, 8], 2^22 levels, a 32-bit field, stochastic rounding), the same accuracy;
* ``bits<b>``: a field of ``b`` bits at a fixed grid of 2^-16 (``quant_bits = b``, clip range
  ``(2^(b-1) - 1) 2^-16``): the range a sum holds halves with every bit taken off; below 16 bits
  the clipping and the wrapped sums (``overflow``: the fraction of coordinates wrapped) cost
  accuracy;
* ``secagg_plus``: SecAgg+ (every client shares keys with 4 neighbours, not 9) under 20 % random
  dropouts (``systems.policy.dropout``) and a threshold of 0.7: fewer bytes, and the rounds where
  an edge keeps fewer than 7 of its 10 (or a client fewer than 4 of its 5 shareholders) fail there
  (``failed``: the fraction of edges);
* ``central_eps10``: central DP (``privacy``: clip C = 0.5, Gaussian noise added by every edge,
  ε = 10 at δ = 1e-5); ``ddg<b>_eps10`` and ``skellam16_eps10``: the same ε by distributed DP (each
  client adds a tenth of the noise in the integers, SecAgg hides all but the noised sum), ``z``
  calibrated on the host for each. At 16 bits distributed DP costs almost nothing over central DP;
  at 12 bits the rounding onto a coarser grid raises the sensitivity and the noise with it.

Cost: 12 runs, 3 min 40 s wall (9 min CPU) on the 2-core CPU machine.

Figures (seed 0; ``up kB`` is one client's uplink a round; checked within the FIGURES tolerances by
``python -m benchmarks.config_figures --config=configs/secure.py``):

  run              model   accuracy%  loss    epsilon  overflow  failed  up kB
  bits12           global  9.8        2.303   -        0.0000    0.0000  4.3
  bits14           global  79.0       0.817   -        0.0000    0.0000  5.0
  bits16           global  84.3       0.640   -        0.0000    0.0000  5.7
  bits20           global  84.3       0.640   -        0.0000    0.0000  7.0
  central_eps10    global  38.3       2.098   10.000   -         -       9.6
  ddg12_eps10      global  20.6       2.243   10.000   0.0000    0.0000  8.0
  ddg16_eps10      global  37.8       2.122   10.000   0.0000    0.0000  9.2
  plain            global  84.3       0.640   -        -         -       9.6
  secagg           global  84.3       0.640   -        0.0000    0.0000  10.2
  secagg_plus      global  83.5       0.652   -        0.0000    0.0000  10.2
  skellam16_eps10  global  37.4       2.124   10.000   0.0000    0.0000  9.2
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
  for b in (12, 14, 16):
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
