"""Generated MNIST-like images (no download): noisy copies of one random prototype per class.

:func:`prototype_images` stands in for MNIST in quick experiments and tests of paper 004's
clustered-FL setup (10 clients by Dirichlet(α = 0.1), images of some clients flipped). Class
``k`` has a prototype ``P_k ∈ [0, 1]^{H×W}``: a random pattern of ``blobs`` bright Gaussian
spots, so prototypes are not mirror-symmetric and a flipped image is a new distribution.
An example of class ``k`` is ``clip(P_k shifted by up to ``max_shift`` pixels + noise · N(0, 1), 0, 1)``
with shape ``[H, W, 1]`` (``[H, W, C]`` with ``channels=C``: one prototype per class and
channel, e.g. a CIFAR-shaped stand-in with ``image_size=32, channels=3``). Examples are dealt to clients by
:func:`fedtree.core.data.partition_dirichlet` and each client's are split into train and test.

With ``max_labels=L`` the images are multi-label (a FLAIR-shaped stand-in): an example shows between
1 and ``L`` distinct classes (the pixelwise maximum of their shifted prototypes) and its label is
multi-hot, ``[num_classes]`` of 0 and 1; the Dirichlet partition deals examples by their first class.
"""

from __future__ import annotations

import numpy as np

from fedtree.core.data import FederatedData, partition_dirichlet, partition_iid, split_train_test


def _prototypes(rng, num_classes: int, size: int, blobs: int, channels: int = 1) -> np.ndarray:
  yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
  protos = np.zeros((num_classes, size, size, channels))
  for k in range(num_classes):
    for c in range(channels):
      for _ in range(blobs):
        cy, cx = rng.uniform(0, size - 1, 2)
        s = rng.uniform(0.6, 1.5)
        protos[k, :, :, c] += np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * s * s))
  return np.clip(protos, 0.0, 1.0)


def prototype_images(
  *,
  num_clients: int = 10,
  num_examples: int = 2000,
  num_classes: int = 10,
  image_size: int = 8,
  blobs: int = 3,
  noise: float = 0.3,
  max_shift: int = 1,
  partition: str = "dirichlet",
  alpha: float = 0.1,
  test_fraction: float = 0.2,
  channels: int = 1,
  max_labels: int | None = None,
  seed: int = 0,
) -> FederatedData:
  """MNIST-like generated images over ``num_clients`` clients (module docstring).

  Args:
    num_examples: examples in all (before the split into clients).
    partition: ``"dirichlet"`` (label skew with ``alpha``) or ``"iid"``.
    test_fraction: share of every client's examples kept as its test data.
    max_labels: ``None`` (one class per example, ``int32`` labels) or the most classes an example
      shows (multi-hot labels ``[num_classes]``; module docstring).
  """
  if image_size < 2 or num_classes < 2:
    raise ValueError(f"image_size={image_size} and num_classes={num_classes} must be >= 2")
  if channels < 1:
    raise ValueError(f"channels={channels} must be >= 1")
  if partition not in ("dirichlet", "iid"):
    raise ValueError(f"partition={partition!r}; choose 'dirichlet' or 'iid'")
  if max_labels is not None and not 1 <= int(max_labels) <= num_classes:
    raise ValueError(f"max_labels={max_labels} must be None or between 1 and num_classes={num_classes}")
  rng = np.random.default_rng(seed)
  protos = _prototypes(rng, num_classes, image_size, blobs, channels)
  y = rng.integers(0, num_classes, num_examples).astype(np.int32)
  shifts = rng.integers(-max_shift, max_shift + 1, (num_examples, 2))
  x = np.stack([np.roll(protos[k], tuple(s), axis=(0, 1)) for k, s in zip(y, shifts, strict=True)])
  labels = y
  if max_labels is not None:   # further classes beside the first, overlaid
    labels = np.zeros((num_examples, num_classes), np.uint8)
    labels[np.arange(num_examples), y] = 1
    for i, extra in enumerate(rng.integers(0, int(max_labels), num_examples)):
      for k in rng.choice(np.flatnonzero(labels[i] == 0), int(extra), replace=False):
        labels[i, k] = 1
        x[i] = np.maximum(x[i], np.roll(protos[k], tuple(shifts[i]), axis=(0, 1)))
  x = np.clip(x + noise * rng.normal(size=x.shape), 0.0, 1.0).astype(np.float32)
  if partition == "dirichlet":
    parts = partition_dirichlet(y, num_clients, alpha, rng, min_size=4)
  else:
    parts = partition_iid(num_examples, num_clients, rng)
  return split_train_test(x, labels, parts, test_fraction=test_fraction, rng=rng, num_classes=num_classes)
