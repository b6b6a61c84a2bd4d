"""GroupPerFL (paper 000): fine-tuning sweep, group stage, costs, pipeline and its config."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference_personalization as ref
from config_files import load_config
from helpers import close, count_traces, row

from fedtree import experiment
from fedtree.algorithms.hierarchical.grouppfl.grouppfl import group_fedopt
from fedtree.core import finetune, loop
from fedtree.core.data import as_device
from fedtree.core.local import ClientData, LocalSchedule
from fedtree.core.metrics import evaluate
from fedtree.core.rng import stream
from fedtree.core.server import fedopt
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.experiment.registry import BUILDERS
from fedtree.experiment.reporting import Reporter

B = 4


def tiny_config(**run_overrides):
  c = load_config("group_personalized")
  c.rounds = 2
  c.rounds_per_call = 2
  c.progress = False
  c.data.group_sizes = (4, 2, 1)
  c.data.dim = 4
  c.data.num_classes = 3
  c.data.mean_examples = 6.0
  c.data.max_examples = 10
  c.data.test_examples = 4
  c.model.hidden = (4,)
  c.local.batch_size = B
  c.runs.grouppfl.group_rounds = 2
  c.runs.grouppfl.cohort_size = 2
  c.runs.grouppfl.finetune.epochs = 2
  c.runs.grouppfl.finetune.learning_rates = (0.01, 0.3)
  for k, v in run_overrides.items():
    c.runs.grouppfl[k] = v
  return c


@pytest.fixture(scope="module")
def small():
  data, groups = grouped_synthetic(group_sizes=(3, 2), dim=4, num_classes=3, mean_examples=8,
                                   min_examples=3, max_examples=11, test_examples=4, seed=2)
  data = as_device(data)
  from fedtree.models import build_model

  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(4,))
  return data, groups, model


# ------------------------------------------------------------------------ fine-tuning
def test_finetune_sweep_matches_per_client_per_rate_loop(small):
  data, groups, model = small
  params = jax.vmap(model.init)(jax.random.split(jax.random.key(0), 2))  # one model per group
  schedule = LocalSchedule(batch_size=B, epochs=2)
  rates = (0.01, 0.5, 1.0)
  key = jax.random.key(3)
  personal, epochs = finetune.finetune(model, params, groups, data, learning_rates=rates,
                                       schedule=schedule, key=key)
  assert jax.tree.leaves(personal)[0].shape[:2] == (3, data.num_clients)
  steps = schedule.num_steps(np.asarray(data.n_train))
  for c in range(data.num_clients):
    cd = ClientData(data.x_train[c], data.y_train[c], data.n_train[c])
    for i, lr in enumerate(rates):
      want = ref.sgd(model, row(params, groups[c]), cd, int(steps[c]), jax.random.fold_in(key, c),
                     lr=lr, batch_size=B)
      close(row(personal, i, c), want)
  np.testing.assert_allclose(np.asarray(epochs), 2.0)  # K_l epochs, counted from the steps run
  # Evaluating inside the program equals evaluating the returned models.
  stats, _ = finetune.finetune_evaluate(model, params, groups, data, learning_rates=rates,
                                        schedule=schedule, key=key, chunk_size=2)
  for i in range(len(rates)):
    direct = evaluate(model, row(personal, i), data.x_test, data.y_test, data.n_test)
    close(finetune.take_rate(stats, i), direct, tol=1e-4)


def test_finetune_sweep_compiles_once(small):
  data, groups, model = small
  params = jax.vmap(model.init)(jax.random.split(jax.random.key(0), 2))
  run = finetune.make_finetuner(model, LocalSchedule(batch_size=B, epochs=1),
                                max_train=data.max_train)
  for rates in ([0.1, 0.2], [0.3, 0.4]):
    run(params, jnp.asarray(groups), data, jnp.asarray(rates), jax.random.key(0))
  assert run._cache_size() == 1


def test_best_rate():
  stats = finetune.EvalStats(loss_sum=jnp.array([[4.0, 4.0], [1.0, 1.0], [9.0, 9.0]]),
                             correct=jnp.array([[1.0, 1.0], [1.0, 2.0], [2.0, 2.0]]),
                             count=jnp.full((3, 2), 2.0))
  assert finetune.best_rate(stats, "loss") == 1
  assert finetune.best_rate(stats, "accuracy") == 2
  with pytest.raises(ValueError, match="select_by='f1'"):
    finetune.best_rate(stats, "f1")


@pytest.mark.parametrize("kwargs,match", [
  (dict(schedule=LocalSchedule(batch_size=B, epochs=None, steps=0)), "fine-tune steps=0"),
  (dict(learning_rates=(0.1, -1.0)), "finetune_learning_rate=-1.0"),
  (dict(learning_rates=()), "empty"),
])
def test_finetune_bad_hyperparameters(small, kwargs, match):
  data, groups, model = small
  args = dict(learning_rates=(0.1,), schedule=LocalSchedule(batch_size=B, epochs=1),
              key=jax.random.key(0))
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    finetune.finetune(model, jax.tree.map(lambda a: a[None], model.init(jax.random.key(0))),
                      np.zeros(data.num_clients, np.int32), data, **args)


# ------------------------------------------------------------------------ group stage
def test_group_stage_is_fedadam_per_group_without_mixing(small):
  """Every group's model after a round = its own FedAdam on its own clients' updates."""
  data, groups, model = small
  schedule = LocalSchedule(batch_size=B, epochs=1)
  server = fedopt("adam", learning_rate=0.05)
  start = model.init(jax.random.key(1))
  alg = group_fedopt(model=model, groups=groups, data=data, local_optimizer=optax.sgd(0.1),
                     schedule=schedule, server_optimizer=server, start_params=start)
  state = alg.init(jax.random.key(0))
  key = jax.random.key(5)
  new, metrics = jax.jit(alg.round)(state, data, key)
  tkey = stream(key, "train")
  steps = schedule.num_steps(np.asarray(data.n_train))
  n = np.asarray(data.n_train, np.float64)
  for g in range(2):
    members = np.flatnonzero(groups == g)
    thetas = [ref.sgd(model, start, ClientData(data.x_train[c], data.y_train[c], data.n_train[c]),
                      int(steps[c]), jax.random.fold_in(tkey, c), lr=0.1, batch_size=B)
              for c in members]
    w = n[members] / n[members].sum()
    delta = jax.tree.map(
      lambda s, *t, w=w: s - sum(wi * ti for wi, ti in zip(w, t, strict=True)), start, *thetas
    )
    upd, _ = server.update(delta, server.init(start), start)
    close(row(new.params[1], g), optax.apply_updates(start, upd))
  # Costs: every client trained once (cohort = whole group): 2 transfers, 1 epoch.
  costs = new.client_state.costs
  np.testing.assert_array_equal(np.asarray(costs.transfers), 2.0)
  np.testing.assert_allclose(np.asarray(costs.epochs), 1.0)
  assert int(metrics["clients_trained"]) == data.num_clients


def test_group_stage_costs_count_sampled_clients_only(small):
  data, groups, model = small
  alg = group_fedopt(model=model, groups=groups, data=data, local_optimizer=optax.sgd(0.1),
                     schedule=LocalSchedule(batch_size=B, epochs=2), cohort_size=1,
                     server_optimizer=fedopt("adam", learning_rate=0.01))
  counted, traces = count_traces(alg)
  state = loop.run(counted, data, num_rounds=5, key=jax.random.key(0),
                         rounds_per_call=1)
  assert len(traces) == 1  # the group round compiles once
  costs = state.client_state.costs
  # One client per group per round: 2 groups x 5 rounds participations in all.
  assert int(np.sum(np.asarray(costs.rounds))) == 10
  np.testing.assert_allclose(np.asarray(costs.transfers), 2.0 * np.asarray(costs.rounds))
  np.testing.assert_allclose(np.asarray(costs.epochs), 2.0 * np.asarray(costs.rounds))


def test_group_stage_does_not_depend_on_chunking(small):
  data, groups, model = small
  out = []
  for chunk in (None, 2):
    alg = group_fedopt(model=model, groups=groups, data=data, local_optimizer=optax.sgd(0.1),
                       schedule=LocalSchedule(batch_size=B, epochs=1), cohort_size=2,
                       chunk_size=chunk, server_optimizer=fedopt("adam", learning_rate=0.01))
    out.append(loop.run(alg, data, num_rounds=2, key=jax.random.key(3), rounds_per_call=2))
  close(out[0].params, out[1].params, tol=1e-6)
  close(out[0].client_state, out[1].client_state)


# ------------------------------------------------------------------------ the pipeline
def _run(config, workdir=None):
  ctx = experiment.make_context(config)
  run = experiment.resolve("grouppfl", config.runs.grouppfl, ctx)
  alg = run.algorithm
  assert alg.report is not None and alg.rounds is not None  # one algorithm: stages + report
  assert run.rounds == alg.rounds
  _, out = experiment.run_algorithm(run, jax.random.key(0), Reporter(workdir, show_progress=False),
                                    eval_every=1, rounds_per_call=1)
  return out, ctx


def _same_stats(a, b):
  for k in ("client_loss", "client_accuracy"):
    np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7, equal_nan=True)


def test_group_stage_with_no_rounds_changes_nothing():
  """T_g = 0: GroupFL = FL and GroupPerFL = PerFL, with several groups or with one."""
  for sizes in ((4, 2, 1), (5,)):
    c = tiny_config(group_rounds=0)
    c.data.group_sizes = sizes
    out, _ = _run(c)
    _same_stats(out["GroupFL"], out["FL"])
    _same_stats(out["GroupPerFL"], out["PerFL"])
    assert out["GroupPerFL"]["rate"] == out["PerFL"]["rate"]
    assert out["GroupPerFL"]["costs"] == out["PerFL"]["costs"]


def test_bad_pipeline_hyperparameters():
  c = tiny_config()
  c.runs.grouppfl.finetune.epochs = 0
  ctx = experiment.make_context(tiny_config())
  with pytest.raises(ValueError, match="finetune.epochs=0"):
    BUILDERS["grouppfl"](c.runs.grouppfl, ctx)
  c = tiny_config()
  c.runs.grouppfl.finetune.learning_rates = (0.1, -0.01)
  with pytest.raises(ValueError, match="-0.01"):
    BUILDERS["grouppfl"](c.runs.grouppfl, ctx)
  c = tiny_config(group_rounds=-1)
  with pytest.raises(ValueError, match="group_rounds=-1"):
    BUILDERS["grouppfl"](c.runs.grouppfl, ctx)
  c = tiny_config(stages=("group", "finetune"))
  with pytest.raises(ValueError, match="stages"):
    BUILDERS["grouppfl"](c.runs.grouppfl, ctx)


def test_group_personalized_config_end_to_end(tmp_path):
  """The shipped config, shrunk: four methods, costs as counted, reports on disk."""
  config = tiny_config()
  results = experiment.train_and_evaluate(config, str(tmp_path))
  out = results["grouppfl"]
  assert list(out) == ["FL", "PerFL", "GroupFL", "GroupPerFL"]
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert "GroupPerFL" in summary["grouppfl"]
  groups = np.asarray(grouped_synthetic(**{k: v for k, v in config.data.items() if k != "name"})[1])
  k = np.minimum(np.bincount(groups), 2)  # cohort 2 per group in the group stage, 2 in all globally
  t, tg, kl, n = 2, 2, 2, len(groups)
  total = {m: {f: float(np.sum(v)) for f, v in out[m]["client_costs"].items()} for m in out}
  assert total["FL"]["rounds"] == t * 2
  assert total["GroupFL"]["rounds"] == t * 2 + tg * k.sum()
  assert total["GroupFL"]["transfers"] == 2 * total["GroupFL"]["rounds"]
  assert total["PerFL"]["transfers"] == total["FL"]["transfers"]  # fine-tuning is local
  assert total["PerFL"]["epochs"] == pytest.approx(total["FL"]["epochs"] + kl * n)
  assert total["GroupPerFL"]["epochs"] == pytest.approx(total["GroupFL"]["epochs"] + kl * n)
  assert out["GroupFL"]["group_accuracy"].shape == (3,)
  assert np.isfinite(out["GroupPerFL"]["perplexity"])
  text = (tmp_path / "grouppfl_report.md").read_text()
  assert "perplexity per group" in text and "communication (models)" in text
  assert (tmp_path / "grouppfl_fig1.png").stat().st_size > 1000


# ------------------------------------------------------------------------ reports
def test_report_pieces(tmp_path):
  from fedtree.algorithms.hierarchical.grouppfl import report as pr

  change = pr.relative_change(np.array([2.0, 0.0, np.nan, 4.0]), np.array([1.0, 1.0, 1.0, 5.0]))
  np.testing.assert_allclose(change, [-0.5, np.nan, np.nan, 0.25])
  groups = np.array([0, 0, 1])
  summary = {
    "accuracy": 0.5, "perplexity": 2.0, "group_accuracy": np.array([0.25, 1.0]),
    "group_perplexity": np.array([3.0, 1.5]), "client_perplexity": np.array([2.0, 4.0, 1.0]),
    "client_costs": {"transfers": np.array([2.0, 4.0, 6.0]), "epochs": np.array([1.0, 2.0, 3.0])},
  }
  better = dict(summary, client_perplexity=np.array([1.0, 5.0, 0.5]))
  text = pr.write_reports(str(tmp_path), {"PerFL": summary, "GroupPerFL": better}, groups=groups,
                          group_names=("big", "small"), histogram_group=0,
                          data_counts=(np.array([5, 7, 2]), np.array([1, 1, 1])))
  assert "| big | 2 | 12 | 2 | 6 |" in text            # data table: clients, train, test, median
  assert "| big | 2 | 25.00 | 25.00 |" in text          # accuracy in %
  assert "| small | communication (models) | 6.00 | 6.00 |" in text
  assert "group big: 50.0% of 2 clients improve perplexity" in text
  assert (tmp_path / "grouppfl_fig1.png").exists()
  assert "communication (MB)" not in text   # no model size given
  text = pr.render_reports({m: dict(r, model_bytes=250_000) for m, r in (("PerFL", summary),)},
                           groups=groups, group_names=("big", "small"))[0]
  assert "| small | communication (MB) | 1.5 |" in text   # 6 transfers of a 0.25 MB model


def test_group_personalized_config_accepts_a_tfds_dataset(tmp_path):
  """The same config on a real dataset (MNIST through the TFDS loader, mocked): only
  config.data (and the model) change; groups come from the loader."""
  tfds = pytest.importorskip("tensorflow_datasets")
  import ml_collections

  c = tiny_config()
  c.data = ml_collections.ConfigDict(dict(
    name="tfds", dataset="mnist", num_clients=6, partition="dirichlet", alpha=1.0,
    num_groups=3, test_fraction=0.25, test_split=None, seed=0,
  ))
  with tfds.testing.mock_data(num_examples=90, policy=tfds.testing.MockPolicy.USE_CODE):
    results = experiment.train_and_evaluate(c, str(tmp_path))
  out = results["grouppfl"]
  assert list(out) == ["FL", "PerFL", "GroupFL", "GroupPerFL"]
  assert out["GroupPerFL"]["group_accuracy"].shape == (3,)
