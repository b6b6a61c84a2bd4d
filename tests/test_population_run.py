"""A config over a population in a store (config.data.name="store"): resident when it fits, streamed when
asked or when it does not, the same table either way; a streamed run checkpoints its paged state and
resumes; what cannot stream is refused in one line naming the run."""

import json

import ml_collections
import numpy as np
import pytest
from config_files import load_config

from fedtree.experiment.data import load
from fedtree.experiment.population import resident_bytes
from fedtree.experiment.runner import train_and_evaluate
from fedtree.population import open_store, write_federated_data

CD = ml_collections.ConfigDict


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
  c = _tiny()
  data, groups, _ = load(c.data)
  path = str(tmp_path_factory.mktemp("pop") / "store")
  write_federated_data(path, data, source={"name": "grouped_synthetic"}, extras={"groups": groups})
  return path


def _tiny() -> ml_collections.ConfigDict:
  c = load_config("quickstart")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress, c.plots = 4, 2, 2, False, False
  c.checkpoint_every, c.run_order = 0, ()
  c.data.group_sizes, c.data.dim, c.data.max_examples, c.data.test_examples = (5, 4, 3), 8, 24, 6
  c.model.hidden = (8,)
  c.runs = CD(
    {
      "fedavg": CD(dict(algorithm="fedavg", cohort_size=3)),
      "hierfavg": CD(dict(algorithm="hierfavg", cohort_size=2, periods=(2,))),
    }
  )
  return c


def _config(store_path, mode, **population):
  c = _tiny()
  c.data = CD(dict(name="store", path=store_path, dataset="grouped_synthetic"))
  c.population = CD(dict(mode=mode, eval_clients=0, eval_chunk=5, **population))
  return c


def _accuracies(result):
  return {run: {m: s["accuracy"] for m, s in models.items()} for run, models in result.items()}


def test_streamed_and_resident_runs_print_the_same_table(store_path, tmp_path, capsys):
  resident = train_and_evaluate(_config(store_path, "resident"), str(tmp_path / "r"))
  streamed = train_and_evaluate(_config(store_path, "streamed"), str(tmp_path / "s"))
  cap = capsys.readouterr()
  out = cap.out + cap.err
  assert "population: resident" in out and "population: streamed from" in out
  a, b = _accuracies(resident), _accuracies(streamed)
  assert a.keys() == b.keys()
  for run in a:
    for m in a[run]:
      np.testing.assert_allclose(b[run][m], a[run][m], atol=1e-6)
  rows = [json.loads(line) for line in open(tmp_path / "s" / "metrics.jsonl")]
  assert any("global/accuracy" in r for r in rows)


def test_auto_holds_a_population_that_fits_and_streams_one_that_does_not(store_path, tmp_path, capsys):
  train_and_evaluate(_config(store_path, "auto"), str(tmp_path / "a"))
  assert "population: resident" in "".join(capsys.readouterr())
  c = _config(store_path, "auto", prefetch=0)
  c.population.eval_chunk = 1
  rows = resident_bytes(open_store(store_path))
  c.memory_limit_bytes = 2 * rows - 1   # the rows need more, twice on CPU; one client at a time, one window
  c.chunk_size, c.rounds_per_call = "1", 1
  c.runs = CD({"fedavg": c.runs.fedavg})
  train_and_evaluate(c, str(tmp_path / "b"))
  assert "population: streamed from" in "".join(capsys.readouterr())


def test_a_streamed_run_resumes_its_paged_state(store_path, tmp_path):
  c = _config(store_path, "streamed")
  c.runs = CD({"scaffold": CD(dict(algorithm="scaffold", cohort_size=3))})
  c.checkpoint_every = 2
  straight = train_and_evaluate(c, str(tmp_path / "straight"))
  half = ml_collections.ConfigDict(c.to_dict())
  half.rounds = 2
  train_and_evaluate(half, str(tmp_path / "resumed"))
  resumed = train_and_evaluate(c, str(tmp_path / "resumed"))
  assert _accuracies(resumed) == _accuracies(straight)


def test_what_cannot_stream_is_refused_naming_the_run(store_path, tmp_path):
  c = _config(store_path, "streamed")
  c.runs = CD({"fomo": CD(dict(algorithm="fedfomo", cohort_size=3, num_candidates=2))})
  with pytest.raises(ValueError, match=r"fomo: fedfomo reads clients beyond its cohort"):
    train_and_evaluate(c, str(tmp_path / "f"))
  c = _config(store_path, "streamed")
  c.data.dataset = "synthetic"
  with pytest.raises(
    ValueError,
    match=r"config.data.dataset='synthetic', but the store .* was converted "
    r"from 'grouped_synthetic'",
  ):
    train_and_evaluate(c, str(tmp_path / "g"))
  c = _config(store_path, "sometimes")
  with pytest.raises(ValueError, match=r"config.population.mode='sometimes'; choose one of"):
    train_and_evaluate(c, str(tmp_path / "h"))


def test_a_streamed_run_scores_personal_models_as_the_resident_run(store_path, tmp_path, capsys):
  """The per-client model sets (issue 49): a streamed run pages each evaluation chunk's rows in and scores
  every client's own model (ClientModels), as the resident run does over every client: the host's
  personal leaves (FedPer), an objective's personal models (Ditto), a wrapper's mixture (APFL) and a
  width method's own sub-model (HeteroFL), beside their global models."""
  runs = CD({
    "fedper": CD(dict(algorithm="fedper", cohort_size=3)),
    "ditto": CD(dict(algorithm="ditto", cohort_size=3, lam=0.1)),
    "apfl": CD(dict(algorithm="apfl", cohort_size=3)),
    "heterofl": CD(dict(algorithm="heterofl", cohort_size=3, rates=(1.0, 0.5))),
  })
  results = []
  for mode in ("resident", "streamed"):
    c = _config(store_path, mode)
    c.runs = runs
    results.append(train_and_evaluate(c, str(tmp_path / mode)))
  assert "not scored in a streamed run" not in "".join(capsys.readouterr())
  a, b = (_accuracies(r) for r in results)
  assert a.keys() == b.keys() and {"personal", "global"} <= set(a["ditto"]) and "own_width" in a["heterofl"]
  for run in a:
    assert a[run].keys() == b[run].keys(), run
    for m in a[run]:
      np.testing.assert_allclose(b[run][m], a[run][m], atol=1e-6, err_msg=f"{run}/{m}")
      assert results[1][run][m]["eval_clients"].startswith("every client (12)")


def test_a_streamed_run_refuses_models_it_cannot_score(store_path, tmp_path):
  """Models made from every client's rows (Per-FedAvg's fine-tuning), or only per-client sets it cannot
  make for a chunk (FedMD's), are refused naming the run, before anything is written."""
  for run, fields, match in [
    ("pfa", dict(algorithm="perfedavg", alpha=0.05, beta=0.05),
     r"pfa: perfedavg's models are made from every client's rows"),
    ("md", dict(algorithm="fedmd", public_examples=8),
     r"md: a streamed run scores none of fedmd's models \('personal'"),
  ]:
    c = _config(store_path, "streamed")
    c.runs = CD({run: CD(dict(cohort_size=3, **fields))})
    with pytest.raises(ValueError, match=match):
      train_and_evaluate(c, str(tmp_path / run))
    assert not (tmp_path / run).exists()


def test_a_streamed_run_over_processes_needs_every_device(store_path, monkeypatch):
  """Over several processes each reads its own clients onto its own devices (tests/test_multihost.py
  runs it): a mesh that leaves some devices out is refused before anything is read or written."""
  import jax

  from fedtree.experiment import population
  from fedtree.population.stream import skeleton

  c = _config(store_path, "streamed")
  c.mesh_shape = 1
  store = open_store(store_path)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "device_count", lambda: 2)
  with pytest.raises(ValueError, match=r"streams .* over 2 processes, each reading its own clients "
                                       r"onto its own devices: config.mesh_shape=1 leaves some"):
    population.plan(c, skeleton(store), store)
  c.mesh_shape = -1
  _, pop = population.plan(c, skeleton(store), store)
  assert pop.streamed and "each of 2 processes reads its own clients of each call's window" in pop.note


def test_a_moving_membership_streams_as_it_runs_resident(store_path, tmp_path):
  """Issue 54 over a streamed population: the round reads the cohort its membership draws (every edge's
  members of the round), so the streamed run prints the resident run's table."""
  results = []
  for mode in ("resident", "streamed"):
    c = _config(store_path, mode)
    c.runs = CD({"mobile": CD(dict(algorithm="hierfavg", cohort_size=2, periods=(2,), mobility=dict(
      model="markov", dwell=2.0, failures=dict(rate=0.3, repair=1))))})
    results.append(_accuracies(train_and_evaluate(c, str(tmp_path / mode))))
  a, b = results
  assert a.keys() == b.keys() == {"mobile"}
  for m in a["mobile"]:
    np.testing.assert_allclose(b["mobile"][m], a["mobile"][m], atol=1e-6)


def test_a_streamed_window_over_a_mesh_is_counted_per_device(store_path):
  """The memory estimate of a streamed run over a mesh (stream_bytes): a device holds its share of a
  window (a process's segment spread over its devices), the process every device's share and its host
  copies, so only the device's bytes shrink with the devices."""
  import types

  import jax

  from fedtree.experiment.context import make_context
  from fedtree.experiment.population import stream_bytes
  from fedtree.experiment.run import resolve

  c = _config(store_path, "streamed")
  ctx = make_context(c)
  run = resolve("fedavg", c.runs.fedavg, ctx)
  key = jax.random.key(0)
  one = stream_bytes(run.algorithm, ctx.data, ctx.population, 2, key)
  four = stream_bytes(run.algorithm, ctx.data, ctx.population, 2, key,
                      mesh=types.SimpleNamespace(devices=np.empty(4, object)))
  assert one[0] > 0 and four[0] == -(-one[0] // 4)
  assert four[1] == one[1] - one[0] + 4 * four[0]
