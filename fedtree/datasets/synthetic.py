"""Datasets generated on the fly: no download, deterministic for a seed.

* :func:`synthetic_alpha_beta` is the Synthetic(α, β) dataset of FedProx (Li et al. 2020,
  Appendix C.1), also used by pFedMe and pFedMT (paper 003). The exact recipe, per client k:

  - ``u_k ~ N(0, α²)``, ``B_k ~ N(0, β²)`` (α, β are standard deviations, as in the
    authors' generator);
  - ``W_k ~ N(u_k, 1)`` of shape ``[d, c]``, ``b_k ~ N(u_k, 1)`` of shape ``[c]``;
  - ``v_k ~ N(B_k, 1)`` of shape ``[d]``; ``x ~ N(v_k, Σ)`` with ``Σ = diag(j^-1.2)``,
    ``j = 1..d``;
  - ``y = argmax(softmax(x W_k + b_k))``;
  - the number of examples is ``(int(lognormal(4, 2)) + 50) × samples_scale``
    (``samples_scale`` = 1 in FedProx, 5 in pFedMe/pFedMT), optionally capped at
    ``max_examples`` (the cap is ours, to bound the padded length; ``None`` keeps the
    recipe exact);
  - each client's examples are split ``1 - test_fraction`` / ``test_fraction``
    (pFedMe: 75/25).

* :func:`grouped_synthetic` builds groups of clients with distinct distributions, so that a
  group model beats the global one and a personal model beats the group model. A global
  linear teacher ``W_0`` is shared by all; group g uses
  ``W_g = W_0 + group_spread · E_g`` and its own feature mean ``m_g ~ N(0, feature_shift²)``;
  client k in g uses ``W_k = W_g + client_spread · E_k`` and ``x ~ N(m_g, I)``; labels are
  ``argmax(x W_k + b_g)``. Group sizes may be very unequal, and per-client example counts
  follow a capped lognormal, so most clients have few examples (as in paper 000's Table 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedtree.core.data import FederatedData, from_client_arrays


def _split(x, y, test_fraction, rng):
  n = len(y)
  perm = rng.permutation(n)
  n_test = min(int(round(test_fraction * n)), n - 1)
  te, tr = perm[:n_test], perm[n_test:]
  return (x[tr], y[tr]), (x[te], y[te])


def synthetic_alpha_beta(
  *,
  num_clients: int = 30,
  alpha: float = 0.5,
  beta: float = 0.5,
  dim: int = 60,
  num_classes: int = 10,
  samples_scale: int = 1,
  max_examples: int | None = None,
  test_fraction: float = 0.25,
  seed: int = 0,
) -> FederatedData:
  """The Synthetic(α, β) dataset of FedProx / pFedMe (recipe in the module docstring)."""
  if num_clients < 1:
    raise ValueError(f"num_clients={num_clients} must be >= 1")
  if alpha < 0 or beta < 0:
    raise ValueError(f"alpha={alpha} and beta={beta} must be >= 0")
  if not 0 <= test_fraction < 1:
    raise ValueError(f"test_fraction={test_fraction} must be in [0, 1)")
  rng = np.random.default_rng(seed)
  sizes = (rng.lognormal(4, 2, num_clients).astype(np.int64) + 50) * int(samples_scale)
  if max_examples is not None:
    sizes = np.minimum(sizes, int(max_examples))
  u = rng.normal(0.0, alpha, num_clients)
  b_mean = rng.normal(0.0, beta, num_clients)
  sigma = np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2)
  train, test = [], []
  for k in range(num_clients):
    w = rng.normal(u[k], 1.0, (dim, num_classes))
    b = rng.normal(u[k], 1.0, num_classes)
    v = rng.normal(b_mean[k], 1.0, dim)
    x = (v + rng.normal(size=(sizes[k], dim)) * np.sqrt(sigma)).astype(np.float32)
    y = np.argmax(x @ w + b, axis=1).astype(np.int32)
    tr, te = _split(x, y, test_fraction, rng)
    train.append(tr)
    test.append(te)
  return from_client_arrays(train, test, num_classes=num_classes)


def grouped_synthetic(
  *,
  group_sizes: Sequence[int] = (24, 12, 8, 4),
  dim: int = 32,
  num_classes: int = 10,
  group_spread: float = 1.0,
  client_spread: float = 0.25,
  feature_shift: float = 1.0,
  mean_examples: float = 40.0,
  min_examples: int = 8,
  max_examples: int = 160,
  test_examples: int = 40,
  seed: int = 0,
) -> tuple[FederatedData, np.ndarray]:
  """Clients in groups with distinct distributions (see the module docstring).

  Returns:
    ``(data, group_labels)``: ``group_labels[c]`` is the group of client ``c``, ready for
    :meth:`fedtree.Topology.from_labels`.
  """
  group_sizes = [int(g) for g in group_sizes]
  if not group_sizes or min(group_sizes) < 1:
    raise ValueError(f"group_sizes={group_sizes} must be non-empty and every group >= 1")
  if not 1 <= min_examples <= max_examples:
    raise ValueError(f"need 1 <= min_examples={min_examples} <= max_examples={max_examples}")
  if test_examples < 1:
    raise ValueError(f"test_examples={test_examples} must be >= 1")
  rng = np.random.default_rng(seed)
  w0 = rng.normal(size=(dim, num_classes)) / np.sqrt(dim)
  train, test, labels = [], [], []
  sigma_log = 1.0
  mu_log = np.log(mean_examples) - sigma_log**2 / 2
  for g, size in enumerate(group_sizes):
    wg = w0 + group_spread * rng.normal(size=(dim, num_classes)) / np.sqrt(dim)
    bg = rng.normal(size=num_classes) * 0.5
    mg = rng.normal(size=dim) * feature_shift
    for _ in range(size):
      wk = wg + client_spread * rng.normal(size=(dim, num_classes)) / np.sqrt(dim)
      n = int(np.clip(rng.lognormal(mu_log, sigma_log), min_examples, max_examples))
      x = (mg + rng.normal(size=(n + test_examples, dim))).astype(np.float32)
      y = np.argmax(x @ wk + bg, axis=1).astype(np.int32)
      train.append((x[:n], y[:n]))
      test.append((x[n:], y[n:]))
      labels.append(g)
  data = from_client_arrays(train, test, num_classes=num_classes)
  return data, np.asarray(labels, dtype=np.int32)
