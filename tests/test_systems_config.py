"""Systems from files and configs: FedScale's traces, the ``systems`` run section, the time axis
of the plots, and configs/systems.py end to end (shrunk)."""

import json
import pickle
import re

import ml_collections
import numpy as np
import pytest
from config_files import load_config
from helpers import small_context

from fedtree.datasets.device_traces import availability_trace, device_capacity_profile
from fedtree.experiment import registry
from fedtree.experiment.capabilities import CAPABILITIES
from fedtree.experiment.plots import plot_time_to_accuracy, time_curve, time_to_target
from fedtree.experiment.runner import train_and_evaluate

CAPACITY = {7: {"computation": 50.0, "communication": 800.0}, 3: {"computation": 20.0, "communication": 80.0}}
BEHAVIOUR = {7: {"active": [10, 50], "inactive": [20, 60], "finish_time": 100, "duration": 5},
             3: {"active": [0], "inactive": [30], "finish_time": 40, "duration": 5}}


def test_fedscale_capacity_trace(tmp_path):
  path = tmp_path / "client_device_capacity"
  path.write_bytes(pickle.dumps(CAPACITY))
  prof = device_capacity_profile(str(path), 2, batch_size=10)
  # sorted ids (3, 7): 1000 / (3 · 10 · ms) steps per second; kbit/s -> bytes/s
  np.testing.assert_allclose(np.asarray(prof.speed), [1000 / 600, 1000 / 1500], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(prof.up), [1e4, 1e5], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(prof.down), np.asarray(prof.up))
  prof = device_capacity_profile(CAPACITY, 1, batch_size=10, ids=[7])
  np.testing.assert_allclose(np.asarray(prof.speed), [1000 / 1500], rtol=1e-6)
  with pytest.raises(ValueError, match=r"device-capacity trace has 2 clients for 3 clients"):
    device_capacity_profile(CAPACITY, 3, batch_size=10)
  with pytest.raises(ValueError, match=r"computation=-1.0"):
    device_capacity_profile({0: {"computation": -1.0, "communication": 5.0}}, 1, batch_size=1)


def test_fedscale_availability_trace():
  avail = availability_trace(BEHAVIOUR, 2)
  # client 3 (row 0): on in [0, 30) of every 40 s; client 7 (row 1): [10, 20) and [50, 60) of 100 s
  for t, want in ((5, [True, False]), (15, [True, True]), (35, [False, False]), (55, [True, True]),
                  (95, [True, False]), (115, [False, True]), (165, [True, False])):
    assert np.asarray(avail.at(float(t))).tolist() == want, t
  with pytest.raises(ValueError, match=r"availability trace has 2 clients for 5 clients"):
    availability_trace(BEHAVIOUR, 5)
  with pytest.raises(ValueError, match=r"2 active and 1 inactive"):
    availability_trace({0: {"active": [0, 5], "inactive": [1], "finish_time": 9}}, 1)


@pytest.fixture(scope="module")
def ctx():
  return small_context()


def kwargs(ctx, **run):
  return registry.factory_kwargs("r", ml_collections.ConfigDict(run), ctx)


def test_systems_section(ctx):
  kw = kwargs(ctx, algorithm="fedavg", systems={
    "speed": {"dist": "lognormal", "median": 2.0, "sigma": 0.5}, "up": 1e5,
    "availability": {"kind": "diurnal", "online_hours": 6.0},
    "policy": {"kind": "deadline", "seconds": 30.0, "partial": True}})
  s = kw["systems"]
  assert s.policy.kind == "deadline" and s.policy.seconds == 30.0 and s.policy.partial
  np.testing.assert_allclose(s.availability.fraction(), 0.25, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(s.profile.up), 1e5)
  again = kwargs(ctx, algorithm="fedavg",
                 systems={"speed": {"dist": "lognormal", "median": 2.0, "sigma": 0.5}, "up": 1e5})["systems"]
  np.testing.assert_array_equal(np.asarray(again.profile.speed), np.asarray(s.profile.speed))  # seeded
  assert kwargs(ctx, algorithm="fedbuff", buffer_size=2, systems={})["systems"].policy.kind == "wait_for_all"
  kw = kwargs(ctx, algorithm="fedbuff", buffer_size=2, tree="config", periods=[2],
              systems={"policy": {"kind": "deadline", "seconds": 5.0, "dropout": 0.1}})  # on the tree
  assert kw["topology"] is ctx.topology and kw["periods"] == (2,) and kw["systems"].policy.dropout == 0.1
  assert kwargs(ctx, algorithm="hierfavg", sampling="data_size")["sampling"] == "data_size"
  # FedProx's systems heterogeneity: its objective under FedAvg with a partial-work deadline
  kw = kwargs(ctx, algorithm="fedavg", objective={"name": "fedprox", "mu": 0.01},
              systems={"policy": {"kind": "deadline", "seconds": 5.0, "partial": True}})
  assert kw["client_update"] is not None and kw["systems"].policy.partial
  with pytest.raises(ValueError, match=r"systems.policy.kind='late'; choose one of"):
    kwargs(ctx, algorithm="fedavg", systems={"policy": {"kind": "late"}})
  with pytest.raises(ValueError, match=r"deadline seconds=-3.0 must be"):
    kwargs(ctx, algorithm="fedavg", systems={"policy": {"kind": "deadline", "seconds": -3.0}})
  with pytest.raises(ValueError, match=r"systems: unknown field 'sped'"):
    kwargs(ctx, algorithm="fedavg", systems={"sped": 1.0})
  with pytest.raises(ValueError, match=r"speed.dist='gauss'"):
    kwargs(ctx, algorithm="fedavg", systems={"speed": {"dist": "gauss"}})
  takers = registry.algorithms_taking(CAPABILITIES["systems"])   # every method over the host, and FedBuff
  assert {"fedavg", "fedbuff", "fedopt", "hierfavg", "fedprox", "ditto", "scaffold"} <= set(takers)
  assert "ifca" not in takers and "bhfl" not in takers
  refusal = (r"algorithm 'ifca' cannot run a 'systems' section .*take it: "
             + re.escape(str(takers)) + "$")
  with pytest.raises(ValueError, match=refusal):   # algorithms without a clock, by name
    kwargs(ctx, algorithm="ifca", num_clusters=2, systems={})
  with pytest.raises(ValueError, match=refusal):
    registry.validate_run("r", ml_collections.ConfigDict(dict(algorithm="ifca", systems={})))
  # server links from the section: one number per level below the root, or a list over its nodes
  s = kwargs(ctx, algorithm="hierfavg", systems={"server_up": [[1e3, 2e3]], "server_down": 5e3})["systems"]
  up, down = s.server_links([1, 2])[1]
  np.testing.assert_allclose(np.asarray(up), [1e3, 2e3])
  np.testing.assert_allclose(np.asarray(down), [5e3, 5e3])


def test_python_names_the_systems_argument_it_does_not_take(ctx):
  """From Python an algorithm without a simulated clock rejects ``systems=`` as Python does an
  unknown keyword, naming it (the config path's refusal lists the algorithms that take it)."""
  from fedtree import algorithms
  from fedtree.toolbox.systems import Systems, make_profile

  systems = Systems(profile=make_profile(np.ones(ctx.data.num_clients), np.ones(ctx.data.num_clients)))
  assert {"fedavg", "fedbuff", "hierfavg", "fedprox", "ditto"} <= set(algorithms.SYSTEMS_ALGORITHMS)
  for name in ("ifca", "bhfl"):
    with pytest.raises(TypeError, match="unexpected keyword argument 'systems'"):
      getattr(algorithms, name)(model=ctx.model, data=ctx.data, systems=systems)


def test_time_axis():
  recs = [{"run": "a", "round": r, "sim_seconds": 900.0 * r, "global/accuracy": 0.1 * r} for r in (3, 1, 2)]
  recs.append({"run": "b", "round": 1, "global/accuracy": 0.5})   # no clock: not on the time axis
  hours, acc = time_curve(recs, "a", "global/accuracy")
  np.testing.assert_allclose(hours, [0.25, 0.5, 0.75])
  np.testing.assert_allclose(acc, [0.1, 0.2, 0.3])
  assert time_to_target(recs, "a", "global/accuracy", 0.2) == 0.5
  assert time_to_target(recs, "b", "global/accuracy", 0.1) is None


@pytest.mark.slow
def test_systems_config_end_to_end(tmp_path):
  c = load_config("systems")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress = 4, 2, 2, False
  c.data.group_sizes = (6, 4)
  c.data.test_examples = 8
  c.model.hidden = (8,)
  for r in c.runs.values():
    if "cohort_size" in r:
      r.cohort_size = 3
  c.runs.fedbuff.buffer_size, c.runs.fedbuff.concurrency = 3, 5
  results = train_and_evaluate(c, str(tmp_path))
  assert set(results) == set(c.run_order)
  recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  for run in c.run_order:
    clock = [r["sim_seconds"] for r in recs if r["run"] == run]
    assert len(clock) == 2 and 0 < clock[0] < clock[1], (run, clock)
  assert (tmp_path / "plot_time_accuracy.png").stat().st_size > 0
  assert plot_time_to_accuracy(recs, str(tmp_path / "t.png"), target=0.5).endswith("t.png")
