"""Per-client input transforms that make some clients' distribution differ from the rest.

Paper 004 (Li & Yan 2023, Sec. 4.1) builds its clustered-FL benchmarks this way: MNIST over
10 clients by Dirichlet(0.1) with the images of 5 random clients flipped, EMNIST over 20
clients with 10 clients' images rotated by 180°. :func:`transform_random_clients` does that
to any :class:`~fedtree.core.data.FederatedData` (TFDS or generated), on the train and test data
of the chosen clients alike, and returns which clients were transformed (the ground-truth
"distribution" of every client, used as the report groups).

Kinds: ``hflip`` (left-right mirror), ``vflip`` (upside down), ``rot180`` (both), for image
examples ``[H, W]`` or ``[H, W, channels]``; for flat examples ``[D]`` every kind reverses the
feature order (a mirror of a 1-D signal), so generated vector data can be used too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedtree.core.data import FederatedData

KINDS = ("hflip", "vflip", "rot180")


def transform_examples(x: np.ndarray, kind: str, example_ndim: int) -> np.ndarray:
  """Applies ``kind`` to every example of ``x [..., *example_shape]`` (``example_ndim`` dims)."""
  if kind not in KINDS:
    raise ValueError(f"transform kind={kind!r}; choose one of {KINDS}")
  if example_ndim == 1:
    return x[..., ::-1]
  h_axis, w_axis = x.ndim - example_ndim, x.ndim - example_ndim + 1
  if kind in ("hflip", "rot180"):
    x = np.flip(x, axis=w_axis)
  if kind in ("vflip", "rot180"):
    x = np.flip(x, axis=h_axis)
  return x


def transform_clients(data: FederatedData, clients: Sequence[int], kind: str) -> FederatedData:
  """``data`` with the train and test inputs of ``clients`` transformed by ``kind``
  (padding is transformed too and stays padding)."""
  idx = np.asarray(clients, dtype=np.int64)
  if idx.size and (idx.min() < 0 or idx.max() >= data.num_clients):
    raise ValueError(f"clients {idx.tolist()} are outside [0, {data.num_clients})")
  nd = len(data.example_shape)
  out = {}
  for field in ("x_train", "x_test"):
    x = np.array(getattr(data, field))
    if idx.size:
      x[idx] = transform_examples(x[idx], kind, nd)
    out[field] = x
  return data.replace(**out)


def transform_random_clients(
  data: FederatedData, *, num_transformed: int, kind: str = "hflip", seed: int = 0,
) -> tuple[FederatedData, np.ndarray]:
  """Transforms ``num_transformed`` clients drawn without replacement (``seed``).

  Returns:
    ``(data, transformed int32[C])`` with ``transformed[c] = 1`` for the changed clients.
  """
  c = data.num_clients
  if not 0 <= int(num_transformed) <= c:
    raise ValueError(f"num_transformed={num_transformed} must be in [0, {c}] (the number of clients)")
  chosen = np.sort(np.random.default_rng(seed).choice(c, size=int(num_transformed), replace=False))
  flags = np.zeros(c, np.int32)
  flags[chosen] = 1
  return transform_clients(data, chosen, kind), flags
