"""Distributed DP: the integer samplers against their exact pmfs (chi-square at a stated false-alarm
rate), the mechanisms' RDP bounds against exact Rényi divergences and dp-accounting, the
subsampling bound against dp-accounting's, the bounds, grid and rounding against TFF's expressions,
calibration, and the noise a secure sum carries."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

from fedtree.toolbox import discrete_noise as dn
from fedtree.toolbox import distributed_dp as ddp
from fedtree.toolbox import secagg

FALSE_ALARM = 1e-6
"""The probability that a chi-square test of a correct sampler fails (seeded, so it is fixed)."""


def _chi_square(samples: np.ndarray, log_pmf, lo: int, hi: int, groups: int = 60) -> None:
  """``samples`` against the pmf on ``[lo, hi]`` (the tails lumped into the end groups), in
  ``groups`` groups of about equal probability; fails when the statistic exceeds its
  ``1 - FALSE_ALARM`` quantile."""
  xs = np.arange(lo, hi + 1)
  p = np.exp(log_pmf(xs))
  cdf = np.cumsum(p) / p.sum()
  edges = np.searchsorted(cdf, np.linspace(0, 1, groups + 1)[1:-1])   # group g: xs[edges[g-1]+1 .. edges[g]]
  bins = np.concatenate([[-np.inf], xs[edges] + 0.5, [np.inf]])
  expected = np.diff(np.concatenate([[0.0], np.cumsum(p)[edges], [p.sum()]])) / p.sum() * len(samples)
  observed, _ = np.histogram(samples, bins=bins)
  keep = expected > 0
  stat = float(np.sum((observed[keep] - expected[keep]) ** 2 / expected[keep]))
  df = int(keep.sum()) - 1
  assert stat <= stats.chi2.isf(FALSE_ALARM, df), (stat, df)


N = 100_000


@pytest.mark.parametrize("sigma", [0.6, 3.7, 40.0, 2.0e4])
def test_discrete_gaussian_against_its_pmf(sigma):
  x = np.asarray(dn.discrete_gaussian(jax.random.key(1), sigma, (N,)))
  width = int(12 * sigma) + 10
  ks = np.arange(-width, width + 1)
  log_z = special.logsumexp(-ks.astype(np.float64) ** 2 / (2 * sigma * sigma))
  _chi_square(x, lambda v: -v.astype(np.float64) ** 2 / (2 * sigma * sigma) - log_z, -width, width)


def test_discrete_gaussian_refuses_a_sigma_it_cannot_draw():
  with pytest.raises(ValueError, match="sigma=1000000000.0 exceeds"):
    dn.discrete_gaussian(jax.random.key(0), 1e9, (3,))
  with pytest.raises(ValueError, match="sigma=0.0 must be a finite number > 0"):
    dn.discrete_gaussian(jax.random.key(0), 0.0, (3,))


@pytest.mark.parametrize("lam", [3.3, 57.5, 1.0e4, 1.0e9])
def test_poisson_offsets_against_the_poisson_pmf(lam):
  """Below λ = 10 JAX's sampler; above, PTRS computed apart from ⌊λ⌋ (exact where K itself is far
  beyond float32's integers)."""
  o = np.asarray(dn.poisson_offset(jax.random.key(2), lam, (N,)))
  floor = math.floor(lam)
  s = math.sqrt(lam)
  _chi_square(o, lambda v: stats.poisson.logpmf(v + floor, lam), max(-floor, int(-8 * s) - 3), int(8 * s) + 3)


@pytest.mark.parametrize("mu", [0.7, 20.0, 5.0e6])
def test_skellam_against_its_pmf(mu):
  x = np.asarray(dn.skellam(jax.random.key(3), mu, (N,)))
  width = int(10 * math.sqrt(2 * mu)) + 10
  _chi_square(x, lambda v: np.log(np.maximum(special.ive(v, 2 * mu), 1e-300)), -width, width)


# ------------------------------------------------------------------------ the bounds, exactly
def _log_renyi(log_p, shift: int, alpha: float) -> float:
  """``D_α(P ‖ P + shift)`` of a pmf given as logs on a symmetric grid (padded)."""
  log_q = np.roll(log_p, shift)
  m = np.isfinite(log_p) & np.isfinite(log_q)
  return float(special.logsumexp(alpha * log_p[m] + (1 - alpha) * log_q[m]) / (alpha - 1))


def _sum_of_discrete_gaussians(sigma: float, n: int, width: int = 300) -> np.ndarray:
  """The log-pmf of the sum of ``n`` discrete Gaussians on ``[-width, width]``, convolved in log
  space (the far tails, where a high order's divergence lives, do not underflow)."""
  ks = np.arange(-width, width + 1)
  log_p = -ks.astype(np.float64) ** 2 / (2 * sigma * sigma)
  log_p -= special.logsumexp(log_p)
  log_z = log_p
  for _ in range(n - 1):   # (log_z * log_p)[m] = logsumexp_j log_z[j] + log_p[m - j], kept on the grid
    shifted = np.full((ks.size, ks.size), -np.inf)
    for j in range(ks.size):
      lo, hi = max(0, j - width), min(ks.size, j + width + 1)
      shifted[j, lo:hi] = log_z[j] + log_p[lo - j + width:hi - j + width]
    log_z = special.logsumexp(shifted, axis=0)
  return log_z


@pytest.mark.parametrize("sigma,n", [(0.5, 2), (0.6, 3), (0.8, 5), (1.0, 8), (0.7, 1)])
def test_ddg_bound_holds_against_the_exact_divergence(sigma, n):
  """Kairouz et al. 2021, Thm. 1, against the Rényi divergence of the exact sum of n discrete
  Gaussians, shifted by Δ (one coordinate; a vector shift adds its coordinates' divergences): never
  below it; for one client (τ = 0) it is the Gaussian's α Δ²/(2σ²), the discrete Gaussian's within
  5 % (closer as σ grows)."""
  log_z = _sum_of_discrete_gaussians(sigma, n)
  tau = ddp.ddg_tau(sigma, n)
  assert (tau == 0) == (n == 1)
  for alpha in (1.5, 2, 5, 16):
    for shift in (1, 2, 4):
      exact = _log_renyi(log_z, shift, alpha)
      bound = float(ddp.ddg_rdp([alpha], l2=shift, l1=shift, variance=n * sigma ** 2, tau=tau, dim=1)[0])
      assert exact <= bound * (1 + 1e-9), (alpha, shift)
      if n == 1:
        assert exact >= 0.95 * bound
    vec = np.array([1, 2, 1])   # three coordinates
    exact = sum(_log_renyi(log_z, int(v), alpha) for v in vec)
    bound = float(ddp.ddg_rdp([alpha], l2=float(np.linalg.norm(vec)), l1=float(vec.sum()),
                              variance=n * sigma ** 2, tau=tau, dim=3)[0])
    assert exact <= bound * (1 + 1e-9)


@pytest.mark.parametrize("mu", [0.3, 1.0, 5.0, 100.0])
def test_skellam_bound_holds_against_the_exact_divergence(mu):
  """Agarwal et al. 2021, Thm. 3.5, against the exact Rényi divergence of Sk(μ, μ) and its shift;
  tight as μ grows (the Gaussian's α Δ²/(4μ))."""
  width = int(60 * math.sqrt(2 * mu)) + 60
  ks = np.arange(-width, width + 1)
  with np.errstate(divide="ignore"):
    log_p = np.log(np.concatenate([np.zeros(50), special.ive(ks, 2 * mu), np.zeros(50)]))
  for alpha in (1.5, 2, 8, 32):
    for shift in (1, 3):
      exact = _log_renyi(log_p, shift, alpha)
      bound = float(ddp.skellam_rdp([alpha], l2=shift, l1=shift, mu=mu)[0])
      assert exact <= bound * (1 + 1e-9)
      if mu >= 100:
        assert exact >= 0.9 * bound
  vec = np.array([2, 1, 1, 1])
  exact = sum(_log_renyi(log_p, int(v), 4) for v in vec)
  assert exact <= float(ddp.skellam_rdp([4], l2=float(np.linalg.norm(vec)), l1=float(vec.sum()), mu=mu)[0])


def test_subsampling_bound_equals_dp_accountings_where_both_are_the_general_theorem():
  """Wang-Balle-Kasiviswanathan's general bound (Thm. 9) applied to the Gaussian: dp-accounting's
  sampled-without-replacement Gaussian is the same expression above order 256, and tighter (Thm.
  27) below; so ours is equal there and never below it."""
  from dp_accounting.rdp import rdp_privacy_accountant as rdp

  orders = np.arange(2, 271)
  some = np.concatenate([np.arange(2, 41), [64, 128, 257, 263, 270]])
  for q, z in ((0.2, 1.5), (0.05, 0.8), (0.5, 3.0), (0.4, 1.0)):
    ours = ddp.subsampled_rdp(orders / (2 * z * z), q, orders)[some - 2]
    theirs = np.array([rdp._compute_rdp_sample_wor_gaussian_int(q, z, int(a)) / (a - 1) for a in some])
    high = some > 256
    np.testing.assert_allclose(ours[high], theirs[high], rtol=1e-10)
    assert np.all(ours[~high] >= theirs[~high] * (1 - 1e-12))
  np.testing.assert_array_equal(ddp.subsampled_rdp(orders / 2.0, 1.0, orders), orders / 2.0)
  with pytest.raises(ValueError, match="consecutive integer orders"):
    ddp.subsampled_rdp([1.0, 2.0], 0.5, [2, 4])


def test_one_discrete_gaussian_against_dp_accountings_pld():
  """One client, one coordinate, sensitivity 1: the discrete Gaussian whose exact privacy loss
  dp-accounting has (its PLD): our RDP-to-ε bound is never below it, and within 40 % of it."""
  from dp_accounting.pld import privacy_loss_distribution as pld

  for sigma in (1.0, 3.0, 10.0):
    rdp = ddp.ddg_rdp(ddp.ORDERS, l2=1.0, l1=1.0, variance=sigma ** 2, tau=0.0, dim=1)
    ours = ddp.epsilon_of_rdp(rdp, 1e-5)
    exact = pld.from_discrete_gaussian_mechanism(sigma, sensitivity=1).get_epsilon_for_delta(1e-5)
    assert exact <= ours <= 1.4 * exact, (sigma, exact, ours)


def test_the_bounds_grid_and_rounding_are_tffs():
  """The expressions TFF's distributed DP aggregators are calibrated with (google-research/federated
  ``distributed_dp/accounting_utils.py``: ``_skellam_rdp``, ``rounded_l2_norm_bound``,
  ``rounded_l1_norm_bound``, ``heuristic_scale_factor`` with ``rho=1``; the discrete Gaussian's
  ``compute_rdp_dgaussian`` where ``τ = 0``), written out here in TFF's units (unscaled norms and
  the central variance, the scale ``s = 1/γ``): ours equal them."""
  orders = np.array([2, 8, 32, 256])
  cases = ((0.5, 1.3, 30, 30, 4096, 16), (1.0, 0.8, 100, 60, 1024, 20), (0.1, 2.0, 8, 8, 64, 12))
  for c, z, n, t, d, bits in cases:
    m = ddp.mechanism("skellam", bits=bits, clip=c, noise_multiplier=z, cohort=n, survivors=t, dim=d)
    s, sigma = 1 / m.gamma, 2 * z * c
    local = sigma / math.sqrt(t)
    k = m.k_stddevs
    spread = math.sqrt(c ** 2 * n ** 2 / d + n * local ** 2)
    tff_scale = math.sqrt(2.0 ** (2 * bits) - n * k ** 2) / (2 * k * spread)
    assert s == pytest.approx(tff_scale, rel=1e-12)
    cs, root = c * s, math.sqrt(d)
    slack = math.sqrt(2 * math.log(1 / m.beta)) * (cs + root / 2)
    tff_l2 = min(cs + root, math.sqrt(cs ** 2 + d / 4 + slack))
    tff_l1 = tff_l2 * min(math.sqrt(d), tff_l2)
    assert (m.l2, m.l1) == pytest.approx((tff_l2, tff_l1), rel=1e-12)
    l2, l1, var = 2 * tff_l2 / s, 2 * tff_l1 / s, sigma ** 2   # replace-one: twice the norms, unscaled
    tff = orders / (2 * var) * l2 ** 2 + np.minimum(
      ((2 * orders - 1) * s * l2 ** 2 + 6 * l1) / (4 * s ** 3 * var ** 2), 3 * l1 / (2 * s * var))
    np.testing.assert_allclose(ddp.round_rdp(m, orders), tff, rtol=1e-12)
    l2s = l2 * s / math.sqrt(m.total_variance)   # the discrete Gaussian's l2 scale; τ = 0: (α/2) l2s²
    ddg = ddp.ddg_rdp(orders, l2=l2 * s, l1=l1 * s, variance=m.total_variance, tau=0.0, dim=d)
    np.testing.assert_allclose(ddg, orders / 2 * l2s ** 2, rtol=1e-12)


def test_the_field_holds_k_standard_deviations_of_the_sum():
  m = ddp.mechanism("ddg", bits=14, clip=0.5, noise_multiplier=1.2, cohort=20, survivors=12, dim=1024)
  sigma = 2 * 1.2 * 0.5
  spread = math.sqrt(20 ** 2 * 0.25 / 1024 + (20 / 12) * sigma ** 2 + 20 * m.gamma ** 2 / 4)
  assert m.k_stddevs * spread == pytest.approx(2 ** 13 * m.gamma, rel=1e-9)
  assert m.client_noise == pytest.approx(sigma / (m.gamma * math.sqrt(12)))
  l2, l1 = ddp.rounding_bound(clip=0.5, gamma=m.gamma, dim=1024, beta=m.beta)
  assert (m.l2, m.l1) == (l2, l1) and l2 >= 0.5 / m.gamma and l1 <= math.sqrt(1024) * l2


def test_calibration_reaches_the_target_and_names_an_unreachable_one():
  parents = [ddp.Parent(50, 10, 10)] * 2
  kw = dict(rounds=30, delta=1e-5, clip=0.5, dim=4096)
  z = ddp.calibrate("ddg", parents, target_epsilon=10.0, bits=16, **kw)
  at = lambda zz: ddp.epsilon(ddp.resolve("ddg", parents, noise_multiplier=zz, bits=16, clip=0.5, dim=4096),  # noqa: E731
                              rounds=30, delta=1e-5)
  assert at(z) <= 10.0 < at(0.999 * z)
  # at 16 bits (and q = 0.2, where the general subsampling bound is close to dp-accounting's for the
  # Gaussian) the rounding costs little: z within 1 % of the central Gaussian's
  from fedtree.toolbox.accountant import calibrate

  central = calibrate(target_epsilon=10.0, sampling_rate=0.2, rounds=30, delta=1e-5, sampling="fixed",
                      population=50, cohort=10)
  assert central * (1 - 1e-3) <= z <= 1.01 * central
  with pytest.raises(ValueError, match="target_epsilon=10.0 is unreachable with mechanism='ddg' at bits=8"):
    ddp.calibrate("ddg", parents, target_epsilon=10.0, bits=8, **kw)


@pytest.mark.parametrize("kw,match", [
  (dict(name="gauss"), r"mechanism='gauss'; choose one of \['ddg', 'skellam'\]"),
  (dict(bits=40), r"bits=40 must be an integer in \[2, 32\]"),
  (dict(clip=0.0), "clip_norm=0.0 must be a finite number > 0"),
  (dict(survivors=30), r"survivors=30 must be in \[1, cohort=20\]"),
  (dict(bits=32), "would have σ = .* grid steps, above the sampler's"),
  (dict(bits=3), "a 3-bit field cannot hold 4 standard deviations"),
])
def test_bad_mechanisms_are_named(kw, match):
  args = dict(name="ddg", bits=16, clip=0.5, noise_multiplier=1.0, cohort=20, survivors=10, dim=1024)
  args.update(kw)
  name = args.pop("name")
  with pytest.raises(ValueError, match=match):
    ddp.mechanism(name, **args)


# ------------------------------------------------------------------------ the noise a secure sum carries
@pytest.mark.parametrize("name", ["ddg", "skellam"])
def test_decoded_noise_of_zero_updates_has_the_calibrated_variance(name):
  """Zero updates through the distributed encoding, summed and decoded: every coordinate is noise of
  variance ``n σ²/t`` (``n`` clients, each ``σ²/t``; rotated back orthonormally), within the
  chi-square interval of the sample's variance."""
  n, t, dim = 6, 4, 128
  m = ddp.mechanism(name, bits=18, clip=1.0, noise_multiplier=0.7, cohort=n, survivors=t, dim=dim)
  enc = secagg.distributed([m])
  rot = jax.random.key(5)

  @jax.jit
  def one(key):
    fields, _ = jax.vmap(lambda k: enc.encode(jnp.zeros(dim), k, rot, 0))(jax.random.split(key, n))
    return enc.decode(secagg.field_sum(fields, jnp.zeros(n, jnp.int32), 1, enc.bits)[0], rot, 0, dim)

  x = np.asarray(jax.vmap(one)(jax.random.split(jax.random.key(0), 12)), np.float64).ravel()
  want = n * m.sigma ** 2 / t
  df = x.size
  lo, hi = stats.chi2.ppf(FALSE_ALARM / 2, df) / df, stats.chi2.isf(FALSE_ALARM / 2, df) / df
  assert lo <= float(np.mean(x ** 2)) / want <= hi
  # and a clipped update comes back within the rounding and the noise
  v = jnp.linspace(-1, 1, dim) * 3.0
  fields, st = jax.vmap(lambda k: enc.encode(v, k, rot, 0))(jax.random.split(jax.random.key(9), n))
  out = np.asarray(enc.decode(secagg.field_sum(fields, jnp.zeros(n, jnp.int32), 1, enc.bits)[0], rot, 0, dim))
  clipped = np.asarray(v) / float(jnp.linalg.norm(v))
  err = out - n * clipped
  assert float(np.mean(err ** 2)) <= 1.5 * (want + n * m.gamma ** 2 / 4)
  assert float(st["secagg_clipped"][0]) == 1.0 and float(st["secagg_rounding_failed"].sum()) == 0
