"""Refusals that refused the wrong thing or said the wrong thing (issue 57 items 10-16): each names
what the run asked for, in the words and fields the user wrote, before anything runs."""

import ml_collections
import pytest
from helpers import ALGORITHM_CASES, small_context

from fedtree.experiment import registry

CD = ml_collections.ConfigDict
MEAN_ONLY = ("cfl", "ifca", "mcfl", "awcfl", "bhfl", "fedasync", "scaffold", "feddyn", "fednova", "mime",
             "afl", "qffl")


@pytest.fixture(scope="module")
def ctx():
  return small_context()


def _build(ctx, name, **fields):
  return registry.build_algorithm(name, CD({"algorithm": name, **ALGORITHM_CASES[name], **fields}), ctx)


def test_an_explicit_mean_aggregator_is_the_weighted_mean_every_method_takes(ctx):
  """Item 10: ``aggregator: {name: mean}`` asks for the weighted mean these methods run: they take it
  (they refused it as ``'block_mean'`` or with "use the mean aggregator"), and it is no update path
  at all (a run without the section, bitwise)."""
  import jax
  from helpers import trees_equal

  for name in MEAN_ONLY:
    _build(ctx, name, aggregator={"name": "mean"})
  kw = registry.factory_kwargs("scaffold", CD({"algorithm": "scaffold", **ALGORITHM_CASES["scaffold"],
                                               "aggregator": {"name": "mean"}}), ctx)
  paths = kw["update_paths"]
  agg = (paths[-1] if isinstance(paths, dict) else paths).aggregator
  assert not agg.blockwise and agg.name == "mean"
  plain, mean = _build(ctx, "cfl"), _build(ctx, "cfl", aggregator={"name": "mean"})
  a, _ = jax.jit(plain.round)(plain.init(jax.random.key(0)), ctx.data, jax.random.key(1))
  b, _ = jax.jit(mean.round)(mean.init(jax.random.key(0)), ctx.data, jax.random.key(1))
  trees_equal(a, b)


@pytest.mark.parametrize("name,message", [
  ("scaffold", r"scaffold: the omniscient attack 'alie' at level -1 is not supported \(it rewrites every "
               r"parent's whole cohort in front of a blockwise mean\): it would still average the clients' "
               r"control variates, so an attacker's variate would steer every client$"),
  ("cfl", r"cfl does not support the omniscient attack 'alie': the attack rewrites every parent's whole "
          r"cohort in front of a blockwise mean, and cfl aggregates its clients by their streamed weighted "
          r"mean only$"),
])
def test_an_omniscient_attack_without_an_aggregator_is_named_as_the_attack(ctx, name, message):
  """Item 11: the run chose no aggregator: the refusal names the attack as unsupported for the method,
  not "a robust (blockwise) aggregator"; a robust aggregator the run did choose is still named as one,
  with the mean as the way out."""
  with pytest.raises(ValueError, match=message):
    _build(ctx, name, attack={"name": "alie", "fraction": 0.3})
  with pytest.raises(ValueError, match=r"scaffold: a robust \(blockwise\) aggregator at level -1: .*; "
                                       r"use the mean aggregator$"):
    _build(ctx, "scaffold", aggregator={"name": "median"})
