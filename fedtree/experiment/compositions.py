"""Every algorithm against every capability: the composition matrix, generated from the code.

A cell is one registered algorithm's smallest run (:data:`fedtree.experiment.registry.cases.SMALLEST`)
with one capability added (:data:`COLUMNS`: privacy at the clients' parents and at the clients, three
aggregator families, three attacks, three compressors, a systems policy, Poisson sampling, secure
aggregation, personal parameters, a model with state, LoRA adapters, the config's tree), on one small
problem (:func:`base_config`). :func:`probe` resolves it as the runner does before it trains anything
(:func:`fedtree.experiment.run.resolve`: the config's checks, every capability's section, the method's
declared refusals (:func:`fedtree.algorithms.host.cannot`), its factory's checks): the cell is ``None``
when the run is built, else the refusal, in the words the user would read. :func:`matrix` probes every
cell (about 45 s on one CPU core) and :func:`page` writes it as ``docs/compositions.md``, which
``python -m fedtree.experiment.compositions --write`` regenerates and ``--check`` compares; the tests
compare the page with the code and run the cells it says run (``tests/test_compositions.py``).
"""

from __future__ import annotations

import copy
import inspect
import pathlib
import re
import sys
from collections.abc import Callable, Mapping
from typing import NamedTuple

import ml_collections

from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.registry.cases import SMALLEST

PAGE = "docs/compositions.md"


class Column(NamedTuple):
  """One capability as a column: ``group`` and ``label`` head it, ``about`` says what it asks of the
  run, ``fields(name)`` the run fields it adds to algorithm ``name``'s smallest run."""

  group: str
  label: str
  about: str
  fields: Callable[[str], dict]


def _fixed(fields: dict) -> Callable[[str], dict]:
  return lambda name: copy.deepcopy(fields)


def _tree(name: str) -> dict:
  """The config's tree: already where the factory requires one (or has its own), else ``tree="config"``."""
  from fedtree.experiment.registry import SPECS

  spec = SPECS[name]
  topo = inspect.signature(spec.factory).parameters.get("topology")
  if spec.tree is not None or (topo is not None and topo.default is inspect.Parameter.empty):
    return {}
  return {"tree": "config"}


COLUMNS: Mapping[str, Column] = {
  "dp_central": Column("privacy", "central DP", "clipping at the clients, Gaussian noise at their parents "
                       "(user-level DP-FedAvg)",
                       _fixed(dict(weighting="uniform", privacy=dict(clip_norm=1.0, noise_multiplier=0.5)))),
  "dp_local": Column("privacy", "local DP", "clipping and Gaussian noise at every client",
                     _fixed(dict(weighting="uniform",
                                 privacy=dict(clip_norm=0.5, noise_multiplier=1.0, mechanism="local")))),
  "median": Column("robust aggregation", "median", "coordinate-wise median at the clients' parents",
                   _fixed(dict(aggregator=dict(name="median")))),
  "krum": Column("robust aggregation", "Krum", "selection by pairwise distances (Krum)",
                 _fixed(dict(aggregator=dict(name="krum", f=0)))),
  "norm_bound": Column("robust aggregation", "norm bound", "every update's norm bounded before the mean",
                       _fixed(dict(aggregator=dict(name="norm_bound", tau=1.0)))),
  "sign_flip": Column("attacks", "sign flip", "a quarter of the clients send their update reversed, "
                      "scaled",
                      _fixed(dict(attack=dict(name="sign_flip", scale=2.0, fraction=0.25)))),
  "label_flip": Column("attacks", "label flip", "a quarter of the clients train on poisoned labels",
                       _fixed(dict(attack=dict(name="label_flip", target=1, fraction=0.25)))),
  "min_max": Column("attacks", "min-max", "an omniscient attack that reads every parent's whole cohort",
                    _fixed(dict(attack=dict(name="min_max", fraction=0.25)))),
  "qsgd": Column("compression", "QSGD", "the clients' updates quantized (4 bits)",
                 _fixed(dict(compression=dict(uplink=dict(name="qsgd", bits=4))))),
  "topk_ef": Column("compression", "top-k + EF", "top-k sparsification with error feedback (state per "
                    "client)", _fixed(dict(compression=dict(uplink=dict(name="topk", fraction=0.3,
                                                                         error_feedback=True))))),
  "downlink": Column("compression", "downlink", "the models sent down quantized (6 bits)",
                     _fixed(dict(compression=dict(downlink=dict(name="qsgd", bits=6))))),
  "deadline": Column("systems", "deadline", "device speeds and a round deadline with partial work",
                     _fixed(dict(systems=dict(speed=dict(dist="lognormal", median=2.0, sigma=0.5),
                                              policy=dict(kind="deadline", seconds=2.0, partial=True))))),
  "poisson": Column("sampling", "Poisson", "every client joins a round with probability q",
                    _fixed(dict(sampling="poisson", poisson_q=0.6, cohort_size=None))),
  "secure": Column("secure aggregation", "SecAgg", "the clients' updates summed modulo 2^b (SecAgg)",
                   _fixed(dict(secure=dict(mechanism="none")))),
  "personal": Column("model", "personal", "the last layer personal to every client",
                     _fixed(dict(personal=dict(patterns=["Dense_1"])))),
  "batchnorm": Column("model", "BatchNorm", "a model with state (BatchNorm statistics)",
                      _fixed(dict(model=dict(norm="batch")))),
  "lora": Column("model", "LoRA", "LoRA adapters on a frozen base", _fixed(dict(adapters=dict(rank=2)))),
  "tree": Column("tree", "tree", "the config's tree (two edges under a root)", _tree),
}
"""The capability columns, in the page's order (a key names a column in tests and ``--cells``)."""


def base_config() -> ml_collections.ConfigDict:
  """The problem every cell runs on: 8 synthetic clients in two groups (the config's tree: a root
  over two edges), 3 classes, an MLP of one hidden layer of 5 units, two rounds of two local steps."""
  return declare_runner_fields(ml_collections.ConfigDict(dict(
    seed=0, rounds=2, eval_every=1, rounds_per_call=1, progress=False, plots=False,
    data=dict(name="grouped_synthetic", group_sizes=(4, 4), dim=6, num_classes=3,
              mean_examples=8, min_examples=4, max_examples=12, test_examples=4),
    topology=dict(kind="groups"), model=dict(name="mlp", hidden=(5,)),
    local=dict(optimizer="sgd", learning_rate=0.05, batch_size=4, steps=2),
    runs={},
  )))


def cell_config(name: str, column: str) -> ml_collections.ConfigDict:
  """:func:`base_config` with one run ``"cell"``: algorithm ``name``'s smallest run and ``column``'s
  fields (a section the run already has is updated, not replaced)."""
  if name not in SMALLEST:
    raise ValueError(f"algorithm={name!r} has no smallest run; choose one of {sorted(SMALLEST)}")
  if column not in COLUMNS:
    raise ValueError(f"column={column!r}; choose one of {list(COLUMNS)}")
  run = {"algorithm": name, "chunk_size": 2, **copy.deepcopy(SMALLEST[name])}
  for key, value in COLUMNS[column].fields(name).items():
    run[key] = {**run[key], **value} if isinstance(value, dict) and isinstance(run.get(key), dict) else value
  config = base_config()
  config.runs = ml_collections.ConfigDict({"cell": run})
  return config


def probe(name: str, column: str):
  """``(None, run)`` when algorithm ``name`` is built with ``column``'s capability, else ``(refusal,
  None)``: the ``ValueError`` the user would read, checked as the runner checks a run before training.
  ``run``: the resolved :class:`fedtree.experiment.run.Run`, ready to train."""
  from fedtree.experiment import runner
  from fedtree.experiment.run import resolve

  try:
    config = runner.prepare_config(cell_config(name, column))
    runner.validate_config(config)
    ctx = runner.make_context(config)
    return None, resolve("cell", config.runs.cell, ctx)
  except ValueError as e:
    return str(e), None


_PREFIX = re.compile(r"^config\.runs\.cell(?: \(algorithm='[^']*'\))?: ")


def reason(name: str, refusal: str) -> str:
  """A refusal as the page states it: without the run's label, the method's name or the list of
  allowed fields (a capability the algorithm does not take reads "takes no ... section")."""
  text = _PREFIX.sub("", refusal)
  section = re.match(r"unknown field '(\w+)': algorithm '[^']*' cannot run a '\w+' section", text)
  if section:
    return f"takes no {section.group(1)!r} section"
  field = re.match(r"unknown field '(\w+)'(?: \(did you mean '\w+'\?\))?; allowed fields", text)
  if field:
    return f"takes no {field.group(1)!r} field"
  for prefix in (f"{name}: ", f"{name}/global: ", f"{name} "):
    if text.startswith(prefix):
      text = text[len(prefix):]
      break
  return text


def matrix(names=None, columns=None, *, progress=None) -> dict[tuple[str, str], str | None]:
  """``{(algorithm, column): None | reason}`` for every registered algorithm (or ``names``) and every
  column (or ``columns``); ``progress(done, total)`` after each cell."""
  from fedtree.experiment.registry import SPECS

  names = sorted(SPECS) if names is None else list(names)
  columns = list(COLUMNS) if columns is None else list(columns)
  out: dict[tuple[str, str], str | None] = {}
  for name in names:
    for column in columns:
      refusal, _ = probe(name, column)
      out[name, column] = None if refusal is None else reason(name, refusal)
      if progress is not None:
        progress(len(out), len(names) * len(columns))
  return out


YES, REFUSED, NOT_TAKEN = "✓", "✗", "·"


def symbol(cell: str | None) -> str:
  """✓ built, · the algorithm takes no such section or field, ✗ refused (the reason under the table)."""
  if cell is None:
    return YES
  return NOT_TAKEN if cell.startswith("takes no ") else REFUSED


def page(cells: Mapping[tuple[str, str], str | None]) -> str:
  """The markdown of ``docs/compositions.md``: the matrix and, per column, every refusal's reason
  with the algorithms it names."""
  names = sorted({n for n, _ in cells})
  columns = [c for c in COLUMNS if any((n, c) in cells for n in names)]
  yes = sum(v is None for v in cells.values())
  lines = [
    "# What composes with what",
    "",
    "<!-- generated by `python -m fedtree.experiment.compositions --write`; do not edit -->",
    "",
    "Every registered algorithm against every capability of the toolbox: **✓** the run is built "
    "(every check the runner makes before it trains passed), **✗** the method refuses the "
    "composition (the reason, word for word, is listed under the table), **·** the algorithm takes "
    "no such section or field. Each cell is the algorithm's smallest run with one capability "
    "added, on 8 synthetic clients under two edges (`fedtree.experiment.compositions`); the tests "
    "probe every cell against this page and train a seeded sample of the ✓ cells to a finite "
    f"state. **{yes} of {len(cells)}** cells are ✓.",
    "",
    "| column | what it adds to the run |",
    "|---|---|",
  ]
  lines += [f"| {COLUMNS[c].label} | {COLUMNS[c].about} |" for c in columns]
  lines += ["", "| algorithm | " + " | ".join(COLUMNS[c].label for c in columns) + " |",
            "|---|" + "|".join(":-:" for _ in columns) + "|"]
  lines += [f"| `{n}` | " + " | ".join(symbol(cells[n, c]) for c in columns) + " |" for n in names]
  lines += ["", "## Why not", ""]
  for c in columns:
    refused: dict[str, list[str]] = {}
    for n in names:
      cell = cells[n, c]
      if cell is not None and not cell.startswith("takes no "):
        refused.setdefault(cell, []).append(n)
    if not refused:
      continue
    lines += [f"### {COLUMNS[c].label} ({COLUMNS[c].group})", ""]
    for text, who in sorted(refused.items(), key=lambda kv: kv[1]):
      lines.append("- " + ", ".join(f"`{n}`" for n in who) + ": " + text.replace("|", "\\|"))
    lines.append("")
  return "\n".join(lines).rstrip() + "\n"


def read_page(text: str) -> dict[tuple[str, str], str]:
  """``{(algorithm, column): symbol}`` of a page's table (:func:`page`'s)."""
  by_label = {col.label: key for key, col in COLUMNS.items()}
  rows = [line for line in text.splitlines() if line.startswith("| algorithm |") or line.startswith("| `")]
  head = [h.strip() for h in rows[0].strip("|").split("|")][1:]
  out = {}
  for line in rows[1:]:
    parts = [p.strip() for p in line.strip("|").split("|")]
    name = parts[0].strip("`")
    for label, mark in zip(head, parts[1:], strict=True):
      out[name, by_label[label]] = mark
  return out


def main(argv: list[str]) -> int:
  """``--write``: probe every cell and write :data:`PAGE`; ``--check``: probe and compare (exit 1 on a
  difference, naming the cells); ``--cells=name:column,...``: print those cells' verdicts."""
  args = argv[1:]
  cells_arg = [a.split("=", 1)[1] for a in args if a.startswith("--cells=")]
  if cells_arg:
    for item in cells_arg[0].split(","):
      name, _, column = item.partition(":")
      refusal, _ = probe(name, column)
      print(f"{name}:{column}: {'yes' if refusal is None else refusal}")
    return 0
  if not {"--write", "--check"} & set(args):
    print("usage: python -m fedtree.experiment.compositions --write | --check | --cells=name:column,...")
    return 2
  path = pathlib.Path(PAGE)

  def progress(done, total):
    if done % 50 == 0 or done == total:
      print(f"  {done}/{total} cells", file=sys.stderr)

  cells = matrix(progress=progress)
  text = page(cells)
  if "--write" in args:
    path.write_text(text)
    print(f"wrote {path}: {sum(v is None for v in cells.values())} of {len(cells)} cells ✓")
    return 0
  old = path.read_text() if path.exists() else ""
  if old == text:
    print(f"{path} is up to date")
    return 0
  before, after = read_page(old) if old else {}, read_page(text)
  moved = sorted(k for k in after if before.get(k) != after[k])
  print(f"{path} differs from the code at {len(moved)} cells: "
        + ", ".join(f"{n}:{c} {before.get((n, c), '?')}->{after[n, c]}" for n, c in moved[:20])
        + ("" if moved else " (the reasons' text)"))
  return 1


if __name__ == "__main__":
  sys.exit(main(sys.argv))
