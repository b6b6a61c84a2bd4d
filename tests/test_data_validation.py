"""Validation at the edge: bad data are refused, naming the client and the value, before
anything compiles (labels outside [0, num_classes), a model whose outputs differ from the
data's classes, clients without training examples, non-finite inputs)."""

import dataclasses

import ml_collections
import numpy as np
import pytest

from fedtree.core.data import check_model_outputs, from_client_arrays
from fedtree.core.ragged import to_ragged_train
from fedtree.models import build_model


def clients(sizes=(4, 3, 5), k=3, dim=2, seed=0):
  rng = np.random.default_rng(seed)
  train = [(rng.normal(size=(n, dim)).astype(np.float32), rng.integers(0, k, n).astype(np.int32))
           for n in sizes]
  return train, [(x[:2].copy(), y[:2].copy()) for x, y in train]


def test_good_data_pass_and_padding_is_not_checked():
  train, test = clients()
  data = from_client_arrays(train, test, num_classes=3)
  # padding rows may hold anything: they are never trained on nor evaluated
  x, y = np.asarray(data.x_train).copy(), np.asarray(data.y_train).copy()
  x[1, 3:] = np.nan
  y[1, 3:] = 99
  dataclasses.replace(data, x_train=x, y_train=y).check_values()


@pytest.mark.parametrize("split", ["train", "test"])
def test_a_label_outside_the_classes_names_the_client_and_label(split):
  train, test = clients()
  (train if split == "train" else test)[2][1][1] = 7
  message = rf"client 2: label 7 in y_{split} is outside \[0, 3\) \(num_classes=3\)"
  with pytest.raises(ValueError, match=message):
    from_client_arrays(train, test, num_classes=3)
  (train if split == "train" else test)[2][1][1] = -1
  with pytest.raises(ValueError, match=rf"client 2: label -1 in y_{split}"):
    from_client_arrays(train, test, num_classes=3)


def test_labels_of_a_ragged_split_name_their_client():
  train, test = clients()
  data = to_ragged_train(from_client_arrays(train, test, num_classes=3))
  y = np.asarray(data.y_train).copy()
  y[int(data.train_offset[1]) + 1] = 5
  with pytest.raises(ValueError, match=r"client 1: label 5 in y_train"):
    dataclasses.replace(data, y_train=y).validate()


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_non_finite_input_names_the_client_example_and_value(value):
  train, test = clients()
  train[1][0][2, 1] = value
  with pytest.raises(ValueError, match=rf"client 1: x_train example 2 holds a non-finite input \({value}\)"):
    from_client_arrays(train, test, num_classes=3)
  train, test = clients()
  test[0][0][1, 0] = value
  with pytest.raises(ValueError, match=r"client 0: x_test example 1 holds a non-finite input"):
    from_client_arrays(train, test, num_classes=3)


def test_a_non_finite_input_of_a_ragged_split_names_its_client():
  train, test = clients()
  data = to_ragged_train(from_client_arrays(train, test, num_classes=3))
  x = np.asarray(data.x_train).copy()
  x[int(data.train_offset[2]) + 3, 0] = np.nan
  with pytest.raises(ValueError, match=r"client 2: x_train flat row 10 holds a non-finite input \(nan\)"):
    dataclasses.replace(data, x_train=x).check_values()


def test_a_client_without_training_examples_is_named():
  train, test = clients()
  train[1] = (train[1][0][:0], train[1][1][:0])
  with pytest.raises(ValueError, match=r"client\(s\) \[1\] have no training examples"):
    from_client_arrays(train, test, num_classes=3)


def test_a_model_whose_outputs_differ_from_the_classes_is_refused():
  train, test = clients()
  data = from_client_arrays(train, test, num_classes=3)
  model = build_model("mlp", example_shape=(2,), num_classes=3, hidden=(4,))
  check_model_outputs(model, data)
  for k in (2, 5):  # fewer and more outputs than classes
    other = build_model("mlp", example_shape=(2,), num_classes=k, hidden=(4,))
    with pytest.raises(ValueError, match=rf"num_classes={k} but the data has 3 classes"):
      check_model_outputs(other, data)
    # a model that claims 3 classes but outputs k logits
    with pytest.raises(ValueError, match=rf"outputs {k} logits per example .* the data has 3 classes"):
      check_model_outputs(other._replace(num_classes=3), data)


def config_with_labels(tmp_path, labels_max):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(40, 3)).astype(np.float32)
  y = (np.arange(40) % (labels_max + 1)).astype(np.int32)
  np.savez(tmp_path / "d.npz", x=x, y=y, client=np.arange(40) % 4)
  return ml_collections.ConfigDict(dict(
    seed=0, rounds=1, eval_every=1, rounds_per_call=1, progress=False, plots=False,
    data=dict(name="arrays", path=str(tmp_path / "d.npz"), num_classes=3),
    topology=dict(kind="flat"), model=dict(name="logreg"),
    local=dict(optimizer="sgd", learning_rate=0.1, batch_size=4, steps=1),
    runs=dict(fedavg=dict(algorithm="fedavg"))))


def test_the_config_path_refuses_before_compiling(tmp_path, monkeypatch):
  from fedtree.experiment import runner

  compiled = []
  monkeypatch.setattr(runner, "run_algorithm", lambda *a, **k: compiled.append(1))
  with pytest.raises(ValueError, match=r"client \d: label [34] in y_(train|test) is outside \[0, 3\)"):
    runner.train_and_evaluate(config_with_labels(tmp_path, 4), None)
  assert not compiled


def test_an_algorithm_factory_refuses_a_model_with_other_outputs():
  """The Python path: the factory's local training is built with the model and the data."""
  import optax
  from helpers import tiny_mlp_problem

  from fedtree.algorithms import fedavg

  data, model, schedule = tiny_mlp_problem()
  fedavg(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule)
  wide = build_model("mlp", example_shape=data.example_shape, num_classes=5, hidden=(4,))
  with pytest.raises(ValueError, match=r"num_classes=5 but the data has 3 classes"):
    fedavg(model=wide, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule)
