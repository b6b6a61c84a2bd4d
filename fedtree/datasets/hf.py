"""Hugging Face ``datasets`` in, split by fedtree's partitioners or by Flower Datasets'.

:func:`from_hf` turns a ``datasets.Dataset`` (in memory, read from local files, or a prepared
cache written by ``save_to_disk``) into :class:`~fedtree.core.data.FederatedData`;
:func:`load_hf` reads the dataset for a config (``config.data.name="hf"``). Nothing is
downloaded: prepare a Hub dataset once where internet is available
(``datasets.load_dataset(name).save_to_disk(dir)``) and point ``path`` at ``dir``.

Clients come from, in order of precedence:

* a Flower Datasets partitioner (``partitioner="flwr.DirichletPartitioner"`` with
  ``partitioner_args``, or a ``flwr_datasets.partitioner.Partitioner`` object): fedtree applies
  the partitioner itself to the dataset and reads which rows every partition holds, so the
  clients are exactly Flower's partitions for the same arguments and seed (``pip install -e
  ".[hf]"``). As ``flwr_datasets.FederatedDataset`` does by default, the rows are shuffled
  first (``shuffle=True``, ``shuffle_seed=42``: its ``shuffle`` and ``seed``; ``shuffle=False``
  hands the partitioner the rows in the dataset's order), and every client keeps its rows in the
  order Flower's partition lists them (its train/test split takes rows out without reordering
  the rest). Use it to reproduce a paper that split its data with Flower;
* one of fedtree's partitioners (``"iid"``, ``"dirichlet"``, ``"shards"``,
  :mod:`fedtree.core.data`; no extra dependency, the default), with ``partitioner_args``
  (``num_clients``, ``alpha``, ``shards_per_client``, ``min_size``, ``self_balancing``), on the
  rows in the dataset's order (``shuffle`` is for Flower's). ``shards`` gives the row sets of
  Flower's ``ShardPartitioner(num_shards_per_partition=s, seed=seed)`` on the unshuffled rows when
  they divide evenly into ``num_clients * s`` shards; ``dirichlet`` draws its own shares: its
  ``min_size`` defaults to 1 (Flower's ``min_partition_size`` to 10) and ``self_balancing``
  (Flower's: a client holding more than the average gets no more rows) is off by default, as in
  flwr-datasets 0.6;
* ``client_column``: one client per value of a natural id (writer, speaker).

With ``clients_by`` (a column) every partition is split further into one client per value
and the partitions become the groups of a two-level tree: Flower's ``GroupedNaturalIdPartitioner``
(groups of natural ids) so gives root -> groups -> natural-id clients (its ``partition_by`` is
the default ``clients_by``). ``tree_columns`` (per-example columns, coarsest first, constant
within a client: e.g. ``("region",)`` above a ``writer`` client column) give the groups of a
deeper tree (``config.topology.kind="columns"``, :func:`fedtree.datasets.columns.client_label_columns`).

Inputs: one ``Image`` column becomes ``float32`` in ``[0, 1]`` (a trailing channel axis added to
grayscale images), numeric columns ``float32`` (several are stacked as features ``[N, F]``), and a
string column makes next-token language-model data (:func:`fedtree.datasets.text.to_federated`,
options in ``text``; the label column is then unused).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedtree.core.data import (
  FederatedData,
  from_client_arrays,
  partition_by_id,
  partition_dirichlet,
  partition_iid,
  partition_shards,
  split_train_test,
)
from fedtree.datasets.columns import client_label_columns, dense_codes

FEDTREE_PARTITIONERS = ("iid", "dirichlet", "shards")
FORMATS = ("disk", "parquet", "csv", "json", "arrow")
_ROW = "__fedtree_row__"


FLOWER_SHUFFLE_SEED = 42
"""``flwr_datasets.FederatedDataset``'s default ``seed``: it shuffles every split with it before
partitioning (``shuffle=True``, its default)."""


def flower_partitions(dataset, partitioner, *, shuffle: bool = False,
                      seed: int | None = FLOWER_SHUFFLE_SEED) -> list[np.ndarray]:
  """The rows of ``dataset`` in every partition of a Flower Datasets ``partitioner`` (applied
  here by Flower itself: ``partitioner.dataset = ...; partitioner.load_partition(i)``), in
  Flower's order within each partition.

  Args:
    dataset: a ``datasets.Dataset``.
    partitioner: a ``flwr_datasets.partitioner.Partitioner`` not yet given a dataset.
    shuffle: shuffle the rows first, with ``seed``, as ``FederatedDataset(shuffle=True,
      seed=seed)`` does before it hands a split to its partitioner (``Dataset.shuffle(seed=...)``).
    seed: the shuffle's seed (``None``: fresh, unpredictable randomness, as Flower's).
  """
  if getattr(partitioner, "_dataset", None) is not None:
    raise ValueError(f"{type(partitioner).__name__} already holds a dataset; pass a fresh partitioner")
  rows = dataset.add_column(_ROW, np.arange(len(dataset)))
  partitioner.dataset = rows.shuffle(seed=seed) if shuffle else rows
  return [np.asarray(partitioner.load_partition(i)[_ROW], np.int64)
          for i in range(partitioner.num_partitions)]


def flower_partitioner(name: str, args: dict[str, Any] | None = None):
  """A Flower Datasets partitioner by class name (``"DirichletPartitioner"``, ...): a row
  partitioner (every one but the vertical ones and the base class, :data:`FLOWER_REFUSED`)."""
  try:
    from flwr_datasets import partitioner as fp
  except ImportError as e:
    raise ImportError(f"partitioner={name!r} needs Flower Datasets: pip install -e \".[hf]\"") from e
  names = sorted(n for n in dir(fp) if n.endswith("Partitioner") and n != "Partitioner")
  rows = [n for n in names if n not in FLOWER_REFUSED and not n.startswith("Vertical")]
  if name in names and name not in rows:
    why = FLOWER_REFUSED.get(name, "it splits the columns (vertical FL), not the rows, into clients")
    raise ValueError(f"Flower partitioner {name!r} is not supported: {why}; choose one of {rows}")
  if name not in names:
    raise ValueError(f"Flower partitioner {name!r} is unknown; choose one of {rows}")
  return getattr(fp, name)(**dict(args or {}))


FLOWER_REFUSED = {
  "IdToSizeFncPartitioner": ("it is a base class; pass an object of a subclass "
                             "(partitioner=MyPartitioner(...))"),
}
"""Flower Datasets partitioners :func:`flower_partitioner` refuses by name, and why; the vertical
ones (``Vertical*``, which split columns, not rows) too."""


def input_columns(x_columns: str | Sequence[str], names: Sequence[str]) -> list[str]:
  """The input columns ``x_columns`` names: a sequence, or one string that is a column of the
  dataset (``names``), or several as the command line gives them (``"a,b,c"``, ``"[a, b, c]"``,
  ``"('a', 'b', 'c')"``: ``--config.data.x_columns=a,b,c`` on a CSV file's columns).

  Example:
    >>> input_columns("a, b,c", ["a", "b", "c", "label"]), input_columns("('a', 'b')", ["a", "b"])
    (['a', 'b', 'c'], ['a', 'b'])
  """
  if not isinstance(x_columns, str):
    return [str(c) for c in x_columns]
  if x_columns in names or "," not in x_columns:
    return [x_columns]
  return [c.strip().strip("'\"") for c in x_columns.strip().strip("[]()").split(",") if c.strip()]


def from_hf(
  train,
  *,
  test=None,
  x_columns: str | Sequence[str] = "image",
  label_column: str = "label",
  client_column: str | None = None,
  partitioner=None,
  partitioner_args: dict[str, Any] | None = None,
  clients_by: str | None = None,
  tree_columns: Sequence[str] = (),
  num_classes: int | None = None,
  test_fraction: float = 0.2,
  text: dict[str, Any] | None = None,
  seed: int = 0,
  shuffle: bool = True,
  shuffle_seed: int | None = FLOWER_SHUFFLE_SEED,
) -> tuple[FederatedData, np.ndarray | None, tuple[np.ndarray, np.ndarray] | None, dict[str, Any]]:
  """Federated data from a Hugging Face dataset.

  Args:
    train: the ``datasets.Dataset`` to partition.
    test: an optional test ``Dataset``: matched to the clients by ``client_column`` when the
      clients are natural ids (clients without test rows get none; test rows of ids without
      training rows are left out), else kept as the central test set ``(x, y)`` while every
      client holds out ``test_fraction`` of its examples.
    x_columns: the input column (an image, a numeric array, or a string: text), or several
      (a sequence, or one string naming them as the command line does: ``"a,b,c"``,
      :func:`input_columns`)
      numeric columns stacked as features.
    label_column: the class label (a ``ClassLabel`` gives ``num_classes``).
    client_column: one client per value of this column (when no ``partitioner``).
    partitioner: ``"iid"``, ``"dirichlet"``, ``"shards"`` (fedtree's), ``"flwr.<ClassName>"``
      (Flower's, built with ``partitioner_args``), or a Flower ``Partitioner`` object.
    partitioner_args: the partitioner's keyword arguments.
    clients_by: split every partition into one client per value of this column; the
      partitions are then the groups.
    tree_columns: per-example group columns, coarsest first, constant within a client.
    num_classes: default: the ``ClassLabel``'s, else the largest label + 1.
    test_fraction: share of a client's examples held out for its test split.
    text: options of :func:`fedtree.datasets.text.to_federated` for a string input column.
    seed: fedtree's partitioners and the train/test split.
    shuffle: a Flower partitioner sees the rows shuffled with ``shuffle_seed`` first, as
      ``FederatedDataset(shuffle=True, seed=shuffle_seed)`` hands them (the default); ``False``:
      in the dataset's order.
    shuffle_seed: ``FederatedDataset``'s ``seed`` (its default 42; ``None``: unpredictable).

  Returns:
    ``(data, groups int32[C] or None, central test (x, y) or None, extras)``; ``extras`` holds
    ``group_names``, ``label_columns`` (``int32[L, C]`` with ``tree_columns``), ``vocab``
    (text) and ``client_names`` where they exist.

  Raises:
    ValueError: an unknown column (listing the dataset's), partitioner or format; a partition
      or client without examples; labels outside ``[0, num_classes)``; non-finite inputs.

  Example:
    >>> import datasets
    >>> ds = datasets.Dataset.from_dict({"x": [[float(i), 1.0] for i in range(12)],
    ...                                  "label": [i % 3 for i in range(12)],
    ...                                  "writer": [i // 4 for i in range(12)]})
    >>> data, groups, central, extras = from_hf(ds, x_columns="x", client_column="writer",
    ...                                         test_fraction=0.25)
    >>> data.num_clients, data.n_train.tolist(), data.n_test.tolist(), extras["client_names"]
    (3, [3, 3, 3], [1, 1, 1], ('0', '1', '2'))
  """
  columns = input_columns(x_columns, train.column_names)
  is_text = len(columns) == 1 and _is_string(train.features.get(columns[0]))
  needed = columns + ([] if is_text else [label_column]) + [c for c in (client_column, clients_by) if c]
  needed += list(tree_columns)
  missing = [c for c in needed if c not in train.column_names]
  if missing:
    raise ValueError(f"column(s) {missing} are not in the dataset; it has {train.column_names}")
  if clients_by and tree_columns:
    raise ValueError("clients_by (partitions as groups) and tree_columns (groups from columns) both set; "
                     "choose one")
  rng = np.random.default_rng(seed)
  if not isinstance(shuffle, bool):
    raise ValueError(f"shuffle={shuffle!r} must be True (a Flower partitioner sees the rows shuffled, as "
                     f"FederatedDataset does) or False")
  own = isinstance(partitioner, str) and partitioner in FEDTREE_PARTITIONERS
  flower = partitioner is not None and not own
  parts, groups_of_part = _partition(train, partitioner, partitioner_args, client_column, label_column, rng,
                                     shuffle=shuffle, shuffle_seed=shuffle_seed)
  if clients_by is None and _flower_name(partitioner) == "GroupedNaturalIdPartitioner":
    flower = partitioner_args.get("partition_by") if isinstance(partitioner, str) else None
    clients_by = flower or getattr(partitioner, "_partition_by", None)
  client_names = None
  if clients_by:
    ids = np.asarray(train[clients_by])
    split, groups_of_part = [], []
    for g, rows in enumerate(parts):
      sub, _ = partition_by_id(ids[rows]) if rows.size else ([], None)
      split += [rows[s] for s in sub]
      groups_of_part += [g] * len(sub)
    parts = split
  elif client_column and partitioner is None:
    client_names = tuple(str(v) for v in np.unique(np.asarray(train[client_column])))
  for c, rows in enumerate(parts):
    if rows.size == 0:
      raise ValueError(f"client {c} received no examples from partitioner={_describe(partitioner)}; every "
                       "client needs one (e.g. Flower's min_partition_size, fewer partitions)")
  extras: dict[str, Any] = {}
  if client_names is not None:
    extras["client_names"] = client_names
  groups = np.asarray(groups_of_part, np.int32) if groups_of_part is not None else None
  if tree_columns:
    client = np.empty(len(train), np.int64)
    for c, rows in enumerate(parts):
      client[rows] = c
    covered = np.concatenate(parts)
    cols, names = client_label_columns([np.asarray(train[t])[covered] for t in tree_columns],
                                       client[covered], names=list(tree_columns))
    extras["label_columns"], extras["group_names"] = np.stack(cols), names[0]
    groups = cols[0]
  if is_text:
    return _text_data(train, columns[0], parts, groups, text, test_fraction, seed, extras)
  x = _inputs(train, columns)
  y = np.asarray(train[label_column])
  k = _num_classes(train, label_column, num_classes, y, test)
  central = None
  if test is not None and client_column and partitioner is None:
    lookup = {str(v): i for i, v in enumerate(np.unique(np.asarray(train[client_column])))}
    test_ids = [str(v) for v in np.asarray(test[client_column])]
    x_t, y_t = _inputs(test, columns), np.asarray(test[label_column])
    test_client = np.asarray([lookup.get(v, -1) for v in test_ids])
    tr = [(x[rows], y[rows]) for rows in parts]
    te = [(x_t[test_client == c], y_t[test_client == c]) for c in range(len(parts))]
    data = from_client_arrays(tr, te, num_classes=k, dtype=x.dtype)
  else:
    data = split_train_test(x, y, parts, test_fraction=test_fraction, rng=rng, num_classes=k,
                            keep_order=flower)
    data.check_values()
    if test is not None:
      central = (_inputs(test, columns), np.asarray(test[label_column], np.int32))
  return data, groups, central, extras


def load_hf(*, path: str, format: str = "disk", split: str = "train", test_split: str | None = None,
            test_path: str | None = None, cache_dir: str | None = None, **kwargs,
            ) -> tuple[FederatedData, np.ndarray | None, Any, dict[str, Any]]:
  """:func:`from_hf` of a dataset read from local files, for ``config.data.name="hf"``.

  Args:
    path: ``format="disk"``: a folder written by ``Dataset.save_to_disk`` or
      ``DatasetDict.save_to_disk`` (a prepared cache); ``"parquet"``, ``"csv"``, ``"json"``,
      ``"arrow"``: a file (or glob) read by ``datasets.load_dataset(format, data_files=path)``.
    format: one of :data:`FORMATS`.
    split: the split to partition, of a ``DatasetDict``.
    test_split: the test split of the same ``DatasetDict`` (``format="disk"``).
    test_path: the test file (the other formats).
    cache_dir: where ``datasets`` keeps the Arrow files of ``load_dataset``.
    **kwargs: :func:`from_hf`'s options.

  Raises:
    ImportError: Hugging Face ``datasets`` is not installed (names the ``hf`` extra).
  """
  try:
    import datasets
  except ImportError as e:
    raise ImportError("config.data.name='hf' needs Hugging Face datasets, which is not installed: "
                      "pip install -e \".[hf]\" (datasets and flwr-datasets)") from e

  if not path:
    raise ValueError(f"config.data.path={path!r}: set it to a save_to_disk folder or a data file "
                     "(--config.data.path=...)")
  if format not in FORMATS:
    raise ValueError(f"config.data.format={format!r}; choose one of {FORMATS}")
  if format == "disk":
    try:
      loaded = datasets.load_from_disk(path)
    except FileNotFoundError as e:
      raise FileNotFoundError(f"config.data.path={path!r} holds no dataset written by save_to_disk: "
                              f"{e}") from e
    if isinstance(loaded, datasets.DatasetDict):
      for s in (split, test_split):
        if s is not None and s not in loaded:
          raise ValueError(f"split {s!r} is not in {path}; it has {sorted(loaded)}")
      train, test = loaded[split], loaded[test_split] if test_split else None
    else:
      if test_split:
        raise ValueError(f"{path} holds one Dataset, not a DatasetDict: it has no test_split={test_split!r}")
      train, test = loaded, None
  else:
    files = {"train": path} | ({"test": test_path} if test_path else {})
    loaded = datasets.load_dataset(format, data_files=files, cache_dir=cache_dir)
    train, test = loaded["train"], loaded["test"] if test_path else None
  return from_hf(train, test=test, **kwargs)


# ------------------------------------------------------------------------ helpers
def _is_string(feature) -> bool:
  return getattr(feature, "dtype", None) in ("string", "large_string")


def _flower_name(partitioner) -> str | None:
  if isinstance(partitioner, str):
    return partitioner.removeprefix("flwr.") if partitioner.startswith("flwr.") else None
  return type(partitioner).__name__ if partitioner is not None else None


def _flower_object_or_none(partitioner, args):
  return flower_partitioner(partitioner.removeprefix("flwr."), args) if isinstance(partitioner, str) \
    else partitioner


def _describe(partitioner) -> str:
  if isinstance(partitioner, str) or partitioner is None:
    return repr(partitioner)
  return type(partitioner).__name__


def _partition(train, partitioner, args, client_column, label_column, rng, *, shuffle, shuffle_seed):
  """``(rows of every partition, group of every partition or None)``."""
  args = dict(args or {})
  n = len(train)
  if partitioner is None:
    if not client_column:
      raise ValueError("from_hf needs a partitioner or a client_column; choose a partitioner among "
                       f"{FEDTREE_PARTITIONERS} or 'flwr.<ClassName>'")
    parts, _ = partition_by_id(dense_codes(np.asarray(train[client_column]))[0])
    return [np.asarray(p, np.int64) for p in parts], None
  if isinstance(partitioner, str) and partitioner in FEDTREE_PARTITIONERS:
    allowed = {"iid": ("num_clients",), "dirichlet": ("num_clients", "alpha", "min_size", "self_balancing"),
               "shards": ("num_clients", "shards_per_client")}[partitioner]
    unknown = sorted(set(args) - set(allowed))
    if unknown or "num_clients" not in args:
      raise ValueError(f"partitioner={partitioner!r} takes partitioner_args {allowed} (num_clients "
                       f"required); got {sorted(args)}")
    c = int(args["num_clients"])
    if partitioner == "iid":
      return partition_iid(n, c, rng), None
    labels = np.asarray(train[label_column])
    if partitioner == "dirichlet":
      return partition_dirichlet(labels, c, float(args.get("alpha", 0.5)), rng,
                                 min_size=int(args.get("min_size", 1)),
                                 self_balancing=bool(args.get("self_balancing", False))), None
    return partition_shards(labels, c, int(args.get("shards_per_client", 2)), rng), None
  if isinstance(partitioner, str) and not partitioner.startswith("flwr."):
    raise ValueError(f"partitioner={partitioner!r}; choose one of {FEDTREE_PARTITIONERS} or "
                     "'flwr.<ClassName>' (a Flower Datasets partitioner)")
  obj = _flower_object_or_none(partitioner, args)
  if not isinstance(partitioner, str) and args:
    raise ValueError("partitioner_args are for a partitioner given by name; this one is already built")
  return flower_partitions(train, obj, shuffle=shuffle, seed=shuffle_seed), None


def _inputs(ds, columns: list[str]) -> np.ndarray:
  import datasets

  if len(columns) == 1:
    col = columns[0]
    values = ds.select_columns([col]).with_format("numpy")[:][col]
    x = np.stack(list(values)) if values.dtype == object else np.asarray(values)
    if isinstance(ds.features[col], datasets.Image):
      if x.ndim == 3:
        x = x[..., None]
      return x.astype(np.float32) / 255.0 if x.dtype == np.uint8 else x.astype(np.float32)
    return x.astype(np.float32)
  data = ds.select_columns(columns).with_format("numpy")[:]
  return np.stack([np.asarray(data[c], np.float32) for c in columns], axis=-1)


def _num_classes(train, label_column, num_classes, y, test) -> int:
  if num_classes is not None:
    return int(num_classes)
  feature = train.features[label_column]
  if hasattr(feature, "num_classes"):
    return int(feature.num_classes)
  top = int(y.max()) if y.size else 0
  if test is not None and label_column in test.column_names and len(test):
    top = max(top, int(np.max(np.asarray(test[label_column]))))
  return top + 1


def _text_data(train, column, parts, groups, text, test_fraction, seed, extras):
  from fedtree.datasets.text import TextCorpus, to_federated

  sentences = np.asarray(train[column], dtype=object)
  g = groups if groups is not None else np.zeros(len(parts), np.int32)
  corpus = TextCorpus(clients=tuple(str(c) for c in range(len(parts))),
                      sentences=tuple(tuple(str(s) for s in sentences[rows]) for rows in parts),
                      groups=tuple(int(v) for v in g),
                      group_names=tuple(str(v) for v in range(int(np.max(g)) + 1)))
  options = {"test_fraction": test_fraction, "seed": seed} | dict(text or {})
  data, _, vocab = to_federated(corpus, **options)
  extras["vocab"] = tuple(vocab.tokens)
  return data, groups, None, extras
