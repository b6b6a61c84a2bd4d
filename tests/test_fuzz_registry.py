"""The fuzz over every registered algorithm (issue 27: keep it in CI): tests/test_fuzz.py varies
trees, cohorts, chunks and periods for eight algorithms; here every algorithm of
:data:`fedtree.experiment.registry.SPECS`, built from a run config as the runner builds it, runs
seeded random problems (group sizes down to one client, clients down to one example, several
data seeds) and must end with a finite state whose models cover every client, or refuse the
problem with a ``ValueError`` naming the value. ``-m slow`` (CI's slow pass: FEDTREE_CI_SLOW=1);
the default run checks that no registered algorithm is missing."""

import jax
import numpy as np
import pytest
from helpers import ALGORITHM_CASES
from multihost_config import get_config

from fedtree.core import loop
from fedtree.experiment import registry, runner

PROBLEMS = 3


def problems(name: str):
  """``PROBLEMS`` seeded problems for algorithm ``name``: group sizes, smallest client, seed."""
  rng = np.random.default_rng(sorted(registry.SPECS).index(name))
  for i in range(PROBLEMS):
    groups = tuple(int(g) for g in rng.integers(1, 4, size=int(rng.integers(1, 4))))
    if i == 0:
      groups = (1,) + groups   # a group of one client
    yield dict(group_sizes=groups, min_examples=int(rng.integers(1, 3)), seed=int(rng.integers(0, 100)))


def test_the_fuzz_covers_every_registered_algorithm():
  assert set(ALGORITHM_CASES) == set(registry.SPECS)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(registry.SPECS))
def test_fuzz_every_registered_algorithm(name):
  for p in problems(name):
    c = get_config(name)
    c.data.group_sizes, c.data.min_examples, c.data.seed = p["group_sizes"], p["min_examples"], p["seed"]
    c.data.max_examples = 6
    c = runner.prepare_config(c)
    try:
      runner.validate_config(c)
      ctx = runner.make_context(c)
      alg = registry.build_algorithm(name, c.runs[name], ctx)
    except ValueError as e:
      assert "=" in str(e) and "\n" not in str(e), f"a refusal must name the bad value on one line: {e}"
      continue
    rounds = alg.rounds if alg.rounds is not None else 2
    state = loop.run(alg, ctx.run_data, num_rounds=rounds, key=jax.random.key(p["seed"]))
    assert int(state.round) == rounds, p
    n = ctx.data.num_clients
    for model, nm in alg.models(state).items():
      for leaf in jax.tree.leaves(nm.params):
        assert np.isfinite(np.asarray(leaf)).all(), (name, model, p)
      rows = jax.tree.leaves(nm.params)[0].shape[0]
      owner = np.asarray(nm.model_of_client)
      assert owner.shape == (n,) and owner.min() >= 0 and owner.max() < rows, (name, model, p)
