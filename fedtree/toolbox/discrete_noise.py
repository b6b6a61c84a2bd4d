"""Integer noise for distributed differential privacy, sampled in jit: the discrete Gaussian and the
Skellam distribution (with the Poisson offsets it is made of).

* :func:`discrete_gaussian`: ``N_Z(0, σ²)``, ``P(x) ∝ exp(-x² / 2σ²)`` on the integers, by Canonne,
  Kamath and Steinke's rejection sampler (2020, Algorithms 2 and 3): a discrete Laplace candidate
  ``U + t V`` (``U`` uniform in ``{0 .. t-1}`` kept with probability ``exp(-U/t)``, ``V`` geometric,
  a random sign), kept with probability ``exp(-(|Y| - σ²/t)² / 2σ²)``, ``t = ⌊σ⌋ + 1``. Integer
  draws are exact; the acceptance probabilities are float32, so the pmf is exact up to a smooth
  relative error of about ``1e-6`` (no lattice artefacts). Valid for ``σ <=``
  :data:`MAX_DISCRETE_GAUSSIAN_SIGMA` (the candidates stay in int32).
* :func:`poisson_offset`: ``K - ⌊λ⌋`` for ``K ~ Poisson(λ)``, any ``λ`` up to about ``1e16``: the
  offset is a small int32 even where ``K`` is not. Below ``λ = 10`` JAX's own sampler; from 10 on
  Hörmann's PTRS (1993, the transformed rejection numpy uses) with the offset computed apart from
  ``⌊λ⌋`` and the log-pmf ``-λ h(δ/λ) - ½ log(2πk) - 1/12k + 1/360k³`` (``δ = k - λ``,
  ``h(x) = (1+x) log(1+x) - x``, Stirling's series), which float32 evaluates without the
  cancellation of ``k log λ - log k!``.
* :func:`skellam`: ``Sk(μ, μ) = N₁ - N₂``, ``N_i ~ Poisson(μ)`` independent (variance ``2μ``), the
  difference of two Poisson offsets (Agarwal, Kairouz and Liu 2021). Sums of independent Skellam
  variables are Skellam: the clients' noise adds up to ``Sk(Σ μ_i)``.

Every sampler takes an explicit key and returns ``int32``; the loops are ``lax.while_loop`` over the
coordinates still waiting (they run until every coordinate is accepted; the expected number of
passes grows as the log of the number of coordinates).

References:
  Canonne, Kamath, Steinke, "The discrete Gaussian for differential privacy", NeurIPS 2020.
  Hörmann, "The transformed rejection method for generating Poisson random variables", Insurance:
  Mathematics and Economics 12, 1993.
  Agarwal, Kairouz, Liu, "The Skellam mechanism for differentially private federated learning",
  NeurIPS 2021.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

MAX_DISCRETE_GAUSSIAN_SIGMA = float(2 ** 26)
"""The largest ``σ`` :func:`discrete_gaussian` samples: its candidates ``U + t V`` (``t = ⌊σ⌋ + 1``,
``V`` up to 30) must stay in int32; the mass it cuts (beyond ``30 t``) is below ``e^-400``."""

_PTRS_MIN = 10.0   # PTRS is valid from λ = 10 (Hörmann 1993)


def _check_scale(name: str, value, limit: float | None = None) -> None:
  if isinstance(value, jax.core.Tracer):
    return
  v = float(value)
  if not (math.isfinite(v) and v > 0):
    raise ValueError(f"{name}={value!r} must be a finite number > 0")
  if limit is not None and v > limit:
    raise ValueError(f"{name}={value!r} exceeds {limit:.4g}, the largest this sampler draws exactly in int32")


def discrete_gaussian(key: jax.Array, sigma, shape: tuple[int, ...]) -> jax.Array:
  """``int32[shape]`` independent draws of the discrete Gaussian ``N_Z(0, σ²)``.

  Args:
    key: the draws' randomness.
    sigma: ``σ > 0`` (not the standard deviation, which is slightly below ``σ`` for ``σ < 1``),
      at most :data:`MAX_DISCRETE_GAUSSIAN_SIGMA`; may be traced.
    shape: the output's shape.

  Returns:
    The draws.

  References:
    Canonne, Kamath, Steinke 2020, Algorithms 2 and 3.
  """
  _check_scale("sigma", sigma, MAX_DISCRETE_GAUSSIAN_SIGMA)
  s = jnp.asarray(sigma, jnp.float32)
  t = (jnp.floor(s) + 1).astype(jnp.int32)
  tf = t.astype(jnp.float32)
  vmax = jnp.minimum((jnp.int32(2 ** 31 - 1) // t) - 1, 30)   # U + t V < 2^31

  def candidate(k):
    ku, kd, kv, kb, kc = jax.random.split(k, 5)
    u = jax.random.randint(ku, shape, 0, t, jnp.int32)
    keep_u = jax.random.uniform(kd, shape) < jnp.exp(-u.astype(jnp.float32) / tf)
    v = jnp.floor(jax.random.exponential(kv, shape)).astype(jnp.int32)   # P(V >= v) = e^-v
    ok_v = v <= vmax
    x = u + t * jnp.minimum(v, vmax)
    negative = jax.random.bernoulli(kb, 0.5, shape)
    ok_sign = ~(negative & (x == 0))
    y = jnp.where(negative, -x, x)
    dist = (jnp.abs(y).astype(jnp.float32) - s * s / tf) / s
    keep = jax.random.uniform(kc, shape) < jnp.exp(-0.5 * dist * dist)
    return y, keep_u & ok_v & ok_sign & keep

  return _rejection(key, candidate, shape)


def _rejection(key, candidate, shape):
  """Draws ``candidate(key) -> (values, accepted)`` until every coordinate has an accepted value."""

  def cond(carry):
    return ~jnp.all(carry[1])

  def body(carry):
    value, done, i = carry
    y, ok = candidate(jax.random.fold_in(key, i))
    take = ok & ~done
    return jnp.where(take, y, value), done | ok, i + 1

  init = (jnp.zeros(shape, jnp.int32), jnp.zeros(shape, bool), jnp.zeros((), jnp.int32))
  value, _, _ = jax.lax.while_loop(cond, body, init)
  return value


def _h(x):
  """``(1 + x) log(1 + x) - x`` for ``x >= -1``, in float32 without cancellation near 0."""
  series = x * x * (0.5 + x * (-1.0 / 6 + x * (1.0 / 12 + x * (-1.0 / 20 + x * (1.0 / 30 + x * (
    -1.0 / 42 + x * (1.0 / 56 + x * (-1.0 / 72))))))))
  direct = jax.scipy.special.xlogy(1.0 + x, 1.0 + x) - x
  return jnp.where(jnp.abs(x) < 0.1, series, direct)


def poisson_offset(key: jax.Array, lam: float, shape: tuple[int, ...]) -> jax.Array:
  """``int32[shape]``: ``K - ⌊λ⌋`` for independent ``K ~ Poisson(λ)`` (see the module docstring).

  Args:
    key: the draws' randomness.
    lam: ``λ > 0``, a Python number (the sampler is chosen by its size), below about ``1e16`` (the
      offset's spread, ``~sqrt(λ)``, must stay well inside int32).
    shape: the output's shape.

  Returns:
    The offsets.

  References:
    Hörmann 1993 (PTRS).
  """
  _check_scale("lam", lam, 1e16)
  lam = float(lam)
  floor = math.floor(lam)
  if lam < _PTRS_MIN:
    return jax.random.poisson(key, lam, shape, jnp.int32) - jnp.int32(floor)
  lam32, frac = jnp.float32(lam), jnp.float32(lam - floor)
  slam = math.sqrt(lam)
  b = 0.931 + 2.53 * slam
  a = -0.059 + 0.02483 * b
  inv_alpha = 1.1239 + 1.1328 / (b - 3.4)
  vr = 0.9277 - 3.6224 / (b - 2)

  def candidate(k):
    ku, kv = jax.random.split(k)
    u = jax.random.uniform(ku, shape) - 0.5
    v = jax.random.uniform(kv, shape)
    us = 0.5 - jnp.abs(u)
    off = jnp.floor(jnp.clip((2 * a / jnp.maximum(us, 1e-30) + b) * u + frac + 0.43, -2.0 ** 30, 2.0 ** 30))
    count = off + jnp.float32(floor)   # K as a float (inexact when huge: used in the log-pmf only)
    squeeze = (us >= 0.07) & (v <= vr)
    delta = off - frac                 # K - λ, exact
    kk = jnp.maximum(count, 1.0)
    log_pmf = (-lam32 * _h(delta / lam32) - 0.5 * jnp.log(2 * jnp.pi * kk) - 1.0 / (12 * kk)
               + 1.0 / (360 * kk ** 3))
    log_pmf = jnp.where(count < 1, -lam32, log_pmf)   # K = 0
    lhs = jnp.log(v) + math.log(inv_alpha) - jnp.log(a / (us * us) + b)
    ok = squeeze | ((count >= 0) & ~((us < 0.013) & (v > us)) & (lhs <= log_pmf))
    return off.astype(jnp.int32), ok

  return _rejection(key, candidate, shape)


def skellam(key: jax.Array, mu: float, shape: tuple[int, ...]) -> jax.Array:
  """``int32[shape]`` independent draws of the symmetric Skellam ``Sk(μ, μ)`` (variance ``2μ``):
  the difference of two Poisson(``μ``) offsets (:func:`poisson_offset`).

  Args:
    key: the draws' randomness.
    mu: ``μ > 0``, a Python number.
    shape: the output's shape.

  Returns:
    The draws.

  References:
    Agarwal, Kairouz, Liu 2021.
  """
  k1, k2 = jax.random.split(key)
  return poisson_offset(k1, mu, shape) - poisson_offset(k2, mu, shape)
