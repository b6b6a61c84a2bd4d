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
  ("afl", r"afl: the omniscient attack 'alie' at the clients' tier is not supported \(it rewrites every "
          r"parent's whole cohort in front of a blockwise mean\): it would still sum what the clients send "
          r"beside their updates \(their losses \(which set the weights λ\)\), so one client could steer "
          r"every step$"),
  ("fedasync", r"fedasync: the omniscient attack 'alie' at the clients' tier is not supported \(it "
               r"rewrites every parent's whole cohort in front of a blockwise mean\): each server step "
               r"applies one client's update alone \(a buffer of one\), so a robust aggregator has no cohort "
               r"to compare; .*Sec. 5\)$"),
])
def test_an_omniscient_attack_without_an_aggregator_is_named_as_the_attack(ctx, name, message):
  """Item 11: the run chose no aggregator: the refusal names the attack as unsupported for the method,
  not "a robust (blockwise) aggregator"; a robust aggregator the run did choose is still named as one,
  with the mean as the way out."""
  with pytest.raises(ValueError, match=message):
    _build(ctx, name, attack={"name": "alie", "fraction": 0.3})
  with pytest.raises(ValueError, match=f"{name}: a robust \\(blockwise\\) aggregator at the clients' tier: "
                                       f".*; use the mean aggregator$"):
    _build(ctx, name, aggregator={"name": "median"})
  # SCAFFOLD, FedDyn and FedNova take both since issue 55 (their tests): the same rule on what they send
  for other in ("scaffold", "feddyn", "fednova"):
    _build(ctx, other, attack={"name": "alie", "fraction": 0.3})


def _with_local(ctx, **local):
  """``ctx`` whose config's ``local`` section sets ``local`` (with the schedule and optimizer of it)."""
  import dataclasses

  from fedtree.experiment.builders import local_optimizer_from_config, schedule_from_config

  config = ctx.config.copy_and_resolve_references()
  with config.local.ignore_type():
    for k, v in local.items():
      config.local[k] = v
  return dataclasses.replace(ctx, config=config, schedule=schedule_from_config(config.local),
                             local_optimizer=local_optimizer_from_config(config.local))


def test_poisson_sampling_runs_with_a_systems_section_and_privacy_refuses_the_pair(ctx):
  """Item 12: Poisson sampling with a systems section trains (the DP-accounting reason applied only to
  a run with a privacy section, which now refuses the pair itself); over-selection, a fixed-size draw,
  is refused for Poisson sampling by its own reason, and no text reads "systems=:"."""
  import jax

  systems = {"speed": {"dist": "lognormal", "median": 2.0, "sigma": 1.0}}
  alg = _build(ctx, "fedavg", sampling="poisson", poisson_q=0.5, systems=systems)
  _, metrics = jax.jit(alg.round)(alg.init(jax.random.key(0)), ctx.data, jax.random.key(1))
  assert float(metrics["round_seconds"]) > 0
  with pytest.raises(ValueError, match=r"privacy: sampling='poisson' with a systems section: its round "
                                       r"policy \(dropout, a deadline, availability\) changes who takes "
                                       r"part, which the Poisson accounting does not model") as e:
    _build(ctx, "fedavg", sampling="poisson", poisson_q=0.5, systems=systems, weighting="uniform",
           privacy={"clip_norm": 1.0, "noise_multiplier": 1.0})
  assert "systems=:" not in str(e.value)
  with pytest.raises(ValueError, match=r"sampling='poisson' with the systems policy 'over_selection': "
                                       r"over-selection samples ceil\(factor k\) clients"):
    _build(ctx, "fedavg", sampling="poisson", poisson_q=0.5,
           systems={**systems, "policy": {"kind": "over_selection", "factor": 1.5}})


def test_fedasyncs_over_selection_refusal_names_fedasync(ctx):
  with pytest.raises(ValueError, match=r"fedasync takes systems with the wait_for_all or deadline policy, "
                                       r"got .*its concurrency \(the clients in flight") as e:
    _build(ctx, "fedasync", systems={"policy": {"kind": "over_selection", "factor": 1.5}})
  assert "fedbuff" not in str(e.value).lower().replace("algorithm='fedasync'", "")


def test_values_derived_from_the_local_section_are_named_by_the_field_written(ctx):
  """Item 12: FedKWS's ALT and APFL's α step take their defaults from ``local.steps`` and
  ``local.learning_rate``: a bad one is named as the field the user wrote, not as ``base_steps`` or
  ``alpha_lr``."""
  with pytest.raises(ValueError, match=r"ALT scales a local step count E of at least 1: the schedule's "
                                       r"steps=0 \(config.local.steps\)") as e:
    _build(_with_local(ctx, steps=0), "fedkws")
  assert "base_steps" not in str(e.value)
  from fedtree.algorithms import apfl

  with pytest.raises(ValueError, match=r"apfl: alpha_lr defaults to the local learning rate, "
                                       r"local_learning_rate=0.0 \(from a config: local.learning_rate\), "
                                       r"which must be > 0") as e:
    apfl(model=ctx.model, data=ctx.data, local_optimizer=ctx.local_optimizer, schedule=ctx.schedule,
         local_learning_rate=0.0)
  assert "alpha_lr=0.0" not in str(e.value)
  with pytest.raises(ValueError, match=r"config.runs.apfl \(algorithm='apfl'\): local_learning_rate=0.0 must "
                                       r"be > 0 and finite$"):   # the run's field, not config.local's
    _build(ctx, "apfl", local_learning_rate=0.0)


def test_pld_with_fixed_size_cohorts_is_refused_before_anything_runs(ctx, tmp_path):
  """Item 13: the privacy capability's plan refuses PLD accounting of fixed-size cohorts, through the
  registry (the library's path) and before the runner writes anything (it was refused only when ε was
  first computed, after config.json and metrics.jsonl)."""
  from test_refusals import tiny

  from fedtree import experiment

  message = r"accountant='pld' accounts Poisson sampling only; use sampling='poisson' or accountant='rdp'"
  with pytest.raises(ValueError, match=message):
    _build(ctx, "fedavg", weighting="uniform", privacy={"clip_norm": 1.0, "noise_multiplier": 1.0,
                                                         "accountant": "pld"})
  c = tiny()
  c.runs.fedavg.weighting = "uniform"
  c.runs.fedavg.privacy = CD({"clip_norm": 1.0, "noise_multiplier": 1.0, "accountant": "pld"})
  c.only = "fedavg"
  with pytest.raises(ValueError, match=message):
    experiment.train_and_evaluate(c, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists() or not list((tmp_path / "w").iterdir())


def test_one_rule_for_one_field(ctx):
  """Item 14: SCAFFOLD refuses a server learning rate that is not > 0 (gradient ascent), as Mime does;
  FedRep's head phase trains whether counted in steps or in epochs (``head_steps=0`` was accepted,
  ``head_epochs=0.0`` refused)."""
  for name in ("scaffold", "mime"):
    with pytest.raises(ValueError, match=rf"{name}: server_learning_rate=-1.0 must be a finite number > 0"):
      _build(ctx, name, server_learning_rate=-1.0)
  with pytest.raises(ValueError, match=r"fedrep: head_steps=0 must be an integer >= 1 \(as head_epochs "
                                       r"must be > 0: the head phase trains\)"):
    _build(ctx, "fedrep", head_steps=0)
  with pytest.raises(ValueError, match=r"fedrep: head_epochs=0.0 must be a finite number > 0"):
    _build(ctx, "fedrep", head_steps=None, head_epochs=0.0)


def test_a_run_section_the_file_does_not_have_is_set_from_the_command_line():
  """Item 15: ``--config.runs.fedavg.model.norm=batch`` (the run lists ``model``, the file's run has no
  such section) failed as a bare ``'model'`` (ml_collections' KeyError): it is split from the flags and
  added after the parse, as a new run is; a field of a section the run has stays ml_collections'."""
  import os

  from fedtree import main

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  argv = ["fedtree", f"--config={root}/configs/quickstart.py", "--config.runs.fedavg.model.norm=batch",
          "--config.runs.fedavg.cohort_size=2", "--config.runs.fedadam.server.learning_rate=0.1"]
  kept, new = main.split_new_runs(argv)
  assert kept == [argv[0], argv[1], argv[3], argv[4]]
  assert new == [(["fedavg", "model", "norm"], "batch")]
  config = ml_collections.ConfigDict({"runs": {"fedavg": {"algorithm": "fedavg"}}})
  main.add_new_runs(config, new)
  assert config.runs.fedavg.to_dict() == {"algorithm": "fedavg", "model": {"norm": "batch"}}


def test_fedbns_refusal_says_how_to_ask_for_batchnorm_from_the_command_line(ctx):
  with pytest.raises(ValueError, match=r"fedbn: the model keeps no BatchNorm statistics \(its state: \[\]\); "
                                       r"ask for one with BatchNorm .*--config.model.norm=batch .*"
                                       r"--config.runs.<label>.model.norm=batch"):
    registry.build_algorithm("fedbn", CD({"algorithm": "fedbn"}), ctx)


def test_an_unknown_algorithm_names_the_closest_first(ctx):
  """Item 16: the 41 names come after a did-you-mean, as the field errors' do."""
  for typo, near in (("scafold", "'scaffold'"), ("FedProx", "'fedprox'"), ("hierfedavg", "'hierfavg'")):
    with pytest.raises(ValueError, match=rf"config.runs.x.algorithm='{typo}' is unknown \(did you mean "
                                         rf"{near}"):
      registry.build_algorithm("x", CD({"algorithm": typo}), ctx)
  with pytest.raises(ValueError, match=r"algorithm='zzz' is unknown; choose one of"):
    registry.build_algorithm("x", CD({"algorithm": "zzz"}), ctx)
