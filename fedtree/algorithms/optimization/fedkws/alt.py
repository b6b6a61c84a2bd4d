"""ALT, FedKWS-UI's adaptive local training (paper 002): clients with more data and more uniform labels
take more local steps.

The utility (:func:`label_entropy`, :func:`client_utility`) and the step counts (:func:`alt_steps`,
:func:`alt_schedule`); the equations: :doc:`FedKWS-UI on the optimization page
<algorithms/optimization.md#fedkws-ui>`.

References:
  Li et al., Avoid overfitting user specific information in federated keyword spotting, 2022.
"""

from __future__ import annotations

import numpy as np

from fedtree.core.data import FederatedData
from fedtree.core.local import LocalSchedule


def label_entropy(y: np.ndarray, n: np.ndarray, num_classes: int) -> np.ndarray:
  """Normalized label entropy ``H(q_k) / log C`` of every client: ``y [C, M]``, ``n [C]``."""
  y, n = np.asarray(y), np.asarray(n)
  valid = np.arange(y.shape[1])[None, :] < n[:, None]
  counts = np.stack([np.bincount(y[k][valid[k]], minlength=num_classes) for k in range(y.shape[0])])
  q = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
  with np.errstate(divide="ignore", invalid="ignore"):
    h = -np.sum(np.where(q > 0, q * np.log(q), 0.0), axis=1)
  return h / np.log(num_classes)


def client_utility(n_train: np.ndarray, y_train: np.ndarray, num_classes: int,
                   n_max: float | None = None) -> np.ndarray:
  """``r̄_k``: the harmonic mean of ``n̄_k`` and ``ē_k`` (float64 ``[C]``).

  ``n̄_k = min(n_k / n_max, 1)``; ``n_max=None``: the largest client's ``n`` (the paper's
  ``max_j n_j``); the authors' code fixes it (100 for 12 classes, 300 for 35).
  """
  n = np.asarray(n_train, np.float64)
  if n_max is not None and not float(n_max) > 0:
    raise ValueError(f"ALT n_max={n_max} must be > 0")
  n_bar = np.minimum(n / (max(n.max(), 1.0) if n_max is None else float(n_max)), 1.0)
  e_bar = label_entropy(y_train, n_train, num_classes)
  s = n_bar + e_bar
  return np.where(s > 0, 2.0 * n_bar * e_bar / np.where(s > 0, s, 1.0), 0.0)


def alt_steps(data: FederatedData, base_steps: int, *, r0: float | None = None,
              min_steps: int = 1, n_max: float | None = None) -> tuple[int, ...]:
  """Per-client local step counts of ALT (:doc:`docs <algorithms/optimization.md#fedkws-ui>`).

  Args:
    data: the federated data (its training labels and counts are read on the host).
    base_steps: ``E``, the steps every client would take without ALT.
    r0: ``r_0``; ``None``: ``K / Σ_k r̄_k`` (work conserved).
    min_steps: the floor of every count.
    n_max: the size that counts as full (:func:`client_utility`; ``None``: the largest client's).
  """
  if int(base_steps) < 1:
    raise ValueError(f"ALT base_steps={base_steps} must be >= 1")
  if int(min_steps) < 0:
    raise ValueError(f"ALT min_steps={min_steps} must be >= 0")
  data.require_padded("ALT's label entropy (FedKWS-UI)")
  r = client_utility(np.asarray(data.n_train), np.asarray(data.y_train), data.num_classes, n_max)
  if r0 is None:
    if r.sum() <= 0:
      raise ValueError("ALT: every client has utility 0 (one label each); pass r0 explicitly")
    r0 = len(r) / r.sum()
  elif not float(r0) > 0:
    raise ValueError(f"ALT r0={r0} must be > 0")
  steps = np.maximum(np.rint(float(r0) * r * int(base_steps)), int(min_steps)).astype(int)
  return tuple(int(s) for s in steps)


def alt_schedule(schedule: LocalSchedule, data: FederatedData, *, r0: float | None = None,
                 min_steps: int = 1, n_max: float | None = None) -> LocalSchedule:
  """``schedule`` (a fixed ``steps`` count E) with ALT's per-client counts."""
  if not isinstance(schedule.steps, int) or isinstance(schedule.steps, bool):
    raise ValueError(
      f"ALT needs a fixed local step count E (config.local.steps), got steps={schedule.steps!r} "
      f"epochs={schedule.epochs!r}"
    )
  return LocalSchedule(batch_size=schedule.batch_size, epochs=None,
                       steps=alt_steps(data, schedule.steps, r0=r0, min_steps=min_steps, n_max=n_max))
