r"""A tree that moves: HierFAVG with static vs mobile clients at several speeds vs edge failures vs
each association policy.

  python -m fedtree.main --config=configs/mobility.py --workdir=/tmp/fedtree_mobility
  python -m fedtree.main --config=configs/mobility.py:bhfl --workdir=/tmp/fedtree_mobility_bhfl

The quickstart's task: 48 clients in 4 groups of 24, 12, 8 and 4, each group with its own
distribution. The default is HierFAVG's client-edge-cloud setting (Liu et al. 2020): root -> 4 edge
servers -> clients, one edge per data group, every edge sampling 4 of its clients of the round and
aggregating every round, the cloud every 5 edge rounds. The ``bhfl`` variant is paper 001's tree,
root -> 2 regions -> 5 edges -> 48 clients (``configs/bhfl.py``'s), regions every 2 rounds, the root
every 4. Edges sit on a grid of the unit square; a client starts near its tree edge (spread 0.1).

Runs (``mobility`` sections, :mod:`fedtree.experiment.capabilities.mobility`):

* ``static``: the tree, fixed (the run without a section, bit for bit);
* ``markov_slow`` / ``markov_fast``: a client leaves its edge after a geometric dwell of mean 20 / 3
  rounds, for another edge drawn uniformly;
* ``waypoint_slow`` / ``waypoint_fast``: random waypoint mobility at 0.02 / 0.1 units a round, each
  client on its nearest edge every round;
* ``fail_wait`` / ``fail_reassociate``: the tree, every edge failing with probability 0.05 a round
  and down 5 rounds; its clients wait, or move to the live edge nearest theirs;
* ``nearest`` / ``balanced`` / ``label_mix``: clients placed uniformly, then associated once by
  latency, by latency under a load cap, or so that every edge's label mix is near the global one.

Every edge trains all of its clients of the round (the load an association puts on an edge is what
it takes in). The final table has the cloud's model (``global``) and the edges' (``level1``: each
client scored with its edge of the last round, 4 edge rounds after the cloud's last), the megabytes
up and down and ``peak edge MB``, what the busiest edge of every round took in from its clients.
``plot_membership_<run>.png`` draws each run's membership over rounds (``docs/mobility.md``).
53 s wall and 76 s of CPU time (the ``bhfl`` variant 36 s wall and 51 s of CPU), measured on
2026-12-07 on the project's quiet 2-core machine.

Measured (CPU, seed 0, 99 rounds; the table written by ``python -m benchmarks.config_figures
--config=configs/mobility.py --write`` and checked against a fresh run, within the tolerances of
``FIGURES``, by the slow ``tests/test_config_figures.py``):

  run               model   accuracy  up MB   peak edge MB
  static            global  0.7385    53.340  26.250
  static            level1  0.7635    53.340  26.250
  markov_slow       global  0.7521    53.340  18.428
  markov_slow       level1  0.7500    53.340  18.428
  markov_fast       global  0.7531    53.340  17.655
  markov_fast       level1  0.7531    53.340  17.655
  waypoint_slow     global  0.7547    53.340  18.848
  waypoint_slow     level1  0.7500    53.340  18.848
  waypoint_fast     global  0.7505    53.340  17.279
  waypoint_fast     level1  0.7526    53.340  17.279
  fail_wait         global  0.7120    42.955  22.936
  fail_wait         level1  0.7516    42.955  22.936
  fail_reassociate  global  0.7422    53.340  32.260
  fail_reassociate  level1  0.7552    53.340  32.260
  nearest           global  0.7526    53.340  15.313
  nearest           level1  0.7505    53.340  15.313
  balanced          global  0.7521    53.340  13.125
  balanced          level1  0.7484    53.340  13.125
  label_mix         global  0.7521    53.340  13.125
  label_mix         level1  0.7453    53.340  13.125

On the fixed tree every edge holds one data group, and its own model beats the cloud's (the edges
specialize between the cloud's rounds); clients that move carry their data across edges, the edges'
models and the cloud's converge, and the cloud's gains. A failed edge whose clients wait costs
accuracy on the groups it serves; re-associating its clients keeps them training at the price of
the busiest edge's load. ``balanced`` and ``label_mix`` cap every edge at 12 clients: the busiest
edge takes in half of what the tree's largest (24 clients) does.

The ``bhfl`` variant (``python -m benchmarks.config_figures --config=configs/mobility.py:bhfl``):

  run               model   accuracy  up MB   peak edge MB
  static            global  0.7495    55.737  13.125
  static            level1  0.7490    55.737  13.125
  static            level2  0.7594    55.737  13.125
  markov_fast       global  0.7526    55.737  14.661
  markov_fast       level1  0.7516    55.737  14.661
  markov_fast       level2  0.7578    55.737  14.661
  waypoint_fast     global  0.7547    55.737  18.815
  waypoint_fast     level1  0.7516    55.737  18.815
  waypoint_fast     level2  0.7490    55.737  18.815
  fail_reassociate  global  0.7458    55.737  18.649
  fail_reassociate  level1  0.7417    55.737  18.649
  fail_reassociate  level2  0.7521    55.737  18.649
  label_mix         global  0.7516    55.737  10.938
  label_mix         level1  0.7531    55.737  10.938
  label_mix         level2  0.7490    55.737  10.938

On the fixed four-level tree the edges' models (``level2``) beat the regions' and the root's; fast
clients erase that edge (``waypoint_fast``: the three levels within 0.006), and ``label_mix`` caps
the busiest of the 5 edges at 10 clients.
"""

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep

CD = ml_collections.ConfigDict

MOBILITY = {
  "static": dict(model="static"),
  "markov_slow": dict(model="markov", dwell=20.0),
  "markov_fast": dict(model="markov", dwell=3.0),
  "waypoint_slow": dict(model="waypoint", speed=0.02),
  "waypoint_fast": dict(model="waypoint", speed=0.1),
  "fail_wait": dict(failures=dict(rate=0.05, repair=5, rule="wait")),
  "fail_reassociate": dict(failures=dict(rate=0.05, repair=5, rule="reassociate")),
  "nearest": dict(association="nearest", placement="uniform"),
  "balanced": dict(association="balanced", placement="uniform"),
  "label_mix": dict(association="label_mix", placement="uniform"),
}
"""Every run's ``mobility`` section."""

# The docstring's figures (benchmarks/config_figures.py): (header, summary field, scale, decimals,
# tolerance in the printed unit). Bytes are exact; accuracy moves with another CPU's summation order.
FIGURES = (
  ("accuracy", "accuracy", 1, 4, 0.02),
  ("up MB", "uplink_MB", 1, 3, 0.001),
  ("peak edge MB", "edge_peak_uplink_MB", 1, 3, 0.001),
)
FIGURE_VARIANTS = ("bhfl",)

BHFL_RUNS = ("static", "markov_fast", "waypoint_fast", "fail_reassociate", "label_mix")
"""The runs of the ``bhfl`` variant (paper 001's 4-level tree)."""


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  """``variant``: ``None`` (HierFAVG's three-level tree) or ``"bhfl"`` (paper 001's four levels)."""
  if variant not in (None, "bhfl"):
    raise ValueError(f"configs/mobility.py:{variant}; choose no variant or 'bhfl'")
  c = CD()
  c.seed = 0
  c.rounds = 99
  c.eval_every = 33
  c.rounds_per_call = 33
  c.chunk_size = None
  c.progress = True
  c.checkpoint_every = 0

  c.data = CD(dict(
    name="grouped_synthetic", group_sizes=(24, 12, 8, 4), dim=32, num_classes=10,
    group_spread=1.5, client_spread=0.25, feature_shift=1.0, mean_examples=40.0,
    min_examples=8, max_examples=160, test_examples=40, seed=0,
  ))
  if variant == "bhfl":
    c.topology = CD(dict(kind="sizes", sizes=((12, 12), (12, 8, 4))))
    periods, labels = (4, 2), BHFL_RUNS
  else:
    c.topology = CD(dict(kind="groups"))
    periods, labels = (5,), tuple(MOBILITY)
  c.model = CD(dict(name="mlp", hidden=(64,)))
  c.local = CD(dict(optimizer="sgd", learning_rate=0.05, batch_size=16, epochs=1, steps=None))
  c.runs = CD()
  for label in labels:
    c.runs[label] = CD(dict(algorithm="hierfavg", periods=periods, mobility=MOBILITY[label]))
  c.run_order = labels
  c.mesh_shape = ml_collections.config_dict.placeholder(int)
  c.sweep = default_sweep()
  return declare_runner_fields(c)
