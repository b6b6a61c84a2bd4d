"""The documentation: the MkDocs site builds in strict mode (a broken reference, a page missing
from the navigation or a bad docstring cross-reference fails), and the examples in the public
entry points' docstrings run as doctests, each in the names of ``docs/examples.py``."""

import doctest
import importlib
import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The names every docstring example may assume (jax, optax, loop, LocalSchedule, a tiny `data`,
# `groups` and `model`, ...): one file, which the API reference shows and every example runs in, so an
# example holds only its own lines.
EXAMPLES = os.path.join(ROOT, "docs", "examples.py")


def example_namespace() -> dict:
  """The globals of ``docs/examples.py`` (imports and the tiny problem), fresh for each module."""
  namespace: dict = {}
  with open(EXAMPLES, encoding="utf-8") as f:
    exec(compile(f.read(), EXAMPLES, "exec"), namespace)   # noqa: S102
  namespace.pop("__builtins__", None)
  return namespace


# The public entry points whose docstrings carry a runnable example. Every algorithm factory's
# example runs one round of one tiny problem (5 clients, logistic regression, 1 local step); its
# cost is the compilation of one round program, ~4-5 s of CPU each (measured on the 2-core dev
# machine), so the default run keeps the core modules and three representative entry points
# (~25 s together) and the other factories run under -m slow.
DOCTEST_MODULES = [
  "fedtree.core.algorithm",    # FederatedAlgorithm
  "fedtree.core.topology",     # Topology
  "fedtree.core.data",         # FederatedData
  "fedtree.core.tier",         # train_cohort
  "fedtree.core.loop",         # loop.run
  "fedtree.toolbox.compression",  # qsgd
  "fedtree.toolbox.secagg",       # a sum that wraps at the field's bound
  "fedtree.toolbox.systems",      # Systems.round (no compilation of a round)
  "fedtree.core.membership", "fedtree.toolbox.mobility",
  "fedtree.toolbox.traffic",      # Traffic
  "fedtree.experiment.plots",  # write_run_plots
  "fedtree.experiment.plots.panels",   # facets
  "fedtree.experiment.plots.records",  # time_to_target
  "fedtree.experiment.plots.table",    # grid_of
  "fedtree.algorithms.host.hierfavg",           # hierfavg
  "fedtree.algorithms.hierarchical.grouppfl.grouppfl",  # GroupPersonalizedFL
  "fedtree.experiment.runner",             # train_and_evaluate
  "fedtree.experiment.config_file",        # load_config (the docs' "From Python" snippet)
  "fedtree.core.metrics",
  "fedtree.core.server_rule",
  "fedtree.core.personal",
  "fedtree.experiment.fields",
  "fedtree.models",
  "fedtree.population.evaluation",   # sample_clients
  "fedtree.population.paged",        # PagedState
  "fedtree.population.reader",       # CohortReader
  "fedtree.population.store",        # write_federated_data, open_store
]
SLOW_DOCTEST_MODULES = [
  "fedtree.algorithms.optimization.fedavg",   # 11 examples, ~18 s
  "fedtree.core.sampling",
  "fedtree.core.updates",
  "fedtree.datasets.hf",
  "fedtree.toolbox.accountant",
  "fedtree.algorithms.optimization.fedprox",
  "fedtree.algorithms.optimization.fedmmd",
  "fedtree.algorithms.personalized.ditto",
  "fedtree.toolbox.lora",
  "fedtree.algorithms.optimization.ffa_lora",
  "fedtree.algorithms.heterogeneous.hetlora",
  "fedtree.algorithms.heterogeneous.heterofl",
  "fedtree.algorithms.heterogeneous.fjord",
  "fedtree.algorithms.heterogeneous.feddf",
  "fedtree.algorithms.heterogeneous.fedmd",
  "fedtree.algorithms.heterogeneous.depthfl",
  "fedtree.algorithms.partial.fedsa_lora",
  "fedtree.datasets.instructions",   # a word-level tokenizer built in the example (transformers)
  "fedtree.models.pretrained",       # a tiny checkpoint written by transformers
  "fedtree.algorithms.personalized.pfedme",
  "fedtree.algorithms.personalized.perfedavg",
  "fedtree.algorithms.hierarchical.pfedmt",
  "fedtree.algorithms.hierarchical.bhfl.bhfl",
  "fedtree.algorithms.clustering.clustered",
  "fedtree.algorithms.clustering.cfl",
  "fedtree.algorithms.clustering.awcfl",
  "fedtree.algorithms.clustering.mcfl",
  "fedtree.algorithms.clustering.ifca",
  "fedtree.algorithms.optimization.fedkws.fedkws",
  "fedtree.algorithms.asynchronous.fedbuff",
  "fedtree.algorithms.optimization.scaffold",
  "fedtree.algorithms.optimization.feddyn",
  "fedtree.algorithms.optimization.fednova",
  "fedtree.algorithms.optimization.fedex",
  "fedtree.algorithms.optimization.mime",
  "fedtree.algorithms.personalized.fedamp",
  "fedtree.algorithms.personalized.fedfomo",
  "fedtree.algorithms.personalized.pfedhn",
  "fedtree.algorithms.personalized.fedproto",
  "fedtree.algorithms.partial.local_only",
  "fedtree.algorithms.partial.fedper",
  "fedtree.algorithms.partial.fedrep",
  "fedtree.algorithms.partial.lgfedavg",
  "fedtree.algorithms.partial.fedbn",
  "fedtree.algorithms.partial.fedrod",
  "fedtree.algorithms.partial.fedbabu",
  "fedtree.algorithms.partial.finetuned",
  "fedtree.algorithms.asynchronous.fedasync",
  "fedtree.algorithms.optimization.moon",
  "fedtree.algorithms.optimization.qffl",
  "fedtree.algorithms.optimization.afl",
  "fedtree.algorithms.personalized.apfl",
  "fedtree.algorithms.personalized.fedala",
  "fedtree.algorithms.personalized.fedem",
  "fedtree.algorithms.personalized.knnper",
]


def test_every_algorithm_factory_has_a_runnable_example():
  """Each factory exported by fedtree.algorithms (and GroupPersonalizedFL) carries an example
  in a module whose doctests run above."""
  import fedtree.algorithms as algorithms
  from fedtree.algorithms.hierarchical.grouppfl.grouppfl import GroupPersonalizedFL

  listed = set(DOCTEST_MODULES + SLOW_DOCTEST_MODULES)
  factories = [getattr(algorithms, n) for n in algorithms.__all__ if n[0].islower()]
  for f in factories + [GroupPersonalizedFL]:
    assert ">>>" in (f.__doc__ or ""), f"{f.__name__} has no docstring example"
    assert f.__module__ in listed, f"{f.__module__} ({f.__name__}) is not in the doctest lists"


def test_every_docstring_example_runs_somewhere():
  """Every module whose docstrings hold an example is in the doctest lists (here, or
  tests/test_robust.py's), so no example goes stale unrun."""
  import ast
  import pathlib

  listed = set(DOCTEST_MODULES + SLOW_DOCTEST_MODULES) | {"fedtree.toolbox.robust", "fedtree.toolbox.attacks"}
  for path in sorted(pathlib.Path(ROOT, "fedtree").rglob("*.py")):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    if any(re.search(r"^\s*>>> ", ast.get_docstring(n) or "", re.M) for n in nodes):
      module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
      assert module in listed, f"{module} has docstring examples that no test runs"


def test_examples_namespace_is_on_the_api_page():
  """The names an example may assume are shown once, on the API reference's algorithms page."""
  page = open(os.path.join(ROOT, "docs", "api", "algorithms.md"), encoding="utf-8").read()
  assert "<!-- include docs/examples.py -->" in page


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason='mkdocs is not installed (pip install -e ".[docs]")')
def test_site_builds_in_strict_mode(tmp_path):
  out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
  assert out.returncode == 0, out.stderr[-4000:]
  for page in ("index.html", "concepts/index.html", "algorithms/bhfl/index.html", "api/core/index.html"):
    assert (tmp_path / "site" / page).exists(), page
  api = (tmp_path / "site" / "api" / "core" / "index.html").read_text()
  assert "train_cohort" in api and "Topology" in api
  site = tmp_path / "site"
  # every docstring example is a code block: no ">>>" turned into nested blockquotes
  for page in ("core", "algorithms", "experiment"):
    html = (site / "api" / page / "index.html").read_text()
    assert "<blockquote" not in html, page
    outside_code = re.sub(r"<pre.*?</pre>", "", html, flags=re.DOTALL)
    assert "&gt;&gt;&gt;" in html and "&gt;&gt;&gt;" not in outside_code, page
  # the modules the reference once missed, and FedMMD's page
  api = (site / "api" / "algorithms" / "index.html").read_text()
  assert 'id="fedtree.algorithms.optimization.fedmmd"' in api
  assert 'id="fedtree.objectives.fedmmd"' in (site / "api" / "objectives" / "index.html").read_text()
  assert 'id="fedtree.experiment.sweep"' in (site / "api" / "experiment" / "index.html").read_text()
  assert (site / "algorithms" / "fedmmd" / "index.html").exists()
  # the toolbox (issue 42 item 6): its pages, and the robust and attack modules' API page
  toolbox = (site / "api" / "toolbox" / "index.html").read_text()
  for module in ("fedtree.toolbox.robust", "fedtree.toolbox.attacks",
                 "fedtree.experiment.capabilities.robust"):
    assert f'id="{module}"' in toolbox, module
  for page in ("toolbox", "robust", "compression", "lora", "privacy"):
    assert (site / page / "index.html").exists(), page
  # a config's launch command is code
  kws = (site / "algorithms" / "fedkws" / "index.html").read_text()
  first_code = kws.split("<pre", 1)[1].split("</pre>", 1)[0]
  assert "fedtree.main" in first_code and "configs/fedkws.py" in first_code
  # offline: every script the pages load is in the site (MathJax bundled)
  for html_path in site.rglob("*.html"):
    for src in re.findall(r'<script[^>]+src="([^"]+)"', html_path.read_text()):
      assert "//" not in src, (html_path, src)
  assert (site / "javascripts" / "mathjax" / "tex-svg.js").stat().st_size > 1_000_000


CAPABILITIES = {   # docs page -> words the README's and the overview's line about it holds
  "docs/privacy.md": "privacy", "docs/robust.md": "robust aggregation",
  "docs/compression.md": "compression", "docs/lora.md": "LoRA", "docs/algorithms/systems.md": "systems",
  "docs/secure.md": "secure aggregation",
}


def test_every_capability_is_one_click_from_the_readme_and_in_the_navigation():
  """Issue 42 item 6: privacy, robust aggregation and attacks, compression, LoRA and systems each
  have a docs page linked from the README's toolbox table and in the site's navigation, with its
  config and notebook named."""
  readme = open(os.path.join(ROOT, "README.md")).read()
  toolbox = readme.split("## The toolbox", 1)[1].split("\n## ", 1)[0]
  nav = open(os.path.join(ROOT, "mkdocs.yml")).read().split("\nnav:", 1)[1]
  for page, words in CAPABILITIES.items():
    assert f"]({page})" in toolbox and words in toolbox, page
    assert page.removeprefix("docs/") in nav, page
    assert os.path.exists(os.path.join(ROOT, page)), page
  for name in ("privacy", "robust", "compression", "peft_lm", "systems", "secure"):
    assert f"(configs/{name}.py)" in toolbox, name
  assert "api/toolbox.md" in nav and "toolbox.md" in nav


def test_the_notebooks_page_lists_every_notebook():
  page = open(os.path.join(ROOT, "docs", "notebooks.md")).read()
  for path in sorted(os.listdir(os.path.join(ROOT, "colab"))):
    if path.endswith(".ipynb"):
      assert f"[`{path}`](https://colab.research.google.com/github/fedtree/fedtree/blob/main/colab/{path})" \
        in page, path


def test_the_docs_name_only_flower_partitioners_the_code_takes():
  """docs/bring-your-own.md lists the Flower partitioners fedtree hands the data to; each must be
  one :func:`fedtree.datasets.hf.flower_partitioner` builds (the vertical ones are refused)."""
  pytest.importorskip("flwr_datasets")
  from fedtree.datasets.hf import flower_partitioner

  page = open(os.path.join(ROOT, "docs", "bring-your-own.md")).read()
  listed = re.search(r'`partitioner="flwr.<ClassName>"` \(([^)]*)\)', page).group(1)
  names = re.findall(r"`(\w+Partitioner)`", listed)
  assert len(names) >= 10
  for name in names:
    try:
      flower_partitioner(name, {})
    except TypeError:   # built without its required arguments: accepted by name
      pass
    except ValueError as e:
      assert "is not supported" not in str(e) and "is unknown" not in str(e), (name, e)


def test_fence_indented_paragraphs():
  sys.path.insert(0, os.path.join(ROOT, "docs"))
  try:
    from griffe_examples import fence_indented_paragraphs
  finally:
    sys.path.pop(0)
  text = "Run it:\n\n  python -m fedtree.main --config=x.py\n\nA table:\n\n  run  acc\n  a    0.5\n\n* a\n  b"
  assert fence_indented_paragraphs(text) == (
    "Run it:\n\n```bash\npython -m fedtree.main --config=x.py\n```\n\nA table:\n\n"
    "```text\nrun  acc\na    0.5\n```\n\n* a\n  b")


@pytest.mark.slow  # a quickstart round in a fresh process: ~22 s on the 2-core machine
def test_the_from_python_snippet_runs_as_a_script(tmp_path):
  """docs/getting-started.md's "From Python" block, saved as a file and run from the repository
  root (as a reader would; 1 round instead of 20)."""
  text = open(os.path.join(ROOT, "docs", "getting-started.md")).read()
  block = text.split("## From Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
  assert "config.rounds = 20" in block and '"/tmp/q"' in block
  script = block.replace("config.rounds = 20", "config.rounds = 1\nconfig.progress = False\n"
                         "config.plots = False\nconfig.eval_every = 1\nconfig.rounds_per_call = 1\n"
                         "config.checkpoint_every = 0")
  script = script.replace('"/tmp/q"', repr(str(tmp_path / "q")))
  (tmp_path / "snippet.py").write_text(script)
  # this checkout's fedtree importable, its root (and so `configs`) not: as an installed package
  (tmp_path / "pkgs").mkdir()
  (tmp_path / "pkgs" / "fedtree").symlink_to(os.path.join(ROOT, "fedtree"))
  out = subprocess.run([sys.executable, str(tmp_path / "snippet.py")], cwd=ROOT, capture_output=True,
                       text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(tmp_path / "pkgs"), "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-3000:]
  assert 0.0 <= float(out.stdout.strip().splitlines()[-1]) <= 1.0


@pytest.mark.slow   # 40 s: the guide's three methods, each against the library's and a per-client loop
def test_the_write_your_own_guide_runs():
  """docs/write-your-own.md's code blocks, in order, as one script: each method built there (FedProx,
  FedPer, SCAFFOLD) equals the library's, SCAFFOLD its per-client loop too, FedPer's models are the
  personal ones, and the declared refusal reads as the library's."""
  text = open(os.path.join(ROOT, "docs", "write-your-own.md")).read()
  blocks = re.findall(r"```python\n(.*?)```", text, re.S)
  assert len(blocks) >= 6
  namespace: dict = {}
  exec(compile("\n".join(blocks), "write-your-own.md", "exec"), namespace)   # noqa: S102
  assert sorted(namespace["my_per"].models(namespace["per_state"])) == ["personal"]
  refusals = namespace["refusals"]
  assert len(refusals) == 2 and "the control variates cover the whole model" in refusals[0]
  text_order = [text.index(h) for h in ("## Step 1: a regularizer", "## Step 2: personal parameters",
                                        "## Step 3: a server rule", "## Step 4: what a method cannot")]
  assert text_order == sorted(text_order)   # the shortest method first (issue 48 item 6)


@pytest.mark.parametrize("name", DOCTEST_MODULES + [pytest.param(m, marks=pytest.mark.slow)
                                                    for m in SLOW_DOCTEST_MODULES])
def test_docstring_examples_run(name):
  if name.startswith("fedtree.experiment.plots"):
    pytest.importorskip("matplotlib")
  flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
  if name == "fedtree.datasets.hf":
    pytest.importorskip("datasets")
  if name in ("fedtree.datasets.instructions", "fedtree.models.pretrained"):
    pytest.importorskip("transformers")
    pytest.importorskip("torch" if name.endswith("pretrained") else "datasets")
  result = doctest.testmod(importlib.import_module(name), optionflags=flags, verbose=False,
                           extraglobs=example_namespace())
  assert result.attempted > 0, f"{name} has no docstring example"
  assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed (output above)"


def _text_of(*globs: str) -> str:
  """Every file under the repository matching ``globs``, whitespace collapsed, joined."""
  import glob

  paths = sorted({p for g in globs for p in glob.glob(os.path.join(ROOT, g), recursive=True)})
  return "\n".join(" ".join(open(p, encoding="utf-8").read().split()) for p in paths)


def test_peer_behaviours_named_as_the_peers_run_them():
  """Issue 57 items 4-5, checked against FedLab 1.3.0's and FLGo 0.4.4's own runs: FedLab's SCAFFOLD
  averages the clients' models uniformly (weighting by examples missed its run by 1.2e-2), FLGo's
  FedAsync weights what arrives together by data size (uniform missed by 2.5e-2). Wherever the
  comparison lives (module docstrings or docs pages), it says so."""
  text = _text_of("fedtree/**/*.py", "docs/**/*.md")
  assert "as FedLab's and PFLlib's SCAFFOLD do" not in text
  assert "FLGo averages uniformly" not in text
  assert re.search(r"``1/\|S\|``, and FedLab 1\.3\.0's\)", text), "FedLab's SCAFFOLD: uniform"
  assert "FLGo weights by data size: ``weighting=\"examples\"``" in text


def test_the_write_your_own_recipe_runs_from_the_users_own_folder(tmp_path, monkeypatch):
  """Issue 57 item 17: steps 1 and 3 saved as ``my_methods/scaffold.py`` and the page's ``my_config.py``,
  in a folder outside the repository, load the shipped quickstart by :func:`shipped_config` (a path
  relative to the repository's root failed there) and validate; the page's command runs the user's
  run alone (``--config.only=mine``), lists every field of ``Inbox`` and says what a first run skips."""
  from fedtree.core.server_rule import Inbox
  from fedtree.experiment import runner
  from fedtree.experiment.config_file import load_config

  text = open(os.path.join(ROOT, "docs", "write-your-own.md")).read()
  python = re.findall(r"```python\n(.*?)```", text, re.S)
  (tmp_path / "my_methods").mkdir()
  (tmp_path / "my_methods" / "__init__.py").write_text("")
  scaffold = [python[i] for i in (0, 1, 3, 4, 5)]   # step 1 (imports, data) and step 3 (SCAFFOLD)
  (tmp_path / "my_methods" / "scaffold.py").write_text("\n".join(scaffold))
  (tmp_path / "my_config.py").write_text(re.search(r"```py\n(# my_config.py\n.*?)```", text, re.S).group(1))
  monkeypatch.chdir(tmp_path)
  monkeypatch.syspath_prepend(str(tmp_path))
  c = load_config("my_config.py")
  assert c.runs.mine.algorithm == "my_methods.scaffold:my_scaffold"
  command = re.search(r"python -m fedtree.main --config=my_config.py [^\n]*", text).group(0)
  assert "--config.only=mine" in command
  c.only = "mine"
  runner.validate_config(runner.prepare_config(c))
  table = re.search(r"\| field \| what it is \|\n\| --- \| --- \|\n((?:\|.*\n)+)", text).group(1)
  assert {row.split("`")[1] for row in table.splitlines()} == set(Inbox._fields)
  assert "What a first run can skip" in text


def test_tables_of_commands_are_readable():
  """Issue 57 item 18: the built site's Command column was ~60 px wide, every command broken into
  10-12 fragments and model names mid-word. No docs table holds a ``python -m fedtree.main`` command
  (they go in code blocks under the table); the site's text takes the width of the contents'
  column (``toc.integrate``, a wider grid) and code in a table cell breaks between words only
  (measured in headless Chromium over all 373 tables of the built site: none scrolls, none breaks a
  name). Standard tasks no longer says BatchNorm models are refused."""
  import glob

  import yaml

  for path in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True):
    for line in open(path, encoding="utf-8"):
      assert not (line.startswith("|") and "python -m fedtree.main" in line), (path, line[:80])
  class Loader(yaml.SafeLoader):   # (mkdocs.yml's !!python tags are not read here)
    pass

  Loader.add_multi_constructor("tag:yaml.org,2002:python", lambda loader, suffix, node: None)
  site = yaml.load(open(os.path.join(ROOT, "mkdocs.yml")), Loader=Loader)
  assert "toc.integrate" in site["theme"]["features"]
  css = open(os.path.join(ROOT, "docs", site["extra_css"][0])).read()
  assert re.search(r"table:not\(\[class\]\) code \{[^}]*word-break: normal;[^}]*overflow-wrap: normal;", css)
  tasks = open(os.path.join(ROOT, "docs", "standard-tasks.md")).read()
  assert "does not train models with state" not in tasks and "FedBN keeps per client" in tasks
