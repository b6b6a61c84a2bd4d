"""Per-client arrays from ``.npz`` files: a published run's exact data, from the command line.

:func:`load_arrays` reads one of four layouts (``config.data.name="arrays"``,
``config.data.path=...``):

* **padded** (one ``.npz``, what :func:`save_arrays` writes): ``x_train [C, M, ...]``,
  ``y_train [C, M]``, ``n_train [C]``, ``x_test``, ``y_test``, ``n_test``; rows past a client's
  count are padding;
* **flat** (one ``.npz``): every example once, ``x [N, ...]``, ``y [N]`` and ``client [N]``
  (any ints or strings naming the client); a test split as ``x_test``, ``y_test``,
  ``client_test`` (clients by the same names), else ``test_fraction`` of every client's
  examples; an optional per-example ``group [N]``;
* **keyed per client** (one ``.npz``, as most papers' code saves it with
  ``np.savez(path, **{f"x_train_{i}": ..., ...})``): ``x_train_<i>``, ``y_train_<i>``,
  ``x_test_<i>``, ``y_test_<i>`` for clients ``i = 0 .. C-1`` (or ``x_<i>``, ``y_<i>`` split by
  ``test_fraction``), an optional scalar ``group_<i>``;
* **a folder** of ``.npz`` files, one client each in sorted file-name order, with ``x_train``,
  ``y_train``, ``x_test``, ``y_test`` (or ``x``, ``y`` split by ``test_fraction``) and an
  optional scalar ``group``.

Group (team) membership: a ``groups`` key, ``int[C]`` per client or ``[L, C]`` label columns
coarsest first (a deeper tree, ``config.topology.kind="columns"``); else the per-example or
per-file ``group``; else (``config.data.team_size`` / ``num_groups``) consecutive clients; else one
group.
``num_classes``: the argument, else a ``num_classes`` key, else the largest label + 1.
Inputs are kept in their dtype (integer token ids stay integers), except that ``uint8`` images
become ``float32`` in ``[0, 1]`` when ``scale_uint8``.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

import numpy as np

from fedtree.core.data import FederatedData, from_client_arrays, split_train_test
from fedtree.datasets.columns import client_label_columns, dense_codes

PADDED_KEYS = ("x_train", "y_train", "n_train", "x_test", "y_test", "n_test")
FLAT_KEYS = ("x", "y", "client")
_KEYED = re.compile(r"^(x_train|y_train|x_test|y_test|x|y|group)_(\d+)$")


def save_arrays(path: str, data: FederatedData, groups=None, *, group_names=None) -> str:
  """Writes ``data`` (padded layout) and its ``groups`` (``int[C]`` or ``[L, C]``) to ``path``
  as an uncompressed ``.npz`` that :func:`load_arrays` reads back; returns the path."""
  if data.ragged:
    raise ValueError("save_arrays writes the padded layout; convert with fedtree.core.ragged.to_padded_train")
  arrays: dict[str, Any] = {k: np.asarray(getattr(data, k)) for k in PADDED_KEYS}
  arrays["num_classes"] = np.asarray(data.num_classes)
  if groups is not None:
    arrays["groups"] = np.asarray(groups)
  if group_names is not None:
    arrays["group_names"] = np.asarray(group_names)
  np.savez(path, **arrays)
  return path if path.endswith(".npz") else path + ".npz"


def load_arrays(*, path: str, num_classes: int | None = None, test_fraction: float = 0.2,
                scale_uint8: bool = True, seed: int = 0,
                ) -> tuple[FederatedData, np.ndarray | None, dict[str, Any]]:
  """``(data, groups int32[C] or None, extras)`` from an ``.npz`` file or a folder of them (the
  module docstring gives the layouts; ``None``: the files name no groups). ``extras`` may hold
  ``group_names`` and
  ``label_columns`` (``[L, C]``, when the tree has more than one level of groups).

  Raises:
    FileNotFoundError: no such file, or a folder without ``.npz`` files.
    ValueError: a file whose keys match no layout (listing the keys it has and needs), or bad
      values (labels outside ``[0, num_classes)``, a client without training examples,
      non-finite inputs), each naming the client.
  """
  if not path:
    raise ValueError(f"config.data.path={path!r}: set it to an .npz file or a folder of them "
                     "(--config.data.path=...)")
  rng = np.random.default_rng(seed)
  extras: dict[str, Any] = {}
  if os.path.isdir(path):
    files = sorted(glob.glob(os.path.join(path, "*.npz")))
    if not files:
      raise FileNotFoundError(f"config.data.path={path!r} is a folder without .npz files (one per client)")
    data, file_groups, k = _from_folder(files, num_classes, test_fraction, rng, scale_uint8)
    groups = file_groups
  elif os.path.isfile(path):
    with np.load(path, allow_pickle=False) as f:
      arrays = {k: f[k] for k in f.files}
    k = num_classes if num_classes is not None else (int(arrays["num_classes"]) if "num_classes" in arrays
                                                     else None)
    groups = None
    if all(key in arrays for key in PADDED_KEYS):
      y_max = max(_max_real(arrays["y_train"], arrays["n_train"]),
                  _max_real(arrays["y_test"], arrays["n_test"]))
      k = y_max + 1 if k is None else int(k)
      data = FederatedData(**{key: arrays[key] for key in PADDED_KEYS}, num_classes=k)
      data = data.replace(x_train=_scaled(data.x_train, scale_uint8),
                          x_test=_scaled(data.x_test, scale_uint8))
      data = data.check_values()
    elif all(key in arrays for key in FLAT_KEYS):
      data, groups, names = _from_flat(arrays, k, test_fraction, rng, scale_uint8)
      if names is not None:
        extras["group_names"] = names
    elif any(_KEYED.match(key) for key in arrays):
      data, groups, k = _from_keyed(arrays, path, k, test_fraction, rng, scale_uint8)
    else:
      raise ValueError(f"{path}: keys {sorted(arrays)} match no layout; need {list(PADDED_KEYS)} (padded), "
                       f"{list(FLAT_KEYS)} (flat) or x_train_<i>, y_train_<i>, x_test_<i>, y_test_<i> per "
                       f"client (keyed), see fedtree.datasets.arrays")
    if "groups" in arrays:
      groups = _client_groups(arrays["groups"], data.num_clients, path)
      if "group_names" in arrays:
        extras["group_names"] = tuple(str(s) for s in arrays["group_names"])
  else:
    raise FileNotFoundError(f"config.data.path={path!r}: no such .npz file or folder")
  if groups is not None:
    groups = np.asarray(groups, np.int32)
    if groups.ndim == 2:
      extras["label_columns"] = groups
      groups = groups[0]
  return data, groups, extras


def _scaled(x: np.ndarray, scale_uint8: bool) -> np.ndarray:
  return x.astype(np.float32) / 255.0 if scale_uint8 and x.dtype == np.uint8 else x


def _max_real(y: np.ndarray, n: np.ndarray) -> int:
  real = np.arange(y.shape[1])[None, :] < np.asarray(n)[:, None]
  real = real.reshape(real.shape + (1,) * (y.ndim - 2))
  return int(np.max(np.where(real, y, 0))) if y.size else 0


def _client_groups(groups: np.ndarray, num_clients: int, where: str) -> np.ndarray:
  groups = np.asarray(groups)
  if groups.ndim not in (1, 2) or groups.shape[-1] != num_clients:
    raise ValueError(f"{where}: groups has shape {groups.shape}; need [C] or [L, C] with C={num_clients} "
                     "clients")
  if groups.ndim == 1:
    return dense_codes(groups)[0]
  client = np.arange(num_clients)
  return np.stack(client_label_columns(list(groups), client)[0])


def _from_flat(arrays, num_classes, test_fraction, rng, scale_uint8):
  x, y = _scaled(arrays["x"], scale_uint8), np.asarray(arrays["y"])
  client, names = dense_codes(arrays["client"])
  y_max = int(y.max()) if y.size else 0
  if "x_test" in arrays:
    test_names = np.asarray(arrays["client_test"]).astype(str)
    lookup = {n: i for i, n in enumerate(names)}
    unknown = sorted(set(test_names.tolist()) - set(lookup))
    if unknown:
      raise ValueError(f"client_test names client(s) {unknown[:5]} that have no training examples")
    test_client = np.asarray([lookup[n] for n in test_names.tolist()], np.int64)
    x_test, y_test = _scaled(arrays["x_test"], scale_uint8), np.asarray(arrays["y_test"])
    y_max = max(y_max, int(y_test.max()) if y_test.size else 0)
    k = y_max + 1 if num_classes is None else int(num_classes)
    train = [(x[client == c], y[client == c]) for c in range(len(names))]
    test = [(x_test[test_client == c], y_test[test_client == c]) for c in range(len(names))]
    data = from_client_arrays(train, test, num_classes=k, dtype=x.dtype)
  else:
    k = y_max + 1 if num_classes is None else int(num_classes)
    parts = [np.flatnonzero(client == c) for c in range(len(names))]
    data = split_train_test(x, y, parts, test_fraction=test_fraction, rng=rng, num_classes=k)
  groups, group_names = None, None
  if "group" in arrays:
    cols, col_names = client_label_columns([arrays["group"]], client, names=["group"])
    groups, group_names = cols[0], col_names[0]
  return data, groups, group_names


def _from_keyed(arrays, path, num_classes, test_fraction, rng, scale_uint8):
  """The keyed-per-client layout: ``{x_train_<i>, ...}`` -> one client per index, as
  :func:`_from_folder` reads one per file."""
  by_client: dict[int, dict[str, np.ndarray]] = {}
  for key, value in arrays.items():
    m = _KEYED.match(key)
    if m:
      by_client.setdefault(int(m.group(2)), {})[m.group(1)] = value
  ids = sorted(by_client)
  if ids != list(range(len(ids))):
    missing = sorted(set(range(ids[-1] + 1)) - set(ids))
    raise ValueError(f"{path}: per-client keys name clients {ids[:5]}...{ids[-1]}, but not {missing[:5]}; "
                     f"the clients must be numbered 0 .. C-1")
  clients = [(f"{path} (client {i})", by_client[i]) for i in ids]
  return _clients_from_dicts(clients, num_classes, test_fraction, rng, scale_uint8,
                             need="x_train_<i>, y_train_<i>, x_test_<i>, y_test_<i> (or x_<i>, y_<i>)",
                             group_key="group_<i>")


def _from_folder(files, num_classes, test_fraction, rng, scale_uint8):
  clients = []
  for c, name in enumerate(files):
    with np.load(name, allow_pickle=False) as f:
      clients.append((f"{name} (client {c})", {k: f[k] for k in f.files}))
  return _clients_from_dicts(clients, num_classes, test_fraction, rng, scale_uint8,
                             need="x_train, y_train, x_test, y_test (or x, y)", group_key="'group'")


def _clients_from_dicts(clients, num_classes, test_fraction, rng, scale_uint8, *, need: str, group_key: str):
  """``(data, groups or None, num_classes)`` of one ``{x_train, y_train, x_test, y_test}`` (or
  ``{x, y}``, split by ``test_fraction``) dict per client, with an optional scalar ``group``;
  ``clients``: ``[(where, arrays)]``."""
  train, test, groups = [], [], []
  for where, a in clients:
    if all(k in a for k in ("x_train", "y_train", "x_test", "y_test")):
      train.append((_scaled(a["x_train"], scale_uint8), a["y_train"]))
      test.append((_scaled(a["x_test"], scale_uint8), a["y_test"]))
    elif "x" in a and "y" in a:
      x, y = _scaled(a["x"], scale_uint8), a["y"]
      order = rng.permutation(len(y))
      n_test = min(int(np.floor(test_fraction * len(y))), max(len(y) - 1, 0))
      test.append((x[order[:n_test]], y[order[:n_test]]))
      train.append((x[order[n_test:]], y[order[n_test:]]))
    else:
      raise ValueError(f"{where}: keys {sorted(a)}; need {need}")
    if not len(train[-1][1]):
      raise ValueError(f"{where} has no training examples")
    groups.append(a["group"] if "group" in a else None)
  labels = np.concatenate([y for _, y in train] + [y for _, y in test])
  k = int(labels.max()) + 1 if num_classes is None else int(num_classes)
  data = from_client_arrays(train, test, num_classes=k, dtype=train[0][0].dtype)
  if all(g is None for g in groups):
    return data, None, k
  if any(g is None for g in groups):
    missing = [where for (where, _), g in zip(clients, groups, strict=True) if g is None]
    raise ValueError(f"some clients name a group and others do not: {missing[:5]} have no {group_key}")
  return data, dense_codes(np.asarray([np.asarray(g).item() for g in groups]))[0], k
