"""Evaluation as the standard benchmarks report it (labels left out, top-k, the central test split)
and the loaders' additions for them (TFF CIFAR-100, the per-client cap, the balanced Dirichlet
split, normalization, 3-channel generated images), each against a plain numpy reference."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedtree.core.data import partition_dirichlet_balanced
from fedtree.core.metrics import client_sums, evaluate, summarize
from fedtree.core.model import Model
from fedtree.datasets import tff_h5
from fedtree.datasets.prototypes import prototype_images
from fedtree.evaluation import central_blocks
from fedtree.experiment.results import evaluation_options


def fixed_logits_model(logits: np.ndarray) -> Model:
  """A model whose output for input row ``i`` (its id in ``x``) is ``logits[i]``."""
  table = np.asarray(logits, np.float32)

  def apply(params, x, *, train=False, rng=None):
    return params["table"][x]

  return Model(init=lambda key: {"table": table}, apply=apply, num_classes=table.shape[-1],
               input_dtype="int32", label_shape=(table.shape[1],) if table.ndim == 3 else ())


def numpy_sums(logits, y, n, ignore=(), k=None):
  """Reference: loss, correct, count (and top-k hits) over real, non-ignored labels."""
  mask = np.arange(len(y)) < n
  mask = mask.reshape(mask.shape + (1,) * (y.ndim - 1)) & np.ones(y.shape, bool)
  if y.ndim > 1:
    mask &= y != 0
  for v in ignore:
    mask &= y != v
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp, y[..., None], -1)[..., 0]
  correct = (logits.argmax(-1) == y) & mask
  out = [float(nll[mask].sum()), float(correct.sum()), float(mask.sum())]
  if k is not None:
    rank = (logits > np.take_along_axis(logits, y[..., None], -1)).sum(-1)
    out.append(float(((rank < k) & mask).sum()))
  return out


@pytest.mark.parametrize("ignore,k", [((), None), ((1, 3), None), ((), 3), ((2,), 2)])
def test_client_sums_leave_out_labels_and_count_top_k_like_numpy(ignore, k):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(5, 4, 6)).astype(np.float32)           # 5 sentences of 4 tokens, 6 ids
  y = rng.integers(0, 6, size=(5, 4)).astype(np.int32)
  model = fixed_logits_model(logits)
  got = client_sums(model, model.init(None), np.arange(5), y, 4, ignore_labels=ignore, top_k=k)
  np.testing.assert_allclose([float(v) for v in got], numpy_sums(logits, y, 4, ignore, k), rtol=1e-5)


def test_evaluate_and_summarize_report_top_k_pooled_and_per_client():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(6, 7)).astype(np.float32)             # 6 examples, 7 classes
  y = rng.integers(0, 7, size=6).astype(np.int32)
  model = fixed_logits_model(logits)
  params = {"table": jnp.asarray(np.stack([logits, logits]))}     # 2 models, one per client
  x = np.stack([np.arange(3), np.arange(3, 6)])
  stats = evaluate(model, params, x, np.stack([y[:3], y[3:]]), np.array([3, 2]), top_k=2)
  s = summarize(stats, top_k=2)
  hits = [numpy_sums(logits[:3], y[:3], 3, k=2)[3], numpy_sums(logits[3:], y[3:], 2, k=2)[3]]
  assert s["top2_accuracy"] == pytest.approx(sum(hits) / 5)
  assert s["client_mean_top2_accuracy"] == pytest.approx((hits[0] / 3 + hits[1] / 2) / 2)
  assert s["top2_accuracy"] >= s["accuracy"]
  with pytest.raises(ValueError, match="top_k=k"):
    summarize(stats)


def test_central_blocks_keep_every_example_once():
  x = np.arange(23 * 2, dtype=np.float32).reshape(23, 2)
  y = np.arange(23, dtype=np.int32)
  bx, by, n = central_blocks(x, y, block=5)
  assert bx.shape == (5, 5, 2) and n.tolist() == [5, 5, 5, 5, 3]
  np.testing.assert_array_equal(np.concatenate([by[i, :m] for i, m in enumerate(n)]), y)
  with pytest.raises(ValueError, match="empty"):
    central_blocks(x[:0], y[:0])


def test_evaluation_options_are_checked_before_anything_compiles():
  def cfg(**metrics):
    return ml_collections.ConfigDict(dict(data=dict(name="tfds"), metrics=metrics))

  assert evaluation_options(cfg(ignore_labels=(1, 3), top_k=5, central=True), num_classes=10,
                            has_central=True, has_local=False) == ((1, 3), 5, True)
  with pytest.raises(ValueError, match=r"ignore_labels=\(0,\): label 0 is not in \[1, 10\)"):
    evaluation_options(cfg(ignore_labels=(0,)), num_classes=10, has_central=False, has_local=True)
  with pytest.raises(ValueError, match="top_k=11 must be in"):
    evaluation_options(cfg(top_k=11), num_classes=10, has_central=False, has_local=True)
  with pytest.raises(ValueError, match="central=True but config.data .name='tfds'. has no central"):
    evaluation_options(cfg(central=True), num_classes=10, has_central=False, has_local=True)
  with pytest.raises(ValueError, match="gives no client any test example"):
    evaluation_options(cfg(), num_classes=10, has_central=True, has_local=False)


# ------------------------------------------------------------------ loaders
def test_dirichlet_balanced_gives_equal_disjoint_skewed_clients():
  y = np.repeat(np.arange(10), 300)
  parts = partition_dirichlet_balanced(y, 20, 0.1, np.random.default_rng(0))
  assert {len(p) for p in parts} == {150}
  every = np.concatenate(parts)
  assert len(np.unique(every)) == len(every) == 3000
  top_share = np.mean([np.bincount(y[p], minlength=10).max() / len(p) for p in parts])
  iid = partition_dirichlet_balanced(y, 20, 1e4, np.random.default_rng(0))
  assert top_share > 0.6 > np.mean([np.bincount(y[p], minlength=10).max() / len(p) for p in iid])
  with pytest.raises(ValueError, match="examples_per_client=200 x 20 clients"):
    partition_dirichlet_balanced(y, 20, 0.1, np.random.default_rng(0), examples_per_client=200)


def test_per_image_standardization_is_tensorflows():
  x = np.random.default_rng(0).integers(0, 256, size=(3, 4, 5, 3)).astype(np.uint8)
  got = tff_h5.per_image_standardization(x)
  for img, g in zip(x.astype(np.float64), got, strict=True):
    want = (img - img.mean()) / max(img.std(), 1 / np.sqrt(img.size))
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)
  flat = tff_h5.per_image_standardization(np.full((1, 2, 2, 1), 7.0))
  np.testing.assert_array_equal(flat, 0.0)                     # std floored: no division by 0


def write_cifar100(path, clients, seed=0):
  import h5py

  rng = np.random.default_rng(seed)
  with h5py.File(path, "w") as f:
    for cid, n in clients.items():
      g = f.create_group(f"examples/{cid}")
      g.create_dataset("image", data=rng.integers(0, 256, size=(n, 32, 32, 3)).astype(np.uint8))
      g.create_dataset("label", data=rng.integers(0, 100, size=n).astype(np.int64))
      g.create_dataset("coarse_label", data=rng.integers(0, 20, size=n).astype(np.int64))


def test_tff_cifar100_pools_its_test_clients_as_the_central_test_set(tmp_path):
  pytest.importorskip("h5py")
  write_cifar100(tmp_path / "tr.h5", {"0": 4, "1": 3, "2": 5})
  write_cifar100(tmp_path / "te.h5", {"0": 2, "7": 3}, seed=1)        # test clients are others
  data, groups, extras = tff_h5.load_tff_h5(str(tmp_path / "tr.h5"), str(tmp_path / "te.h5"), kind="cifar100",
                                            crop=24, normalize="per_image")
  assert data.example_shape == (24, 24, 3) and data.num_classes == 100
  np.testing.assert_array_equal(data.n_train, [4, 3, 5])
  assert int(np.asarray(data.n_test).sum()) == 0
  assert extras["central_x"].shape == (5, 24, 24, 3) and extras["central_y"].shape == (5,)
  import h5py

  with h5py.File(tmp_path / "tr.h5") as f:
    raw = f["examples/1/image"][()][:, 4:28, 4:28, :]                # the central 24x24 crop
  want = tff_h5.per_image_standardization(raw)
  np.testing.assert_allclose(np.asarray(data.x_train[1, :3]), want, atol=1e-5)
  with pytest.raises(ValueError, match="crop=40 must be in"):
    tff_h5.load_tff_h5(str(tmp_path / "tr.h5"), str(tmp_path / "te.h5"), kind="cifar100", crop=40)
  with pytest.raises(ValueError, match="options of kind='cifar100', not 'emnist'"):
    tff_h5.load_tff_h5(str(tmp_path / "tr.h5"), str(tmp_path / "te.h5"), kind="emnist", crop=24)


def test_a_missing_tff_file_names_the_command_that_prepares_it(tmp_path):
  with pytest.raises(ValueError, match=r"the TFF stackoverflow data are not prepared.*"
                                       r"tff-datasets-public/stackoverflow.tar.bz2 \| tar -xj"):
    tff_h5.load_tff_h5(str(tmp_path / "so_train.h5"), str(tmp_path / "so_test.h5"), kind="stackoverflow")


def test_max_examples_per_client_keeps_the_first_ones(tmp_path):
  h5py = pytest.importorskip("h5py")
  with h5py.File(tmp_path / "tr.h5", "w") as f:
    f.create_group("examples/a").create_dataset(
      "tokens", data=np.asarray([f"w{i} x" for i in range(6)], dtype="S"))
  with h5py.File(tmp_path / "te.h5", "w") as f:
    f.create_group("examples/a").create_dataset("tokens", data=np.asarray([b"w0 x"]))
  data, _, extras = tff_h5.load_tff_h5(str(tmp_path / "tr.h5"), str(tmp_path / "te.h5"), kind="stackoverflow",
                                       seq_len=4, max_examples_per_client=4)
  assert int(data.n_train[0]) == 4
  words = [t for t in extras["vocab"][4:]]
  assert "w5" not in words and "w3" in words     # the vocabulary counts only the kept sentences


def test_generated_images_with_channels():
  d = prototype_images(num_clients=3, num_examples=60, num_classes=4, image_size=10, channels=3, seed=0)
  assert d.example_shape == (10, 10, 3)
  one = prototype_images(num_clients=3, num_examples=60, num_classes=4, image_size=10, seed=0)
  assert one.example_shape == (10, 10, 1)
  with pytest.raises(ValueError, match="channels=0"):
    prototype_images(channels=0)


def test_rows_and_the_final_table_carry_central_and_top_k():
  from fedtree.experiment.reporting import format_summary
  from fedtree.experiment.runner import round_metrics_of

  s = {"central_accuracy": 0.5, "central_loss": 1.5, "central_top5_accuracy": 0.8, "top5_accuracy": 0.9,
       "accuracy": 0.4, "loss": 2.0}
  row = round_metrics_of(s)
  assert row == {"accuracy": 0.4, "loss": 2.0, "central_accuracy": 0.5, "central_loss": 1.5,
                 "central_top5_accuracy": 0.8, "top5_accuracy": 0.9}
  table = format_summary({"fedavg": {"global": s}})
  header = table.splitlines()[2]
  assert "central" in header and "top5" in header and "0.5000" in table and "0.9000" in table
