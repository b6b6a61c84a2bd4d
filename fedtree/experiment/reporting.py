"""Metric reporting: a live progress bar, JSON lines and TensorBoard events in the workdir, a
final summary table.

TensorBoard events are written (under ``<workdir>/tensorboard/<run>``) when ``tensorboardX``
is installed (``pip install -e ".[tensorboard]"``); everything else needs nothing extra.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, NamedTuple

import numpy as np


class _Discard:
  """A text stream that drops what is written to it."""

  def write(self, text: str) -> int:
    return len(text)

  def flush(self) -> None:
    pass


_DISCARD = _Discard()


class Reporter:
  """Writes every logged metric dict to ``workdir/metrics.jsonl`` and shows progress.

  One line per report: ``{"run": label, "round": r, ...metrics}``. The file is idempotent by
  (run, round): :meth:`start_run` drops the rows of that run after the round it starts from
  (rows logged after the last checkpoint of a killed run), and TensorBoard purges its events
  there too, so a resumed run leaves exactly the rows of an uninterrupted one. Results
  (tables) go to ``out`` (stdout), progress and messages to ``stream`` (stderr).
  """

  def __init__(self, workdir: str | None, *, show_progress: bool = True, stream=None, out=None):
    self._stream = stream or sys.stderr
    self._out = out or sys.stdout
    self.workdir = workdir
    self._path = os.path.join(workdir, "metrics.jsonl") if workdir else None
    self._file = open(self._path, "a") if self._path else None
    self._show = show_progress
    self._bar = None
    self._last_round = 0
    self._tb: dict[str, Any] = {}
    self._purge: dict[str, int] = {}

  @classmethod
  def silent(cls) -> Reporter:
    """A reporter that writes and prints nothing (the processes other than 0 of a
    multi-process run, whose rows and tables process 0 reports)."""
    return cls(None, show_progress=False, stream=_DISCARD, out=_DISCARD)

  def start_run(self, label: str, total_rounds: int, from_round: int = 0) -> None:
    """A run starts (or resumes) at ``from_round``: its rows after that round are dropped."""
    self._drop_rows(label, from_round)
    self._purge[label] = int(from_round) + 1
    self._last_round = int(from_round)
    if self._show:
      from tqdm.auto import tqdm

      self._bar = tqdm(total=total_rounds, initial=int(from_round), desc=label, unit="round",
                       file=self._stream, dynamic_ncols=True, leave=True)

  def _drop_rows(self, label: str, after: int) -> None:
    if self._path is None or not os.path.exists(self._path):
      return
    self._file.close()
    kept, dropped = [], 0
    with open(self._path) as f:
      for line in f:
        try:
          row = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill
          dropped += 1
          continue
        if row.get("run") == label and int(row.get("round", 0)) > after:
          dropped += 1
          continue
        kept.append(line if line.endswith("\n") else line + "\n")
    if dropped:
      tmp = self._path + ".tmp"
      with open(tmp, "w") as f:
        f.writelines(kept)
      os.replace(tmp, self._path)
    self._file = open(self._path, "a")

  def row(self, label: str, round_: int, match: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The last ``metrics.jsonl`` row of run ``label`` at ``round_`` whose fields include
    ``match`` (e.g. ``{"experiment": 3}``: one experiment of a sweep), ``None`` without a workdir
    or such a row: where a resumed run's cumulative counts continue from."""
    found = None
    for row in self._rows(label, match):
      if int(row.get("round", -1)) == int(round_):
        found = row
    return found

  def first_round(self, label: str, key: str, at_least: float, upto: int,
                  match: dict[str, Any] | None = None) -> int | None:
    """The first round ``<= upto`` at which a ``metrics.jsonl`` row of run ``label`` (whose fields
    include ``match``) has ``key >= at_least``; ``None`` without a workdir or such a row: where a
    resumed run's rounds to a target accuracy continue from."""
    found = None
    for row in self._rows(label, match):
      r, v = int(row.get("round", -1)), row.get(key)
      if r <= int(upto) and isinstance(v, (int, float)) and v >= at_least:
        found = r if found is None else min(found, r)
    return found

  def rows(self, label: str) -> list[dict[str, Any]]:
    """Every ``metrics.jsonl`` row of run ``label``, in order (none without a workdir)."""
    return list(self._rows(label, None))

  def _rows(self, label: str, match: dict[str, Any] | None):
    """The ``metrics.jsonl`` rows of run ``label`` whose fields include ``match``, in order (lines
    that do not parse skipped; none without a workdir)."""
    if self._path is None or not os.path.exists(self._path):
      return
    with open(self._path) as f:
      for line in f:
        try:
          row = json.loads(line)
        except json.JSONDecodeError:
          continue
        if row.get("run") == label and all(row.get(k) == v for k, v in (match or {}).items()):
          yield row

  def log(self, label: str, round_: int, metrics: dict[str, Any], *, tensorboard_run: str | None = None
          ) -> None:
    """One ``metrics.jsonl`` row of run ``label`` (integers stay integers) and its TensorBoard
    scalars, under ``tensorboard/<tensorboard_run>`` (default ``label``; a sweep gives every
    experiment its own, ``<label>/<setting>/seed<s>``, so their curves do not collide)."""
    record = {"run": label, "round": int(round_)}
    record.update({k: _scalar(v) for k, v in metrics.items()})
    if self._file:
      self._file.write(json.dumps(record) + "\n")
      self._file.flush()
    writer = self._tensorboard(tensorboard_run or label, label)
    if writer is not None:
      for k, v in record.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in TENSORBOARD_SKIP:
          writer.add_scalar(k, v, int(round_))
      writer.flush()
    if self._bar is not None:
      self._bar.update(max(0, int(round_) - self._last_round))
      shown = {k: f"{v:.4g}" for k, v in record.items()
               if k in ("train_loss",) or k.endswith("/accuracy")}
      self._bar.set_postfix(shown, refresh=True)
    self._last_round = int(round_)

  def end_run(self, label: str) -> None:
    if self._bar is not None:
      self._bar.close()
      self._bar = None

  def print(self, text: str) -> None:
    """A message (stderr)."""
    print(text, file=self._stream, flush=True)

  def result(self, text: str) -> None:
    """A result (stdout): tables, reports."""
    print(text, file=self._out, flush=True)

  def write_files(self, files: dict[str, str | bytes]) -> None:
    """Writes ``{name: content}`` into the workdir (nothing without one)."""
    if not self.workdir:
      return
    for name, content in files.items():
      path = os.path.join(self.workdir, name)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "wb" if isinstance(content, bytes) else "w") as f:
        f.write(content)

  def summary_table(self, results: dict[str, dict[str, dict[str, Any]]], groups=None,
                    group_names=None) -> str:
    """A table with one row per (run, model): overall and mean-per-client accuracy, loss, and
    accuracy per group (:func:`format_summary`)."""
    text = format_summary(results, group_names)
    self.result(text)
    return text

  def _tensorboard(self, name: str, label: str):
    """The writer of TensorBoard run ``name`` (a folder), purged after where run ``label`` resumed."""
    if not self.workdir:
      return None
    if name not in self._tb:
      try:
        SummaryWriter = _summary_writer()
      except ImportError:
        self._tb[name] = None
      else:
        self._tb[name] = SummaryWriter(os.path.join(self.workdir, "tensorboard", *name.split("/")),
                                       purge_step=self._purge.get(label))
    return self._tb[name]

  def close(self) -> None:
    for w in self._tb.values():
      if w is not None:
        w.close()
    self._tb = {}
    if self._file:
      self._file.close()
      self._file = None


TENSORBOARD_SKIP = ("run", "round", "seed", "experiment")
"""Row fields that identify a row rather than measure it: not TensorBoard scalars."""


def _summary_writer():
  """``tensorboardX.SummaryWriter``, imported without PyTorch: tensorboardX imports ``torch`` where it
  is installed only to accept its tensors, which fedtree never passes, and that import costs a run
  about 1.5 s and 190 MiB of resident memory (measured with torch 2.13 on CPU). Where torch is already
  imported nothing changes."""
  if "tensorboardX.writer" in sys.modules or "torch" in sys.modules:
    from tensorboardX import SummaryWriter

    return SummaryWriter
  sys.modules["torch"] = None   # type: ignore[assignment]  # ``import torch`` raises ImportError meanwhile
  try:
    from tensorboardX import SummaryWriter

    return SummaryWriter
  finally:
    del sys.modules["torch"]


def _scalar(v):
  if isinstance(v, dict):  # a sweep's setting
    return {str(k): _scalar(x) for k, x in v.items()}
  if isinstance(v, (bool, np.bool_)):
    return bool(v)
  v = np.asarray(v)
  if v.ndim == 0 and v.dtype.kind in "iu":
    return int(v)
  if v.ndim == 0:
    f = float(v)
    return f if math.isfinite(f) else None
  return v.tolist()


AP_COLUMNS = {"macro_ap": "macro AP", "micro_ap": "micro AP", "central_macro_ap": "central macro AP",
              "central_micro_ap": "central micro AP"}
"""A multi-label model's averaged precisions and their column headers in the final table."""


class _Columns(NamedTuple):
  """The optional columns of the final table: each shown when some model's summary reports it."""

  num_groups: int           # accuracy per group: one column per group
  ppl: bool                 # perplexity (token level)
  sent: bool                # perplexity (sentence level)
  central: bool             # accuracy on the central test split
  topk: list[str]           # ``top{k}_accuracy`` fields, sorted
  ap: list[str]             # a multi-label model's averaged precisions (macro, micro; central ones)
  clustered: bool           # intra-/inter-cluster accuracy and the number of clusters
  ari: bool                 # adjusted Rand index
  kws: bool                 # false-accept and false-reject rates
  eps: bool                 # the privacy spent
  asr: bool                 # a backdoor's attack success rate
  traffic: bool             # megabytes up and down
  peak: bool                # the busiest edge's megabytes in (a moving membership)
  fair: bool                # per-client percentiles and Gini coefficient
  target: float | None      # the target accuracy whose first round is reported
  hours: bool               # and the simulated hours then (a run with a systems clock)


def _columns(results: dict[str, dict[str, dict[str, Any]]]) -> _Columns:
  summaries = [s for models in results.values() for s in models.values()]

  def has(key: str) -> bool:
    return any(key in s for s in summaries)

  return _Columns(
    num_groups=max((len(s["group_accuracy"]) for s in summaries if "group_accuracy" in s), default=0),
    ppl=has("perplexity"), sent=has("sentence_perplexity"), central=has("central_accuracy"),
    topk=sorted({k for s in summaries for k in s if k.startswith("top") and k.endswith("_accuracy")}),
    ap=[k for k in AP_COLUMNS if has(k)],
    clustered=has("intra_cluster_accuracy"), ari=has("adjusted_rand_index"), kws=has("false_accept_rate"),
    eps=has("epsilon"), asr=has("attack_success_rate"), traffic=has("uplink_MB"),
    peak=has("edge_peak_uplink_MB"), fair=has("fairness"),
    target=(target := next((s["target_accuracy"] for s in summaries if s.get("target_accuracy") is not None),
                           None)),
    hours=target is not None and has("hours_to_target"))


def _header(c: _Columns, group_names) -> list[str]:
  header = ["run", "model", "accuracy", "client mean", "loss"]
  header += ["ppl"] if c.ppl else []
  header += ["sent ppl"] if c.sent else []
  header += ["central"] if c.central else []
  header += [k.removesuffix("_accuracy") for k in c.topk]
  header += [AP_COLUMNS[k] for k in c.ap]
  header += ["intra", "inter", "clusters"] if c.clustered else []
  header += ["ARI"] if c.ari else []
  header += ["FA %", "FR %"] if c.kws else []
  header += ["ε"] if c.eps else []
  header += ["ASR"] if c.asr else []
  header += ["up MB", "down MB"] if c.traffic else []
  header += ["peak edge MB"] if c.peak else []
  header += ["clients p10/p50/p90 gini"] if c.fair else []
  header += [f"rounds to {c.target:g}"] if c.target is not None else []
  header += [f"hours to {c.target:g}"] if c.hours else []
  return header + group_headers(c.num_groups, group_names)


def _row(label: str, name: str, s: dict[str, Any], c: _Columns) -> list[str]:
  """The cells of one model's row (those of the groups it has no accuracy for left out)."""
  row = [label, name, f"{s.get('accuracy', float('nan')):.4f}",
         f"{s.get('client_mean_accuracy', float('nan')):.4f}", f"{s.get('loss', float('nan')):.4f}"]
  row += [f"{s.get('perplexity', float('nan')):.2f}"] if c.ppl else []
  row += [f"{s.get('sentence_perplexity', float('nan')):.2f}"] if c.sent else []
  row += [f"{s['central_accuracy']:.4f}" if "central_accuracy" in s else ""] if c.central else []
  row += [f"{s[k]:.4f}" if k in s else "" for k in c.topk]
  row += [f"{s[k]:.4f}" if k in s else "" for k in c.ap]
  if c.clustered:
    row += ([f"{s['intra_cluster_accuracy']:.4f}", f"{s['inter_cluster_accuracy']:.4f}",
             str(s["num_clusters"])] if "intra_cluster_accuracy" in s else ["", "", ""])
  if c.ari:
    row += [f"{s['adjusted_rand_index']:.3f}" if "adjusted_rand_index" in s else ""]
  if c.kws:
    row += [f"{100 * s.get('false_accept_rate', float('nan')):.2f}",
            f"{100 * s.get('false_reject_rate', float('nan')):.2f}"]
  if c.eps:
    row += [f"{s['epsilon']:.3f}" if "epsilon" in s else ""]
  if c.asr:
    row += [f"{s['attack_success_rate']:.4f}" if "attack_success_rate" in s else ""]
  if c.traffic:
    row += [f"{s['uplink_MB']:.3f}", f"{s['downlink_MB']:.3f}"] if "uplink_MB" in s else ["", ""]
  if c.peak:
    row += [f"{s['edge_peak_uplink_MB']:.3f}" if "edge_peak_uplink_MB" in s else ""]
  if c.fair:
    row += [fairness_cell(s["fairness"]) if "fairness" in s else ""]
  if c.target is not None:
    reached = s.get("rounds_to_target")
    row += [str(reached) if reached is not None else ("-" if "accuracy" in s else "")]
  if c.hours:
    h = s.get("hours_to_target")
    row += [f"{h:.2f}" if h is not None else ("-" if "hours_to_target" in s else "")]
  ga = s.get("group_accuracy")
  return row + ([f"{a:.3f}" for a in ga] if ga is not None else [])


_LEGENDS = (   # (a column of _Columns, what the title says of it when the table shows it), in order
  ("num_groups", "a group's column = accuracy on that group"),
  ("ppl", "ppl / sent ppl = perplexity at token / sentence level"),
  ("central", "central = accuracy on the central test split (global models)"),
  ("topk", "topK = top-K accuracy"),
  ("ap", "AP = averaged precision of a multi-label model, macro (mean over labels) or micro (every label "
         "pooled); accuracy and loss = means over labels"),
  ("clustered", "intra/inter = intra-/inter-cluster accuracy"),
  ("ari", "ARI = adjusted Rand index against the true clusters"),
  ("kws", "FA / FR = false-accept / false-reject rate in %"),
  ("asr", "ASR = the backdoor's attack success rate on triggered test data"),
  ("peak", "peak edge MB = what the busiest edge of every round took in from its clients, summed (a moving "
           "membership)"),
  ("eps", "ε = user-level privacy spent at the run's δ, replace-one adjacency with fixed-size cohorts "
          "(about twice the add/remove ε of Opacus at the same noise multiplier), add/remove with Poisson "
          "sampling or privacy.adjacency='add_remove'"),
  ("fair", "clients = 10th/50th/90th percentile and Gini coefficient of per-client accuracy (perplexity for "
           "a language model)"),
)


def _title(c: _Columns) -> str:
  parts = [legend for column, legend in _LEGENDS if getattr(c, column)]
  if c.target is not None:
    parts.append(f"rounds to {c.target:g} = the first evaluation round whose accuracy reached {c.target:g} "
                 f"(- never)")
    if c.hours:
      parts.append(f"hours to {c.target:g} = the simulated hours at that round (systems)")
  return "Final evaluation (test data of every client" + "".join(f"; {p}" for p in parts) + ")"


def format_summary(results: dict[str, dict[str, dict[str, Any]]], group_names=None) -> str:
  """The final table: a row per (run, model) that trained (a model whose ``trained`` is False
  is named below the table instead), a column per group (named by ``group_names``)."""
  columns = _columns(results)
  header = _header(columns, group_names)
  rows = [header]
  untrained = []
  for label, models in results.items():
    for name, s in models.items():
      if s.get("trained") is False:  # still the initial parameters: not a result
        untrained.append(f"{label} {name}")
        continue
      row = _row(label, name, s, columns)
      rows.append(row + [""] * (len(header) - len(row)))
  widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
  lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
  lines.insert(1, "  ".join("-" * w for w in widths))
  if untrained:
    lines.append(f"(left out, never trained within the run: its parameters are still the initial "
                 f"ones: {', '.join(untrained)})")
  return "\n".join(["", _title(columns)] + lines)


def group_headers(num_groups: int, group_names=None) -> list[str]:
  """The name of every group (``group_names``, e.g. the data's), else ``gN``."""
  if group_names is not None and len(group_names) == num_groups:
    return [str(n) for n in group_names]
  return [f"g{g}" for g in range(num_groups)]


def fairness_cell(d: dict[str, Any]) -> str:
  """The compact table cell of a :func:`fedtree.core.metrics.client_distribution`:
  ``p10/p50/p90 gini`` (perplexities with one decimal, accuracies with two)."""
  f = ".1f" if d.get("metric") == "perplexity" else ".2f"
  nums = [d.get(k) for k in ("p10", "p50", "p90", "gini")]
  if any(v is None or not math.isfinite(v) for v in nums):
    return "-"
  return f"{nums[0]:{f}}/{nums[1]:{f}}/{nums[2]:{f}} {nums[3]:.3f}"
