"""Issue 49, the population on disk: the store's blocks are bitwise the resident layout's, every
source converts to it (tiny data of each source's real schema, written here), and bad input is
refused in one line before anything is read or left behind."""

import doctest
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("datasets")
h5py = pytest.importorskip("h5py")

from fedtree.core import ragged  # noqa: E402
from fedtree.datasets import tff_h5  # noqa: E402
from fedtree.datasets.synthetic import synthetic_alpha_beta  # noqa: E402
from fedtree.population import convert as streamed  # noqa: E402
from fedtree.population import store as store_lib  # noqa: E402
from fedtree.population.store import Feature, StoreWriter, open_store, write_federated_data  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELDS = ("x_train", "y_train", "n_train", "x_test", "y_test", "n_test")


def assert_same_data(a, b):
  """Bitwise: the same arrays, dtypes and shapes, and the same classes."""
  for f in FIELDS:
    x, y = np.asarray(getattr(a, f)), np.asarray(getattr(b, f))
    assert x.dtype == y.dtype and x.shape == y.shape, (f, x.dtype, y.dtype, x.shape, y.shape)
    np.testing.assert_array_equal(x, y, err_msg=f)
  assert a.num_classes == b.num_classes


def data_and_store(tmp_path, **kw):
  data = synthetic_alpha_beta(num_clients=12, dim=5, seed=1, **kw)
  return data, write_federated_data(str(tmp_path / "s"), data, source={"name": "synthetic", "seed": 1},
                                    groups=np.arange(12) % 3)


def test_docstring_examples_run():
  from fedtree.population import evaluation, paged, reader

  for module in (store_lib, reader, paged, evaluation):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0, module.__name__


def test_blocks_are_bitwise_the_resident_layout(tmp_path):
  data, store = data_and_store(tmp_path)
  assert_same_data(store.to_federated_data(), data)
  rng = np.random.default_rng(0)
  for _ in range(3):
    ids = rng.choice(12, 5, replace=False)
    sub = data.take(ids)
    for split in ("train", "test"):
      block = store.read(ids, split)
      for got, want in zip(block, (getattr(sub, f"{k}_{split}") for k in ("x", "y", "n")), strict=True):
        assert got.dtype == np.asarray(want).dtype
        np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(store.extra("groups"), np.arange(12) % 3)
  assert store.num_clients == 12 and store.width() == data.max_train and store.fingerprint == store.verify()


def test_ragged_blocks_and_a_ragged_source(tmp_path):
  data, store = data_and_store(tmp_path)
  ids = np.array([7, 2, 7, 11])                           # repeats allowed
  flat = store.read_ragged(ids, "train")
  want = ragged.from_padded(data.take(ids), "train")
  for k in ("x", "y", "offsets"):
    np.testing.assert_array_equal(getattr(flat, k), getattr(want, k))
  padded = store.read_ragged(ids, rows=int(flat.x.shape[0]) + 3)
  assert padded.x.shape[0] == flat.x.shape[0] + 3 and not padded.x[-3:].any()
  # a ragged FederatedData writes the same store rows
  again = write_federated_data(str(tmp_path / "r"), ragged.to_ragged_train(data), source={"name": "x"})
  np.testing.assert_array_equal(again.read(ids).x, store.read(ids).x)
  assert again.verify() == again.fingerprint


def test_read_refusals(tmp_path):
  data, store = data_and_store(tmp_path)
  with pytest.raises(ValueError, match=r"client id 12 is outside store .* clients 0..11"):
    store.read([0, 12])
  with pytest.raises(ValueError, match="client id -1 is outside"):
    store.read_ragged([-1])
  with pytest.raises(ValueError, match="1-D integer array"):
    store.read([[0]])
  widest = int(np.argmax(data.n_train))
  n = int(data.n_train[widest])
  with pytest.raises(ValueError, match=f"client {widest} has {n} train rows, more than width=1"):
    store.read([widest], width=1)
  with pytest.raises(ValueError, match="more than rows=1"):
    store.read_ragged([widest], rows=1)
  with pytest.raises(ValueError, match="split='central'; store .* has splits"):
    store.read([0], "central")
  store.check_source({"name": "synthetic", "seed": 1, "cache_dir": "/elsewhere", "layout": "ragged"})
  with pytest.raises(ValueError, match=r"converted from another dataset .*name: 'synthetic' in the store vs "
                                       r"'leaf' in the config"):
    open_store(store.path, source={"name": "leaf", "seed": 1})


def test_half_written_damaged_and_mismatched_stores_are_refused(tmp_path):
  data, store = data_and_store(tmp_path)
  path = store.path
  with pytest.raises(FileNotFoundError, match="no store at .*convert the data first"):
    open_store(str(tmp_path / "none"))
  # a conversion killed half way: only <path>.partial exists, and a writer that raised leaves nothing
  w = StoreWriter(str(tmp_path / "half"), x=Feature((5,), "float32"), y=Feature((), "int32"), source={})
  w.add((np.ones((2, 5), np.float32), np.zeros(2, np.int32)))
  with pytest.raises(FileNotFoundError, match=r"a conversion stopped before it finished .*half.partial"):
    open_store(str(tmp_path / "half"))
  with pytest.raises(ValueError, match="labels span"):
    with StoreWriter(str(tmp_path / "bad"), x=Feature((5,), "float32"), y=Feature((), "int32"),
                     source={}) as w:
      w.add((np.ones((2, 5), np.float32), np.array([0, 3], np.int32)))
      w.finish(num_classes=3)
  assert not os.path.exists(tmp_path / "bad") and not os.path.exists(tmp_path / "bad.partial")
  # a folder without a manifest
  os.makedirs(tmp_path / "empty")
  with pytest.raises(ValueError, match="holds no finished store"):
    open_store(str(tmp_path / "empty"))
  # an index that does not match the rows
  index = dict(np.load(os.path.join(path, "index.npz")))
  good = index["train_counts"].copy()
  index["train_counts"][0] += 1
  np.savez(os.path.join(path, "index.npz"), **index)
  with pytest.raises(ValueError, match="the index does not match the rows of its train split"):
    open_store(path)
  index["train_counts"] = good
  np.savez(os.path.join(path, "index.npz"), **index)
  open_store(path)
  # a file of another size than recorded, then rows changed in place (same size)
  file = os.path.join(path, "train", "data.arrow")
  blob = open(file, "rb").read()
  open(file, "wb").write(blob + b"\0")
  with pytest.raises(ValueError, match=r"train/data.arrow has \d+ bytes, the manifest recorded"):
    open_store(path)
  x0 = np.asarray(data.x_train[0, 0]).tobytes()
  at = blob.index(x0)
  open(file, "wb").write(blob[:at] + bytes(len(x0)) + blob[at + len(x0):])
  with pytest.raises(ValueError, match="its rows do not match its manifest"):
    open_store(path).verify()
  manifest = json.load(open(os.path.join(path, "manifest.json")))
  manifest["complete"] = False
  json.dump(manifest, open(os.path.join(path, "manifest.json"), "w"))
  with pytest.raises(ValueError, match="is not a finished"):
    open_store(path)


def test_writer_refusals(tmp_path):
  x, y = Feature((3,), "float32"), Feature((), "int32")
  with pytest.raises(ValueError, match="exists; choose another path or overwrite"):
    StoreWriter(str(tmp_path), x=x, y=y, source={})
  with pytest.raises(ValueError, match="dtype object"):
    StoreWriter(str(tmp_path / "o"), x=Feature((3,), "object"), y=y, source={})
  with StoreWriter(str(tmp_path / "w"), x=x, y=y, source={}) as w:
    with pytest.raises(ValueError, match=r"client 0 \('a'\), train: x \(2, 4\) and y \(2,\) do not match"):
      w.add((np.ones((2, 4)), np.zeros(2)), name="a")
    with pytest.raises(ValueError, match="client 0 has no training examples"):
      w.add((np.ones((0, 3)), np.zeros(0)))
    with pytest.raises(ValueError, match="client 0, train: example 1 holds a non-finite input"):
      w.add((np.array([[0, 0, 0], [0, np.nan, 0]]), np.zeros(2)))
    with pytest.raises(ValueError, match="no client was added"):
      w.finish(num_classes=2)
    w.add((np.ones((1, 3)), np.zeros(1)))
    with pytest.raises(ValueError, match=r"groups has shape \(2,\); need \[C\] or \[L, C\] with C=1"):
      w.finish(num_classes=2, groups=[0, 1])
  assert not os.path.exists(tmp_path / "w")


# ------------------------------------------------------------------------ sources
def write_tff(path, clients, kind):
  """A TFF h5 file (``examples/<client id>/<feature>``) of ``{client id: examples}``."""
  rng = np.random.default_rng(len(clients))
  with h5py.File(path, "w") as f:
    ex = f.create_group("examples")
    for cid, n in clients.items():
      g = ex.create_group(cid)
      if kind == "emnist":
        g["pixels"] = rng.random((n, 28, 28)).astype(np.float32)
        g["label"] = rng.integers(0, 7, n).astype(np.int32)
      elif kind == "shakespeare":
        g["snippets"] = np.asarray([f"{cid} says {i}: to be or not".encode() * (1 + i % 3) for i in range(n)])
      elif kind == "cifar100":
        g["image"] = rng.integers(0, 255, (n, 32, 32, 3)).astype(np.uint8)
        g["label"] = rng.integers(0, 100, n).astype(np.int64)
      else:
        g["tokens"] = np.asarray([" ".join(f"w{int(j)}" for j in rng.zipf(1.5, 1 + i % 7)).encode()
                                  for i in range(n)])


@pytest.mark.parametrize("kind,options", [
  ("emnist", {}),
  ("stackoverflow", dict(seq_len=6, vocab_size=12, max_examples_per_client=3)),
  ("shakespeare", dict(seq_len=10, vocab_size=20)),
  ("cifar100", dict(crop=24, normalize="per_image")),
])
def test_tff_h5_converts_to_the_loaders_rows(tmp_path, kind, options):
  write_tff(tmp_path / "tr.h5", {"f2": 3, "f10": 5, "b7": 1}, kind)
  write_tff(tmp_path / "te.h5", {"f2": 2, "f10": 1} if kind != "cifar100" else {"t0": 4, "t1": 2}, kind)
  paths = dict(train_path=str(tmp_path / "tr.h5"), test_path=str(tmp_path / "te.h5"))
  data, groups, extras = tff_h5.load_tff_h5(**paths, kind=kind, **options)
  store = streamed.convert_tff_h5(str(tmp_path / "s"), **paths, kind=kind, progress=False, **options)
  assert_same_data(store.to_federated_data(), data)
  assert list(store.client_names) == list(extras["clients"])
  np.testing.assert_array_equal(store.extra("groups"), groups)
  if "vocab" in extras:
    assert list(store.extra("vocab")) == list(extras["vocab"])
  if kind == "cifar100":
    central = store.read_ragged(np.arange(len(store.counts("central"))), "central")
    np.testing.assert_array_equal(central.x, extras["central_x"])
    np.testing.assert_array_equal(central.y, extras["central_y"])
  assert store.source["kind"] == kind and store.verify() == store.fingerprint


def test_the_streamed_vocabulary_counts_the_loaders_tokens():
  import collections

  sentences = np.asarray([s.encode() for s in ["a  b\tc", " lead trail ", "caf\u00e9\u00a0x\ny", "", "z"]])
  for kind, key in (("stackoverflow", "tokens"), ("shakespeare", "snippets")):
    want = collections.Counter(t for toks in tff_h5.client_tokens(kind, {key: sentences}) for t in toks)
    got = collections.Counter()
    tff_h5.count_tokens(kind, {key: sentences}, got)
    assert got == want, kind


def test_tff_h5_refusals_leave_no_store(tmp_path):
  write_tff(tmp_path / "tr.h5", {"a": 2, "b": 0}, "emnist")
  write_tff(tmp_path / "te.h5", {"a": 1, "z": 1}, "emnist")
  paths = dict(train_path=str(tmp_path / "tr.h5"), test_path=str(tmp_path / "te.h5"))
  with pytest.raises(ValueError, match="test clients are not in"):
    streamed.convert_tff_h5(str(tmp_path / "s"), **paths, kind="emnist", progress=False)
  write_tff(tmp_path / "te.h5", {"a": 1}, "emnist")
  with pytest.raises(ValueError, match="client 'b' has no example"):
    streamed.convert_tff_h5(str(tmp_path / "s"), **paths, kind="emnist", progress=False)
  with pytest.raises(ValueError, match="TFF kind='mnist'"):
    streamed.convert_tff_h5(str(tmp_path / "s"), **paths, kind="mnist", progress=False)
  with pytest.raises(ValueError, match="lacks feature"):
    streamed.convert_tff_h5(str(tmp_path / "s"), **paths, kind="stackoverflow", progress=False)
  assert not any(p.name.startswith("s") for p in tmp_path.iterdir())


def write_leaf(root):
  rng = np.random.default_rng(0)
  for split, sizes in (("train", {"u1": 3, "u0": 2}), ("test", {"u0": 1})):
    os.makedirs(root / split)
    data = {u: {"x": rng.random((n, 784)).round(3).tolist(), "y": rng.integers(0, 62, n).tolist()}
            for u, n in sizes.items()}
    blob = {"users": list(sizes), "num_samples": list(sizes.values()), "user_data": data}
    (root / split / "all.json").write_text(json.dumps(blob))


def test_every_loaded_source_converts_through_the_command(tmp_path):
  """LEAF JSON, .npz arrays and a Hugging Face dataset (with a Flower partitioner) through
  ``fedtree.convert.convert``: the store holds the loader's rows, groups and vocabulary."""
  import ml_collections

  from fedtree.convert import convert
  from fedtree.datasets.arrays import save_arrays
  from fedtree.experiment.data import load_with_info

  pytest.importorskip("flwr_datasets")
  write_leaf(tmp_path / "leaf")
  arrays = save_arrays(str(tmp_path / "a.npz"), synthetic_alpha_beta(num_clients=4, dim=3, seed=0),
                       groups=[0, 0, 1, 1])
  datasets = pytest.importorskip("datasets")
  rng = np.random.default_rng(0)
  datasets.Dataset.from_dict({"x": rng.random((60, 2)).tolist(), "label": rng.integers(0, 3, 60).tolist()}
                             ).save_to_disk(str(tmp_path / "hf"))
  sources = [dict(name="leaf", root=str(tmp_path / "leaf"), kind="femnist"),
             dict(name="arrays", path=arrays),
             dict(name="hf", path=str(tmp_path / "hf"), x_columns="x", partitioner="flwr.IidPartitioner",
                  partitioner_args={"num_partitions": 3})]
  for i, source in enumerate(sources):
    store = convert(source, str(tmp_path / f"store{i}"), progress=False)
    data, groups, _, info = load_with_info(ml_collections.ConfigDict(source))
    assert_same_data(store.to_federated_data(), data)
    np.testing.assert_array_equal(store.extra("groups"), groups)
    store.check_source(source | {"cache_dir": "/x"})
  with pytest.raises(ValueError, match=r"data.name='mnist'; choose one of"):
    convert({"name": "mnist"}, str(tmp_path / "no"))


def test_an_in_memory_hugging_face_dataset_converts(tmp_path):
  datasets = pytest.importorskip("datasets")
  from fedtree.datasets.hf import from_hf

  rows = range(12)
  ds = datasets.Dataset.from_dict({"x": [[float(i), 1.0] for i in rows], "label": [i % 3 for i in rows],
                                   "writer": [i // 4 for i in rows]})
  data, _, _, extras = from_hf(ds, x_columns="x", client_column="writer", test_fraction=0.25)
  store = write_federated_data(str(tmp_path / "s"), data, source={"name": "hf"},
                               client_names=extras["client_names"])
  assert_same_data(store.to_federated_data(), data)
  assert list(store.client_names) == ["0", "1", "2"]


def test_tfds_converts_under_mock_data(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  from fedtree.convert import convert
  from fedtree.datasets.tfds_loader import load_tfds

  source = dict(name="tfds", dataset="mnist", num_clients=4, partition="iid", test_fraction=0.25, seed=0)
  with tfds.testing.mock_data(num_examples=40, policy=tfds.testing.MockPolicy.USE_CODE):
    store = convert(source, str(tmp_path / "s"), progress=False)
    data, _, central = load_tfds(name="mnist", num_clients=4, partition="iid", test_fraction=0.25, seed=0)
  assert_same_data(store.to_federated_data(), data)
  np.testing.assert_array_equal(store.read_ragged([0], "central").x, central[0])


def write_flair(path):
  """FLAIR as pfl-research's prepare_dataset.py writes it: users under their partition, multi-hot
  labels as (row, column) pairs, the label mappings as JSON."""
  rng = np.random.default_rng(0)
  users = {"train": {"u9": 2, "u1": 3}, "val": {"v0": 1}, "test": {"t0": 2}}
  labels = {}
  with h5py.File(path, "w") as f:
    for part, sizes in users.items():
      for uid, n in sizes.items():
        f[f"/{part}/{uid}/images"] = rng.integers(0, 255, (n, 8, 8, 3)).astype(np.uint8)
        rows = np.repeat(np.arange(n), 2).astype(np.uint16)
        cols = rng.integers(0, 4, 2 * n).astype(np.uint8)
        f[f"/{part}/{uid}/labels_row"], f[f"/{part}/{uid}/labels_col"] = rows, cols
        f[f"/{part}/{uid}/fine_grained_labels_row"] = rows
        f[f"/{part}/{uid}/fine_grained_labels_col"] = cols.astype(np.uint16) * 2
        f[f"/{part}/{uid}/image_ids"] = np.asarray([f"{uid}_{i}" for i in range(n)], dtype="S")
        labels[uid] = (rows, cols)
    f["/metadata/label_mapping"] = json.dumps({f"l{i}": i for i in range(4)})
    f["/metadata/fine_grained_label_mapping"] = json.dumps({f"f{i}": i for i in range(8)})
  return labels


def test_flair_in_pfl_research_layout(tmp_path):
  from fedtree.convert import convert

  labels = write_flair(tmp_path / "flair.hdf5")
  store = convert(dict(name="flair", path=str(tmp_path / "flair.hdf5")), str(tmp_path / "s"), progress=False)
  assert list(store.client_names) == ["u1", "u9"] and store.num_classes == 4
  assert store.label_kind == "multi_hot"
  block = store.read([0])
  assert block.x.dtype == np.uint8 and block.x.shape == (1, 3, 8, 8, 3) and block.y.shape == (1, 3, 4)
  with h5py.File(tmp_path / "flair.hdf5") as f:
    np.testing.assert_array_equal(block.x[0], f["/train/u1/images"][()])
  want = np.zeros((3, 4), np.uint8)
  want[labels["u1"][0].astype(int), labels["u1"][1].astype(int)] = 1
  np.testing.assert_array_equal(block.y[0], want)
  assert store.counts("test").tolist() == [0, 0] and store.counts("central").tolist() == [2]
  fine = streamed.convert_flair(str(tmp_path / "f"), h5_path=str(tmp_path / "flair.hdf5"), labels="fine",
                                central="val", progress=False)
  assert fine.num_classes == 8 and fine.counts("central").tolist() == [1]
  with pytest.raises(ValueError, match="FLAIR labels='medium'"):
    streamed.convert_flair(str(tmp_path / "g"), h5_path=str(tmp_path / "flair.hdf5"), labels="medium")
  write_tff(tmp_path / "tff.h5", {"a": 1}, "emnist")
  with pytest.raises(ValueError, match="is not FLAIR in pfl-research's layout"):
    streamed.convert_flair(str(tmp_path / "g"), h5_path=str(tmp_path / "tff.h5"))


def _command(tmp_path, out):
  write_tff(tmp_path / "tr.h5", {"a": 2, "b": 1}, "emnist")
  write_tff(tmp_path / "te.h5", {"a": 1}, "emnist")
  data = repr(dict(name="tff_h5", kind="emnist", train_path=str(tmp_path / "tr.h5"),
                   test_path=str(tmp_path / "te.h5")))
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  return subprocess.run([sys.executable, "-m", "fedtree.convert", "--progress=false", f"--data={data}",
                         f"--out={out}"], env=env, capture_output=True, text=True, timeout=300)


def test_the_command_refuses_in_one_line_before_reading(tmp_path):
  os.makedirs(tmp_path / "s")
  out = _command(tmp_path, tmp_path / "s")
  assert out.returncode == 1
  line = f"fedtree: error: {tmp_path / 's'} exists; choose another path or overwrite it (--overwrite)"
  assert out.stderr.strip().splitlines() == [line]


@pytest.mark.slow
def test_the_command_converts(tmp_path):
  ok = _command(tmp_path, tmp_path / "s")
  assert ok.returncode == 0, ok.stderr[-2000:]
  assert "fedtree: wrote ClientStore(" in ok.stdout and "2 clients" in ok.stdout
  assert open_store(str(tmp_path / "s")).num_clients == 2


def test_the_format_comparison_and_the_synthetic_h5_run_at_a_tiny_size(tmp_path):
  """benchmarks/population_store.py cannot rot: every format written, read back (the script checks
  the rows), timed; the synthetic TFF files convert to a store (no timing asserted)."""
  pytest.importorskip("grain")
  from benchmarks import population_store as bench

  rows = bench.main(["--clients=30", "--cohort=4", "--cohorts=2", "--cold-cohorts=1",
                     f"--out-dir={tmp_path}", f"--root={tmp_path}"])
  assert [r["format"] for r in rows] == list(bench.FORMATS) and all(r["disk_bytes"] > 0 for r in rows)
  assert "arrow" in json.load(open(tmp_path / "population_store.json"))["table"]
  train, test = bench.main([f"--write-h5={tmp_path / 'h5'}", "--clients=12"])
  store = streamed.convert_tff_h5(str(tmp_path / "so"), train_path=train, test_path=test,
                                  kind="stackoverflow", seq_len=20, vocab_size=10_004, progress=False)
  sizes = bench.client_sizes(12)
  np.testing.assert_array_equal(store.counts("train"), sizes)
  assert store.num_clients == 12 and 0 < store.counts("test").sum() < sizes.sum()
