"""Which ε (issue 40 item 5): fixed-size cohorts are accounted with replace-one adjacency, whose ε
is about twice the add/remove ε Opacus and most DP-SGD papers report at the same noise multiplier;
``privacy.adjacency="add_remove"`` is offered where the sampling makes it valid (every client every
round; Poisson sampling is add/remove already), and refused by name elsewhere. The final table and
the calibration message name the relation."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from helpers import small_context

from fedtree.core.updates import UpdatePath, aggregate_children, init_update_state
from fedtree.experiment import reporting
from fedtree.experiment.capabilities import privacy as xp
from fedtree.experiment.registry import run_context

dp_accounting = pytest.importorskip("dp_accounting")


def test_replace_one_epsilon_is_about_twice_add_remove_at_the_same_noise_multiplier():
  """The figure the module docstring quotes: configs/privacy.py's eps10 (z = 1.548, 20 of 100
  clients, 40 rounds, δ = 1e-5) spends ε = 10.0 replace-one, 4.99 add/remove with Poisson
  sampling at the same q (dp-accounting's own accountants)."""
  z, rounds, delta = 1.548, 40, 1e-5
  rel = dp_accounting.NeighboringRelation
  wor = dp_accounting.rdp.RdpAccountant(neighboring_relation=rel.REPLACE_ONE)
  wor.compose(dp_accounting.SelfComposedDpEvent(
    dp_accounting.SampledWithoutReplacementDpEvent(100, 20, dp_accounting.GaussianDpEvent(z)), rounds))
  poisson = dp_accounting.rdp.RdpAccountant(neighboring_relation=rel.ADD_OR_REMOVE_ONE)
  poisson.compose(dp_accounting.SelfComposedDpEvent(
    dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(z)), rounds))
  kw = dict(noise_multiplier=z, sampling_rate=0.2, rounds=rounds, delta=delta)
  replace_one = xp.epsilon(**kw, sampling="fixed", population=100, cohort=20)
  add_remove = xp.epsilon(**kw, sampling="poisson")
  assert replace_one == pytest.approx(wor.get_epsilon(delta), rel=1e-9) and round(replace_one, 1) == 10.0
  assert add_remove == pytest.approx(poisson.get_epsilon(delta), rel=1e-9) and round(add_remove, 2) == 4.99
  assert 1.9 < replace_one / add_remove < 2.1


def _plan(privacy, **run):
  ctx = small_context()   # root -> 2 edge servers -> 3 clients each
  cfg = ml_collections.ConfigDict({"algorithm": "hierfavg", "chunk_size": 3, "weighting": "uniform",
                                   "privacy": privacy, **run})
  return xp.plan(dict(privacy), run_context(ctx, "dp", cfg), verbose=False), ctx


def _noise_std(p):
  """The ``dp_noise_std`` the plan's central noise reports at the clients' parents."""
  parts = xp.transforms(p)[-1]
  path = UpdatePath(client=parts["client"][0], node=parts["node"][0])
  parents = {"w": np.zeros((2, 3), np.float32)}
  kids = {"w": np.ones((6, 3), np.float32)}
  state = init_update_state(path, {"w": parents["w"][0]}, 6, 2)
  out = aggregate_children(path, state, parents, kids, jnp.ones(6, jnp.float32), np.arange(6) // 3,
                           jax.random.key(0))
  return float(out[3]["dp_noise_std"])


def test_add_remove_where_every_client_takes_part():
  """``cohort_size=None`` (no sampling): add/remove is a Gaussian mechanism of sensitivity C, noise
  z C (half the replace-one noise 2 z C) for the same ε; ε is dp-accounting's Gaussian under
  ADD_OR_REMOVE_ONE; the normalisation defaults to the fixed one."""
  z, c = 1.3, 0.5
  p, _ = _plan({"clip_norm": c, "noise_multiplier": z, "adjacency": "add_remove"}, cohort_size=None, rounds=7)
  assert p.adjacency == "add_remove" and p.normalize == "fixed" and p.sampling_rate == 1.0
  rel = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
  acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=rel)
  acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), 7))
  assert xp.epsilon_after(p, 7) == pytest.approx(acc.get_epsilon(p.delta), rel=1e-9)
  assert _noise_std(p) == pytest.approx(z * c)
  one, _ = _plan({"clip_norm": c, "noise_multiplier": z, "normalize": "fixed"}, cohort_size=None, rounds=7)
  assert one.adjacency == "replace_one" and _noise_std(one) == pytest.approx(2 * z * c)
  assert xp.epsilon_after(one, 7) == pytest.approx(xp.epsilon_after(p, 7), rel=1e-9)


def test_add_remove_is_refused_where_the_sampling_does_not_support_it():
  with pytest.raises(ValueError, match=r"adjacency='add_remove' with fixed-size cohorts \(q=0.6667 < 1\): "
                                       r"sampling without replacement is accounted with replace-one"):
    _plan({"clip_norm": 1.0, "noise_multiplier": 1.0, "adjacency": "add_remove"}, cohort_size=2)
  with pytest.raises(ValueError, match=r"normalize='count' with adjacency='add_remove'"):
    _plan({"clip_norm": 1.0, "noise_multiplier": 1.0, "adjacency": "add_remove", "normalize": "count"},
          cohort_size=None)
  with pytest.raises(ValueError, match=r"adjacency='replace_one' with sampling='poisson'"):
    _plan({"clip_norm": 1.0, "noise_multiplier": 1.0, "adjacency": "replace_one"}, sampling="poisson",
          poisson_q=0.5)
  with pytest.raises(ValueError, match=r"adjacency='neighbour'; choose one of \['replace_one', "):
    _plan({"clip_norm": 1.0, "noise_multiplier": 1.0, "adjacency": "neighbour"}, cohort_size=None)
  p, _ = _plan({"clip_norm": 1.0, "noise_multiplier": 1.0}, sampling="poisson", poisson_q=0.5)
  assert p.adjacency == "add_remove"


def test_the_calibration_message_and_the_final_table_name_the_adjacency(capsys):
  p = xp.plan({"clip_norm": 1.0, "target_epsilon": 5.0},
          run_context(small_context(), "dp", ml_collections.ConfigDict(
            {"algorithm": "hierfavg", "weighting": "uniform", "cohort_size": 2, "rounds": 3})))
  assert p.adjacency == "replace_one"
  err = capsys.readouterr().err
  assert "calibrated to target_epsilon=5.0" in err and "replace-one adjacency)" in err
  table = reporting.format_summary({"dp": {"global": {"accuracy": 0.5, "loss": 1.0, "epsilon": 5.0}}})
  assert "ε = user-level privacy spent at the run's δ, replace-one adjacency with fixed-size cohorts" in table
  assert "ε =" not in reporting.format_summary({"plain": {"global": {"accuracy": 0.5, "loss": 1.0}}})
