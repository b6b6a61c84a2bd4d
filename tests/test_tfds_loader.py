"""The TFDS loader, on data mocked by ``tfds.testing.mock_data`` (no download, no TensorFlow)."""

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from fedtree.core.topology import Topology  # noqa: E402
from fedtree.datasets.tfds_loader import load_tfds  # noqa: E402


def test_mnist_dirichlet_with_teams_and_central_test():
  with tfds.testing.mock_data(num_examples=120, policy=tfds.testing.MockPolicy.USE_CODE):
    data, groups, central = load_tfds(name="mnist", num_clients=6, partition="dirichlet",
                                      alpha=1.0, test_fraction=0.25, team_size=3, seed=0)
  assert data.num_clients == 6 and data.example_shape == (28, 28, 1) and data.num_classes == 10
  assert int(np.asarray(data.n_train).sum() + np.asarray(data.n_test).sum()) == 120
  assert float(np.asarray(data.x_train).max()) <= 1.0
  np.testing.assert_array_equal(groups, [0, 0, 0, 1, 1, 1])
  data.validate(Topology.from_labels(groups))
  x, y = central
  assert x.shape == (120, 28, 28, 1) and y.shape == (120,)


@pytest.mark.parametrize("partition", ["iid", "shards"])
def test_other_partitions(partition):
  with tfds.testing.mock_data(num_examples=60, policy=tfds.testing.MockPolicy.USE_CODE):
    data, groups, _ = load_tfds(name="mnist", num_clients=5, partition=partition, num_groups=2,
                                test_split=None)
  assert data.num_clients == 5 and sorted(set(groups.tolist())) == [0, 1]


def test_loader_errors():
  with pytest.raises(ValueError, match="partition='ring'"):
    load_tfds(partition="ring")
  with pytest.raises(ValueError, match="needs config.data.id_feature"):
    load_tfds(partition="by_id")
  with pytest.raises(FileNotFoundError, match="not prepared"):
    load_tfds(name="mnist", data_dir="/nonexistent/tfds")


def test_a_missing_dataset_is_never_downloaded(tmp_path, capfd, monkeypatch):
  """Issue 42 item 5: an empty data_dir is refused naming the dataset, the folder searched and the
  command that prepares it; TFDS is asked with download=False and writes nothing there."""
  calls = []
  real = tfds.data_source

  def spy(*args, **kwargs):
    calls.append(kwargs)
    return real(*args, **kwargs)

  monkeypatch.setattr(tfds, "data_source", spy)
  with pytest.raises(FileNotFoundError) as e:
    load_tfds(name="mnist", data_dir=str(tmp_path))
  message = str(e.value)
  assert f"TFDS dataset 'mnist' (split 'train') is not prepared in config.data.data_dir='{tmp_path}'" \
    in message
  assert f"(searched {tmp_path}/mnist/" in message
  assert f"`tfds build mnist --data_dir={tmp_path} --file_format=array_record`" in message
  assert calls and all(c.get("download") is False for c in calls)
  assert list(tmp_path.iterdir()) == []
  assert "Downloading" not in "".join(capfd.readouterr())


def test_the_prepare_command_and_default_folder():
  from fedtree.datasets.tfds_loader import prepare_command, searched_dir

  assert prepare_command("mnist", None) == "tfds build mnist --file_format=array_record"
  assert searched_dir("mnist", "/d").startswith("/d/mnist/")
  assert searched_dir("not_a_tfds_dataset_x", "/d") == "/d"
