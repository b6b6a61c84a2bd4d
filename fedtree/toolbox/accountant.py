"""The privacy spent: ε of a sampled Gaussian mechanism composed over rounds, and the noise
multiplier that reaches a target ε, with Google's ``dp_accounting`` (the ``privacy`` extra).

The unit is a client (user-level DP): one round is one sampled Gaussian mechanism over a
parent's clients (Poisson sampling at rate ``q``, or a fixed-size cohort drawn without
replacement), composed over the rounds, under a neighbouring relation (:data:`ADJACENCIES`):
replace-one for fixed-size cohorts (the relation sampling without replacement is analysed under),
add/remove for Poisson sampling. The transforms whose noise this accounts for are
:mod:`fedtree.toolbox.privacy`'s; a run's ``privacy`` section is resolved against its tree and
cohort by :mod:`fedtree.experiment.capabilities.privacy`.

Example:
  ``configs/privacy.py``'s ``eps10`` run (``z = 1.548``, 6 of 30 clients a round, 40 rounds): its
  ε under replace-one adjacency, and what Poisson sampling at the same rate (add/remove) gives:

  >>> round(epsilon(noise_multiplier=1.548, sampling_rate=0.2, rounds=40, delta=1e-5, sampling="fixed",
  ...               population=30, cohort=6), 2)
  10.0
  >>> round(epsilon(noise_multiplier=1.548, sampling_rate=0.2, rounds=40, delta=1e-5), 2)
  4.99
"""

from __future__ import annotations

import functools
import math

import numpy as np

ACCOUNTANTS = ("rdp", "pld")


SAMPLINGS = ("fixed", "poisson")


ADJACENCIES = ("replace_one", "add_remove")
"""The neighbouring datasets ε is accounted between: one client's data replaced by another's, or
one client added or removed."""


def _dpa():
  try:
    import dp_accounting
  except ImportError as e:  # pragma: no cover - the extra is in dev
    raise ImportError("privacy accounting needs dp-accounting: pip install 'fedtree[privacy]'") from e
  return dp_accounting


def check_delta(delta) -> float:
  """``delta`` if it is in (0, 1), else a ``ValueError`` naming it."""
  if not (isinstance(delta, (int, float, np.floating)) and 0 < float(delta) < 1):
    raise ValueError(f"delta={delta!r}; it must be in (0, 1)")
  return float(delta)


def check_adjacency(adjacency: str | None, sampling: str, sampling_rate) -> None:
  """Named errors for an unknown neighbouring relation, or one the sampling's accounting does not
  support: add/remove with fixed-size cohorts below every client (sampling without replacement is
  accounted replace-one), replace-one with Poisson sampling."""
  if adjacency is None:
    return
  if adjacency not in ADJACENCIES:
    raise ValueError(f"adjacency={adjacency!r}; choose one of {list(ADJACENCIES)}")
  if adjacency == "add_remove" and sampling == "fixed" and float(sampling_rate) < 1:
    raise ValueError(f"adjacency='add_remove' with fixed-size cohorts (q={float(sampling_rate):.4g} < 1): "
                     f"sampling without replacement is accounted with replace-one adjacency only; sample "
                     f"with sampling='poisson' (poisson_q) for add/remove, or let every client take part "
                     f"every round (cohort_size=None)")
  if adjacency == "replace_one" and sampling == "poisson":
    raise ValueError("adjacency='replace_one' with sampling='poisson': Poisson sampling is accounted with "
                     "add/remove adjacency (dp-accounting's RDP supports no other); use "
                     "adjacency='add_remove'")


def check_delta_population(delta: float, population: int) -> float:
  """``delta`` if it is below ``1 / population`` (the units of privacy: clients), else a
  ``ValueError``: a mechanism that publishes one unit's data outright is (0, 1/n)-DP, so a δ of
  1/n or more promises nothing (common choices: 1e-5, or below 1/n)."""
  if float(delta) * int(population) >= 1:
    n = int(population)
    raise ValueError(f"delta={delta!r} is not below 1/n = 1/{n} ({n} clients, the unit of privacy): "
                     f"publishing one client's data outright meets it; choose delta < {1 / n:.3g} "
                     f"(e.g. 1e-5)")
  return float(delta)


def check_sampling(sampling: str, sampling_rate) -> None:
  """Named errors for an unknown sampling or a rate outside (0, 1]."""
  if sampling not in SAMPLINGS:
    raise ValueError(f"sampling={sampling!r}; choose one of {list(SAMPLINGS)}")
  q = float(sampling_rate)
  if not (0 < q <= 1):
    raise ValueError(f"sampling rate q={sampling_rate!r}; it must be in (0, 1]")


def _event(z: float, q: float, rounds: int, sampling: str, size: int | None, cohort: int | None):
  dpa = _dpa()
  gauss = dpa.GaussianDpEvent(z)
  if q >= 1:
    one = gauss
  elif sampling == "poisson":
    one = dpa.PoissonSampledDpEvent(q, gauss)
  else:
    if size is None or cohort is None:
      size, cohort = 10 ** 6, max(1, round(q * 10 ** 6))
    one = dpa.SampledWithoutReplacementDpEvent(int(size), int(cohort), gauss)
  return dpa.SelfComposedDpEvent(one, int(rounds))


def default_adjacency(sampling: str) -> str:
  """The neighbouring relation a sampling is accounted under by default: replace-one for
  fixed-size cohorts, add/remove for Poisson sampling."""
  return "replace_one" if sampling == "fixed" else "add_remove"


def check_accountant(accountant: str, sampling: str) -> None:
  """``accountant`` is one of :data:`ACCOUNTANTS` and accounts ``sampling`` (PLD: Poisson only).

  Raises:
    ValueError: an unknown accountant, or PLD with fixed-size cohorts.
  """
  if accountant not in ACCOUNTANTS:
    raise ValueError(f"accountant={accountant!r}; choose one of {list(ACCOUNTANTS)}")
  if accountant == "pld" and sampling == "fixed":
    raise ValueError("accountant='pld' accounts Poisson sampling only; use sampling='poisson' or "
                     "accountant='rdp' for fixed-size cohorts")


def _accountant(accountant: str, sampling: str, adjacency: str | None = None):
  dpa = _dpa()
  check_accountant(accountant, sampling)
  adjacency = default_adjacency(sampling) if adjacency is None else adjacency
  if accountant == "rdp":
    rel = dpa.NeighboringRelation
    rel = rel.REPLACE_ONE if adjacency == "replace_one" else rel.ADD_OR_REMOVE_ONE
    return dpa.rdp.RdpAccountant(neighboring_relation=rel)
  return dpa.pld.PLDAccountant()


def epsilon(*, noise_multiplier: float, sampling_rate: float, rounds: int, delta: float,
            accountant: str = "rdp", sampling: str = "poisson", population: int | None = None,
            cohort: int | None = None, adjacency: str | None = None) -> float:
  """ε at ``delta`` after ``rounds`` sampled Gaussian mechanisms with noise multiplier ``z``
  (``inf`` for ``z = 0``; 0 for no round).

  Args:
    noise_multiplier: ``z >= 0``, the noise std over the sensitivity under ``adjacency``.
    sampling_rate: ``q`` in (0, 1] (Poisson: each client's probability; fixed: cohort / population).
    rounds: the number of rounds a client could have taken part in.
    delta: δ in (0, 1).
    accountant: ``"rdp"`` or ``"pld"`` (Poisson only).
    sampling: ``"poisson"`` or ``"fixed"`` (without replacement).
    population, cohort: the fixed-size sampling's sizes (default from ``q``).
    adjacency: ``"replace_one"`` or ``"add_remove"`` (:data:`ADJACENCIES`); default
      :func:`default_adjacency` (replace-one for ``"fixed"``, add/remove for ``"poisson"``).
      Add/remove with ``"fixed"`` needs ``q = 1`` (no sampling); replace-one with ``"poisson"``
      is not offered.
  """
  z = float(noise_multiplier)
  if not (math.isfinite(z) and z >= 0):
    raise ValueError(f"noise_multiplier={noise_multiplier!r}; it must be a finite number >= 0")
  check_delta(delta)
  check_sampling(sampling, sampling_rate)
  check_adjacency(adjacency, sampling, sampling_rate)
  acc = _accountant(accountant, sampling, adjacency)
  if rounds <= 0:
    return 0.0
  if z == 0:
    return math.inf
  acc.compose(_event(z, float(sampling_rate), rounds, sampling, population, cohort))
  return float(acc.get_epsilon(delta))


def calibrate(*, target_epsilon: float, sampling_rate: float, rounds: int, delta: float,
              accountant: str = "rdp", sampling: str = "poisson", population: int | None = None,
              cohort: int | None = None, adjacency: str | None = None) -> float:
  """The smallest noise multiplier whose ε after ``rounds`` is at most ``target_epsilon``
  (``dp_accounting.calibrate_dp_mechanism``).

  Raises:
    ValueError: a target that is not a positive number, or one no ``z <= 1024`` reaches.
  """
  t = target_epsilon
  if not (isinstance(t, (int, float, np.floating)) and math.isfinite(float(t)) and float(t) > 0):
    raise ValueError(f"target_epsilon={target_epsilon!r}; it must be a finite number > 0")
  check_delta(delta)
  check_sampling(sampling, sampling_rate)
  check_adjacency(adjacency, sampling, sampling_rate)
  return _search(float(t), float(sampling_rate), int(rounds), float(delta), accountant, sampling,
                 population, cohort, adjacency)


@functools.cache   # a pure search, asked again for the same run (validation, then the sweep)
def _search(t: float, sampling_rate: float, rounds: int, delta: float, accountant: str, sampling: str,
            population: int | None, cohort: int | None, adjacency: str | None = None) -> float:
  target_epsilon = t
  dpa = _dpa()

  def eps(z):
    return epsilon(noise_multiplier=z, sampling_rate=sampling_rate, rounds=rounds, delta=delta,
                   accountant=accountant, sampling=sampling, population=population, cohort=cohort,
                   adjacency=adjacency)

  hi = 1.0   # a bracket [lo, hi] with eps(lo) > t >= eps(hi), by doubling / halving from 1
  while eps(hi) > t:
    hi *= 2
    if hi > 1024:
      raise ValueError(f"target_epsilon={target_epsilon!r} is unreachable at delta={delta!r} over {rounds} "
                       f"rounds (q={sampling_rate!r}) with any noise multiplier up to 1024")
  lo = hi / 2
  while eps(lo) <= t:
    if lo < 0.02:   # a target so loose that a tiny z reaches it: that z (conservative)
      return float(lo)
    lo /= 2
  return float(dpa.calibrate_dp_mechanism(
    lambda: _accountant(accountant, sampling, adjacency),
    lambda z: _event(z, float(sampling_rate), rounds, sampling, population, cohort),
    float(t), float(delta),
    bracket_interval=dpa.ExplicitBracketInterval(lo, hi), tol=1e-5))

