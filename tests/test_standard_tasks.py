"""The published setups of configs/benchmarks: every hyperparameter equals the table its source
publishes (written here from the source, apart from fedtree.experiment.standard_tasks' copy), every
docstring cites its source and marks a published figure as the source's, every config runs shrunk
on files of the real schema written here (TFF h5, LEAF JSON, TFDS mocks), every ``:offline``
variant runs on generated data, and missing data or a model that does not fit are refused before
anything compiles."""

import json
import os

import jax
import ml_collections
import numpy as np
import pytest
from config_files import ROOT, load_config

from fedtree.experiment.builders import server_from_config
from fedtree.experiment.runner import make_context, train_and_evaluate

BENCHMARKS = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "configs", "benchmarks"))
                    if f.endswith(".py"))

# ------------------------------------------------------------------ the sources' tables
# google-research/federated optimization/docs/hyperparameters.md ("Default values" and "Best
# hyperparameters", base-10 logs), the tasks AFO (Reddi et al. 2021) reports.
AFO_DEFAULTS = {   # task: (clients per round, batch size, total rounds); client epochs 1
  "cifar100_image": (10, 20, 4000), "emnist_character": (10, 20, 1500),
  "shakespeare_character": (10, 4, 1200), "stackoverflow_word": (50, 16, 1500),
}
AFO_CLIENT_LR = {  # Fed...: Adam, Yogi, AvgM, Avg
  "cifar100_image": (-1.5, -1.5, -1.5, -1), "emnist_character": (-1.5, -1.5, -1.5, -1),
  "shakespeare_character": (0, 0, 0, 0), "stackoverflow_word": (-0.5, -0.5, -0.5, -0.5),
}
AFO_SERVER_LR = {
  "cifar100_image": (0, 0, 0, 0.5), "emnist_character": (-2.5, -2.5, -0.5, 0),
  "shakespeare_character": (-2, -2, -0.5, 0), "stackoverflow_word": (-2, -2, 0, 0),
}
AFO_EPSILON = {    # Adam, Yogi
  "cifar100_image": (-1, -1), "emnist_character": (-4, -4), "shakespeare_character": (-3, -3),
  "stackoverflow_word": (-5, -5),
}
AFO_CONFIG = {"cifar100_image": "afo_cifar100", "emnist_character": "afo_emnist",
              "shakespeare_character": "afo_shakespeare", "stackoverflow_word": "afo_stackoverflow"}
AFO_MODEL = {"cifar100_image": "resnet18_afo", "emnist_character": "emnist_cnn",
             "shakespeare_character": "shakespeare_lstm", "stackoverflow_word": "stackoverflow_lstm"}
METHODS = ("fedadam", "fedyogi", "fedavgm", "fedavg")


@pytest.mark.parametrize("task", sorted(AFO_CONFIG))
def test_afo_configs_equal_the_hyperparameter_tables(task):
  c = load_config(f"benchmarks/{AFO_CONFIG[task]}")
  cohort, batch, rounds = AFO_DEFAULTS[task]
  assert (c.rounds, c.local.batch_size, c.local.epochs, c.local.optimizer) == (rounds, batch, 1, "sgd")
  assert c.model.name == AFO_MODEL[task]
  assert set(c.runs) == set(METHODS)
  for i, method in enumerate(METHODS):
    run = c.runs[method]
    assert run.cohort_size == cohort and run.weighting == "examples", method
    assert run.local_learning_rate == pytest.approx(10.0 ** AFO_CLIENT_LR[task][i]), method
    server = run.server
    assert server.learning_rate == pytest.approx(10.0 ** AFO_SERVER_LR[task][i]), method
    if method in ("fedadam", "fedyogi"):   # Keras' defaults, accumulator 0 (the repository's README)
      assert server.tau == pytest.approx(10.0 ** AFO_EPSILON[task][i]), method
      assert (server.name, server.b1, server.b2, server.initial_accumulator, server.bias_correction) == (
        method, 0.9, 0.999, 0.0, True)
    else:
      assert server.name == method and server.get("momentum", 0.0) == (0.9 if method == "fedavgm" else 0.0)


def test_afo_task_specific_settings():
  so = load_config("benchmarks/afo_stackoverflow")
  # optimization/tasks/stackoverflow_nwp.py: vocab 10,000 (+ pad/OOV/BOS/EOS), 20 words, 1,000 sentences
  assert (so.data.vocab_size, so.data.seq_len, so.data.max_examples_per_client) == (10_004, 20, 1000)
  assert tuple(so.metrics.ignore_labels) == (1, 2, 3)             # accuracy_no_oov_or_eos
  assert load_config("benchmarks/afo_shakespeare").data.seq_len == 80
  c100 = load_config("benchmarks/afo_cifar100")
  assert (c100.data.crop, c100.data.normalize, c100.metrics.central) == (24, "per_image", True)


def keras_adam_or_yogi(kind, grads, lr, eps, b1=0.9, b2=0.999):
  """The reference code's server steps (Keras' Adam; utils/optimizers/yogi.py) on pseudo-gradients."""
  m = v = np.zeros_like(grads[0])
  x = np.zeros_like(grads[0])
  for t, g in enumerate(grads, start=1):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g if kind == "adam" else v + (1 - b2) * np.sign(g * g - v) * g * g
    x = x - lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m / (np.sqrt(v) + eps)
  return x


@pytest.mark.parametrize("method", ["fedadam", "fedyogi"])
def test_afo_adaptive_servers_step_as_the_reference_code(method):
  server_cfg = load_config("benchmarks/afo_emnist").runs[method].server
  opt = server_from_config(ml_collections.ConfigDict(server_cfg.to_dict()))
  grads = [np.array([0.3, -0.02, 1e-3]), np.array([0.1, 0.05, -2e-3]), np.array([-0.2, 0.0, 0.01])]
  params = np.zeros(3)
  state = opt.init(params)
  for g in grads:
    upd, state = opt.update(g, state, params)
    params = params + np.asarray(upd)
  want = keras_adam_or_yogi(method[3:], grads, server_cfg.learning_rate, server_cfg.tau)
  np.testing.assert_allclose(params, want, rtol=1e-4, atol=1e-9)


def test_leaf_config_equals_paper_experiments():
  # TalwalkarLab/leaf paper_experiments/femnist.sh and models/utils/args.py
  c = load_config("benchmarks/leaf_femnist")
  assert (c.local.learning_rate, c.local.batch_size, c.local.epochs, c.rounds) == (0.004, 10, 1, 2000)
  assert sorted(r.cohort_size for r in c.runs.values()) == [3, 35]
  assert {r.algorithm for r in c.runs.values()} == {"fedavg"} and {r.weighting for r in c.runs.values()} == {
    "examples"}
  assert (c.data.name, c.data.kind, c.model.name) == ("leaf", "femnist", "leaf_cnn")


@pytest.mark.parametrize("variant,partition", [(None, "dirichlet_balanced"), ("iid", "iid")])
def test_flgo_config_equals_flgo_bench(variant, partition):
  # WwZzz/FLGo-Bench README, CIFAR10 100 clients: proportion 0.2, batch 50, 5 epochs, 2,000 rounds,
  # train_holdout 0.2, FedAvg lr 0.1 (iid and dir0.1)
  c = load_config("benchmarks/flgo_cifar10", variant)
  assert (c.data.num_clients, c.data.partition, c.data.test_fraction, c.rounds) == (100, partition, 0.2, 2000)
  if variant is None:
    assert c.data.alpha == 0.1
  assert (c.local.learning_rate, c.local.batch_size, c.local.epochs) == (0.1, 50, 5)
  assert (c.runs.fedavg.cohort_size, c.runs.fedavg.weighting, c.model.name) == (20, "uniform", "flgo_cnn")
  assert c.metrics.central


@pytest.mark.parametrize("variant,rounds,partition", [(None, 1500, "iid"),
                                                      ("noniid", 3000, "dirichlet_balanced")])
def test_pfl_config_equals_pfl_research(variant, rounds, partition):
  # apple/pfl-research benchmarks/image_classification/configs/baseline.yaml and README
  c = load_config("benchmarks/pfl_cifar10", variant)
  assert (c.data.num_clients, c.data.partition, c.rounds) == (1000, partition, rounds)
  if variant == "noniid":
    assert (c.data.alpha, c.data.examples_per_client) == (0.1, 50)
  assert (c.local.learning_rate, c.local.batch_size, c.local.epochs) == (0.1, 10, 1)
  run = c.runs.fedavg
  assert (run.cohort_size, run.weighting) == (50, "uniform")
  assert (run.server.name, run.server.learning_rate) == ("fedavg", 1.0)
  assert (c.model.name, c.data.test_fraction, c.metrics.central) == ("cnn", 0.0, True)


def test_pfl_flair_config_equals_pfl_research():
  # apple/pfl-research benchmarks/flair/configs/baseline.yaml and train.py
  c = load_config("benchmarks/pfl_flair")
  assert (c.data.name, c.data.labels, c.data.central) == ("flair", "coarse", "val")
  assert (c.rounds, c.eval_every) == (5000, 20)
  assert (c.local.optimizer, c.local.learning_rate, c.local.batch_size) == ("sgd", 0.01, 16)
  assert c.local.epochs == 2
  run = c.runs.fedavg
  assert (run.algorithm, run.cohort_size, run.weighting) == ("fedavg", 200, "uniform")
  assert run.server.to_dict() == dict(name="adam", learning_rate=0.1, b1=0.9, b2=0.99, eps=0.01)
  assert c.model.to_dict() == dict(name="resnet18", stem="imagenet", groups=32, standardize="imagenet")
  assert c.metrics.central and load_config("benchmarks/pfl_flair", "store").data.dataset == "flair"


def test_flair_without_its_store_is_refused_naming_the_conversion_and_the_offline_variant():
  c = load_config("benchmarks/pfl_flair")
  c.data.path = "/nowhere/flair_federated.hdf5"
  with pytest.raises(ValueError, match=r"FLAIR .* streams from a store, which is not prepared: .*python -m "
                                       r"fedtree.convert .*configs/benchmarks/pfl_flair.py:offline"):
    make_context(c)


# ------------------------------------------------------------------ docstrings
@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_docstring_cites_its_source_data_and_command(name):
  import ast

  path = os.path.join(ROOT, "configs", "benchmarks", f"{name}.py")
  doc = ast.get_docstring(ast.parse(open(path).read()))
  for part in ("Source:", "Published figure", "Data:", "Prepare", "Differences from",
               f"--config=configs/benchmarks/{name}.py", f"configs/benchmarks/{name}.py:offline", ":offline"):
    assert part in doc, (name, part)
  figure = doc[doc.index("Published figure"):doc.index("Data:")]
  if "%" in figure:    # a number is quoted: it is the source's, not fedtree's
    assert "not fedtree's" in figure, name
  docs = open(os.path.join(ROOT, "docs", "standard-tasks.md")).read()
  assert f"configs/benchmarks/{name}.py" in docs, name


# ------------------------------------------------------------------ generated files of the real schema
def write_h5(path, kind, clients, seed=0):
  h5py = pytest.importorskip("h5py")
  rng = np.random.default_rng(seed)
  words = ["how", "do", "i", "sort", "a", "list", "in", "python", "java", "map"]
  with h5py.File(path, "w") as f:
    for cid, n in clients.items():
      g = f.create_group(f"examples/{cid}")
      if kind == "emnist":
        g.create_dataset("pixels", data=rng.random((n, 28, 28)).astype(np.float32))
        g.create_dataset("label", data=rng.integers(0, 62, n).astype(np.int32))
      elif kind == "shakespeare":
        g.create_dataset("snippets", data=np.asarray(
          [" ".join(rng.choice(words, 12)).encode() for _ in range(n)]))
      elif kind == "stackoverflow":
        g.create_dataset("tokens", data=np.asarray(
          [" ".join(rng.choice(words, 7)).encode() for _ in range(n)]))
      else:
        g.create_dataset("image", data=rng.integers(0, 256, (n, 32, 32, 3)).astype(np.uint8))
        g.create_dataset("label", data=rng.integers(0, 100, n).astype(np.int64))


def write_leaf_femnist(root, users):
  rng = np.random.default_rng(0)
  for split, frac in (("train", 1.0), ("test", 0.5)):
    os.makedirs(root / split, exist_ok=True)
    data = {u: {"x": rng.random((max(1, int(n * frac)), 784)).round(3).tolist(),
                "y": rng.integers(0, 62, max(1, int(n * frac))).tolist()} for u, n in users.items()}
    blob = {"users": list(users), "num_samples": [len(d["y"]) for d in data.values()], "user_data": data}
    (root / split / "all.json").write_text(json.dumps(blob))


TINY_MODEL = {   # the benchmark's model, with fewer channels or units
  "afo_cifar100": {"width": 4}, "afo_emnist": {"features": (4, 8), "dense": 8},
  "afo_shakespeare": {"hidden": 8}, "afo_stackoverflow": {"hidden": 8, "embed": 4, "projection": 4},
  "leaf_femnist": {"dense": 8}, "flgo_cifar10": {}, "pfl_cifar10": {"features": (4, 8), "dense": 8},
  "pfl_flair": {"width": 8, "groups": 4},
}


def shrunk(name, variant, tmp_path):
  """``configs/benchmarks/<name>.py[:variant]`` with its data written to ``tmp_path`` (or mocked:
  the caller wraps TFDS configs in ``tfds.testing.mock_data``), 1 round, small cohorts."""
  c = load_config(f"benchmarks/{name}", variant) if variant else load_config(f"benchmarks/{name}")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress, c.checkpoint_every = 1, 1, 1, False, 0
  c.plots = False
  c.eval_chunk_size = "2"
  for k, v in TINY_MODEL[name].items():
    c.model[k] = v
  offline = "offline" in (variant or "")
  if offline and c.data.name == "prototype_images":
    c.data.num_clients, c.data.num_examples = 6, 240
  elif offline:   # the stdlib corpus: fewer packages
    c.data.packages, c.data.min_sentences = ("json", "wsgiref"), 4
  elif c.data.name == "tff_h5":
    kind = c.data.kind
    write_h5(tmp_path / "tr.h5", kind, {"a": 6, "b": 4, "c": 5})
    test = {"x": 3, "y": 2} if kind == "cifar100" else {"a": 2, "b": 2, "c": 1}
    write_h5(tmp_path / "te.h5", kind, test, seed=1)
    c.data.train_path, c.data.test_path = str(tmp_path / "tr.h5"), str(tmp_path / "te.h5")
    c.data.cache_dir = None
  elif c.data.name == "leaf":
    write_leaf_femnist(tmp_path / "leaf", {"w0": 6, "w1": 4, "w2": 8, "w3": 5})
    c.data.root, c.data.cache_dir = str(tmp_path / "leaf"), None
  elif c.data.name == "store":   # the config's own data block, written and converted (FLAIR's HDF5)
    from test_population_store import write_flair

    from fedtree.convert import convert

    source = load_config(f"benchmarks/{name}").data
    write_flair(tmp_path / "flair.hdf5")
    source.path = str(tmp_path / "flair.hdf5")
    c.data.path = str(tmp_path / "store")
    convert(source.to_dict(), c.data.path, progress=False)
  elif c.data.name == "tfds":
    c.data.num_clients = 6
    if c.data.partition == "dirichlet_balanced":
      c.data.examples_per_client = 8
  for run in c.runs.values():
    run.cohort_size = 2
  return c


def run_shrunk(name, variant, tmp_path, only=None):
  c = shrunk(name, variant, tmp_path)
  if only:
    c.only = only
  if c.data.name == "tfds":
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=60, policy=tfds.testing.MockPolicy.USE_CODE):
      results = train_and_evaluate(c, str(tmp_path / "work"))
  else:
    results = train_and_evaluate(c, str(tmp_path / "work"))
  central = c.metrics.get("central", False)
  for label in (only.split(",") if only else list(c.runs)):
    s = results[label]["global"]
    key = "central_accuracy" if central else "accuracy"
    assert 0.0 <= s[key] <= 1.0, (name, label, s)
    assert np.isfinite(s["central_loss" if central else "loss"])
  return results


FAST = {"afo_shakespeare": "fedavg"}   # the others: test_every_benchmark_runs_shrunk_... (slow)


@pytest.mark.parametrize("name", sorted(FAST))
def test_a_benchmark_runs_shrunk_on_files_of_its_schema(name, tmp_path):
  run_shrunk(name, None, tmp_path, only=FAST[name])


@pytest.mark.slow
@pytest.mark.parametrize("name,variant", [(n, "store" if n == "pfl_flair" else None) for n in BENCHMARKS]
                         + [("flgo_cifar10", "iid"), ("pfl_cifar10", "noniid")])
def test_every_benchmark_runs_shrunk_on_files_of_its_schema(name, variant, tmp_path):
  """Every run of every config (its model with fewer channels), one round on written or mocked data
  through the real loaders."""
  results = run_shrunk(name, variant, tmp_path)
  if name == "afo_stackoverflow":   # special tokens left out: no OOV/EOS target counted
    assert results["fedavg"]["global"]["accuracy"] >= 0.0


def test_stackoverflow_accuracy_leaves_out_oov_bos_eos(tmp_path):
  """The shrunk Stack Overflow task scored with and without AFO's exclusions: the counts differ by
  exactly the OOV and EOS targets of the test sentences."""
  c = shrunk("afo_stackoverflow", None, tmp_path)
  ctx = make_context(c)
  y = np.asarray(ctx.data.y_test)
  real = (np.arange(y.shape[1])[None, :, None] < np.asarray(ctx.data.n_test)[:, None, None]) & (y != 0)
  special = real & np.isin(y, (1, 2, 3))
  assert special.sum() > 0 and (real & ~special).sum() > 0
  from fedtree.core.metrics import make_evaluator

  params = jax.tree.map(lambda a: a[None], ctx.model.init(jax.random.key(0)))
  moc = np.zeros(y.shape[0], np.int32)
  every = make_evaluator(ctx.model)(params, ctx.data.x_test, ctx.data.y_test, ctx.data.n_test, moc)
  afo = make_evaluator(ctx.model, ignore_labels=tuple(c.metrics.ignore_labels))(
    params, ctx.data.x_test, ctx.data.y_test, ctx.data.n_test, moc)
  assert float(np.sum(every.count)) == real.sum() and float(np.sum(afo.count)) == (real & ~special).sum()


# ------------------------------------------------------------------ offline variants
@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_offline_variant_loads_and_builds_without_files(name, tmp_path):
  c = shrunk(name, "offline", tmp_path)
  ctx = make_context(c)            # data generated or bundled, model built and checked, nothing compiled
  assert ctx.data.num_clients >= 2 and ctx.model.num_classes == ctx.data.num_classes


@pytest.mark.slow
@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_offline_variant_runs(name, tmp_path):
  c = shrunk(name, "offline", tmp_path)
  results = train_and_evaluate(c, str(tmp_path / "work"))
  for label in c.runs:
    assert 0.0 <= results[label]["global"]["accuracy"] <= 1.0


# ------------------------------------------------------------------ refused before anything compiles
@pytest.mark.parametrize("name,match", [
  ("afo_emnist", r"TFF emnist data are not prepared.*fed_emnist.tar.bz2"),
  ("afo_cifar100", r"TFF cifar100 data are not prepared.*fed_cifar100.tar.bz2"),
  ("leaf_femnist", r"LEAF femnist data are not prepared.*preprocess.sh -s niid --sf 0.05 -k 100 -t sample"),
])
def test_missing_data_is_refused_naming_the_command_that_prepares_it(name, match, tmp_path):
  c = load_config(f"benchmarks/{name}")
  if c.data.name == "leaf":
    c.data.root = str(tmp_path / "nowhere")
  else:
    c.data.train_path, c.data.test_path = str(tmp_path / "a.h5"), str(tmp_path / "b.h5")
  with pytest.raises(ValueError, match=match):
    train_and_evaluate(c, None)


def test_missing_tfds_data_is_refused_naming_the_command_that_prepares_it(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  c = load_config("benchmarks/pfl_cifar10")
  c.data.data_dir = str(tmp_path / "tfds")
  with pytest.raises(FileNotFoundError, match=r"'cifar10'.*not prepared.*tfds build cifar10 --data_dir="):
    train_and_evaluate(c, None)


@pytest.mark.parametrize("name,model,match", [
  ("afo_emnist", "vgg11", "'vgg11' takes images whose sides are between 32 and 63"),
  ("afo_emnist", "shakespeare_lstm", "'shakespeare_lstm' takes sentences"),
  ("afo_shakespeare", "fedavg_cnn", r"'fedavg_cnn' takes images \[H, W\] or \[H, W, C\]"),
  ("afo_cifar100", "lenet5", None),                           # 24x24x3 fits LeNet-5: accepted
])
def test_a_model_that_does_not_fit_the_data_is_refused_by_name(name, model, match, tmp_path):
  c = shrunk(name, "offline", tmp_path)
  c.model = ml_collections.ConfigDict(dict(name=model))
  if match is None:
    assert make_context(c).model.num_classes == 100
    return
  with pytest.raises(ValueError, match=match):
    make_context(c)


def test_a_language_model_on_real_valued_data_is_refused():
  from fedtree.core.data import check_model_inputs
  from fedtree.datasets.prototypes import prototype_images
  from fedtree.models.lm import build_lm

  data = prototype_images(num_clients=2, num_examples=20, image_size=4)
  flat = data.replace(x_train=np.asarray(data.x_train).reshape(2, -1, 16),
                      x_test=np.asarray(data.x_test).reshape(2, -1, 16))
  model = build_lm("lstm_lm", example_shape=(16,), num_classes=10, hidden=4, embed=4)
  with pytest.raises(ValueError, match=r"reads token ids \(integers, input_dtype=int32\).*are float32"):
    check_model_inputs(model, flat)


def test_a_run_sets_its_own_client_learning_rate(tmp_path):
  """``local_learning_rate`` (fedavg / fedopt): the run's clients step at that rate, the config's
  other runs at ``config.local.learning_rate``."""
  import jax.numpy as jnp

  from fedtree.experiment import registry

  c = shrunk("afo_emnist", "offline", tmp_path)
  ctx = make_context(c)
  g = {"w": jnp.ones(3)}
  for label in ("fedadam", "fedavg"):
    opt = registry.factory_kwargs(label, c.runs[label], ctx)["local_optimizer"]
    step, _ = opt.update(g, opt.init(g), g)
    np.testing.assert_allclose(np.asarray(step["w"]), -c.runs[label].local_learning_rate, rtol=1e-6)
  assert c.runs.fedadam.local_learning_rate != c.local.learning_rate
