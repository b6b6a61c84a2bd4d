"""The float hyperparameters of MOON (μ, τ), q-FFL (q, L), AFL (γ_λ) and FedAsync (α, the staleness
exponent) are sweep axes: experiment ``e`` of one stacked program equals the run with its value done
alone (a traced value reaches every factory; nothing needs a concrete one)."""

import jax
import optax
import pytest
from helpers import close, tiny_mlp_problem

from fedtree import algorithms
from fedtree.core import loop
from fedtree.core.local import LocalSchedule
from fedtree.core.sweep import sweep

CASES = [
  ("moon", {"mu": [0.0, 2.0], "temperature": [0.5, 0.2]}, {}),
  ("qffl", {"q": [0.0, 3.0], "lipschitz": [10.0, 4.0]}, {}),   # (L given: no learning rate needed)
  ("afl", {"domain_learning_rate": [0.0, 1.0]}, {}),
  ("fedasync", {"alpha": [1.0, 0.3], "staleness_exponent": [0.0, 1.0]}, {"concurrency": 3}),
]


@pytest.mark.parametrize("name,values,extra", [CASES[1]] + [pytest.param(*c, marks=pytest.mark.slow)
                                                             for c in CASES[:1] + CASES[2:]])
def test_swept_floats_equal_the_runs_alone(name, values, extra):
  data, model, _ = tiny_mlp_problem()
  common = dict(model=model, data=data, local_optimizer=optax.sgd(0.1),
                schedule=LocalSchedule(batch_size=4, steps=2), **extra)
  factory = getattr(algorithms, name)
  state = loop.run(sweep(lambda hp: factory(**common, **hp), values, [0, 0]), data, num_rounds=2,
                   key=jax.random.key(0), cache=None)
  one = factory(**common, **{k: v[1] for k, v in values.items()})   # experiment 1, alone
  alone = loop.run(one, data, num_rounds=2, key=jax.random.key(0), cache=None)
  close(jax.tree.map(lambda a: a[1], state.inner.params), alone.params, tol=2e-5)
