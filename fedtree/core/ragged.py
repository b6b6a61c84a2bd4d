"""Client data without padding waste: every client's examples stored flat, with offsets.

Natural federated splits are long-tailed (a few clients hold most examples). The padded
layout (:class:`fedtree.core.data.FederatedData`, ``x: [C, M, ...]``) costs
``C x max_c n_c`` examples; :class:`RaggedData` costs ``sum_c n_c``: client ``c``'s examples
are rows ``offsets[c] : offsets[c + 1]`` of one flat ``x: [N, ...]``.

Training reads it through the same :class:`fedtree.core.local.ClientData` as the padded
path: :func:`client_data` gives every client of a cohort the *shared* flat arrays plus its
``offset`` and count, and :func:`fedtree.core.local.batch_at` gathers a batch by
``offset + index`` inside jit. Vmapped over a cohort with ``in_axes`` ``None`` for the flat
arrays (:func:`client_axes`), nothing is copied per client: a step costs O(batch), and
memory grows with the total number of examples, not with ``clients x largest client``.
The padded arrays stay the simple default path; :func:`from_padded` / :func:`to_padded`
convert between the two (tested to give the same batches).

Measured (``python -m benchmarks.ragged``, train split): PerMFL's Synthetic(0.5, 0.5) as
fedtree generates it (50 clients, 188 to 10,511 examples of 60 floats, seed 0) is 128.2 MB
padded vs 15.6 MB ragged (8.2x); 100,000 clients with StackOverflow-like lognormal sentence
counts (1 to 40,052, 10.2M sentences of 20 tokens) would be 640.8 GB padded vs 1.63 GB
ragged (393x).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedtree.core.data import FederatedData
from fedtree.core.local import ClientData


@struct.dataclass
class RaggedData:
  """One split (train or test) of every client, flat.

  Attributes:
    x: ``[N, ...]`` every client's examples back to back (``N = sum_c counts[c]``).
    y: ``int32[N]`` labels (``[N, T]`` next tokens of a language model).
    offsets: ``int32[C + 1]``; client ``c`` owns rows ``offsets[c] : offsets[c + 1]``.
    num_classes: number of label values (static).
  """

  x: jax.Array | np.ndarray  # host arrays until moved to the device
  y: jax.Array | np.ndarray
  offsets: jax.Array | np.ndarray
  num_classes: int = struct.field(pytree_node=False, default=0)

  @property
  def num_clients(self) -> int:
    return int(self.offsets.shape[0]) - 1

  @property
  def counts(self) -> jax.Array | np.ndarray:
    """``int32[C]`` examples per client."""
    return self.offsets[1:] - self.offsets[:-1]

  @property
  def nbytes(self) -> int:
    return int(sum(np.asarray(a).nbytes for a in (self.x, self.y, self.offsets)))


def from_client_arrays(clients: Sequence[tuple[np.ndarray, np.ndarray]], *, num_classes: int,
                       dtype=np.float32) -> RaggedData:
  """Concatenates per-client ``(x, y)`` (host arrays) into a :class:`RaggedData`.

  Raises:
    ValueError: no client, or a client whose ``x`` and ``y`` lengths differ.
  """
  if not clients:
    raise ValueError("from_client_arrays needs at least one client")
  for c, (x, y) in enumerate(clients):
    if len(x) != len(y):
      raise ValueError(f"client {c} has {len(x)} x rows but {len(y)} labels")
  counts = np.asarray([len(y) for _, y in clients], np.int64)
  offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
  x = np.concatenate([np.asarray(x, dtype) for x, _ in clients])
  y = np.concatenate([np.asarray(y, np.int32) for _, y in clients])
  return RaggedData(x=x, y=y, offsets=offsets, num_classes=int(num_classes))


def from_padded(data: FederatedData, split: str = "train") -> RaggedData:
  """The ``"train"`` or ``"test"`` split of padded ``data``, flat (padding dropped)."""
  if split not in ("train", "test"):
    raise ValueError(f"split={split!r}; choose 'train' or 'test'")
  x, y, n = (np.asarray(getattr(data, f"{k}_{split}")) for k in ("x", "y", "n"))
  return from_client_arrays([(x[c, : n[c]], y[c, : n[c]]) for c in range(len(n))],
                            num_classes=data.num_classes, dtype=x.dtype)


def to_padded(data: RaggedData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``(x [C, M, ...], y [C, M, ...], n int32[C])`` with ``M`` the largest client."""
  off = np.asarray(data.offsets)
  counts = off[1:] - off[:-1]
  m = max(1, int(counts.max()))
  x = np.zeros((len(counts), m) + tuple(data.x.shape[1:]), np.asarray(data.x).dtype)
  y = np.zeros((len(counts), m) + tuple(data.y.shape[1:]), np.int32)
  for c in range(len(counts)):
    x[c, : counts[c]] = np.asarray(data.x)[off[c]: off[c + 1]]
    y[c, : counts[c]] = np.asarray(data.y)[off[c]: off[c + 1]]
  return x, y, counts.astype(np.int32)


def client_data(data: RaggedData, clients: jax.Array, *, cursor=0, shuffle=True) -> ClientData:
  """A cohort's :class:`ClientData` over the shared flat arrays: ``x``/``y`` are ``data``'s
  (not copied), ``n = counts[clients]`` and ``offset = offsets[clients]`` (``[K]`` each).
  Vmap with :func:`client_axes`."""
  clients = jnp.asarray(clients, jnp.int32)
  offsets = jnp.asarray(data.offsets)
  return ClientData(x=jnp.asarray(data.x), y=jnp.asarray(data.y),
                    n=offsets[clients + 1] - offsets[clients], cursor=cursor, shuffle=shuffle,
                    offset=offsets[clients])


def client_axes(cursor_batched: bool = False, shuffle_batched: bool = False) -> ClientData:
  """``in_axes`` for vmapping over :func:`client_data`'s cohort: flat arrays shared."""
  # vmap in_axes in ClientData's shape: axis numbers and None, not data
  return ClientData(x=None, y=None, n=0, cursor=0 if cursor_batched else None,  # type: ignore[arg-type]
                    shuffle=0 if shuffle_batched else None, offset=0)  # type: ignore[arg-type]


def padded_bytes(counts: np.ndarray, example_bytes: int) -> int:
  """Bytes of the padded layout: every client padded to the largest (``C x M x bytes``)."""
  counts = np.asarray(counts)
  return int(len(counts) * max(1, int(counts.max())) * int(example_bytes))


def ragged_bytes(counts: np.ndarray, example_bytes: int) -> int:
  """Bytes of the flat layout: the examples plus ``C + 1`` int32 offsets."""
  counts = np.asarray(counts)
  return int(counts.sum()) * int(example_bytes) + 4 * (len(counts) + 1)


def to_ragged_train(data: FederatedData) -> FederatedData:
  """``data`` with its training split stored flat (:attr:`FederatedData.train_offset`): the
  padding rows are dropped, so training memory grows with the number of examples. Test
  splits stay padded. Local training through :func:`fedtree.core.tier.train_cohort` gives the
  same batches and the same models as on the padded layout (tested)."""
  if data.ragged:
    return data
  flat = from_padded(data, "train")
  n = np.asarray(data.n_train).astype(np.int32)
  return dataclasses.replace(
    data,
    x_train=np.asarray(flat.x), y_train=np.asarray(flat.y), n_train=n,
    train_offset=np.asarray(flat.offsets[:-1], np.int32), ragged_max_train=int(n.max()),
  ).validate()


def to_padded_train(data: FederatedData) -> FederatedData:
  """The inverse of :func:`to_ragged_train`: every client's training rows padded to the largest."""
  if not data.ragged:
    return data
  n = np.asarray(data.n_train).astype(np.int32)
  x, y = np.asarray(data.x_train), np.asarray(data.y_train)
  # offsets need not be contiguous or ordered: gather each client's rows explicitly
  clients = [(x[o:o + k], y[o:o + k]) for o, k in zip(np.asarray(data.train_offset), n, strict=True)]
  flat = from_client_arrays(clients, num_classes=data.num_classes, dtype=x.dtype)
  px, py, pn = to_padded(flat)
  return dataclasses.replace(data, x_train=px, y_train=py, n_train=pn, train_offset=None,
                             ragged_max_train=0).validate()
