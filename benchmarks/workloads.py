"""The benchmark workloads, described once and built identically for every framework.

(a) ``mlp``: FedAvg of a 60-200-200-10 MLP, 64 examples per client, batch 16, 4 local steps,
    every client sampled (the setting of FedJAX/FLSim-style throughput comparisons).
(b) ``cnn``: the cross-framework workload of the pfl-research benchmark (Granqvist et al.
    2024): 1,000 clients x 50 images 32x32x3, cohort 50, 1 local epoch of batch 10, local lr
    0.1, server lr 1.0, the CNN conv3x3(32)-conv3x3(64)-maxpool2-dropout-dense128-dropout-dense10.
(c) ``tree``: HierFAVG on a 3-tier tree (10 edges x 100 clients) against the flat FedAvg round
    over the same 1,000 clients and the same local work.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Workload:
  """One benchmark setting (static; every framework builds the same arrays from it)."""

  name: str
  model: str                     # "mlp" | "cnn"
  num_clients: int
  examples: int                  # per client
  example_shape: tuple[int, ...]
  num_classes: int = 10
  cohort: int | None = None      # clients per round (None: all)
  batch_size: int = 16
  local_steps: int = 4           # steps per round (= epochs * examples / batch here)
  lr: float = 0.05
  server_lr: float = 1.0
  edges: int | None = None       # 3-tier tree: root -> edges -> clients
  seed: int = 0

  @property
  def cohort_size(self) -> int:
    return self.num_clients if self.cohort is None else self.cohort

  @property
  def examples_per_round(self) -> int:
    """Examples processed per round (cohort x local steps x batch)."""
    return self.cohort_size * self.local_steps * self.batch_size

  def label(self) -> str:
    tree = f", tree {self.edges}x{self.num_clients // self.edges}" if self.edges else ""
    return f"{self.name}: {self.model}, {self.num_clients} clients, cohort {self.cohort_size}{tree}"


def mlp(num_clients: int = 1000) -> Workload:
  """Workload (a)."""
  return Workload("a", "mlp", num_clients, 64, (60,), batch_size=16, local_steps=4, lr=0.05)


def cnn(num_clients: int = 1000, cohort: int = 50) -> Workload:
  """Workload (b): 50 images per client, batch 10, one epoch = 5 steps."""
  return Workload("b", "cnn", num_clients, 50, (32, 32, 3), cohort=min(cohort, num_clients),
                  batch_size=10, local_steps=5, lr=0.1)


def tree(num_clients: int = 1000, edges: int = 10) -> Workload:
  """Workload (c): same clients and local work as (a), on a 3-tier tree."""
  return dataclasses.replace(mlp(num_clients), name="c", edges=edges)


def make_arrays(w: Workload) -> tuple[np.ndarray, np.ndarray]:
  """``x [C, M, *shape] float32``, ``y [C, M] int32``: CIFAR-10 through TFDS for (b) when it is
  already on disk, otherwise Gaussian features and random labels (speed does not depend on
  the values)."""
  rng = np.random.default_rng(w.seed)
  n = w.num_clients * w.examples
  x = y = None
  if w.model == "cnn":
    x, y = _cifar10(n)
  if x is None:
    x = rng.standard_normal((n,) + w.example_shape, dtype=np.float32)
    y = rng.integers(0, w.num_classes, n).astype(np.int32)
  x = x.reshape((w.num_clients, w.examples) + w.example_shape)
  return x, y.reshape(w.num_clients, w.examples).astype(np.int32)


def _cifar10(n: int):
  """The first ``n`` CIFAR-10 training images (repeated if needed) if TFDS has them locally."""
  try:
    import tensorflow_datasets as tfds

    builder = tfds.builder("cifar10")
    if not builder.is_prepared():
      return None, None
    ds = tfds.as_numpy(builder.as_dataset(split="train", batch_size=-1))
  except Exception:  # noqa: BLE001 - any failure means "not available here"
    return None, None
  x = (ds["image"].astype(np.float32) / 255.0)
  y = ds["label"].astype(np.int32)
  reps = -(-n // len(y))
  return np.tile(x, (reps, 1, 1, 1))[:n], np.tile(y, reps)[:n]


def data_source(w: Workload) -> str:
  if w.model == "cnn" and _cifar10(1)[0] is not None:
    return "cifar10 (tfds)"
  return "random"
