"""The workdir of a config's runs: what it holds, the fingerprint that refuses another config's
runs in it, and what is written at the end (``summary.json``, the pictures)."""

from __future__ import annotations

import json
import os
from typing import Any

import jax.numpy as jnp
import ml_collections
import numpy as np

from fedtree.experiment.fields import LOCAL_FIELDS, RUNNER_FIELDS, field
from fedtree.experiment.reporting import Reporter

PLOT_EXTRA = 'pip install -e ".[plot]"'
"""What installs the optional plotting library (matplotlib)."""


def write_plots(workdir: str, config: ml_collections.ConfigDict, reporter: Reporter) -> None:
  """The run's pictures (``plot_*.png``, :func:`fedtree.experiment.plots.write_run_plots`) in
  ``workdir``, after the results are written; skipped with one line naming the extra to install
  when matplotlib is absent (or cannot be imported), and when ``config.plots`` is False."""
  import importlib.util

  if not field(config, "plots"):
    return
  missing = f"note: matplotlib is not installed, so no plot_*.png ({PLOT_EXTRA})"
  if importlib.util.find_spec("matplotlib") is None:
    reporter.print(missing)
    return
  from fedtree.experiment.plots import write_run_plots

  try:
    written = write_run_plots(workdir)
  except ImportError as e:   # a broken install: the results are written, the pictures are not
    reporter.print(f"{missing}: {e}")
    return
  if written:
    reporter.print("plots: " + ", ".join(os.path.abspath(p) for p in written))


def workdir_listing(workdir: str) -> str:
  """What ``workdir`` holds, one full path a line (folders with a trailing ``/``): the results
  of every run of the config, its metrics, summaries, reports, plots, checkpoints."""
  root = os.path.abspath(workdir)
  names = sorted(os.listdir(root))
  lines = [f"fedtree: the workdir {root} holds:"]
  for name in names:
    if name.endswith(".tmp"):
      continue
    path = os.path.join(root, name)
    lines.append(f"  {path}{'/' if os.path.isdir(path) else ''}")
  return "\n".join(lines)


FINGERPRINT_IGNORES = ("rounds", "progress", "checkpoint_every", "keep_checkpoints", "eval_chunk_size",
                       "rounds_per_call", "run_order", "plots", "memory_limit_bytes", "mesh_shape",
                       "only", "divergence_bound", "target_accuracy", "without_data",
                       "communication_budget_MB")
"""Top-level config fields that do not change a run's results (left out of its fingerprint)."""


def config_fingerprint(config: ml_collections.ConfigDict) -> str:
  """A hash of everything in ``config`` that changes results."""
  import hashlib

  d = json.loads(config.to_json_best_effort(sort_keys=True))
  for k in FINGERPRINT_IGNORES:
    d.pop(k, None)
  return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


WORKDIR_OUTPUTS = ("metrics.jsonl", "summary.json", "checkpoints", "tensorboard", "fingerprint.json")


def prepare_workdir(workdir: str, config: ml_collections.ConfigDict, *, overwrite: bool) -> None:
  """Creates ``workdir``, refuses one that holds a different config's run (unless
  ``overwrite``: its outputs are removed), and records the config and its fingerprint:
  :func:`check_workdir`, then :func:`write_workdir`."""
  check_workdir(workdir, config, overwrite=overwrite)
  write_workdir(workdir, config, overwrite=overwrite)


def check_workdir(workdir: str, config: ml_collections.ConfigDict, *, overwrite: bool) -> None:
  """Raises ``ValueError`` for a ``workdir`` that is a file, or that holds a run of a different
  config (its ``fingerprint.json``) unless ``overwrite``. Reads only."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f"--workdir={workdir} is a file, not a folder")
  path = os.path.join(workdir, "fingerprint.json")
  new = config_fingerprint(config)
  old = None
  if os.path.exists(path):
    try:
      with open(path) as f:
        old = json.load(f).get("fingerprint")
    except (OSError, ValueError):
      old = "unreadable"
  if old is not None and old != new and not overwrite:
    keys = _difference_keys(workdir, config)
    if keys == []:  # the same config, fingerprinted before a runner field was added: resumable
      return
    raise ValueError(
      f"--workdir={workdir} holds a run of a different config ({_describe(workdir, config, keys)}; "
      f"fingerprint {old}, this config {new}); resuming would mix the two. Use another "
      "--workdir, or --overwrite to delete its results and start fresh"
    )


def _flat(d, prefix="config") -> dict[str, Any]:
  if isinstance(d, dict):
    out = {}
    for k, v in d.items():
      out.update(_flat(v, f"{prefix}.{k}"))
    return out
  return {prefix: d}


ABSENT = "<absent>"


def _runner_default(key: str):
  parts = key.split(".")
  if len(parts) == 2 and parts[1] in RUNNER_FIELDS:
    return RUNNER_FIELDS[parts[1]][1]
  if len(parts) == 3 and parts[1] == "local" and parts[2] in LOCAL_FIELDS:
    return LOCAL_FIELDS[parts[2]][1]
  return ABSENT


def _same(key: str, a, b) -> bool:
  """``a`` (the workdir's ``config.json``) and ``b`` (this config) at ``key`` are the same
  setting: equal (1 and 1.0 alike, not True and 1), absent and None, or absent and the default
  of a runner field added since (:mod:`fedtree.experiment.fields`)."""
  if a == b and isinstance(a, bool) == isinstance(b, bool):
    return True
  if {type(a), type(b)} <= {type(None), str} and {a, b} <= {None, ABSENT}:
    return True
  return a == ABSENT and b == _runner_default(key)


def _difference_keys(workdir: str, config: ml_collections.ConfigDict) -> list[str] | None:
  """The result-changing fields in which ``config`` differs from the workdir's ``config.json``
  (``None``: that file is missing or unreadable)."""
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      old = _flat(json.load(f))
  except (OSError, ValueError):
    return None
  new = _flat(json.loads(config.to_json_best_effort()))
  ignored = {f"config.{k}" for k in FINGERPRINT_IGNORES}
  return sorted(k for k in set(old) | set(new)
                if not _same(k, old.get(k, ABSENT), new.get(k, ABSENT))
                and not any(k == i or k.startswith(i + ".") for i in ignored))


def _describe(workdir: str, config: ml_collections.ConfigDict, keys: list[str] | None) -> str:
  """``keys`` as ``run 'hierfavg': config.runs.hierfavg.periods is [10] there, [3] here; ...``."""
  if keys is None:
    return "its config.json is missing or unreadable"
  if not keys:
    return "see its config.json"
  with open(os.path.join(workdir, "config.json")) as f:
    old = _flat(json.load(f))
  new = _flat(json.loads(config.to_json_best_effort()))
  parts = []
  for k in keys[:3]:
    run = k.split(".")[2] if k.startswith("config.runs.") else None
    where = f"run {run!r}: " if run else ""
    parts.append(f"{where}{k} is {old.get(k, ABSENT)!r} there, {new.get(k, ABSENT)!r} here")
  more = f" and {len(keys) - 3} more fields" if len(keys) > 3 else ""
  return "; ".join(parts) + more


def write_workdir(workdir: str, config: ml_collections.ConfigDict, *, overwrite: bool) -> None:
  """Creates ``workdir`` (removing its outputs first when ``overwrite``) and writes the
  config and its fingerprint."""
  import shutil

  os.makedirs(workdir, exist_ok=True)
  if overwrite:
    for name in WORKDIR_OUTPUTS:
      p = os.path.join(workdir, name)
      if os.path.isdir(p):
        shutil.rmtree(p)
      elif os.path.exists(p):
        os.remove(p)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
  with open(os.path.join(workdir, "fingerprint.json"), "w") as f:
    json.dump({"fingerprint": config_fingerprint(config), "ignored_fields": list(FINGERPRINT_IGNORES)}, f)


def _jsonable(obj):
  if isinstance(obj, dict):
    return {str(k): _jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_jsonable(v) for v in obj]
  if isinstance(obj, (np.ndarray, jnp.ndarray)):
    return _jsonable(np.asarray(obj).tolist())
  if isinstance(obj, (np.floating, float)):
    return None if not np.isfinite(obj) else float(obj)
  if isinstance(obj, np.integer):
    return int(obj)
  return obj



def write_summary(workdir: str, results: dict[str, Any]) -> None:
  """``summary.json``: every run's final summaries (written whole, then moved into place)."""
  tmp = os.path.join(workdir, "summary.json.tmp")
  with open(tmp, "w") as f:
    json.dump(_jsonable(results), f, indent=2)
  os.replace(tmp, os.path.join(workdir, "summary.json"))
