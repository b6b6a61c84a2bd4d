"""Distributed differential privacy under secure aggregation: the distributed discrete Gaussian
(Kairouz, Liu, Steinke 2021) and Skellam (Agarwal, Kairouz, Liu 2021) mechanisms' parameters and
their privacy accounting (host numbers; the in-jit half is :mod:`fedtree.toolbox.secagg`).

Every client of a parent's cohort of ``n`` clips its update to L2 norm ``c``, scales it by
``1/γ`` and rotates it (a randomized Hadamard transform of the update padded to ``d``, a power of
2), rounds it at random to the integers until its norm is at most ``Δ₂`` (conditional rounding),
adds integer noise and sends it modulo ``2^b``; the parent decodes the modular sum. The noise of one
client is ``N_Z(0, σ²/(t γ²))`` (``ddg``) or ``Sk(μ, μ)`` with ``2μ = σ²/(t γ²)`` (``skellam``),
so any ``t`` or more survivors (the parent's threshold: below it the round fails there) add up
to at least the central noise ``σ = 2 z c``: ``z`` times a client's sensitivity under replace-one
adjacency (one client's clipped update replaced by another's), the convention of
:func:`fedtree.toolbox.privacy.central`'s noise under fixed-size cohorts.

* :func:`granularity`: ``γ`` such that ``k`` standard deviations of a coordinate of the sum (the
  signal of ``n`` aligned updates, ``n c / sqrt(d)``; the noise; the rounding, ``n γ²/4``) fit
  in ``[-2^(b-1) γ, 2^(b-1) γ)``: ``γ² = (n² c²/d + (n/t) σ²) / (2^(2b) / 4k² - n/4)``;
* :func:`rounding_bound`: ``Δ₂² = min(c²/γ² + d/4 + sqrt(2 log(1/β)) (c/γ + sqrt(d)/2),
  (c/γ + sqrt(d))²)`` (Kairouz et al., Thm. 2: a randomized rounding meets it with probability at
  least ``1 - β``), and ``Δ₁ = min(Δ₂², sqrt(d) Δ₂)`` (integer vectors);
* :func:`ddg_rdp`: ``ε(α) = α/2 · min(‖Δ‖₂²/σ̃² + τ d/2, (‖Δ‖₂/σ̃ + τ ‖Δ‖₁)²)`` with
  ``τ = 10 Σ_{k=1}^{n-1} exp(-2π² σ_i² k/(k+1))`` (Kairouz et al., Thm. 1: the sum of ``n``
  discrete Gaussians of parameter ``σ_i`` against a shift ``Δ``; ``σ̃² = σ²/γ²``);
* :func:`skellam_rdp`: ``ε(α) = α ‖Δ‖₂²/(4μ) + min(((2α-1)‖Δ‖₂² + 6‖Δ‖₁)/(16μ²), 3‖Δ‖₁/(4μ))``
  (Agarwal et al., Thm. 3.5; ``μ`` the Skellam parameter of the sum);
* :func:`subsampled_rdp`: amplification by sampling a fixed-size cohort without replacement, for
  any mechanism's RDP curve (Wang, Balle, Kasiviswanathan 2019, Thm. 9; replace-one adjacency:
  ``‖Δ‖ <= 2Δ₂``); :func:`epsilon` composes it over the rounds and converts with dp-accounting's
  RDP-to-(ε, δ) conversion, :func:`calibrate` finds the ``z`` of a target ε.

dp-accounting has the discrete Gaussian's privacy loss in one dimension (its PLD), not the sum of
several clients' discrete Gaussians in ``d`` dimensions nor the Skellam mechanism: these are the
papers' bounds, tested against exact Rényi divergences, dp-accounting's Gaussian and its PLD.

References:
  Kairouz, Liu, Steinke, "The distributed discrete Gaussian mechanism for federated learning with
  secure aggregation", ICML 2021.
  Agarwal, Kairouz, Liu, "The Skellam mechanism for differentially private federated learning",
  NeurIPS 2021.
  Wang, Balle, Kasiviswanathan, "Subsampled Rényi differential privacy and analytical moments
  accountant", AISTATS 2019.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from scipy.special import gammaln, logsumexp

from fedtree.toolbox.discrete_noise import MAX_DISCRETE_GAUSSIAN_SIGMA

MECHANISMS = ("ddg", "skellam")
"""The distributed mechanisms: the distributed discrete Gaussian and the Skellam mechanism."""

ORDERS = tuple(range(2, 257))
"""The integer Rényi orders accounted (the subsampling bound holds at integer orders)."""

DEFAULT_BETA = math.exp(-0.5)
"""The conditional rounding's failure probability per try (the papers' and TFF's choice)."""

MAX_SKELLAM_MU = 1e15
"""The largest per-client Skellam parameter sampled (:func:`fedtree.toolbox.discrete_noise.skellam`)."""


class Mechanism(NamedTuple):
  """One parent's distributed mechanism, resolved (host numbers; scaled units are ``1/γ`` of the
  update's).

  Attributes:
    name: ``"ddg"`` or ``"skellam"``.
    bits: ``b``, the field's bits (modulus ``2^b``).
    clip: ``c``, every client's L2 clip norm.
    dim: ``d``, the rotated vector's length (the update padded to a power of 2).
    cohort: ``n``, the clients that mask (the most that can survive).
    survivors: ``t``, the fewest survivors of a round that succeeds.
    noise_multiplier: ``z``: the survivors' noise adds up to at least ``σ = 2 z c``.
    k_stddevs: the standard deviations of the sum the field holds.
    beta: the conditional rounding's failure probability per try.
    gamma: ``γ``, the granularity.
    client_noise: one client's noise parameter, scaled: ``σ/(γ sqrt(t))`` (the discrete
      Gaussian's ``σ_i``) or ``σ²/(2 γ² t)`` (the Skellam ``μ_i``).
    l2: ``Δ₂``, the scaled norm bound of a rounded update.
    l1: ``Δ₁``, its L1 bound.
  """

  name: str
  bits: int
  clip: float
  dim: int
  cohort: int
  survivors: int
  noise_multiplier: float
  k_stddevs: float
  beta: float
  gamma: float
  client_noise: float
  l2: float
  l1: float

  @property
  def total_variance(self) -> float:
    """``σ̃² = σ²/γ²``: the scaled noise variance of a sum of ``t`` clients (at least)."""
    return (self.sigma / self.gamma) ** 2

  @property
  def sigma(self) -> float:
    """``σ = 2 z c``: the survivors' summed noise std, in the update's units (at least)."""
    return 2 * self.noise_multiplier * self.clip


def granularity(*, bits: int, clip: float, sigma: float, cohort: int, survivors: int, dim: int,
                k_stddevs: float) -> float:
  """``γ``: the step of the integer grid such that ``k_stddevs`` standard deviations of a coordinate
  of the parent's sum fit in the field (see the module docstring).

  Raises:
    ValueError: the field cannot hold ``k_stddevs`` standard deviations of ``cohort`` roundings
      at any ``γ`` (too few bits for the cohort).
  """
  room = (2.0 ** bits / (2 * k_stddevs)) ** 2 - cohort / 4
  if room <= 0:
    raise ValueError(f"bits={bits}: a {bits}-bit field cannot hold {k_stddevs:g} standard deviations of the "
                     f"rounding error of {cohort} clients (needs 2^(2b) > k² n); use more bits")
  signal = cohort ** 2 * clip ** 2 / dim + (cohort / survivors) * sigma ** 2
  return math.sqrt(signal / room)


def rounding_bound(*, clip: float, gamma: float, dim: int, beta: float) -> tuple[float, float]:
  """``(Δ₂, Δ₁)``: the scaled L2 norm a conditionally rounded update keeps (Kairouz et al. 2021,
  Thm. 2) and the L1 norm that implies for an integer vector."""
  c = clip / gamma
  first = c * c + dim / 4 + math.sqrt(2 * math.log(1 / beta)) * (c + math.sqrt(dim) / 2)
  l2 = math.sqrt(min(first, (c + math.sqrt(dim)) ** 2))
  return l2, min(l2 * l2, math.sqrt(dim) * l2)


def ddg_tau(sigma: float, cohort: int) -> float:
  """``τ = 10 Σ_{k=1}^{n-1} exp(-2π² σ² k/(k+1))``: how far the sum of ``n`` discrete Gaussians of
  parameter ``σ`` is from one discrete Gaussian (Kairouz et al. 2021, Thm. 1; 0 for one client)."""
  k = np.arange(1, max(int(cohort), 1), dtype=np.float64)
  return float(10 * np.sum(np.exp(-2 * np.pi ** 2 * sigma ** 2 * k / (k + 1))))


def ddg_rdp(orders, *, l2: float, l1: float, variance: float, tau: float, dim: int) -> np.ndarray:
  """RDP of the distributed discrete Gaussian against a shift of norms ``l2``, ``l1``: the summed
  noise of scaled variance ``variance`` (``n σ_i²``), ``τ`` from :func:`ddg_tau`, dimension ``dim``
  (Kairouz et al. 2021, Thm. 1)."""
  a = np.asarray(orders, np.float64)
  sq = math.sqrt(variance)
  return a / 2 * min(l2 * l2 / variance + tau * dim / 2, (l2 / sq + tau * l1) ** 2)


def skellam_rdp(orders, *, l2: float, l1: float, mu: float) -> np.ndarray:
  """RDP of the multidimensional Skellam mechanism ``Sk(μ, μ)`` against a shift of norms ``l2``,
  ``l1`` (Agarwal et al. 2021, Thm. 3.5)."""
  a = np.asarray(orders, np.float64)
  return a * l2 * l2 / (4 * mu) + np.minimum(((2 * a - 1) * l2 * l2 + 6 * l1) / (16 * mu * mu),
                                             3 * l1 / (4 * mu))


def mechanism(name: str, *, bits: int, clip: float, noise_multiplier: float, cohort: int, survivors: int,
              dim: int, k_stddevs: float = 4.0, beta: float = DEFAULT_BETA) -> Mechanism:
  """One parent's :class:`Mechanism`: ``γ`` (:func:`granularity`), the rounding bound, the
  clients' noise.

  Raises:
    ValueError: an unknown name, a bad value (named), or a noise no sampler here draws.
  """
  if name not in MECHANISMS:
    raise ValueError(f"mechanism={name!r}; choose one of {list(MECHANISMS)}")
  if not (isinstance(bits, (int, np.integer)) and 2 <= int(bits) <= 32):
    raise ValueError(f"bits={bits!r} must be an integer in [2, 32]")
  for field, v in (("clip_norm", clip), ("noise_multiplier", noise_multiplier), ("k_stddevs", k_stddevs)):
    if not (math.isfinite(float(v)) and float(v) > 0):
      raise ValueError(f"{field}={v!r} must be a finite number > 0")
  if not 0 < float(beta) < 1:
    raise ValueError(f"beta={beta!r} must be in (0, 1) (the conditional rounding's failure probability)")
  if not 1 <= int(survivors) <= int(cohort):
    raise ValueError(f"survivors={survivors!r} must be in [1, cohort={cohort}]")
  sigma = 2 * float(noise_multiplier) * float(clip)
  gamma = granularity(bits=int(bits), clip=float(clip), sigma=sigma, cohort=int(cohort),
                      survivors=int(survivors), dim=int(dim), k_stddevs=float(k_stddevs))
  l2, l1 = rounding_bound(clip=float(clip), gamma=gamma, dim=int(dim), beta=float(beta))
  per_client = sigma / (gamma * math.sqrt(int(survivors)))
  if name == "ddg":
    noise = per_client
    if noise > MAX_DISCRETE_GAUSSIAN_SIGMA:
      raise ValueError(f"bits={bits}: each client's discrete Gaussian would have σ = {noise:.3g} grid steps, "
                       f"above the sampler's {MAX_DISCRETE_GAUSSIAN_SIGMA:.3g}; use fewer bits (more buy "
                       f"nothing once the grid is far below the noise)")
  else:
    noise = per_client ** 2 / 2
    if noise > MAX_SKELLAM_MU:
      raise ValueError(f"bits={bits}: each client's Skellam parameter would be {noise:.3g}, above the "
                       f"sampler's {MAX_SKELLAM_MU:.3g}; use fewer bits")
  return Mechanism(name, int(bits), float(clip), int(dim), int(cohort), int(survivors),
                   float(noise_multiplier), float(k_stddevs), float(beta), gamma, noise, l2, l1)


def round_rdp(m: Mechanism, orders=ORDERS) -> np.ndarray:
  """One round's RDP of ``m`` at a parent, before sampling, under replace-one adjacency (one
  client's rounded update replaced by another's: ``‖Δ‖₂ <= 2Δ₂``, ``‖Δ‖₁ <= 2Δ₁``)."""
  l2, l1 = 2 * m.l2, 2 * m.l1
  if m.name == "ddg":
    sigma_i = m.sigma / (m.gamma * math.sqrt(m.survivors))
    return ddg_rdp(orders, l2=l2, l1=l1, variance=m.total_variance, tau=ddg_tau(sigma_i, m.cohort), dim=m.dim)
  return skellam_rdp(orders, l2=l2, l1=l1, mu=m.total_variance / 2)


def _log_comb(n, k):
  return gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)


def subsampled_rdp(rdp, q: float, orders=ORDERS) -> np.ndarray:
  """RDP at integer ``orders`` of a mechanism with RDP ``rdp`` (at orders ``2 ..``, aligned with
  ``orders``: ``rdp[i]`` at ``orders[i]``, which must be ``2, 3, ...``) applied to a cohort drawn
  without replacement at rate ``q`` (replace-one adjacency; Wang, Balle, Kasiviswanathan 2019,
  Thm. 9 with ``ε(∞) = ∞``):
  ``(1/(α-1)) log(1 + q² C(α,2) min(4(e^{ε(2)} - 1), 2e^{ε(2)}) + Σ_{j=3}^α 2 q^j C(α,j) e^{(j-1)ε(j)})``.
  ``q = 1`` is the mechanism itself."""
  rdp = np.asarray(rdp, np.float64)
  orders = np.asarray(orders)
  if not np.array_equal(orders, np.arange(2, 2 + len(orders))):
    raise ValueError("subsampled_rdp needs the consecutive integer orders 2, 3, ...")
  if q >= 1:
    return rdp
  lq = math.log(q)
  e2 = rdp[0]
  second = 2 * lq + min(math.log(4) + e2 + math.log(-math.expm1(-e2)) if e2 > 0 else -np.inf,
                        math.log(2) + e2)
  out = np.empty(len(orders))
  j_all = np.arange(3, int(orders[-1]) + 1)
  tail_terms = math.log(2) + j_all * lq + (j_all - 1) * rdp[1:]   # j = 3.. (rdp[j-2] at order j)
  for i, a in enumerate(orders):
    a = int(a)
    terms = [0.0, _log_comb(a, 2) + second]
    if a >= 3:
      j = j_all[: a - 2]
      terms.extend(tail_terms[: a - 2] + _log_comb(a, j))
    out[i] = logsumexp(terms) / (a - 1)
  return out


def epsilon_of_rdp(rdp, delta: float, orders=ORDERS) -> float:
  """ε at ``delta`` of an RDP curve (dp-accounting's conversion, Canonne-Kamath-Steinke 2020)."""
  from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

  return float(compute_epsilon(np.asarray(orders, np.float64), np.asarray(rdp, np.float64), float(delta))[0])


def epsilon(mechanisms, *, rounds: int, delta: float) -> float:
  """ε at ``delta`` after ``rounds`` rounds: every parent ``(Mechanism, q)`` of ``mechanisms`` (its
  clients' sampling rate ``q``) releases one subsampled mechanism a round; a client is under one
  parent (parallel composition), so ε is the largest parent's (0 for no round)."""
  if rounds <= 0:
    return 0.0
  return max(_parent_epsilon(m, float(q), int(rounds), float(delta)) for m, q in mechanisms)


@functools.cache
def _parent_epsilon(m: Mechanism, q: float, rounds: int, delta: float) -> float:
  return epsilon_of_rdp(rounds * subsampled_rdp(round_rdp(m), q), delta)


class Parent(NamedTuple):
  """What a parent's mechanism depends on: its clients ``population``, its ``cohort`` and the
  fewest ``survivors`` of a round that succeeds there."""

  population: int
  cohort: int
  survivors: int


def resolve(name: str, parents, *, noise_multiplier: float, bits: int, clip: float, dim: int,
            k_stddevs: float = 4.0, beta: float = DEFAULT_BETA) -> list[tuple[Mechanism, float]]:
  """``[(Mechanism, q)]`` of every distinct :class:`Parent` of ``parents``."""
  return [(mechanism(name, bits=bits, clip=clip, noise_multiplier=noise_multiplier, cohort=p.cohort,
                     survivors=p.survivors, dim=dim, k_stddevs=k_stddevs, beta=beta), p.cohort / p.population)
          for p in sorted(set(parents))]


def calibrate(name: str, parents, *, target_epsilon: float, rounds: int, delta: float, bits: int, clip: float,
              dim: int, k_stddevs: float = 4.0, beta: float = DEFAULT_BETA) -> float:
  """The smallest noise multiplier ``z`` (to 1e-4 relative) whose ε after ``rounds`` is at most
  ``target_epsilon``.

  Raises:
    ValueError: a target that is not a positive number, or one no ``z`` reaches with ``bits`` bits
      (the rounding's sensitivity grows with ``z``, through ``γ``, as fast as the noise: ε has a floor).
  """
  t = float(target_epsilon)
  if not (math.isfinite(t) and t > 0):
    raise ValueError(f"target_epsilon={target_epsilon!r}; it must be a finite number > 0")

  def eps(z):
    return epsilon(resolve(name, parents, noise_multiplier=z, bits=bits, clip=clip, dim=dim,
                           k_stddevs=k_stddevs, beta=beta), rounds=rounds, delta=delta)

  hi = 1.0
  while eps(hi) > t:
    hi *= 2
    if hi > 2 ** 12:
      raise ValueError(f"target_epsilon={t!r} is unreachable with mechanism={name!r} at bits={bits} over "
                       f"{rounds} rounds: ε stays at {eps(hi):.4g} or more whatever the noise (the rounding "
                       f"onto a {bits}-bit grid costs as much privacy as the noise buys); use more bits")
  lo = hi / 2
  while eps(lo) <= t:
    hi, lo = lo, lo / 2
    if lo < 1e-4:
      return hi
  while hi - lo > 1e-4 * hi:
    mid = (lo + hi) / 2
    lo, hi = (lo, mid) if eps(mid) <= t else (mid, hi)
  return hi
