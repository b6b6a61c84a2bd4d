"""Every runner field can be set from the command line on every shipped config (issue 27 item 4),
and a config's runs can be selected (issue 28 item 8): the flags are parsed as ``fedtree.main``
parses them (ml_collections' config flag) and the result validated, nothing trained."""

import os

import pytest
from absl import flags
from ml_collections import config_flags

from fedtree.experiment import fields, runner, validation, workdir

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # absl loads configs by load_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py")) + sorted(
  f"benchmarks/{f[:-3]}" for f in os.listdir(os.path.join(ROOT, "configs", "benchmarks"))
  if f.endswith(".py")) + sorted(f"llm/{f[:-3]}" for f in os.listdir(os.path.join(ROOT, "configs", "llm"))
                                 if f.endswith(".py"))


def parse(name: str, *overrides: str):
  """``--config=configs/<name>.py`` with ``overrides`` (``field=value``), as the command line does."""
  path = os.path.join(ROOT, "configs", f"{name}.py")
  argv = ["fedtree", f"--config={path}", *(f"--config.{o}" for o in overrides)]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True, sys_argv=argv)
  fv(argv)
  return fv.config


def test_every_shipped_config_is_tested():
  assert len(CONFIGS) >= 9 and "quickstart" in CONFIGS


@pytest.mark.parametrize("name", CONFIGS)
def test_every_runner_field_is_settable_on_every_config(name):
  """One command line setting every runner field (the example values of
  :data:`fedtree.experiment.fields.RUNNER_FIELDS`), parsed and validated."""
  label = validation.ordered_runs(parse(name))[-1][0]
  cases = {f: v for f, (_, _, v) in fields.RUNNER_FIELDS.items()}
  cases.update({f"local.{f}": v for f, (_, _, v) in fields.LOCAL_FIELDS.items()})
  cases.update(run_order=f"('{label}',)", only=label)
  c = parse(name, *(f"{f}={v}" for f, v in cases.items()))
  for field, value in cases.items():
    got = c
    for part in field.split("."):
      got = got[part]
    want = eval(value) if field == "run_order" else value
    assert str(got) == str(want) or (isinstance(got, float) and got == float(value)), (field, got)
  runner.validate_config(runner.prepare_config(c))


@pytest.mark.parametrize("args,check", [
  (("local.steps=10",), lambda c: c.local.steps == 10),                     # was: NoneType not overridable
  (("local.epochs=0.5",), lambda c: c.local.epochs == 0.5),                 # was: invalid literal for int()
  (("checkpoint_every=5",), lambda c: c.checkpoint_every == 5),
  (("chunk_size=8",), lambda c: runner.prepare_config(c).chunk_size == 8),  # the number, not "8"
  (("chunk_size=None",), lambda c: runner.prepare_config(c).chunk_size is None),
  (("eval_chunk_size=4",), lambda c: runner.prepare_config(c).eval_chunk_size == 4),
])
def test_the_commands_the_issue_could_not_run(args, check):
  for name in ("quickstart", "personalization"):
    assert check(parse(name, *args)), (name, args)


def test_only_runs_a_subset_of_the_runs_in_their_order():
  c = runner.prepare_config(parse("quickstart", "only=hierfavg,fedavg"))
  assert [label for label, _ in runner.selected_runs(c)] == ["fedavg", "hierfavg"]
  c = runner.prepare_config(parse("quickstart", "only=fedavgg"))
  with pytest.raises(ValueError, match=r"config.only='fedavgg' names \['fedavgg'\], not among the config"):
    runner.validate_config(c)


def test_only_and_the_divergence_bound_do_not_change_the_fingerprint():
  base = workdir.config_fingerprint(runner.prepare_config(parse("quickstart")))
  assert workdir.config_fingerprint(runner.prepare_config(parse("quickstart", "only=fedavg"))) == base
  bounded = runner.prepare_config(parse("quickstart", "divergence_bound=1e9"))
  assert workdir.config_fingerprint(bounded) == base
  assert workdir.config_fingerprint(runner.prepare_config(parse("quickstart", "dtype=float64"))) != base


def test_a_config_built_in_python_gets_the_same_fields_as_a_file():
  c = runner.prepare_config(parse("quickstart"))
  for field in fields.RUNNER_FIELDS:
    assert field in c, field
  for field in fields.LOCAL_FIELDS:
    assert field in c.local, field
