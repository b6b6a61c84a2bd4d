"""Hugging Face datasets in: round trips, Flower Datasets' partitions reproduced exactly, trees
from columns, and the config path (data.name="hf") from local files. No download: every
dataset is built here, in memory or written by the test."""

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")
fp = pytest.importorskip("flwr_datasets.partitioner")

from fedtree.datasets.hf import flower_partitions, from_hf, load_hf  # noqa: E402

N = 240


def table(n=N):
  """Rows with a unique id (x[0]), a 5-class label, 24 writers in 6 regions, a numeric score."""
  rng = np.random.default_rng(0)
  writer = rng.integers(0, 24, n)
  return datasets.Dataset.from_dict(
    {"x": [[float(i), float(v)] for i, v in enumerate(rng.normal(size=n))],
     "label": rng.integers(0, 5, n).tolist(), "writer": [f"w{w:02d}" for w in writer],
     "region": [f"r{w // 4}" for w in writer], "score": rng.normal(size=n).tolist()},
    features=datasets.Features({"x": datasets.Sequence(datasets.Value("float32")),
                                "label": datasets.ClassLabel(num_classes=5),
                                "writer": datasets.Value("string"), "region": datasets.Value("string"),
                                "score": datasets.Value("float32")}))


def client_rows(data):
  """The dataset rows (ids) each client holds, train and test together."""
  out = []
  for c in range(data.num_clients):
    ids = np.concatenate([np.asarray(data.x_train[c, :data.n_train[c], 0]),
                          np.asarray(data.x_test[c, :data.n_test[c], 0])])
    out.append(sorted(ids.astype(int).tolist()))
  return out


def flower_rows(name, args, shuffle=False, ordered=False):
  """Flower's own partitions of the same dataset, read from each partition's ids; ``shuffle``: of
  the rows shuffled as ``FederatedDataset`` hands them to its partitioner (its default
  ``shuffle=True, seed=42``); ``ordered``: in the partition's order."""
  p = getattr(fp, name)(**args)
  p.dataset = table().shuffle(seed=42) if shuffle else table()
  rows = [[int(r[0]) for r in p.load_partition(i)["x"]] for i in range(p.num_partitions)]
  return rows if ordered else [sorted(r) for r in rows]


SEEDED = {
  "DirichletPartitioner": dict(num_partitions=6, partition_by="label", alpha=0.5, min_partition_size=5),
  "InnerDirichletPartitioner": dict(partition_sizes=[40] * 6, partition_by="label", alpha=0.5),
  "PathologicalPartitioner": dict(num_partitions=6, partition_by="label", num_classes_per_partition=2),
  "ShardPartitioner": dict(num_partitions=6, partition_by="label", num_shards_per_partition=2),
  "ContinuousPartitioner": dict(num_partitions=6, partition_by="score", strictness=0.5),
}
UNSEEDED = {
  "IidPartitioner": dict(num_partitions=6),
  "NaturalIdPartitioner": dict(partition_by="writer"),
  "SizePartitioner": dict(partition_sizes=[10, 30, 50, 60, 90]),
  "LinearPartitioner": dict(num_partitions=5),
  "SquarePartitioner": dict(num_partitions=5),
  "ExponentialPartitioner": dict(num_partitions=4),
}
CASES = ([(n, dict(a, seed=s)) for n, a in SEEDED.items() for s in (7, 42)]
         + list(UNSEEDED.items()))


@pytest.mark.filterwarnings("ignore:Classes.*will NOT be used:UserWarning")  # Pathological's notice
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("name,args", CASES, ids=[f"{n}-{a.get('seed', '')}" for n, a in CASES])
def test_every_flower_partitioner_gives_flowers_partition(name, args, shuffle):
  """``shuffle=False``: the partitioner on the dataset's rows; ``shuffle=True`` (the default): on
  the rows shuffled as ``FederatedDataset`` shuffles them."""
  kw = {} if shuffle else {"shuffle": False}
  data, groups, _, _ = from_hf(table(), x_columns="x", partitioner=f"flwr.{name}", partitioner_args=args,
                               test_fraction=0.25, **kw)
  assert client_rows(data) == flower_rows(name, args, shuffle=shuffle)
  assert groups is None


def client_rows_in_order(data):
  """Each client's training rows (ids) in storage order, and its test rows in storage order."""
  return ([data.x_train[c, :data.n_train[c], 0].astype(int).tolist() for c in range(data.num_clients)],
          [data.x_test[c, :data.n_test[c], 0].astype(int).tolist() for c in range(data.num_clients)])


def test_iid_through_fedtree_is_flowers_federated_dataset(tmp_path):
  """Issue 40: Flower's ``FederatedDataset`` (its own code, from a local parquet file) shuffles the
  rows before its ``IidPartitioner`` (``shuffle=True, seed=42`` by default): on label-sorted rows
  every partition then holds every class. fedtree gives the same partitions, every client's rows
  in Flower's order (train and test each a subsequence of the partition), and ``shuffle=False`` /
  ``shuffle_seed`` follow ``FederatedDataset(shuffle=..., seed=...)``."""
  fds_mod = pytest.importorskip("flwr_datasets")
  n = 200
  ds = datasets.Dataset.from_dict({"x": [[float(i), 0.0] for i in range(n)],
                                   "label": [i * 10 // n for i in range(n)]})   # sorted: 20 of each class
  path = str(tmp_path / "sorted.parquet")
  ds.to_parquet(path)
  for shuffle, seed in [(True, 42), (True, 3), (False, 42)]:
    fds = fds_mod.FederatedDataset(dataset="parquet", data_files={"train": path}, shuffle=shuffle, seed=seed,
                                   partitioners={"train": fp.IidPartitioner(num_partitions=5)},
                                   cache_dir=str(tmp_path / "cache"))
    flower = [[int(r[0]) for r in fds.load_partition(i)["x"]] for i in range(5)]
    data, _, _, _ = from_hf(ds, x_columns="x", partitioner="flwr.IidPartitioner",
                            partitioner_args=dict(num_partitions=5), shuffle=shuffle, shuffle_seed=seed,
                            test_fraction=0.2)
    train, test = client_rows_in_order(data)
    for c in range(5):
      assert sorted(train[c] + test[c]) == sorted(flower[c]), (shuffle, seed, c)
      assert train[c] == [r for r in flower[c] if r in set(train[c])]   # Flower's order
      assert test[c] == [r for r in flower[c] if r in set(test[c])]
      classes = {r * 10 // n for r in flower[c]}
      assert len(classes) >= 7 if shuffle else len(classes) == 2   # (unshuffled: 40 sorted rows)


def test_fedtree_shards_are_flowers_shard_partitioner_on_unshuffled_rows():
  """fedtree's ``shards`` with seed s deals the same row sets as Flower's
  ``ShardPartitioner(num_shards_per_partition=k, seed=s)`` on the dataset's rows when the rows
  divide evenly into shards (240 rows: 6 clients x 2 shards of 20)."""
  for seed in (7, 42):
    mine, _, _, _ = from_hf(table(), x_columns="x", partitioner="shards",
                            partitioner_args=dict(num_clients=6, shards_per_client=2), seed=seed)
    flower = flower_rows("ShardPartitioner", dict(num_partitions=6, partition_by="label",
                                                  num_shards_per_partition=2, seed=seed))
    assert client_rows(mine) == flower


def test_dirichlet_self_balancing():
  """``self_balancing``: a client that holds more than the average when a class is dealt gets none
  of it (classes dealt in label order); without it, the skew goes unchecked."""
  from fedtree.core.data import partition_dirichlet

  labels = np.random.default_rng(0).integers(0, 10, 2000)
  avg = labels.size / 8
  for seed in range(5):
    parts = partition_dirichlet(labels, 8, 0.1, np.random.default_rng(seed), self_balancing=True)
    assert sorted(np.concatenate(parts).tolist()) == list(range(labels.size))
    for k in range(1, 10):
      for p in parts:
        if np.sum(labels[p] < k) > avg:
          assert not np.any(labels[p] == k), (seed, k)
  plain = [max(len(p) for p in partition_dirichlet(labels, 8, 0.1, np.random.default_rng(s)))
           for s in range(5)]
  balanced = [max(len(p) for p in partition_dirichlet(labels, 8, 0.1, np.random.default_rng(s),
                                                      self_balancing=True)) for s in range(5)]
  assert np.mean(balanced) < np.mean(plain)
  data, _, _, _ = from_hf(table(), x_columns="x", partitioner="dirichlet",
                          partitioner_args=dict(num_clients=4, alpha=0.3, min_size=10, self_balancing=True))
  assert data.num_clients == 4 and min(data.n_train + data.n_test) >= 10


def test_seeds_give_different_flower_partitions():
  a, b = (flower_rows("DirichletPartitioner", dict(SEEDED["DirichletPartitioner"], seed=s)) for s in (7, 42))
  assert a != b


def test_grouped_natural_id_is_a_two_level_tree():
  args = dict(partition_by="writer", group_size=5)
  data, groups, _, _ = from_hf(table(), x_columns="x", partitioner="flwr.GroupedNaturalIdPartitioner",
                               partitioner_args=args, test_fraction=0.25)
  ds, rows = table(), client_rows(data)
  writers = np.asarray(ds["writer"])
  assert data.num_clients == len(set(writers))                   # a client per writer
  assert all(len(set(writers[r])) == 1 for r in rows)
  flower = flower_rows("GroupedNaturalIdPartitioner", args)
  assert groups.max() + 1 == len(flower)                         # a group per Flower partition
  for g, part in enumerate(flower):
    assert sorted(sum((rows[c] for c in np.flatnonzero(groups == g)), [])) == part


def test_a_flower_partitioner_object_equals_the_named_one():
  args = dict(partition_by="writer", group_size=5)
  by_name = from_hf(table(), x_columns="x", partitioner="flwr.GroupedNaturalIdPartitioner",
                    partitioner_args=args)
  by_object = from_hf(table(), x_columns="x", partitioner=fp.GroupedNaturalIdPartitioner(**args))
  assert client_rows(by_name[0]) == client_rows(by_object[0])
  assert np.array_equal(by_name[1], by_object[1])
  with pytest.raises(ValueError, match="partitioner_args are for a partitioner given by name"):
    from_hf(table(), x_columns="x", partitioner=fp.IidPartitioner(num_partitions=3),
            partitioner_args=dict(num_partitions=4))


def test_flower_partitions_reads_rows_without_touching_the_dataset():
  ds = table()
  parts = flower_partitions(ds, fp.IidPartitioner(num_partitions=4))
  assert sorted(np.concatenate(parts).tolist()) == list(range(N))
  assert "__fedtree_row__" not in ds.column_names


def test_round_trip_images_labels_and_natural_clients():
  rng = np.random.default_rng(1)
  images = rng.integers(0, 256, (30, 6, 6), dtype=np.uint8)
  owner = [f"c{i % 3}" for i in range(30)]
  ds = datasets.Dataset.from_dict(
    {"image": list(images), "label": [i % 4 for i in range(30)], "owner": owner},
    features=datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=7),
                                "owner": datasets.Value("string")}))
  data, groups, central, extras = from_hf(ds, client_column="owner", test_fraction=0.2, seed=3)
  assert data.num_classes == 7 and data.example_shape == (6, 6, 1) and data.x_train.dtype == np.float32
  assert extras["client_names"] == ("c0", "c1", "c2") and groups is None and central is None
  assert data.n_train.tolist() == [8, 8, 8] and data.n_test.tolist() == [2, 2, 2]
  # every client row is one of its owner's images, scaled to [0, 1], with its label
  for c in range(3):
    for x, y in zip(data.x_train[c, :8], data.y_train[c, :8], strict=True):
      i = int(np.flatnonzero((images.astype(np.float32) / 255.0 == x[..., 0]).all(axis=(1, 2)))[0])
      assert owner[i] == f"c{c}" and y == i % 4


def test_fedtree_partitioner_and_central_test():
  train, test = table(), table(40)
  data, _, central, _ = from_hf(train, test=test, x_columns="x", partitioner="dirichlet",
                                partitioner_args=dict(num_clients=4, alpha=0.3), seed=0)
  assert sorted(sum(client_rows(data), [])) == list(range(N))
  assert central[0].shape == (40, 2) and central[1].tolist() == test["label"]


def test_tree_from_columns_writer_region_root():
  from fedtree.core.topology import Topology

  data, groups, _, extras = from_hf(table(), x_columns="x", client_column="writer", tree_columns=("region",))
  ds = table()
  writers, regions = np.asarray(ds["writer"]), np.asarray(ds["region"])
  topo = Topology.from_label_columns(list(extras["label_columns"]))
  assert topo.num_clients == data.num_clients == len(set(writers))
  assert topo.num_nodes(1) == len(set(regions)) and np.array_equal(groups, extras["label_columns"][0])
  names = extras["client_names"]
  for c, name in enumerate(names):
    assert extras["group_names"][groups[c]] == regions[writers == name][0]


def test_text_column_gives_language_model_data():
  ds = datasets.Dataset.from_dict({"text": [f"the cat {w} sat on the mat" for w in ("a", "b", "c", "d") * 6],
                                   "user": [i % 3 for i in range(24)]})
  data, _, _, extras = from_hf(ds, x_columns="text", client_column="user",
                               text=dict(seq_len=8, vocab_size=50, test_fraction=0.25))
  assert data.num_clients == 3 and data.x_train.dtype == np.int32 and data.y_train.shape[-1] == 8
  assert "cat" in extras["vocab"] and data.num_classes == len(extras["vocab"])


@pytest.mark.parametrize("kwargs,match", [
  (dict(x_columns="pixels", client_column="writer"), r"column\(s\) \['pixels'\] are not in the dataset"),
  (dict(x_columns="x", partitioner="zipf"), r"partitioner='zipf'; choose one of"),
  (dict(x_columns="x", partitioner="flwr.ZipfPartitioner"),
   "Flower partitioner 'ZipfPartitioner' is unknown"),
  # split columns, not rows (issue 42 item 6: the docs named them with "any partitioner")
  (dict(x_columns="x", partitioner="flwr.VerticalEvenPartitioner", partitioner_args=dict(num_partitions=2)),
   r"'VerticalEvenPartitioner' is not supported: it splits the columns .* choose one of \['Continuous"),
  (dict(x_columns="x", partitioner="flwr.IdToSizeFncPartitioner"),
   r"'IdToSizeFncPartitioner' is not supported: it is a base class"),
  (dict(x_columns="x", partitioner="iid", partitioner_args=dict(clients=3)), r"takes partitioner_args"),
  (dict(x_columns="x"), "needs a partitioner or a client_column"),
  (dict(x_columns="x", client_column="writer", num_classes=3), r"label \d in y_\w+ is outside \[0, 3\)"),
  (dict(x_columns="x", partitioner="flwr.DirichletPartitioner",
        partitioner_args=dict(num_partitions=40, partition_by="label", alpha=0.01, min_partition_size=0,
                              seed=1)), "client 0 received no examples"),
])
def test_bad_input_is_refused(kwargs, match):
  with pytest.raises(ValueError, match=match):
    from_hf(table(), **kwargs)


def test_load_hf_from_save_to_disk_and_parquet(tmp_path):
  dd = datasets.DatasetDict({"train": table(), "test": table(30)})
  dd.save_to_disk(str(tmp_path / "disk"))
  data, _, central, _ = load_hf(path=str(tmp_path / "disk"), test_split="test", x_columns="x",
                                partitioner="iid", partitioner_args=dict(num_clients=3))
  assert data.num_clients == 3 and central[1].shape == (30,)
  table().to_parquet(str(tmp_path / "train.parquet"))
  data2, _, _, _ = load_hf(path=str(tmp_path / "train.parquet"), format="parquet", x_columns="x",
                           client_column="writer", cache_dir=str(tmp_path / "cache"))
  assert data2.num_clients == 24
  with pytest.raises(ValueError, match=r"split 'validation' is not in"):
    load_hf(path=str(tmp_path / "disk"), split="validation", x_columns="x", client_column="writer")
  with pytest.raises(ValueError, match=r"format='tfrecord'"):
    load_hf(path=str(tmp_path / "disk"), format="tfrecord")


def test_config_tree_from_columns_through_make_context(tmp_path):
  """data.name="hf" from a save_to_disk folder, topology.kind="columns": root -> country ->
  region -> writer, built before anything compiles."""
  from config_files import load_config

  from fedtree.experiment.runner import make_context

  ds = table()
  ds = ds.add_column("country", [f"k{int(r[1:]) // 3}" for r in ds["region"]])
  ds.save_to_disk(str(tmp_path / "saved"))
  c = load_config("own_data", "hf")
  c.data.path, c.data.x_columns, c.data.client_column = str(tmp_path / "saved"), "x", "writer"
  with c.unlocked():
    c.data.partitioner, c.data.partitioner_args = None, None
    c.data.tree_columns = ("country", "region")
  c.topology.kind = "columns"
  ctx = make_context(c)
  topo = ctx.topology
  assert topo.depth == 3 and topo.num_clients == 24
  assert [topo.num_nodes(lv) for lv in range(4)] == [1, 2, 6, 24]
  assert np.array_equal(ctx.groups, topo.ancestor(1))
  c.topology.kind = "columns"
  c.data.tree_columns = ()
  with pytest.raises(ValueError, match="topology.kind='columns' needs data that name label columns"):
    make_context(c)


def test_a_test_split_follows_the_natural_clients():
  train, test = table(), table(60)
  data, _, central, extras = from_hf(train, test=test, x_columns="x", client_column="writer")
  assert central is None and data.n_test.sum() == 60            # every test writer also trains here
  writers = np.asarray(test["writer"])
  for c, name in enumerate(extras["client_names"]):
    ids = sorted(np.asarray(data.x_test[c, :data.n_test[c], 0]).astype(int).tolist())
    assert ids == np.flatnonzero(writers == name).tolist()       # test rows keep their row ids


def test_config_hf_flower_gives_flowers_partition(tmp_path):
  from config_files import load_config

  from fedtree.experiment.data import load_with_info

  table().save_to_disk(str(tmp_path / "saved"))
  c = load_config("own_data", "hf_flower")
  c.data.path, c.data.x_columns = str(tmp_path / "saved"), "x"
  c.data.partitioner_args.num_partitions, c.data.partitioner_args.seed = 6, 7
  data, groups, _, _ = load_with_info(c.data)
  assert c.data.shuffle    # the config hands Flower the rows shuffled, as FederatedDataset does
  assert client_rows(data) == flower_rows("DirichletPartitioner", dict(c.data.partitioner_args), shuffle=True)
  assert groups.tolist() == [0] * 6


def test_without_the_hf_extra_the_error_names_it(monkeypatch, tmp_path):
  """Issue 42 item 7: configs/own_data.py:hf on an install without ``datasets`` said only
  "No module named 'datasets'"."""
  from config_files import load_config

  from fedtree.experiment.data import load_with_info

  monkeypatch.setitem(__import__("sys").modules, "datasets", None)
  cfg = load_config("own_data", "hf").data
  cfg.path = str(tmp_path)
  with pytest.raises(ImportError, match=r"config.data.name='hf' needs Hugging Face datasets, which is not "
                                        r"installed: pip install -e \"\.\[hf\]\""):
    load_with_info(cfg)


@pytest.mark.parametrize("given", ["a,b,c", "a, b, c", "[a,b,c]", "('a', 'b', 'c')", ("a", "b", "c")])
def test_several_csv_columns_are_the_inputs_as_the_command_line_names_them(tmp_path, given):
  """Issue 42 item 7: ``--config.data.x_columns=a,b,c`` (a string, as the command line gives it)
  named one column "a,b,c", which the file does not have."""
  from config_files import load_config

  from fedtree.experiment.data import load_with_info

  rng = np.random.default_rng(0)
  datasets.Dataset.from_dict({k: rng.normal(size=40).tolist() for k in "abc"}
                             | {"label": rng.integers(0, 3, 40).tolist()}).to_csv(str(tmp_path / "d.csv"))
  cfg = load_config("own_data", "hf").data
  cfg.path, cfg.format, cfg.partitioner_args.num_clients = str(tmp_path / "d.csv"), "csv", 4
  with cfg.ignore_type():
    cfg.x_columns = given
  data, *_ = load_with_info(cfg)
  assert data.example_shape == (3,) and data.num_clients == 4
