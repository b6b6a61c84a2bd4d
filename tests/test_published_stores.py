"""Issue 49 item 7: the published setups run through the streamed store. Each config's own data block is
converted (``fedtree.convert.convert``) from mock data of the real schema the test writes (LEAF's FEMNIST
JSON, TFF's StackOverflow h5, TFDS CIFAR-10 under ``tfds.testing.mock_data``, FLAIR in pfl-research's
HDF5 layout), then its ``:store,quick`` variant runs streamed over it, end to end."""

import json

import numpy as np
import pytest
from config_files import load_config
from test_population_store import write_flair, write_tff

from fedtree.convert import convert
from fedtree.experiment.runner import train_and_evaluate


def _write_femnist(root, writers: int = 6):
  """LEAF's ``femnist`` layout: ``train/*.json`` and ``test/*.json`` of ``{users, num_samples,
  user_data: {user: {x: [784 floats], y: [label]}}}``."""
  rng = np.random.default_rng(0)
  for split, n in (("train", 4), ("test", 2)):
    (root / split).mkdir(parents=True)
    users = [f"f{i:04d}_{i}" for i in range(writers)]
    data = {u: {"x": rng.random((n, 784)).round(3).tolist(), "y": rng.integers(0, 62, n).tolist()}
            for u in users}
    blob = {"users": users, "num_samples": [n] * writers, "user_data": data}
    (root / split / "all_data_0.json").write_text(json.dumps(blob))


def _run_streamed(config, store, workdir, cohort: int, capsys, model=None, key="accuracy"):
  """The config's ``:store,quick`` variant over ``store``, streamed, 1 round (``model``: fields that
  shrink its model); returns the global model's summary, whose ``key`` is finite."""
  c = load_config(f"benchmarks/{config}", "store,quick")
  c.data.path = store
  c.population = dict(mode="streamed", eval_clients=2, eval_chunk=2)
  c.runs[c.only].cohort_size = cohort
  c.rounds, c.eval_every, c.plots, c.progress = 1, 1, False, False
  c.model.update(model or {})
  result = train_and_evaluate(c, str(workdir))
  out = "".join(capsys.readouterr())
  assert "population: streamed from" in out and "calls; waited" in out
  assert np.isfinite(result[c.only]["global"][key])
  return result[c.only]["global"]


@pytest.mark.slow   # LEAF's CNN (6.6 M parameters) compiled on CPU
def test_leaf_femnist_runs_streamed_from_its_converted_json(tmp_path, capsys):
  _write_femnist(tmp_path / "leaf")
  source = load_config("benchmarks/leaf_femnist").data
  source.root, source.cache_dir = str(tmp_path / "leaf"), str(tmp_path / "cache")
  store = convert(source.to_dict(), str(tmp_path / "store"), progress=False)
  assert store.num_clients == 6 and store.source["name"] == "leaf"
  _run_streamed("leaf_femnist", str(tmp_path / "store"), tmp_path / "run", 3, capsys)


@pytest.mark.slow   # AFO's StackOverflow LSTM (vocabulary 10,004) compiled on CPU
def test_afo_stackoverflow_runs_streamed_from_its_converted_h5(tmp_path, capsys):
  clients = {f"c{i}": 2 + i % 3 for i in range(6)}
  write_tff(tmp_path / "tr.h5", clients, "stackoverflow")
  write_tff(tmp_path / "te.h5", {c: 1 for c in clients}, "stackoverflow")
  source = load_config("benchmarks/afo_stackoverflow").data
  source.train_path, source.test_path = str(tmp_path / "tr.h5"), str(tmp_path / "te.h5")
  source.cache_dir = str(tmp_path / "cache")
  store = convert(source.to_dict(), str(tmp_path / "store"), progress=False)
  assert store.num_clients == 6 and store.source["name"] == "tff_h5"
  _run_streamed("afo_stackoverflow", str(tmp_path / "store"), tmp_path / "run", 3, capsys)


@pytest.mark.slow   # TFDS under mock_data, then a CNN (shrunk) compiled on CPU: 17 s
def test_pfl_cifar10_runs_streamed_from_its_converted_tfds_data(tmp_path, capsys):
  tfds = pytest.importorskip("tensorflow_datasets")
  source = load_config("benchmarks/pfl_cifar10").data
  source.num_clients = 6
  with tfds.testing.mock_data(num_examples=60, policy=tfds.testing.MockPolicy.USE_CODE):
    store = convert(source.to_dict(), str(tmp_path / "store"), progress=False)
  assert store.num_clients == 6 and store.source["name"] == "tfds" and store.counts("central").sum() == 60
  s = _run_streamed("pfl_cifar10", str(tmp_path / "store"), tmp_path / "run", 3, capsys,
                    model=dict(features=(4, 8), dense=8), key="central_accuracy")
  assert 0.0 <= s["central_accuracy"] <= 1.0


@pytest.mark.slow   # pfl-research's ResNet-18 (width shrunk) compiled on CPU: 43 s
def test_pfl_flair_runs_streamed_from_its_converted_hdf5(tmp_path, capsys):
  write_flair(tmp_path / "flair.hdf5")
  source = load_config("benchmarks/pfl_flair").data
  source.path = str(tmp_path / "flair.hdf5")
  store = convert(source.to_dict(), str(tmp_path / "store"), progress=False)
  assert store.label_kind == "multi_hot" and store.source["name"] == "flair"
  assert store.counts("central").sum() == 1   # the val user (pfl-research scores on val)
  s = _run_streamed("pfl_flair", str(tmp_path / "store"), tmp_path / "run", 2, capsys,
                    model=dict(width=8, groups=4), key="central_loss")
  for m in ("central_macro_ap", "central_micro_ap", "central_macro_precision", "central_micro_recall"):
    assert 0.0 <= s[m] <= 1.0, m
