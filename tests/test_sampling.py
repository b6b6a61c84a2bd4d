"""fedtree.core.sampling: static-shape cohorts per parent and their chunk sizes."""

import jax
import numpy as np
import pytest

from fedtree.core.sampling import cohort_sampler


def test_cohort_sampler_static_shapes_and_membership():
  parent = np.array([0, 1, 0, 1, 1, 2, 2])
  s = cohort_sampler(parent, [1, 2, 2], chunk_size=4)
  assert s.cohort_size == 5 and s.padded_size == 8
  seen = set()
  for i in range(20):
    c = s(jax.random.key(i))
    clients, par, valid = map(np.asarray, (c.clients, c.parent, c.valid))
    assert clients.shape == (8,) and valid.sum() == 5
    np.testing.assert_array_equal(parent[clients[valid]], par[valid])
    for g in range(3):
      members = clients[valid & (par == g)]
      assert len(set(members.tolist())) == len(members)  # without replacement
    seen.add(tuple(clients[valid]))
  assert len(seen) > 1
  full = cohort_sampler(parent, -1)(jax.random.key(0))
  assert sorted(np.asarray(full.clients).tolist()) == list(range(7))


def test_cohort_larger_than_group_is_an_error():
  with pytest.raises(ValueError, match=r"cohort_size=3 exceeds group 0, which has 2 clients"):
    cohort_sampler(np.array([0, 0, 1, 1, 1]), 3)
  with pytest.raises(ValueError, match="must be >= 1"):
    cohort_sampler(np.array([0, 0]), 0)


def test_chunk_size_choices():
  from fedtree.core.tuning import default_chunk_size

  parent = np.zeros(10, int)
  assert cohort_sampler(parent, 10, chunk_size="auto").chunk_size == default_chunk_size(10, group_sizes=[10])
  assert cohort_sampler(parent, 10, chunk_size=None).chunk_size == 10
  with pytest.raises(ValueError, match="chunk_size='fast'; choose an int"):
    cohort_sampler(parent, 10, chunk_size="fast")


# ------------------------------------------------------------------------ draws independent of the population
# (issue 43 item 4) A parent of many children draws its cohort with replacement and rejection
# instead of shuffling every child. Its draws cannot equal the shuffle's bit for bit, so its
# distribution is proved by seeded frequency tests: every ordered cohort of a small parent equally
# likely, every client of a large one included at rate k/n, tolerances 5 standard deviations of the
# counts (binomial), and the chi-square statistic of all cells within 5 of its own.
def _counts_within(counts: np.ndarray, p: float, draws: int):
  """Every cell of ``counts`` (``draws`` trials each) within 5 sd of ``draws * p``, and the cells'
  chi-square statistic within 5 sd of its mean (``cells - 1`` degrees of freedom)."""
  mean, sd = draws * p, np.sqrt(draws * p * (1 - p))
  assert np.all(np.abs(counts - mean) <= 5 * sd), (counts.min(), counts.max(), mean, sd)
  chi2 = float(np.sum((counts - mean) ** 2 / mean))
  dof = counts.size - 1
  assert abs(chi2 - dof) <= 5 * np.sqrt(2 * dof), (chi2, dof)


def _ordered_cells(cohorts: np.ndarray, n: int) -> np.ndarray:
  """Counts of every ordered tuple of distinct values of ``range(n)`` among the rows ``cohorts``."""
  import itertools

  cells = {t: i for i, t in enumerate(itertools.permutations(range(n), cohorts.shape[1]))}
  ids = np.asarray([cells[tuple(int(v) for v in row)] for row in cohorts])
  return np.bincount(ids, minlength=len(cells))


@pytest.mark.parametrize("redraw", [1e-9, 0.6])
def test_drawn_cohorts_are_uniform_ordered_samples_without_replacement(redraw):
  """Two parents (6 and 4 children; cohorts of 3 and 2) drawn with replacement and rejection:
  each of the 120 ordered cohorts of parent 0 and the 12 of parent 1 equally likely, the two
  parents independent (the 6 x 4 first slots), also when draws are so few that most are
  rejected (``redraw_probability=0.6``: rejection keeps the distribution exact)."""
  from fedtree.core.sampling import CohortSampler

  parent = np.array([0, 1, 0, 1, 0, 0, 1, 0, 1, 0])   # interleaved: children 0 2 4 5 7 9 | 1 3 6 8
  s = CohortSampler(parent=tuple(parent.tolist()), sizes=(3, 2), chunk_size=5, method="draw",
                    redraw_probability=redraw)
  assert s._static["draw"] is not None
  draws = 60_000
  c = jax.jit(jax.vmap(s))(jax.random.split(jax.random.key(43), draws))
  clients, par, valid = (np.asarray(a) for a in (c.clients, c.parent, c.valid))
  assert clients.shape == (draws, 5) and valid.all() and (par == [0, 0, 0, 1, 1]).all()
  np.testing.assert_array_equal(parent[clients], par)
  local = np.searchsorted(np.flatnonzero(parent == 0), clients[:, :3]), \
    np.searchsorted(np.flatnonzero(parent == 1), clients[:, 3:])
  _counts_within(_ordered_cells(local[0], 6), 1 / 120, draws)
  _counts_within(_ordered_cells(local[1], 4), 1 / 12, draws)
  _counts_within(np.bincount(local[0][:, 0] * 4 + local[1][:, 0], minlength=24), 1 / 24, draws)


def test_a_large_parent_draws_without_touching_the_population():
  """``method="auto"``: a parent of 200,000 children draws its cohort of 8 with no array of
  the population's size in the program (the shuffle sorts one); a small parent beside it (50
  children, 5 drawn) is shuffled whole; both are samples without replacement of their own."""
  sizes = (200_000, 50)
  parent = np.repeat([0, 1], sizes)
  auto, shuffle = (cohort_sampler(parent, [8, 5], chunk_size=13, method=m) for m in ("auto", "shuffle"))
  plan = auto._static["draw"]
  assert plan is not None and plan["drawn"].tolist() == [True] * int(plan["drawn"].sum()) + [False] * 50

  def largest(f):
    jaxpr = jax.make_jaxpr(f)(jax.random.key(0))
    sizes = []

    def walk(j):
      for e in j.eqns:
        sizes.extend(int(np.prod(v.aval.shape)) for v in e.outvars if hasattr(v.aval, "shape"))
        for sub in jax.extend.core.jaxprs_in_params(e.params):
          walk(sub)

    walk(jaxpr.jaxpr)
    return max(sizes)

  assert largest(auto) < 1_000 and largest(shuffle) >= 200_000
  for i in range(5):
    c = jax.jit(auto)(jax.random.key(i))
    clients, par = np.asarray(c.clients), np.asarray(c.parent)
    np.testing.assert_array_equal(parent[clients], par)
    for g in (0, 1):
      assert len(set(clients[par == g].tolist())) == (8, 5)[g]


def test_a_large_parent_includes_every_client_at_rate_k_over_n():
  """5,000 children (above ``DRAW_FROM``), cohorts of 5, 40,000 draws: every client's inclusion
  count is binomial(40,000, 1/1,000) and each slot's client uniform."""
  from fedtree.core.sampling import DRAW_FROM

  n, k, draws = 5_000, 5, 40_000
  assert n >= DRAW_FROM
  s = cohort_sampler(np.zeros(n, int), k, chunk_size=k)
  assert s._static["draw"] is not None
  clients = np.asarray(jax.jit(jax.vmap(s))(jax.random.split(jax.random.key(7), draws)).clients)
  assert all(len(set(row)) == k for row in clients.tolist())
  _counts_within(np.bincount(clients.ravel(), minlength=n), k / n, draws)
  _counts_within(np.bincount(clients[:, 0] // 50, minlength=100), 1 / 100, draws)   # slot 0 by blocks


def test_small_populations_keep_the_shuffle_draws_bit_for_bit():
  """Below ``DRAW_FROM`` children per parent (every shipped config) a draw is the shuffle's."""
  parent = np.array([0, 1, 0, 1, 1, 2, 2] * 100)
  auto = cohort_sampler(parent, [3, 2, 2], chunk_size=4)
  assert auto._static["draw"] is None
  shuffle = cohort_sampler(parent, [3, 2, 2], chunk_size=4, method="shuffle")
  for i in range(3):
    for a, b in zip(auto(jax.random.key(i)), shuffle(jax.random.key(i)), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_draws_needed_bounds_the_rejections():
  """``m`` draws hold ``k`` distinct values except with probability at most ``tail`` (simulated);
  one draw is always distinct; a bad method is refused by name."""
  from fedtree.core.sampling import draws_needed

  assert draws_needed(10, 1, 1e-9) == 1 and draws_needed(10, 0, 1e-9) == 0
  assert draws_needed(10**6, 100, 1e-9) < 130 < draws_needed(1_000, 100, 1e-9)
  assert draws_needed(50, 20, 1e-9) > draws_needed(50, 20, 0.05) >= 20
  rng = np.random.default_rng(0)
  m = draws_needed(50, 20, 0.05)
  fewer = np.mean([len(set(rng.integers(0, 50, m).tolist())) < 20 for _ in range(20_000)])
  assert fewer <= 0.05 + 5 * np.sqrt(0.05 * 0.95 / 20_000), fewer
  with pytest.raises(ValueError, match=r"method='fast'; choose one of \('auto', 'draw', 'shuffle'\)"):
    cohort_sampler(np.zeros(4, int), 2, method="fast")
