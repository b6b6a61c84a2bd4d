"""data.name="arrays": per-client arrays from .npz files written by the test, in every layout,
and from the command line (configs/own_data.py)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from config_files import load_config

from fedtree.core.data import from_client_arrays
from fedtree.datasets.arrays import load_arrays, save_arrays
from fedtree.experiment.data import load_with_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def per_client(sizes=(6, 9, 4, 7), k=3, seed=0):
  rng = np.random.default_rng(seed)
  train = [(rng.normal(size=(n, 2, 2)).astype(np.float32), rng.integers(0, k, n).astype(np.int32))
           for n in sizes]
  test = [(x[:2] + 1, y[:2]) for x, y in train]
  return train, test


def same_clients(data, train, test):
  for c, ((x, y), (xt, yt)) in enumerate(zip(train, test, strict=True)):
    np.testing.assert_array_equal(data.x_train[c, :data.n_train[c]], x)
    np.testing.assert_array_equal(data.y_train[c, :data.n_train[c]], y)
    np.testing.assert_array_equal(data.x_test[c, :data.n_test[c]], xt)
    np.testing.assert_array_equal(data.y_test[c, :data.n_test[c]], yt)


def test_padded_round_trip_with_two_level_groups(tmp_path):
  train, test = per_client()
  data = from_client_arrays(train, test, num_classes=5)
  path = save_arrays(str(tmp_path / "p.npz"), data, groups=[[0, 0, 1, 1], [0, 1, 2, 2]])
  back, groups, extras = load_arrays(path=path)
  assert back.num_classes == 5
  same_clients(back, train, test)
  assert groups.tolist() == [0, 0, 1, 1] and extras["label_columns"].tolist() == [[0, 0, 1, 1], [0, 1, 2, 2]]


def test_flat_layout_with_named_clients_test_split_and_groups(tmp_path):
  train, test = per_client()
  names = np.array(["bob", "amy", "dan", "cat"])             # sorted: amy bob cat dan
  np.savez(tmp_path / "f.npz",
           x=np.concatenate([x for x, _ in train]), y=np.concatenate([y for _, y in train]),
           client=np.repeat(names, [len(y) for _, y in train]),
           x_test=np.concatenate([x for x, _ in test]), y_test=np.concatenate([y for _, y in test]),
           client_test=np.repeat(names, [len(y) for _, y in test]),
           group=np.repeat(np.array(["north", "south", "north", "south"]), [len(y) for _, y in train]))
  data, groups, extras = load_arrays(path=str(tmp_path / "f.npz"))
  order = np.argsort(names)
  same_clients(data, [train[i] for i in order], [test[i] for i in order])
  assert groups.tolist() == [1, 0, 1, 0] and extras["group_names"] == ("north", "south")
  assert data.num_classes == 3


def test_flat_layout_without_test_split_holds_out_a_fraction(tmp_path):
  np.savez(tmp_path / "f.npz", x=np.arange(40, dtype=np.float32)[:, None], y=np.arange(40) % 2,
           client=np.arange(40) % 4)
  data, groups, _ = load_arrays(path=str(tmp_path / "f.npz"), test_fraction=0.3)
  assert groups is None and data.n_train.tolist() == [7] * 4 and data.n_test.tolist() == [3] * 4
  for c in range(4):   # every client's examples, train and test together, are its own
    held = np.concatenate([data.x_train[c, :7, 0], data.x_test[c, :3, 0]])
    assert sorted(held.astype(int).tolist()) == list(range(c, 40, 4))


def test_folder_layout_one_file_per_client(tmp_path):
  train, test = per_client()
  for c, ((x, y), (xt, yt)) in enumerate(zip(train, test, strict=True)):
    np.savez(tmp_path / f"client_{c:02d}.npz", x_train=x, y_train=y, x_test=xt, y_test=yt, group=c // 2)
  data, groups, _ = load_arrays(path=str(tmp_path), num_classes=4)
  same_clients(data, train, test)
  assert groups.tolist() == [0, 0, 1, 1] and data.num_classes == 4


def test_keyed_per_client_layout(tmp_path):
  """Issue 40: one .npz keyed per client, as most papers' code saves it (``x_train_0``,
  ``y_train_0``, ...; the keys' order in the file does not matter, clients 10 and 2 sort as
  numbers), or ``x_<i>``, ``y_<i>`` split by ``test_fraction``; clients not numbered 0 .. C-1 are
  refused naming the missing one."""
  train, test = per_client(sizes=(6, 9, 4, 7, 5, 3, 8, 6, 4, 5, 7))
  arrays = {}
  for c in reversed(range(len(train))):
    arrays.update({f"x_train_{c}": train[c][0], f"y_train_{c}": train[c][1], f"x_test_{c}": test[c][0],
                   f"y_test_{c}": test[c][1], f"group_{c}": c % 3})
  np.savez(tmp_path / "k.npz", **arrays)
  data, groups, _ = load_arrays(path=str(tmp_path / "k.npz"))
  same_clients(data, train, test)
  assert groups.tolist() == [c % 3 for c in range(len(train))]
  xy = {f"{k}_{c}": v for c, (x, y) in enumerate(train) for k, v in (("x", x), ("y", y))}
  np.savez(tmp_path / "xy.npz", **xy)
  data, groups, _ = load_arrays(path=str(tmp_path / "xy.npz"), test_fraction=0.25)
  assert groups is None and (data.n_train + data.n_test).tolist() == [len(y) for _, y in train]
  np.savez(tmp_path / "gap.npz", x_0=train[0][0], y_0=train[0][1], x_2=train[2][0], y_2=train[2][1])
  with pytest.raises(ValueError, match=r"per-client keys name clients \[0, 2\].*but not \[1\]"):
    load_arrays(path=str(tmp_path / "gap.npz"))
  np.savez(tmp_path / "half.npz", x_train_0=train[0][0], y_train_0=train[0][1])
  with pytest.raises(ValueError, match=r"\(client 0\): keys \['x_train', 'y_train'\]; need x_train_<i>"):
    load_arrays(path=str(tmp_path / "half.npz"))


def test_uint8_images_become_floats_in_unit_range(tmp_path):
  x = np.full((10, 3, 3), 255, np.uint8)
  np.savez(tmp_path / "u.npz", x=x, y=np.zeros(10, np.int32), client=np.arange(10) % 2)
  data, _, _ = load_arrays(path=str(tmp_path / "u.npz"))
  assert data.x_train.dtype == np.float32 and float(data.x_train[0, 0].max()) == 1.0


@pytest.mark.parametrize("write,kwargs,match", [
  (lambda p: np.savez(p, a=np.zeros(3)), {}, r"keys \['a'\] match no layout"),
  (lambda p: np.savez(p, x=np.zeros((6, 2)), y=np.arange(6), client=np.arange(6) % 2), dict(num_classes=4),
   r"client 0: label 4 in y_train is outside \[0, 4\) \(num_classes=4\); 2 label\(s\) of y_train"),
  (lambda p: np.savez(p, x=np.array([[0.0], [np.inf], [1.0], [2.0]]), y=np.zeros(4, int),
                      client=np.array([0, 0, 1, 1])), dict(test_fraction=0.0),
   r"client 0: x_train example \d holds a non-finite input \(inf\)"),
  (lambda p: np.savez(p, x=np.zeros((4, 2)), y=np.zeros(4, int), client=np.arange(4) % 2,
                      group=np.arange(4)), {}, r"column 'group' must be constant within a client: client 0"),
])
def test_bad_files_are_refused(tmp_path, write, kwargs, match):
  write(str(tmp_path / "bad.npz"))
  with pytest.raises(ValueError, match=match):
    load_arrays(path=str(tmp_path / "bad.npz"), **kwargs)


def test_missing_path_and_groups_twice_are_refused(tmp_path):
  with pytest.raises(FileNotFoundError, match="no such .npz file or folder"):
    load_arrays(path=str(tmp_path / "nope.npz"))
  with pytest.raises(ValueError, match=r"config.data.path=None: set it"):
    load_with_info(load_config("own_data").data)
  train, test = per_client()
  path = save_arrays(str(tmp_path / "g.npz"), from_client_arrays(train, test, num_classes=3),
                     groups=[0, 0, 1, 1])
  cfg = load_config("own_data").data
  cfg.path, cfg.team_size = path, 2
  with pytest.raises(ValueError, match="team_size=2 / num_groups=None would replace them"):
    load_with_info(cfg)


def test_cli_reads_the_arrays_and_reports_fairness(tmp_path):
  train, test = per_client(sizes=(12, 9, 14, 10, 8, 11), k=3)
  path = save_arrays(str(tmp_path / "clients.npz"), from_client_arrays(train, test, num_classes=3),
                     groups=[0, 0, 0, 1, 1, 1])
  work = tmp_path / "run"
  cmd = [sys.executable, "-m", "fedtree.main", "--config=configs/own_data.py", f"--workdir={work}",
         f"--config.data.path={path}", "--config.rounds=2", "--config.eval_every=2",
         "--config.rounds_per_call=2", "--config.progress=False", "--config.model.hidden=(8,)"]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-3000:]
  assert "clients p10/p50/p90 gini" in out.stdout
  summary = json.load(open(work / "summary.json"))
  fair = summary["fedavg"]["global"]["fairness"]
  acc = np.asarray(summary["fedavg"]["global"]["client_accuracy"], float)
  assert fair["clients"] == 6 and fair["p50"] == pytest.approx(np.percentile(acc, 50))
  assert len(summary["hierfavg"]["level1"]["group_fairness"]) == 2
  assert (work / "plot_client_fairness.png").stat().st_size > 1000
