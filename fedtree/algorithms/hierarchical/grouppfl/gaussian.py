"""The Gaussian hierarchical model of paper 000 (section 4, "A Bayesian view"), solved exactly.

The posteriors under no, group and global sharing (:func:`posterior_local`, :func:`posterior_group`,
:func:`posterior_global`), the paper's formula (:func:`posterior_global_paper`) and the correction to
it: :doc:`the Gaussian model on the GroupPerFL page <algorithms/grouppfl.md#the-gaussian-model>`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _groups(sigmas: Sequence[Sequence[float]]) -> list[np.ndarray]:
  out = [np.asarray(s, np.float64).reshape(-1) for s in sigmas]
  if not out or any(s.size == 0 for s in out):
    raise ValueError("need at least one group and at least one client per group")
  if any(np.any(s <= 0) for s in out):
    got = [s.tolist() for s in out]
    raise ValueError(f"client noise standard deviations must be > 0; got {got}")
  return out


def sample(rng: np.random.Generator, *, theta0: float, sigma0: float,
           sigmas: Sequence[Sequence[float]],
           num_draws: int) -> tuple[np.ndarray, list[np.ndarray]]:
  """``num_draws`` independent draws of the model with a fixed ``θ_0``.

  Returns:
    ``(theta [R, M], x)`` where ``x[m]`` is ``[R, N_m]``: the group parameters and every
    client's observation.
  """
  groups = _groups(sigmas)
  if sigma0 < 0:
    raise ValueError(f"sigma0={sigma0} must be >= 0")
  theta = theta0 + sigma0 * rng.standard_normal((num_draws, len(groups)))
  x = [theta[:, m : m + 1] + s * rng.standard_normal((num_draws, s.size))
       for m, s in enumerate(groups)]
  return theta, x


def posterior_local(x11, sigma11: float) -> tuple[np.ndarray, float]:
  """No sharing: ``θ_11 | x_11 ~ N(x_11, σ_11²)``."""
  return np.asarray(x11, np.float64), float(sigma11) ** 2


def posterior_group(x1, sigmas1: Sequence[float]) -> tuple[np.ndarray, float]:
  """Group sharing: ``μ_g1 = Σ σ_1n^{-2} x_1n / Σ σ_1n^{-2}``, ``σ_g1² = 1 / Σ σ_1n^{-2}``.

  ``x1`` is ``[..., N_1]`` (leading axes are independent draws).
  """
  prec = np.asarray(sigmas1, np.float64) ** -2
  return np.asarray(x1, np.float64) @ prec / prec.sum(), 1.0 / prec.sum()


def _combine(x1, sigmas1, mu_rest, var_rest, sigma0):
  prec = np.asarray(sigmas1, np.float64) ** -2
  w_rest = 1.0 / (sigma0**2 + var_rest)
  total = prec.sum() + w_rest
  return (np.asarray(x1, np.float64) @ prec + w_rest * mu_rest) / total, 1.0 / total


def posterior_global(x: Sequence, sigmas: Sequence[Sequence[float]], sigma0: float):
  """Global sharing, exact: ``θ_11`` given every client's data (group 0 is the target's).

  Each other group ``m`` is pooled into ``x̄_m`` (variance ``s_m²``); then
  ``μ_{G/1} = Σ_m (σ_0² + s_m²)^{-1} x̄_m / Σ_m (σ_0² + s_m²)^{-1}``,
  ``σ_{G/1}² = 1 / Σ_m (σ_0² + s_m²)^{-1}`` and the result combines group 0's data with the
  prior ``N(μ_{G/1}, σ_0² + σ_{G/1}²)`` on ``θ_1``. ``x[m]`` is ``[..., N_m]``.
  """
  groups = _groups(sigmas)
  if len(groups) < 2:
    return posterior_group(x[0], groups[0])
  num, den = 0.0, 0.0
  for m in range(1, len(groups)):
    xbar, s2 = posterior_group(x[m], groups[m])
    w = 1.0 / (sigma0**2 + s2)
    num, den = num + w * xbar, den + w
  return _combine(x[0], groups[0], num / den, 1.0 / den, sigma0)


def posterior_global_paper(x: Sequence, sigmas: Sequence[Sequence[float]], sigma0: float):
  """Global sharing as printed in paper 000 (per-client weights ``(σ_0² + σ_mn²)^{-1}``);
  exact only when every other group has one client (:doc:`docs
  <algorithms/grouppfl.md#the-gaussian-model>`)."""
  groups = _groups(sigmas)
  if len(groups) < 2:
    return posterior_group(x[0], groups[0])
  num, den = 0.0, 0.0
  for m in range(1, len(groups)):
    w = 1.0 / (sigma0**2 + groups[m] ** 2)
    num, den = num + np.asarray(x[m], np.float64) @ w, den + w.sum()
  return _combine(x[0], groups[0], num / den, 1.0 / den, sigma0)


def posterior_numeric(x: Sequence, sigmas: Sequence[Sequence[float]], sigma0: float, *,
                      prior_var: float = 1e10, groups_seen: int | None = None):
  """Posterior of ``θ_1`` by direct Gaussian conditioning (float64 linear algebra).

  The latent vector ``(θ_0, θ_1..θ_M)`` has prior precision from ``θ_0 ~ N(0, prior_var)``
  (a proper stand-in for the flat prior) and ``θ_m | θ_0 ~ N(θ_0, σ_0²)``; the data add
  ``Σ_n σ_mn^{-2}`` to ``θ_m``'s precision. Only the first ``groups_seen`` groups' data are
  conditioned on (default all). Returns ``(mean, variance)`` of ``θ_1``; ``x[m]`` is ``[N_m]``.
  """
  groups = _groups(sigmas)
  m_all = len(groups)
  seen = m_all if groups_seen is None else int(groups_seen)
  q = np.zeros((m_all + 1, m_all + 1))
  b = np.zeros(m_all + 1)
  q[0, 0] = 1.0 / prior_var + m_all / sigma0**2
  for m, s in enumerate(groups):
    q[0, m + 1] = q[m + 1, 0] = -1.0 / sigma0**2
    q[m + 1, m + 1] = 1.0 / sigma0**2
    if m < seen:
      prec = s**-2
      q[m + 1, m + 1] += prec.sum()
      b[m + 1] = np.asarray(x[m], np.float64) @ prec
  cov = np.linalg.inv(q)
  mean = cov @ b
  return float(mean[1]), float(cov[1, 1])


def variance_ratios(sigmas: Sequence[Sequence[float]], sigma0: float) -> dict[str, float]:
  """The paper's ratios ``σ_g1²/σ_11²`` and ``σ_G1²/σ_g1²`` (exact global variance)."""
  groups = _groups(sigmas)
  s11 = groups[0][0]
  _, vg = posterior_group(np.zeros(groups[0].size), groups[0])
  _, vG = posterior_global([np.zeros(s.size) for s in groups], groups, sigma0)
  return {"group_vs_local": vg / s11**2, "global_vs_group": vG / vg}
