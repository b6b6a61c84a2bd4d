"""Paper 000, section 4: the Gaussian hierarchical model's posteriors, checked three ways."""

import numpy as np
import pytest

from fedtree.algorithms.hierarchical.grouppfl import gaussian

SIGMAS = [[1.0, 0.5, 2.0], [1.0, 1.5, 0.7, 1.2], [0.8], [2.0, 0.6]]
SIGMA0 = 0.9


def _data(seed=0):
  rng = np.random.default_rng(seed)
  _, x = gaussian.sample(rng, theta0=0.3, sigma0=SIGMA0, sigmas=SIGMAS, num_draws=1)
  return [xm[0] for xm in x]


def test_group_posterior_matches_direct_conditioning():
  x = _data()
  mean, var = gaussian.posterior_group(x[0], SIGMAS[0])
  # Conditioning on group 0 only: θ_1 | θ_0 ~ N(θ_0, σ_0²) with θ_0 flat is a flat prior on θ_1.
  nmean, nvar = gaussian.posterior_numeric(x, SIGMAS, SIGMA0, groups_seen=1)
  np.testing.assert_allclose([mean, var], [nmean, nvar], rtol=1e-6)
  s = np.asarray(SIGMAS[0])
  assert var / s[0] ** 2 == pytest.approx(1.0 / (1.0 + np.sum((s[0] / s[1:]) ** 2)))


def test_global_posterior_matches_direct_conditioning():
  x = _data(1)
  mean, var = gaussian.posterior_global(x, SIGMAS, SIGMA0)
  nmean, nvar = gaussian.posterior_numeric(x, SIGMAS, SIGMA0)
  np.testing.assert_allclose([mean, var], [nmean, nvar], rtol=1e-6)


def test_paper_formula_is_exact_with_one_client_per_other_group_only():
  sig = [[1.0, 0.5], [1.3], [0.7], [2.0]]
  rng = np.random.default_rng(2)
  _, x = gaussian.sample(rng, theta0=-1.0, sigma0=SIGMA0, sigmas=sig, num_draws=1)
  x = [xm[0] for xm in x]
  np.testing.assert_allclose(gaussian.posterior_global_paper(x, sig, SIGMA0),
                             gaussian.posterior_global(x, sig, SIGMA0), rtol=1e-12)
  # With several clients in another group the printed formula is over-confident.
  x = _data(3)
  _, v_paper = gaussian.posterior_global_paper(x, SIGMAS, SIGMA0)
  _, v_exact = gaussian.posterior_global(x, SIGMAS, SIGMA0)
  assert v_paper < v_exact


def test_more_sharing_means_less_uncertainty_and_paper_ratios():
  r = gaussian.variance_ratios(SIGMAS, SIGMA0)
  assert 0 < r["global_vs_group"] < 1 and 0 < r["group_vs_local"] < 1
  # σ_G1²/σ_g1² = 1 / (1 + (σ_0² + σ_{G/1}²)^{-1} / Σ σ_1n^{-2}) with the exact σ_{G/1}².
  s_m2 = [1.0 / np.sum(np.asarray(s) ** -2) for s in SIGMAS[1:]]
  var_rest = 1.0 / sum(1.0 / (SIGMA0**2 + v) for v in s_m2)
  expect = 1.0 / (1.0 + (1.0 / (SIGMA0**2 + var_rest)) / np.sum(np.asarray(SIGMAS[0]) ** -2))
  assert r["global_vs_group"] == pytest.approx(expect)


def test_sampled_estimates_have_the_derived_means_and_variances():
  """Location family + flat prior: θ_11 - μ(x) ~ N(0, σ²) over draws with θ_0 fixed."""
  rng = np.random.default_rng(4)
  r = 40_000
  theta, x = gaussian.sample(rng, theta0=2.0, sigma0=SIGMA0, sigmas=SIGMAS, num_draws=r)
  target = theta[:, 0]
  cases = {
    "local": gaussian.posterior_local(x[0][:, 0], SIGMAS[0][0]),
    "group": gaussian.posterior_group(x[0], SIGMAS[0]),
    "global": gaussian.posterior_global(x, SIGMAS, SIGMA0),
  }
  for name, (mu, var) in cases.items():
    err = target - mu
    assert abs(err.mean()) < 5 * np.sqrt(var / r), name
    assert abs(err.var() - var) < 5 * var * np.sqrt(2.0 / r), (name, err.var(), var)
  assert cases["global"][1] < cases["group"][1] < cases["local"][1]


def test_sampling_exposes_the_printed_global_variance_as_too_small():
  """Two big other groups: the printed formula counts their 40 correlated clients as
  independent and claims σ_G1² ≈ 0.51; the errors have the exact 0.60."""
  sig = [[1.0], [1.0] * 20, [1.0] * 20]
  r = 40_000
  theta, x = gaussian.sample(np.random.default_rng(5), theta0=0.0, sigma0=1.0, sigmas=sig,
                             num_draws=r)
  mu_p, var_p = gaussian.posterior_global_paper(x, sig, 1.0)
  mu_e, var_e = gaussian.posterior_global(x, sig, 1.0)
  tol = 5 * np.sqrt(2.0 / r)
  assert abs((theta[:, 0] - mu_e).var() / var_e - 1) < tol
  assert (theta[:, 0] - mu_p).var() / var_p - 1 > 0.1


def test_bad_inputs_raise():
  with pytest.raises(ValueError, match="must be > 0"):
    gaussian.posterior_global([[0.0], [0.0]], [[1.0], [0.0]], 1.0)
  with pytest.raises(ValueError, match="sigma0"):
    gaussian.sample(np.random.default_rng(0), theta0=0.0, sigma0=-1.0, sigmas=[[1.0]], num_draws=2)
