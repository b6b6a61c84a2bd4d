"""The ``secure`` run section (fedtree.experiment.capabilities.secure): composed into the update paths at
any level of the tree, its ε per round, what cannot compose refused by name with the reason, and
the shipped configs/secure.py end to end (shrunk)."""

import dataclasses
import json

import jax
import ml_collections
import numpy as np
import pytest
from helpers import small_context as _ctx

from fedtree.experiment import capabilities as sections
from fedtree.experiment import registry
from fedtree.experiment.capabilities import secure
from fedtree.toolbox import distributed_dp as ddp
from fedtree.toolbox import secagg


def _run(**fields):
  base = dict(algorithm="hierfavg", weighting="uniform", cohort_size=2, periods=(1,))
  return ml_collections.ConfigDict({**base, **fields})


def _args(run, ctx=None):
  ctx = _ctx() if ctx is None else ctx
  return registry.capability_arguments("r", run, ctx)


def test_the_section_builds_a_secure_level_and_refuses_a_robust_one():
  paths = _args(_run(secure=dict(mechanism="none", bits=24, quant_bits=16, levels=[-1, 0])))["update_paths"]
  assert set(paths) == {-1, 0}
  leaf = paths[-1]
  assert leaf.client.name == "secure" and leaf.node.name == "secure"
  assert leaf.aggregator.accumulate is not None
  assert leaf.aggregator.name == "secure_sum[fixed_point, 24 bits]" and leaf.down.name == "secure"
  for extra, name in ((dict(aggregator=dict(name="median")), "median"),
                      (dict(attack=dict(name="alie", fraction=0.3)), "alie\\+mean")):
    with pytest.raises(ValueError, match=rf"secure aggregation \(the 'secure' section\) cannot compose "
                                         rf"with aggregator '{name}': it reads every update of a parent's "
                                         r"cohort .* reveals only their sum"):
      _args(_run(secure=dict(mechanism="none"), **extra))
  # a client attack and compression before the encoding compose
  both = _args(_run(secure=dict(mechanism="none"), attack=dict(name="sign_flip", fraction=0.3),
                    compression=dict(uplink=dict(name="qsgd", bits=4), downlink=dict(name="fp16"))))
  both = both["update_paths"][-1]
  assert both.client.name == "sign_flip+compression+secure" and both.down.name == "compression+secure"


def test_algorithms_outside_hierfavgs_family_are_refused_naming_those_that_take_it():
  takers = registry.algorithms_taking(sections.CAPABILITIES["secure"])
  assert {"fedavg", "hierfavg", "fedprox", "ditto"} <= set(takers)
  assert not {"fedbuff", "cfl", "ifca", "bhfl"} & set(takers)
  run = ml_collections.ConfigDict(dict(algorithm="fedbuff", secure=dict(mechanism="none")))
  with pytest.raises(ValueError, match=r"algorithm 'fedbuff' cannot run a 'secure' section \(secure "):
    registry.validate_run("r", run)


DP = dict(mechanism="ddg", clip_norm=0.5, noise_multiplier=1.0, bits=16)


@pytest.mark.parametrize("run,match", [
  (dict(secure=dict(mechanism="aes")), r"mechanism='aes'; choose one of \['none', 'ddg', 'skellam'\]"),
  (dict(secure=dict(mechanism="none", bitz=8)), r"unknown field 'bitz' \(did you mean 'bits'\?\)"),
  (dict(secure=dict(mechanism="none", bits=40)), r"bits=40 must be an integer in \[2, 32\]"),
  (dict(secure=dict(mechanism="none", quant_bits=30)), r"quant_bits=30 must be an integer in \[2, 24\]"),
  (dict(secure=dict(mechanism="none", clip_norm=1.0)),
   r"\['clip_norm'\] do not apply: mechanism='none' adds no noise"),
  (dict(secure=dict(DP, clip_range=8.0)), r"\['clip_range'\] do not apply: mechanism='ddg' scales, rotates"),
  (dict(secure=dict(mechanism="none", threshold=2.0)), r"threshold=2.0 must be in \(0, 1\]"),
  (dict(secure=dict(mechanism="none", neighbours=3)), "neighbours=3 must be an even integer >= 2"),
  (dict(secure=dict(mechanism="none", levels=[5])),
   r"levels=\[5\]: choose server levels of this 2-level tree"),
  (dict(secure=dict(DP, levels=0)), "levels=0 with mechanism='ddg': the clients add the distributed noise"),
  (dict(secure=DP, weighting="examples"), "differential privacy needs weighting='uniform'"),
  (dict(secure=DP, sampling="poisson", poisson_q=0.5), r"mechanism='ddg' with the run's sampling='poisson'"),
  (dict(secure=DP, privacy=dict(clip_norm=1.0, noise_multiplier=1.0)), "two DP mechanisms on one update"),
  (dict(secure=dict(mechanism="ddg", noise_multiplier=1.0)), "mechanism='ddg' needs clip_norm"),
  (dict(secure=dict(DP, target_epsilon=3.0)), "give exactly one of noise_multiplier and target_epsilon"),
  (dict(secure=dict(DP, noise_multiplier=0.0)), "noise_multiplier=0.0: a DP mechanism needs z > 0"),
  (dict(secure=dict(DP, bits=32)), "bits=32: each client's discrete Gaussian would have σ"),
  (dict(secure=dict(DP, delta=0.5)), "delta=0.5 is not below 1/n"),
])
def test_what_cannot_work_is_refused_by_name(run, match):
  with pytest.raises(ValueError, match=match):
    _args(_run(**run))


def test_epsilon_every_round_is_the_accountants_and_a_target_is_calibrated(capsys):
  ctx = _ctx()
  run = _run(secure=dict(mechanism="skellam", clip_norm=0.5, target_epsilon=8.0, bits=18, threshold=0.5))
  rctx = registry.run_context(ctx, "r", run)
  metrics = secure.round_metrics(run.secure, rctx)
  assert metrics(int(ctx.config.rounds))["epsilon"] <= 8.0 + 1e-9
  assert metrics(0)["epsilon"] == 0.0 and metrics(1)["epsilon"] < metrics(2)["epsilon"]
  p = secure.plan(dict(run.secure.to_dict()), rctx)
  assert "secure: noise_multiplier z=" in capsys.readouterr().err
  # the accountant's view: every parent's mechanism at its sampling rate, survivors at the threshold
  assert [m.survivors for m in p.mechanisms] == [1, 1] and p.rates == (2 / 3, 2 / 3)
  pairs = tuple(zip(p.mechanisms, p.rates, strict=True))
  assert metrics(3)["epsilon"] == ddp.epsilon(pairs, rounds=3, delta=1e-5)
  assert secure.round_metrics({"mechanism": "none"}, rctx) is None


def test_the_numerics_compose_with_poisson_cohorts_at_both_levels():
  """SecAgg at the clients' parents and at the root, Poisson cohorts (no dropouts modelled: nothing
  fails), two rounds to a finite state, the root's edge counted in bytes."""
  ctx = _ctx()
  run = _run(sampling="poisson", poisson_q=0.5, cohort_size=3,
             secure=dict(mechanism="none", levels=[-1, 0], bits=20, quant_bits=16))
  alg = registry.build_algorithm("r", run, ctx)
  state = alg.init(jax.random.key(0))
  for r in range(2):
    state, m = jax.jit(alg.round)(state, ctx.data, jax.random.key(r))
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(state.params))
  assert float(m["secagg_failed"]) == 0 and float(m["level0_secagg_failed"]) == 0
  dim = secure._model_dim(ctx)
  assert float(m["level0_uplink_bytes"]) == secagg.masked_bytes(20, dim) + float(secagg.exchange_bytes(2)[0])


def test_distributed_dp_on_a_three_level_tree_accounts_at_the_clients_parents():
  """root -> 2 regions -> 3 edges -> clients: the noise is added by the clients and summed at each
  edge; ε is the edge's with the largest sampling rate (parallel composition), and a round runs."""
  from fedtree.core.topology import Topology

  ctx = dataclasses.replace(_ctx(), topology=Topology.from_sizes([[2, 2], [2]]))
  run = _run(periods=(1, 1), secure=dict(DP, threshold=1.0), cohort_size=[1, 2, 2])
  rctx = registry.run_context(ctx, "r", run)
  p = secure.plan(dict(run.secure.to_dict()), rctx)
  assert p.levels == (2,) and len(p.mechanisms) == 3 and p.rates == (0.5, 1.0, 1.0)
  eps = secure.round_metrics(run.secure, rctx)(4)["epsilon"]
  assert eps == ddp.epsilon([(p.mechanisms[1], 1.0)], rounds=4, delta=1e-5)
  alg = registry.build_algorithm("r", run, ctx)
  state, m = jax.jit(alg.round)(alg.init(jax.random.key(0)), ctx.data, jax.random.key(1))
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(state.params))
  assert float(m["secagg_rounding_failed"]) == 0


def test_a_secure_run_reports_its_bytes_in_the_byte_columns():
  """The uplink is the masked vector and the protocol's keys and shares; the downlink the model and
  the neighbours' keys and shares; SecAgg+ sends less than SecAgg for the same cohort."""
  ctx = _ctx()
  dim = secure._model_dim(ctx)

  def one(**sec):
    section = dict(mechanism="none", bits=20, quant_bits=16, **sec)
    alg = registry.build_algorithm("r", _run(cohort_size=3, secure=section), ctx)
    _, m = jax.jit(alg.round)(alg.init(jax.random.key(0)), ctx.data, jax.random.key(1))
    return m

  m = one()
  up, down = secagg.exchange_bytes(3)
  assert float(m["uplink_bytes"]) == secagg.masked_bytes(20, dim) + float(up)
  assert float(m["downlink_bytes"]) == 4 * dim + float(down)
  assert float(one(neighbours=2)["uplink_bytes"]) == float(m["uplink_bytes"])   # k = 2 = n - 1: the same
  big = secagg.exchange_bytes(100)[0] - secagg.exchange_bytes(100, 8)[0]
  assert big > 0


def test_the_shipped_config_builds_every_run():
  """configs/secure.py: every run's section resolves on the config's tree (DP calibrated)."""
  from config_files import load_config

  from fedtree.experiment.context import make_context

  c = load_config("secure")
  assert len(c.runs) == 12
  ctx = make_context(c)
  for label, run in c.runs.items():
    registry.validate_run(label, run)
    if run.get("secure", None) is not None:
      p = secure.plan(dict(run.secure.to_dict()), registry.run_context(ctx, label, run), verbose=False)
      if p.mechanism != "none":
        assert p.mechanisms[0].dim == 4096 and p.rates == (0.2, 0.2)


@pytest.mark.slow
def test_shipped_config_runs_shrunk(tmp_path):
  """configs/secure.py, four of its runs for 2 rounds on 20 clients: secure aggregation at 32 bits
  trains as the plain run does (within the grid); the ε columns are the targets."""
  from config_files import load_config

  from fedtree.experiment.runner import train_and_evaluate

  c = load_config("secure")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress, c.plots = 2, 2, 2, False, False
  c.data.num_clients = 20
  c.topology.sizes = (10, 10)
  keep = ("plain", "secagg", "ddg16_eps10", "central_eps10")
  c.runs = ml_collections.ConfigDict({k: c.runs[k] for k in keep})
  for run in c.runs.values():
    run.cohort_size = 5
  train_and_evaluate(c, str(tmp_path))
  summary = json.load(open(tmp_path / "summary.json"))
  assert abs(summary["plain"]["global"]["accuracy"] - summary["secagg"]["global"]["accuracy"]) <= 0.02
  for label in ("ddg16_eps10", "central_eps10"):
    assert summary[label]["global"]["epsilon"] == pytest.approx(10.0, abs=0.01)
  assert summary["secagg"]["global"]["uplink_MB"] > summary["plain"]["global"]["uplink_MB"]
