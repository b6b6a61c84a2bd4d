"""Federated data as padded, stacked arrays, and the partitioners that build them.

Every client is a row: ``x: [C, M, ...]``, ``y: [C, M]`` and ``count: int32[C]``; rows are
padded to ``M`` and entries ``>= count[c]`` are padding that is never trained on nor
evaluated. Train and test splits are kept side by side.

Partitioners map a centralized ``(x, y)`` to per-client index lists (IID, Dirichlet label
skew, label shards, by a natural id such as the writer or speaker); :func:`from_client_arrays`
pads the lists into a :class:`FederatedData`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import struct

from fedtree.core.topology import Topology

WINDOW_END = np.iinfo(np.int32).max   # FederatedData.window past its clients (above every client id)

Array = jax.Array | np.ndarray  # host (numpy) arrays until as_device


@struct.dataclass
class FederatedData:
  """Padded per-client train and test data.

  Attributes:
    x_train: ``[C, M, ...]`` features; rows past ``n_train[c]`` are padding.
    y_train: ``int32[C, M]`` labels, or ``int32[C, M, T]`` next tokens of a language model
      (``x_train`` then holds ``int32[C, M, T]`` token ids; id 0 is padding, see
      :func:`fedtree.core.model.token_mask`).
    n_train: ``int32[C]`` number of real training examples per client.
    x_test: ``[C, M_test, ...]``.
    y_test: ``int32[C, M_test]``.
    n_test: ``int32[C]``.
    num_classes: number of label values (static).
    train_offset: ``None`` (the padded layout above), or ``int32[C]`` for the *ragged* training
      layout (:func:`fedtree.core.ragged.to_ragged_train`): ``x_train``/``y_train`` are then
      every client's training examples back to back, ``[N, ...]`` with ``N = sum(n_train)``,
      client ``c`` owning rows ``train_offset[c] : train_offset[c] + n_train[c]``, so memory
      grows with the number of examples rather than ``clients x largest client``. Local
      training (:func:`fedtree.core.tier.train_cohort`) gathers batches by index from the
      shared flat arrays; test splits stay padded.
    ragged_max_train: the largest client's training count (static; ragged layout only).
    window: ``None`` (every client's rows are held), or ``int32[W]`` for a *window* of the
      population (:mod:`fedtree.population`): the arrays with a row per client (``x_*``, ``y_*``,
      ``train_offset``) then hold ``W`` rows, those of the clients a round reads, ``window`` the
      client at each row in ascending order (rows past the window's clients: :data:`WINDOW_END`),
      so client ``c`` is at row ``searchsorted(window, c)`` (clients outside the window: any row,
      never read); nothing of the window grows with the population. ``n_train`` and
      ``n_test`` keep every client's count. A round indexes a client's data, and its paged state,
      by its row (:attr:`fedtree.core.sampling.Cohort.rows`, :meth:`windowed`); its randomness and
      its aggregation by its index, so a round over a window computes bitwise what it computes over
      the whole population.

  Example:
    >>> train = [(np.ones((n, 4)), np.zeros(n, np.int32)) for n in (3, 1)]   # 2 clients
    >>> data = from_client_arrays(train, [(x[:1], y[:1]) for x, y in train], num_classes=2)
    >>> data.x_train.shape, data.n_train.tolist(), data.num_clients
    ((2, 3, 4), [3, 1], 2)
  """

  x_train: Array
  y_train: Array
  n_train: Array
  x_test: Array
  y_test: Array
  n_test: Array
  num_classes: int = struct.field(pytree_node=False, default=0)
  train_offset: Array | None = None
  ragged_max_train: int = struct.field(pytree_node=False, default=0)
  window: Array | None = None

  @property
  def ragged(self) -> bool:
    """Whether the training split is stored flat with offsets (see ``train_offset``)."""
    return self.train_offset is not None

  @property
  def num_clients(self) -> int:
    return int(self.n_train.shape[0])

  @property
  def windowed(self) -> bool:
    """Whether the per-client rows hold a window of the population (see ``window``)."""
    return self.window is not None

  def rows_of(self, clients: jax.Array) -> jax.Array:
    """Every client of ``clients`` (indices into the population) as its row in the per-client
    arrays: itself, or its row of the window."""
    if self.window is None:
      return clients
    rows = jax.numpy.searchsorted(self.window, clients, side="left").astype(jax.numpy.int32)
    return jax.numpy.minimum(rows, self.window.shape[0] - 1)

  @property
  def max_train(self) -> int:
    """The padded length of a client's training rows (the largest client when ragged)."""
    return self.ragged_max_train if self.ragged else int(self.x_train.shape[1])

  @property
  def example_shape(self) -> tuple[int, ...]:
    return tuple(self.x_test.shape[2:])

  def require_padded(self, who: str) -> FederatedData:
    """Returns ``self``; raises a ``ValueError`` naming ``who`` when the training split is
    ragged and ``who`` reads the padded ``[C, M, ...]`` rows directly."""
    if self.ragged:
      raise ValueError(
        f"{who} reads every client's padded training rows ([C, M, ...]) and does not take the "
        "ragged layout (FederatedData.train_offset); use padded data "
        "(config.data.layout='padded', or fedtree.core.ragged.to_padded_train)"
      )
    return self

  def validate(self, topology: Topology | None = None) -> FederatedData:
    """Checks shapes and counts (and agreement with ``topology``); returns ``self``."""
    c = self.n_train.shape[0]
    rows = c if self.window is None else int(self.x_test.shape[0])
    if self.window is not None and self.ragged:
      raise ValueError("a window of the population holds padded rows (FederatedData.window with a ragged "
                       "training split, train_offset, is not supported)")
    if self.window is not None and tuple(self.window.shape) != (rows,):
      raise ValueError(f"FederatedData.window has shape {tuple(self.window.shape)}; it needs the client of "
                       f"every row of the window ({rows},)")
    names = (("n_train", c), ("x_test", rows), ("y_test", rows), ("n_test", c)) + (
      (("train_offset", rows),) if self.ragged else (("x_train", rows), ("y_train", rows)))
    for name, want in names:
      if getattr(self, name).shape[0] != want:
        raise ValueError(
          f"FederatedData.{name} has {getattr(self, name).shape[0]} clients, n_train has {c}"
          + ("" if self.window is None else f" (and the window {rows} rows)"))
    # class labels [C, M] (flat: [N]), next tokens [C, M, T] (flat: [N, T]), or multi-hot labels
    # [C, M, K] (flat: [N, K])
    lead = 1 if self.ragged else 2
    splits = (("y_train", self.y_train, self.x_train, lead), ("y_test", self.y_test, self.x_test, 2))
    for name, y, x, k in splits:
      if y.shape not in (x.shape[:k], x.shape, x.shape[:k] + (self.num_classes,)):
        raise ValueError(f"{name} shape {y.shape} is neither x.shape[:{k}] {x.shape[:k]} (class labels) "
                         f"nor x.shape {x.shape} (next tokens) nor {x.shape[:k] + (self.num_classes,)} "
                         "(multi-hot labels)")
    if self.x_train.shape[lead:] != self.x_test.shape[2:]:
      raise ValueError(
        f"train examples have shape {self.x_train.shape[lead:]}, test {self.x_test.shape[2:]}"
      )
    n_train, n_test = np.asarray(self.n_train), np.asarray(self.n_test)
    checks = [("n_test", n_test, self.x_test.shape[1])]
    if not self.ragged:
      checks.insert(0, ("n_train", n_train, self.x_train.shape[1]))
    for name, n, m in checks:
      bad = np.flatnonzero((n < 0) | (n > m))
      if bad.size:
        raise ValueError(f"{name}[{int(bad[0])}]={int(n[bad[0]])} is outside [0, {m}] (the padded length)")
    if self.ragged:
      off, total = np.asarray(self.train_offset), int(self.x_train.shape[0])
      bad = np.flatnonzero((n_train < 0) | (off < 0) | (off + n_train > total))
      if bad.size:
        c0 = int(bad[0])
        raise ValueError(f"ragged client {c0}: rows {int(off[c0])}:{int(off[c0] + n_train[c0])} are "
                         f"outside the {total} flat training rows")
      if n_train.size and int(n_train.max()) != self.ragged_max_train:
        raise ValueError(f"ragged_max_train={self.ragged_max_train} but the largest client has "
                         f"{int(n_train.max())} training examples")
    empty = np.flatnonzero(n_train == 0)
    if empty.size:
      raise ValueError(f"client(s) {empty[:10].tolist()} have no training examples (n_train == 0)")
    if self.num_classes <= 0:
      raise ValueError(f"num_classes={self.num_classes} must be positive")
    if self.window is None:   # (a window's rows come from a store whose labels were checked when written)
      self._check_labels()
    if topology is not None and topology.num_clients != c:
      raise ValueError(
        f"the tree has {topology.num_clients} clients but the data has {c}: "
        f"{topology!r} vs x_train{tuple(self.x_train.shape)}"
      )
    return self

  def real_rows(self, split: str) -> np.ndarray:
    """``bool`` mask of the real (not padding) examples of ``split`` (``"train"`` or
    ``"test"``): ``[C, M]`` padded, ``[N]`` for a ragged training split (every row real)."""
    if split not in ("train", "test"):
      raise ValueError(f"split={split!r}; choose 'train' or 'test'")
    n = np.asarray(getattr(self, f"n_{split}"))
    if split == "train" and self.ragged:
      return np.ones(self.x_train.shape[0], bool)
    m = getattr(self, f"x_{split}").shape[1]
    return np.arange(m)[None, :] < n[:, None]

  def client_of_row(self, split: str, rows: tuple[np.ndarray, ...]) -> np.ndarray:
    """The client owning each index of ``rows`` (``np.nonzero`` of :meth:`real_rows`)."""
    if split == "train" and self.ragged:
      return np.searchsorted(np.asarray(self.train_offset) + np.asarray(self.n_train), rows[0], side="right")
    return rows[0]

  def _check_labels(self) -> None:
    """Every real label (class or next token) lies in ``[0, num_classes)``."""
    k = self.num_classes
    for split in ("train", "test"):
      y = getattr(self, f"y_{split}")
      if isinstance(y, jax.Array) and not y.is_fully_addressable:
        continue  # spans processes (fedtree.core.sharding): checked where it was loaded
      y = np.asarray(y)
      real = self.real_rows(split)
      real = real.reshape(real.shape + (1,) * (y.ndim - real.ndim))
      bad = np.nonzero(((y < 0) | (y >= k)) & real)
      if bad[0].size:
        c = int(self.client_of_row(split, bad)[0])
        value = int(y[tuple(b[0] for b in bad)])
        raise ValueError(
          f"client {c}: label {value} in y_{split} is outside [0, {k}) (num_classes={k}); "
          f"{bad[0].size} label(s) of y_{split} out of range. Set num_classes to the number of classes, "
          "or remap the labels to 0..num_classes-1"
        )

  def check_values(self) -> FederatedData:
    """:meth:`validate`, then every real input finite (a pass over ``x``; run once, where the
    data enter: :func:`from_client_arrays` and the experiment's context). Returns ``self``.

    Raises:
      ValueError: naming the first client (and example) whose input holds a NaN or an infinity.
    """
    self.validate()
    if self.window is not None:   # a window's rows come from a store that checked them when written
      return self
    for split in ("train", "test"):
      x = getattr(self, f"x_{split}")
      if not np.issubdtype(x.dtype, np.floating) or (isinstance(x, jax.Array) and not x.is_fully_addressable):
        continue
      x = np.asarray(x)
      real = self.real_rows(split)
      # in slices of the leading axis, so the boolean temporaries stay ~64 MB whatever x's size
      step = max(1, (64 << 20) // max(1, x[:1].size))
      features = int(np.prod(x.shape[real.ndim:]))
      finite = np.concatenate([
        np.isfinite(x[i:i + step]).reshape(x[i:i + step].shape[:real.ndim] + (features,)).all(axis=-1)
        for i in range(0, max(x.shape[0], 1), step)])
      bad = np.nonzero(real & ~finite)
      if bad[0].size:
        c = int(self.client_of_row(split, bad)[0])
        row = x[tuple(b[0] for b in bad)]
        value = float(row[~np.isfinite(row)].reshape(-1)[0])
        where = f"example {int(bad[-1][0])}" if not (split == "train" and self.ragged) else \
          f"flat row {int(bad[0][0])}"
        raise ValueError(
          f"client {c}: x_{split} {where} holds a non-finite input ({value}); "
          f"{bad[0].size} example(s) of x_{split} with NaN or infinite inputs. Clean or drop them before "
          "training"
        )
    return self

  def take(self, clients) -> FederatedData:
    """The data of a subset of clients (host-side; for references and analysis)."""
    idx = np.asarray(clients)
    if self.ragged:
      off, n = np.asarray(self.train_offset)[idx], np.asarray(self.n_train)[idx]
      rows = np.concatenate([np.arange(0)] + [np.arange(o, o + k) for o, k in zip(off, n, strict=True)])
      return dataclasses.replace(
        self, **{f: getattr(self, f)[idx] for f in ("x_test", "y_test", "n_test")},
        x_train=np.asarray(self.x_train)[rows], y_train=np.asarray(self.y_train)[rows], n_train=n,
        train_offset=np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int32),
        ragged_max_train=int(n.max()) if n.size else 0,
      )
    return dataclasses.replace(self, **{f: getattr(self, f)[idx] for f in _ARRAY_FIELDS})


_ARRAY_FIELDS = ("x_train", "y_train", "n_train", "x_test", "y_test", "n_test")


def _pad_stack(arrays: Sequence[np.ndarray], length: int, dtype) -> np.ndarray:
  first = np.asarray(arrays[0])
  out = np.zeros((len(arrays), length) + first.shape[1:], dtype=dtype)
  for i, a in enumerate(arrays):
    out[i, : len(a)] = a
  return out


def from_client_arrays(
  train: Sequence[tuple[np.ndarray, np.ndarray]],
  test: Sequence[tuple[np.ndarray, np.ndarray]],
  *,
  num_classes: int,
  dtype=np.float32,
) -> FederatedData:
  """Pads per-client ``(x, y)`` lists into a :class:`FederatedData`."""
  if len(train) != len(test):
    raise ValueError(f"{len(train)} clients have train data but {len(test)} have test data")
  if len(train) == 0:
    raise ValueError("from_client_arrays needs at least one client")
  n_train = np.array([len(y) for _, y in train], dtype=np.int32)
  n_test = np.array([len(y) for _, y in test], dtype=np.int32)
  m_train, m_test = max(1, int(n_train.max())), max(1, int(n_test.max()))
  data = FederatedData(
    x_train=_pad_stack([x for x, _ in train], m_train, dtype),
    y_train=_pad_stack([y for _, y in train], m_train, np.int32),
    n_train=n_train,
    x_test=_pad_stack([x for x, _ in test] if n_test.max() else [x[:0] for x, _ in train], m_test, dtype),
    y_test=_pad_stack([y for _, y in test] if n_test.max() else [y[:0] for _, y in train], m_test, np.int32),
    n_test=n_test,
    num_classes=int(num_classes),
  )
  return data.check_values()


def split_train_test(
  x: np.ndarray, y: np.ndarray, client_indices: Sequence[np.ndarray], *, test_fraction: float,
  rng: np.random.Generator, num_classes: int, keep_order: bool = False,
) -> FederatedData:
  """Splits every client's examples into train and test, then pads.

  Each client keeps at least one training example; ``test_fraction`` of the rest (rounded
  down), drawn at random, go to its test split. ``keep_order``: both splits keep the rows in
  the order ``client_indices`` lists them (e.g. a Flower partition's; the same test rows are
  drawn), else they are in the random order of the draw.
  """
  if not 0.0 <= test_fraction < 1.0:
    raise ValueError(f"test_fraction={test_fraction} must be in [0, 1)")
  train, test = [], []
  for c, idx in enumerate(client_indices):
    idx = rng.permutation(np.asarray(idx))
    if idx.size == 0:
      raise ValueError(f"client {c} received no examples from the partitioner")
    n_test = min(int(np.floor(test_fraction * idx.size)), idx.size - 1)
    test_idx, train_idx = idx[:n_test], idx[n_test:]
    if keep_order:
      listed = np.asarray(client_indices[c])
      held = np.isin(listed, test_idx)
      test_idx, train_idx = listed[held], listed[~held]
    train.append((x[train_idx], y[train_idx]))
    test.append((x[test_idx], y[test_idx]))
  return from_client_arrays(train, test, num_classes=num_classes, dtype=x.dtype)


# ------------------------------------------------------------------ partitioners
def partition_iid(num_examples: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
  """Shuffles the examples and deals them into ``num_clients`` near-equal parts."""
  _check_partition_args(num_examples, num_clients)
  return [np.sort(p) for p in np.array_split(rng.permutation(num_examples), num_clients)]


def partition_dirichlet(
  labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator, *, min_size: int = 1,
  max_tries: int = 100, self_balancing: bool = False,
) -> list[np.ndarray]:
  """Label skew: for every class, the share of each client is ``Dirichlet(alpha)``.

  Smaller ``alpha`` gives more skew. Redraws (up to ``max_tries``) until every client holds at
  least ``min_size`` examples, as in Hsu et al. 2019 and most simulators. ``self_balancing``
  (the balancing of the NIID-Bench code that Flower's ``DirichletPartitioner`` offers under the
  same name): a client already holding more than the average ``N / num_clients`` examples gets
  a share 0 of the classes still to deal, the others' shares renormalised (equal shares where
  every open client's draw underflowed to 0). Flower's defaults
  differ in ``min_partition_size=10`` (here ``min_size=1``); its draws differ anyway (its own
  random stream), so use ``flwr.DirichletPartitioner`` to reproduce its clients.
  """
  labels = np.asarray(labels)
  _check_partition_args(labels.size, num_clients)
  if alpha <= 0:
    raise ValueError(f"alpha={alpha} must be > 0")
  if min_size * num_clients > labels.size:
    raise ValueError(f"min_size={min_size} x {num_clients} clients > {labels.size} examples")
  classes = np.unique(labels)
  average = labels.size / num_clients
  for _ in range(max_tries):
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for k in classes:
      idx = rng.permutation(np.flatnonzero(labels == k))
      shares = rng.dirichlet(np.full(num_clients, alpha))
      if self_balancing:
        open_ = np.asarray([len(p) <= average for p in parts])   # (never all full: sizes sum below N)
        shares = np.where(open_, shares, 0.0)
        shares = shares / shares.sum() if shares.sum() > 0 else open_ / open_.sum()
      cuts = (np.cumsum(shares)[:-1] * idx.size).astype(int)
      if self_balancing:   # a closed client's cut must not lose a row to rounding (1 - 1e-16 of the rows)
        cuts = np.floor(np.cumsum(shares)[:-1] * idx.size + 1e-6).astype(int)
      for c, chunk in enumerate(np.split(idx, cuts)):
        parts[c].extend(chunk.tolist())
    if min(len(p) for p in parts) >= min_size:
      return [np.sort(np.array(p, dtype=np.int64)) for p in parts]
  raise ValueError(
    f"partition_dirichlet: no draw in {max_tries} tries gave every one of {num_clients} clients "
    f">= {min_size} examples at alpha={alpha}; raise alpha or lower num_clients"
  )


def partition_dirichlet_balanced(
  labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator, *,
  examples_per_client: int | None = None,
) -> list[np.ndarray]:
  """Label skew with equal client sizes (Hsu et al. 2019, "Measuring the effects of non-identical
  data distribution for federated visual classification"; pfl-research's and FLGo's CIFAR-10
  partitions): client ``c`` draws its class mix ``q_c ~ Dirichlet(alpha p)`` (``p`` the classes'
  shares of the data) and then ``examples_per_client`` examples (default ``N // num_clients``)
  class by class from ``q_c``, without replacement; where a class has run out, ``q_c`` is
  renormalized over the classes left. Examples beyond ``num_clients x examples_per_client`` are
  left out.

  Raises:
    ValueError: ``alpha <= 0``, fewer examples than ``num_clients x examples_per_client``.
  """
  labels = np.asarray(labels)
  _check_partition_args(labels.size, num_clients)
  if alpha <= 0:
    raise ValueError(f"alpha={alpha} must be > 0")
  size = labels.size // num_clients if examples_per_client is None else int(examples_per_client)
  if size < 1 or size * num_clients > labels.size:
    raise ValueError(f"examples_per_client={size} x {num_clients} clients must be in [1, {labels.size}] "
                     "(the examples)")
  classes = np.unique(labels)
  pools = [list(rng.permutation(np.flatnonzero(labels == k))) for k in classes]
  prior = np.asarray([len(p) for p in pools], np.float64) / labels.size
  parts = []
  for _ in range(num_clients):
    q = rng.dirichlet(alpha * prior)
    need, mine = size, []
    while need:
      left = np.asarray([len(p) for p in pools], np.float64)
      w = np.where(left > 0, q, 0.0)
      w = w / w.sum() if w.sum() > 0 else left / left.sum()
      counts = np.minimum(rng.multinomial(need, w), left.astype(np.int64))
      for k, n in enumerate(counts):
        mine.extend(pools[k][:n])
        del pools[k][:n]
      need -= int(counts.sum())
    parts.append(np.sort(np.asarray(mine, np.int64)))
  return parts


def partition_shards(
  labels: np.ndarray, num_clients: int, shards_per_client: int, rng: np.random.Generator,
) -> list[np.ndarray]:
  """McMahan et al.'s pathological non-IID split: sort by label, cut into shards, deal them."""
  labels = np.asarray(labels)
  _check_partition_args(labels.size, num_clients)
  num_shards = num_clients * shards_per_client
  if shards_per_client < 1 or num_shards > labels.size:
    raise ValueError(
      f"shards_per_client={shards_per_client} x {num_clients} clients needs <= {labels.size} shards"
    )
  order = np.argsort(labels, kind="stable")
  shards = np.array_split(order, num_shards)
  assignment = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
  return [np.sort(np.concatenate([shards[s] for s in row])) for row in assignment]


def partition_by_id(ids: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
  """One client per distinct natural id (writer, speaker, user); returns (parts, id of each)."""
  ids = np.asarray(ids)
  if ids.ndim != 1 or ids.size == 0:
    raise ValueError(f"partition_by_id needs a non-empty 1-D id array, got shape {ids.shape}")
  uniq, inverse = np.unique(ids, return_inverse=True)
  order = np.argsort(inverse, kind="stable")
  cuts = np.cumsum(np.bincount(inverse))[:-1]
  return list(np.split(order, cuts)), uniq


def _check_partition_args(num_examples: int, num_clients: int) -> None:
  if num_clients < 1:
    raise ValueError(f"num_clients={num_clients} must be >= 1")
  if num_examples < num_clients:
    raise ValueError(f"{num_examples} examples cannot give {num_clients} clients one each")


def as_device(data: FederatedData) -> FederatedData:
  """Moves the arrays to the default device (``jax.Array``; dtypes as ``jnp.asarray`` gives
  them). One copy per array: ``jax.device_put`` of the host array, where ``jnp.asarray`` held
  two transient copies of it besides (on CPU the clients' data then peaked at three times its
  size; now twice, the host array and the device's, until the host array is dropped)."""
  names = _ARRAY_FIELDS + (("train_offset",) if data.ragged else ())
  arrays: dict[str, Any] = {f: _to_device(getattr(data, f)) for f in names}
  return dataclasses.replace(data, **arrays)


def check_model_inputs(model, data: FederatedData) -> None:
  """Refuses a model that reads token ids (``model.input_dtype`` an integer type, e.g. a language
  model) on data of real-valued features (images, MFCCs), before anything compiles. (Integer
  features are valid input to a real-valued model: they are cast.)

  Raises:
    ValueError: naming the model's input dtype and the data's.
  """
  want = np.dtype(getattr(model, "input_dtype", "float32"))
  have = np.dtype(data.x_test.dtype)
  if np.issubdtype(want, np.integer) and not np.issubdtype(have, np.integer):
    raise ValueError(f"the model reads token ids (integers, input_dtype={want.name}) but the data's "
                     f"examples are {have.name} of shape {tuple(data.example_shape)}; choose a model for "
                     "this data")


def _to_device(a) -> jax.Array:
  return a if isinstance(a, jax.Array) else jax.device_put(np.asarray(a))


def check_model_outputs(model, data: FederatedData) -> None:
  """Refuses a model whose number of outputs differs from the data's classes, before
  anything compiles (``jax.eval_shape`` of ``model.init`` and ``model.apply`` on one example;
  nothing is allocated).

  A model with more outputs than classes would otherwise train without a word; one with fewer
  would stop later with a non-finite loss.

  Args:
    model: a :class:`fedtree.core.model.Model`.
    data: the federated data.

  Raises:
    ValueError: naming both numbers, when ``model.num_classes`` or the size of the last axis
      of the model's output is not ``data.num_classes``.
  """
  k = data.num_classes
  if int(model.num_classes) != k:
    raise ValueError(f"the model has num_classes={model.num_classes} but the data has {k} classes "
                     "(labels 0..num_classes-1); build the model with the data's num_classes")
  example = jax.ShapeDtypeStruct((1,) + data.example_shape, data.x_test.dtype)
  params = jax.eval_shape(model.init, jax.ShapeDtypeStruct((), jax.random.key(0).dtype))
  out = jax.eval_shape(lambda p, x: model.apply(p, x, train=False), params, example)
  if out.shape[-1] != k:
    raise ValueError(f"the model outputs {out.shape[-1]} logits per example (output shape {out.shape}) "
                     f"but the data has {k} classes; its last layer must have num_classes={k} outputs")
