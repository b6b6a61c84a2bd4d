"""Natural federated splits: LEAF JSON and TFF h5 loaders on tiny generated files (nothing
lost or duplicated, deterministic, clear errors) and the fingerprinted cache."""

import json
import os

import numpy as np
import pytest

from fedtree.datasets import cache, leaf, tff_h5


def _write_leaf(root, kind):
  rng = np.random.default_rng(0)
  users = {"u2": 3, "u0": 2, "u1": 4}
  plays = {"u0": "hamlet", "u1": "lear", "u2": "hamlet"}

  def example(u, i, split):
    if kind == "femnist":
      return list(rng.random(784).round(3)), (ord(u[-1]) * 7 + i + (split == "test")) % 62
    s = f"{u} line {i} {split} " * 8
    return s[:80], s[80]

  for split, scale in (("train", 1), ("test", 0)):
    os.makedirs(root / split, exist_ok=True)
    names = sorted(users)
    for f, part in enumerate((names[:2], names[2:])):     # users spread over two files
      data = {}
      for u in part:
        n = users[u] if scale else 1
        xs, ys = zip(*(example(u, i, split) for i in range(n)), strict=True)
        data[u] = {"x": list(xs), "y": list(ys)}
      blob = {"users": part, "num_samples": [len(data[u]["y"]) for u in part], "user_data": data,
              "hierarchies": [plays[u] for u in part]}
      (root / split / f"part{f}.json").write_text(json.dumps(blob))
  return users


def test_leaf_femnist_loses_and_duplicates_nothing(tmp_path):
  users = _write_leaf(tmp_path, "femnist")
  data, groups, extras = leaf.load_leaf(str(tmp_path), kind="femnist")
  assert list(extras["clients"]) == ["u0", "u1", "u2"]
  np.testing.assert_array_equal(data.n_train, [users[u] for u in ("u0", "u1", "u2")])
  np.testing.assert_array_equal(data.n_test, [1, 1, 1])
  assert data.x_train.shape[2:] == (28, 28, 1) and data.num_classes == 62
  src = json.loads((tmp_path / "train" / "part0.json").read_text())["user_data"]["u1"]
  np.testing.assert_allclose(np.asarray(data.x_train[1, :4]).reshape(4, -1), src["x"], rtol=1e-6)
  np.testing.assert_array_equal(data.y_train[1, :4], src["y"])
  np.testing.assert_array_equal(groups, [0, 0, 0])
  again = leaf.load_leaf(str(tmp_path), kind="femnist")[0]
  np.testing.assert_array_equal(data.x_train, again.x_train)


def test_leaf_shakespeare_groups_by_play(tmp_path):
  _write_leaf(tmp_path, "shakespeare")
  data, groups, extras = leaf.load_leaf(str(tmp_path), kind="shakespeare", group_key="hierarchies",
                                        seq_len=80)
  assert list(extras["group_names"]) == ["hamlet", "lear"]
  np.testing.assert_array_equal(groups, [0, 1, 0])
  vocab = leaf.vocabulary_from_extras(extras)
  # x is the 80 characters, y the same shifted by one plus the next character
  x, y = np.asarray(data.x_train[0, 0]), np.asarray(data.y_train[0, 0])
  s = ("u0 line 0 train " * 8)
  assert "".join(vocab.decode(x)) == s[:80]
  assert "".join(vocab.decode(y)) == s[1:81]
  np.testing.assert_array_equal(x[1:], y[:-1])


def test_leaf_errors(tmp_path):
  with pytest.raises(ValueError, match="no train/"):
    leaf.load_leaf(str(tmp_path / "missing"), kind="femnist")
  _write_leaf(tmp_path, "femnist")
  with pytest.raises(ValueError, match="kind='emnist'"):
    leaf.load_leaf(str(tmp_path), kind="emnist")
  (tmp_path / "train" / "part1.json").write_text("{not json")
  with pytest.raises(ValueError, match="not LEAF JSON"):
    leaf.load_leaf(str(tmp_path), kind="femnist")
  (tmp_path / "train" / "part1.json").write_text(json.dumps(
    {"users": ["u9"], "user_data": {"u9": {"x": [], "y": []}}}))
  with pytest.raises(ValueError, match="empty client"):
    leaf.load_leaf(str(tmp_path), kind="femnist")


def _write_h5(path, clients, kind):
  h5py = pytest.importorskip("h5py")
  with h5py.File(path, "w") as f:
    ex = f.create_group("examples")
    for cid, n in clients.items():
      g = ex.create_group(cid)
      if kind == "emnist":
        g["pixels"] = np.full((n, 28, 28), float(len(cid)), np.float32) + np.arange(n)[:, None, None]
        g["label"] = np.arange(n, dtype=np.int32) % 10
      else:
        g["tokens"] = np.asarray([f"w{i} w{i + 1} {cid} ." .encode() for i in range(n)])


def test_tff_h5_emnist_and_stackoverflow(tmp_path):
  _write_h5(tmp_path / "tr.h5", {"f2": 3, "f10": 5}, "emnist")
  _write_h5(tmp_path / "te.h5", {"f2": 1}, "emnist")
  data, groups, extras = tff_h5.load_tff_h5(str(tmp_path / "tr.h5"), str(tmp_path / "te.h5"), kind="emnist")
  assert list(extras["clients"]) == ["f10", "f2"]
  np.testing.assert_array_equal(data.n_train, [5, 3])
  np.testing.assert_array_equal(data.n_test, [0, 1])
  np.testing.assert_array_equal(np.asarray(data.x_train[0, :5, 0, 0, 0]), 3 + np.arange(5))
  assert data.num_classes == 5
  _write_h5(tmp_path / "so_tr.h5", {"a": 2, "b": 3}, "so")
  _write_h5(tmp_path / "so_te.h5", {"b": 1}, "so")
  d1, _, e1 = tff_h5.load_tff_h5(str(tmp_path / "so_tr.h5"), str(tmp_path / "so_te.h5"),
                                 kind="stackoverflow", seq_len=6, vocab_size=50)
  d2, _, e2 = tff_h5.load_tff_h5(str(tmp_path / "so_tr.h5"), str(tmp_path / "so_te.h5"),
                                 kind="stackoverflow", seq_len=6, vocab_size=50)
  np.testing.assert_array_equal(d1.n_train, [2, 3])
  np.testing.assert_array_equal(d1.n_test, [0, 1])
  np.testing.assert_array_equal(d1.x_train, d2.x_train)
  assert list(e1["vocab"]) == list(e2["vocab"])
  with pytest.raises(ValueError, match="does not exist"):
    tff_h5.load_tff_h5(str(tmp_path / "nope.h5"), str(tmp_path / "te.h5"), kind="emnist")
  (tmp_path / "bad.h5").write_text("not h5")
  with pytest.raises(ValueError, match="not an h5 file"):
    tff_h5.load_tff_h5(str(tmp_path / "bad.h5"), str(tmp_path / "te.h5"), kind="emnist")
  with pytest.raises(ValueError, match="lacks feature"):
    tff_h5.load_tff_h5(str(tmp_path / "so_tr.h5"), str(tmp_path / "te.h5"), kind="emnist")


def test_cache_hits_on_same_source_and_misses_on_change(tmp_path):
  _write_leaf(tmp_path / "src", "femnist")
  calls = []

  def build():
    calls.append(1)
    data, _, extras = leaf.load_leaf(str(tmp_path / "src"), kind="femnist")
    return data, extras

  key = cache.fingerprint(cache.source_fingerprint(str(tmp_path / "src")), {"kind": "femnist"})
  d1, e1, hit1 = cache.cached(str(tmp_path / "c"), key, build)
  d2, e2, hit2 = cache.cached(str(tmp_path / "c"), key, build)
  assert (hit1, hit2, len(calls)) == (False, True, 1)
  np.testing.assert_array_equal(d1.x_train, d2.x_train)
  assert d2.num_classes == 62 and list(e2["clients"]) == list(e1["clients"])
  assert cache.fingerprint(cache.source_fingerprint(str(tmp_path / "src")), {"kind": "x"}) != key
  (tmp_path / "src" / "train" / "part0.json").write_text(
    (tmp_path / "src" / "train" / "part0.json").read_text() + " ")
  assert cache.fingerprint(cache.source_fingerprint(str(tmp_path / "src")), {"kind": "femnist"}) != key


@pytest.mark.slow
def test_group_personalized_lm_leaf_shakespeare_end_to_end(tmp_path):
  """``configs/group_personalized_lm.py:leaf_shakespeare`` shrunk, on generated LEAF JSON:
  roles grouped by play, the report's tables named by the plays, perplexities finite."""
  from config_files import load_config

  from fedtree import experiment

  _write_leaf(tmp_path / "leaf", "shakespeare")
  c = load_config("group_personalized_lm", "leaf_shakespeare")
  c.rounds, c.rounds_per_call, c.eval_every, c.progress = 1, 1, 1, False
  c.data.root, c.data.cache_dir, c.data.seq_len = str(tmp_path / "leaf"), str(tmp_path / "cache"), 12
  c.model.embed, c.model.hidden = 4, 8
  c.local.batch_size = 2
  g = c.runs.grouppfl
  g.group_rounds, g.cohort_size = 1, 2
  g.finetune.epochs, g.finetune.learning_rates = 1, (0.1,)
  results = experiment.train_and_evaluate(c, str(tmp_path / "work"))["grouppfl"]
  assert list(results) == ["FL", "PerFL", "GroupFL", "GroupPerFL"]
  for r in results.values():
    assert np.isfinite(r["perplexity"]) and np.isfinite(r["sentence_perplexity"])
  text = (tmp_path / "work" / "grouppfl_report.md").read_text()
  assert "| hamlet | 2 |" in text and "| lear | 1 |" in text
  assert len(list((tmp_path / "cache").glob("leaf-*.npz"))) == 1


def test_tff_h5_shakespeare_and_file_errors(tmp_path):
  """Shakespeare snippets -> next-character windows over the training file's characters; an
  empty client and a file without ``examples`` are named errors."""
  h5py = pytest.importorskip("h5py")
  with h5py.File(tmp_path / "tr.h5", "w") as f:
    f.create_group("examples/b").create_dataset("snippets", data=np.asarray([b"to be", b"or not"]))
    f.create_group("examples/a").create_dataset("snippets", data=np.asarray([b"abc"]))
  with h5py.File(tmp_path / "te.h5", "w") as f:
    f.create_group("examples/b").create_dataset("snippets", data=np.asarray([b"be z"]))
  data, groups, extras = tff_h5.load_tff_h5(str(tmp_path / "tr.h5"), str(tmp_path / "te.h5"),
                                            kind="shakespeare", seq_len=4)
  vocab = leaf.vocabulary_from_extras(extras)
  assert list(extras["clients"]) == ["a", "b"] and data.num_classes == vocab.size
  np.testing.assert_array_equal(groups, [0, 0])
  # "to be" + BOS/EOS = 7 ids -> 2 windows of 4 inputs; "or not" = 8 ids -> 2 windows: 4 in all
  np.testing.assert_array_equal(data.n_train, [1, 4])
  np.testing.assert_array_equal(data.n_test, [0, 2])             # "be z": 6 ids -> 2 windows
  x, y = np.asarray(data.x_train[1, 0]), np.asarray(data.y_train[1, 0])
  assert x[0] == 2 and "".join(vocab.decode(x[1:])) == "to " and "".join(vocab.decode(y[:3])) == "to "
  np.testing.assert_array_equal(x[1:], y[:-1])
  assert "z" not in vocab.tokens and np.asarray(data.y_test[1, 0])[3] == 1   # unseen char -> <oov>

  with h5py.File(tmp_path / "empty.h5", "w") as f:
    f.create_group("examples/a").create_dataset("snippets", data=np.asarray([], dtype="S1"))
  with pytest.raises(ValueError, match="empty client"):
    tff_h5.load_tff_h5(str(tmp_path / "empty.h5"), str(tmp_path / "te.h5"), kind="shakespeare")
  with h5py.File(tmp_path / "flat.h5", "w") as f:
    f.create_dataset("snippets", data=np.asarray([b"x"]))
  with pytest.raises(ValueError, match="no 'examples' group"):
    tff_h5.load_tff_h5(str(tmp_path / "flat.h5"), str(tmp_path / "te.h5"), kind="shakespeare")
  with h5py.File(tmp_path / "none.h5", "w") as f:
    f.create_group("examples")
  with pytest.raises(ValueError, match="has no client"):
    tff_h5.load_tff_h5(str(tmp_path / "none.h5"), str(tmp_path / "te.h5"), kind="shakespeare")


def test_tfds_text_corpus_groups_clients_from_a_fake_source(monkeypatch):
  """tfds_text_corpus on a fake TFDS source (no TensorFlow): one client per client id, one
  group per group feature, each text split into sentences, ``max_examples`` honoured, the
  dataset opened without downloading."""
  tfds = pytest.importorskip("tensorflow_datasets")
  from fedtree.datasets import text

  examples = [
    {"text": b"Hello there. How are you?", "client_id": b"u2", "topic": b"chat"},
    {"text": b"Atoms bond.", "client_id": b"u1", "topic": b"sci"},
    {"text": b"Fine: thanks", "client_id": b"u2", "topic": b"chat"},
    {"text": b"Never read.", "client_id": b"u3", "topic": b"sci"},
  ]
  calls = []

  def fake_load(name, **kwargs):
    calls.append((name, kwargs))
    return list(examples)

  monkeypatch.setattr(tfds, "load", fake_load)
  monkeypatch.setattr(tfds, "as_numpy", lambda ds: iter(ds))
  corpus = text.tfds_text_corpus("fake_text", group_key="topic", max_examples=3, data_dir="/d")
  assert calls == [("fake_text", {"split": "train", "data_dir": "/d", "download": False})]
  assert corpus.clients == ("u1", "u2") and corpus.group_names == ("chat", "sci")
  assert corpus.groups == (1, 0)
  assert corpus.sentences == (("Atoms bond.",), ("Hello there.", "How are you?", "Fine:", "thanks"))
  single = text.tfds_text_corpus("fake_text")
  assert single.group_names == ("all",) and single.clients == ("u1", "u2", "u3")
