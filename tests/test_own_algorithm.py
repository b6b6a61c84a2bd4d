"""A researcher's own algorithm from a config (issue 35 item 5): ``algorithm: "module:factory"``
names a factory of the user's own module, whose signature is its run schema exactly as a built-in
factory's (fields coerced and checked, capabilities' sections taken where the signature takes
``update_paths``), run through the runner as a built-in one is; a bad path is refused by name. The
module is written by the test into a folder put on ``sys.path`` (``python -m fedtree.main`` puts the
working directory there)."""

import textwrap

import jax
import ml_collections
import numpy as np
import pytest
from config_files import load_config

from fedtree.experiment import registry
from fedtree.experiment.runner import train_and_evaluate

MODULE = '''
"""A researcher's FedProx, written over the library's host."""

from fedtree.algorithms import fedprox
from fedtree.algorithms.host import hierfavg, method_over
from fedtree.experiment.capability import Capability

NOT_A_FACTORY = 3


@method_over(hierfavg)
def my_prox(host, *, mu: float, name: str = "my_prox"):
  """FedProx under another name: the library's, called with the run's arguments."""
  return fedprox(mu=mu, name=name, **host)


def flat_only(*, model, data, local_optimizer, schedule, steps: int = 1, name: str = "flat_only"):
  """A factory that is not a method over the host: its signature alone is its schema."""
  from fedtree.algorithms import fedavg
  return fedavg(model=model, data=data, local_optimizer=local_optimizer, schedule=schedule, name=name)


def _noted(section, run):
  scale = float(section.get("scale", 1.0))
  return lambda r: {"my_metric": scale * r}


NOTED = Capability(name="noted", about="a per-round number", round_metrics=_noted,
                   algorithms=lambda spec: True)
'''


@pytest.fixture
def own_module(tmp_path, monkeypatch):
  """The name of a module written into a folder on ``sys.path`` (unique per test: no stale import)."""
  name = f"my_methods_{tmp_path.name.replace('-', '_')}"
  (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE))
  monkeypatch.syspath_prepend(str(tmp_path))
  return name


def _config(runs: dict, rounds: int = 2) -> ml_collections.ConfigDict:
  c = load_config("quickstart")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress, c.plots = rounds, rounds, 1, False, False
  c.data.group_sizes = (3, 2)
  c.data.max_examples = 24
  c.model.hidden = (8,)
  c.checkpoint_every = 0
  c.runs = ml_collections.ConfigDict(runs)
  c.run_order = tuple(runs)
  return c


def test_an_own_factory_runs_as_the_built_in_one(own_module, tmp_path):
  """The same FedProx named by the library and by the user's module: bitwise the same summaries,
  with a privacy section (a capability its signature takes through ``update_paths``)."""
  privacy = dict(clip_norm=1.0, noise_multiplier=0.5)
  c = _config({"builtin": dict(algorithm="fedprox", mu=0.01, weighting="uniform", cohort_size=3,
                               privacy=privacy),
               "mine": dict(algorithm=f"{own_module}:my_prox", mu=0.01, weighting="uniform", cohort_size=3,
                            privacy=privacy)})
  out = train_and_evaluate(c, str(tmp_path / "work"))
  assert out["mine"]["global"]["accuracy"] == out["builtin"]["global"]["accuracy"]
  assert out["mine"]["global"]["epsilon"] == out["builtin"]["global"]["epsilon"] > 0
  ctx_free = registry.schema(registry.spec_of(f"{own_module}:my_prox"))
  assert ctx_free.scalars["mu"] is float and "privacy" in ctx_free.sections


def test_an_own_factory_is_built_with_its_attribute_as_name(own_module):
  from helpers import small_context

  ctx = small_context()
  run = ml_collections.ConfigDict(dict(algorithm=f"{own_module}:my_prox", mu=1, chunk_size=3))
  alg = registry.build_algorithm("mine", run, ctx)
  assert alg.name == "my_prox"   # (mu=1 coerced to the float its annotation says)
  state = jax.eval_shape(alg.init, jax.random.key(0))
  assert len(state.params) == 1   # topology optional: one server, as the library's fedprox
  # a factory that is not over the host: its own parameters are its fields
  flat = ml_collections.ConfigDict(dict(algorithm=f"{own_module}:flat_only", steps=2))
  assert registry.build_algorithm("flat", flat, ctx).name == "flat_only"


def test_an_own_factory_checks_its_fields_as_a_built_in_one(own_module):
  where = f"config.runs.mine (algorithm='{own_module}:my_prox')"
  with pytest.raises(ValueError, match=r"unknown field 'muu' \(did you mean 'mu'\?\)") as e:
    registry.validate_run("mine", ml_collections.ConfigDict(dict(algorithm=f"{own_module}:my_prox", muu=1.0)))
  assert where in str(e.value)
  with pytest.raises(ValueError, match=r"algorithm 'my_methods_.*:flat_only' cannot run a 'privacy' section"):
    registry.validate_run("flat", ml_collections.ConfigDict(
      dict(algorithm=f"{own_module}:flat_only", privacy=dict(clip_norm=1.0, noise_multiplier=1.0))))


@pytest.mark.parametrize("path, message", [
  ("no_such_module_xyz:f", r"module 'no_such_module_xyz' cannot be imported"),
  ("{m}:missing", r"module 'my_methods_.*' has no attribute 'missing'"),
  ("{m}:NOT_A_FACTORY", r"is a int, not an algorithm factory"),
  ("{m}:", r"is not 'module:attribute'"),
  ("fedavgg", r"algorithm='fedavgg' is unknown \(did you mean 'fedavg' or .*\); choose one of \[.*\] "
              r"or a factory of your own as 'module:function'"),
])
def test_a_bad_algorithm_path_is_refused_by_name(own_module, path, message):
  run = ml_collections.ConfigDict(dict(algorithm=path.format(m=own_module)))
  with pytest.raises(ValueError, match=message):
    registry.validate_run("r", run)


def test_an_own_capability_from_the_config(own_module, tmp_path):
  """``config.capabilities`` adds a capability of the user's module: its section is a run field,
  its per-round metric lands in the summary."""
  c = _config({"fedavg": dict(algorithm="fedavg", cohort_size=3, noted=dict(scale=2.0))})
  c.capabilities = (f"{own_module}:NOTED",)
  out = train_and_evaluate(c, None)
  assert out["fedavg"]["global"]["my_metric"] == 2.0 * 2
  c.capabilities = (f"{own_module}:my_prox",)
  with pytest.raises(ValueError, match=r"config.capabilities: .*:my_prox' is a function, not a"):
    train_and_evaluate(c, None)
  np.testing.assert_equal(registry.factory_name(f"{own_module}:my_prox"), "my_prox")
