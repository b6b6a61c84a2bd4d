"""Initial weights from a file (fedtree.experiment.params): ``config.init_params`` and
``config.runs.<label>.init_params``, saved as a flat .npz or an orbax directory."""

import jax
import ml_collections
import numpy as np
import optax
import pytest
from config_files import load_config
from helpers import trees_equal

from fedtree import algorithms, evaluation
from fedtree.core import loop
from fedtree.core.local import LocalSchedule
from fedtree.experiment import runner
from fedtree.experiment.params import check_params, flatten_params, load_params, save_params
from fedtree.experiment.registry import build_algorithm
from fedtree.models import build_model


def _model(hidden=(8,)):
  return build_model("mlp", example_shape=(4,), num_classes=3, hidden=hidden)


def test_npz_and_orbax_round_trip(tmp_path):
  model = _model()
  p = model.init(jax.random.key(1))
  path = save_params(str(tmp_path / "p.npz"), p)
  with np.load(path) as z:
    assert sorted(z.files) == ["Dense_0/bias", "Dense_0/kernel", "Dense_1/bias", "Dense_1/kernel"]
  trees_equal(load_params(path, model), p)
  trees_equal(load_params(save_params(str(tmp_path / "orbax"), p), model), p)
  # leaves are cast to the model's dtypes
  wide = {k: v.astype(np.float64) for k, v in flatten_params(p).items()}
  like = jax.eval_shape(model.init, jax.random.key(0))
  got = check_params(wide, like)
  assert all(a.dtype == np.float32 for a in jax.tree.leaves(got))
  trees_equal(got, p)


def test_mismatched_params_are_refused_by_leaf(tmp_path):
  path = save_params(str(tmp_path / "wide.npz"), _model((8,)).init(jax.random.key(0)))
  with pytest.raises(ValueError, match=r"leaf 'Dense_0/bias' has shape \(8,\), the model's has shape \(6,\)"):
    load_params(path, _model((6,)))
  with pytest.raises(ValueError, match=r"leaf 'Dense_1/bias' has shape \(3,\), the model's has shape \(8,\)"):
    load_params(path, _model((8, 8)))
  flat = flatten_params(_model((8,)).init(jax.random.key(0)))
  del flat["Dense_1/kernel"]
  with open(tmp_path / "partial.npz", "wb") as f:
    np.savez(f, **flat)
  with pytest.raises(ValueError, match=r"has no leaf 'Dense_1/kernel' \(the model's has shape \(8, 3\)\)"):
    load_params(str(tmp_path / "partial.npz"), _model((8,)))
  flat["Dense_1/kernel"] = np.zeros((8, 3), np.float32)
  flat["Dense_2/kernel"] = np.zeros((3, 3), np.float32)
  with open(tmp_path / "extra.npz", "wb") as f:
    np.savez(f, **flat)
  with pytest.raises(ValueError, match=r"leaves the model lacks: \['Dense_2/kernel'\]"):
    load_params(str(tmp_path / "extra.npz"), _model((8,)))
  with pytest.raises(FileNotFoundError, match="nowhere.npz"):
    load_params(str(tmp_path / "nowhere.npz"), _model())
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match="not an orbax checkpoint"):
    load_params(str(tmp_path / "empty"), _model())


def _tiny():
  c = load_config("quickstart")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress, c.plots = 1, 1, 1, False, False
  c.checkpoint_every, c.chunk_size = 0, None
  c.data.group_sizes, c.data.max_examples, c.data.test_examples = (3, 2), 24, 10
  c.model.hidden = (8,)
  c.runs = ml_collections.ConfigDict({"fedavg": dict(algorithm="fedavg", cohort_size=3)})
  c.run_order = ("fedavg",)
  return c


def _library_fedavg(c, ctx, start):
  """FedAvg of ``_tiny()``'s run called directly, from ``init_params=start``."""
  return algorithms.fedavg(model=ctx.model, data=ctx.data, local_optimizer=optax.sgd(c.local.learning_rate),
                           schedule=LocalSchedule(batch_size=c.local.batch_size, epochs=1),
                           cohort_size=3, chunk_size=None, init_params=start)


def test_config_and_run_init_params_start_every_run_as_the_library_call(tmp_path):
  c = _tiny()
  model = runner.make_context(c).model
  p, q = model.init(jax.random.key(7)), model.init(jax.random.key(8))
  c.init_params = save_params(str(tmp_path / "p.npz"), p)                 # every run
  c.runs.from_q = dict(algorithm="fedavg", cohort_size=3,
                       init_params=save_params(str(tmp_path / "q.npz"), q))   # this run
  runner.validate_config(c)
  ctx = runner.make_context(c)
  key = jax.random.key(0)
  for label, start in (("fedavg", p), ("from_q", q)):
    built = build_algorithm(label, c.runs[label], ctx)
    trees_equal(built.init(key), _library_fedavg(c, ctx, start).init(key))
  first = build_algorithm("fedavg", c.runs.fedavg, ctx).init(key).params[0]
  trees_equal(jax.tree.map(lambda a: a[0], first), p)


@pytest.mark.slow
def test_run_from_saved_params_equals_the_library_call(tmp_path):
  c = _tiny()
  ctx = runner.make_context(c)
  p = ctx.model.init(jax.random.key(7))
  c.init_params = save_params(str(tmp_path / "p.npz"), p)
  got = runner.train_and_evaluate(c, str(tmp_path / "work"))["fedavg"]["global"]
  alg = _library_fedavg(c, ctx, p)
  state = loop.run(alg, ctx.data, num_rounds=int(c.rounds), key=jax.random.key(c.seed))
  want = evaluation.evaluate_models(alg, state, ctx.model, ctx.data, groups=ctx.groups)["global"]
  assert got["accuracy"] == pytest.approx(want["accuracy"], abs=1e-7)
  assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
  c.init_params = None
  plain = runner.train_and_evaluate(c, str(tmp_path / "plain"))["fedavg"]["global"]
  assert plain["loss"] != got["loss"]


def test_config_init_params_errors_name_the_field(tmp_path):
  c = _tiny()
  c.init_params = 3
  with pytest.raises(ValueError, match=r"config.init_params=3; it must be the path"):
    runner.make_context(c)
  c = _tiny()
  c.init_params = save_params(str(tmp_path / "other.npz"), _model((5,)).init(jax.random.key(0)))
  with pytest.raises(ValueError, match=r"other.npz'.*leaf 'Dense_0/bias' has shape \(5,\), the model's has "
                                       r"shape \(8,\)"):
    runner.make_context(c)
  c = _tiny()
  c.runs.fedavg.init_params = 5
  with pytest.raises(ValueError, match=r"config.runs.fedavg.init_params=5; it must be the path"):
    build_algorithm("fedavg", c.runs.fedavg, runner.make_context(c))
