"""Adaptive search over a sweep's settings: random draws, successive halving, population-based
training, and what a study keeps.

``config.sweep`` (beside :mod:`fedtree.experiment.sweep`'s fields; all optional)::

  sweep.params = "local.learning_rate=loguniform(0.001,1);runs.fedprox.mu=uniform(0,1)"
  sweep.samples = 27          # random search: 27 settings drawn from the distributions
  sweep.sample_seed = 0       # the draw's seed (the same settings whatever else changes)
  sweep.rungs = "4,12"        # successive halving: at rounds 4 and 12 the worse settings stop
  sweep.halving_rate = 3      # ... keeping the best 1/3 (at least one) at every rung
  sweep.pbt_interval = 10     # population-based training: an exploit step every 10 rounds
  sweep.pbt_fraction = 0.25   # ... the bottom quarter copies the top quarter
  sweep.pbt_perturb = 0.2     # ... and scales each copied value by 0.8 or 1.2
  sweep.pbt_resample = 0.0    # ... or draws it anew with this probability

**Random search** (Bergstra & Bengio 2012): with ``samples > 0`` every swept path holds a
distribution, ``loguniform(a,b)`` (``0 < a < b``), ``uniform(a,b)`` (``a < b``) or
``choice(v1,v2,...)`` (a plain list is a choice), and ``samples`` settings are drawn from them,
path by path in sorted order, with ``numpy.random.default_rng(sample_seed)`` (:func:`draw`).

**Successive halving** (Jamieson & Talwalkar 2016; Li et al. 2018, Hyperband's inner loop): the
experiments train together as one program (:func:`fedtree.core.sweep.sweep`) up to the first rung;
there every setting is scored by the mean of ``sweep.select`` over its seeds, the best
``max(1, floor(n / halving_rate))`` go on and the others stop (:func:`survivors`); the experiment
axis is compacted to the survivors (:func:`fedtree.core.sweep.compact`), so the compute of the
stopped ones is reclaimed, and a survivor goes on with the computation it would have had among all
(its key, state and setting are its own; to float rounding, since XLA may order a narrower batch's
sums differently). The sweep table gives every setting the round it reached and its
metrics there; the client updates column (every client that trained and sent an update, summed
over rounds) is the study's cost. Hyperband's brackets are successive halving runs with different
rungs: ``sweep.hyperband_min_rounds`` runs them all (:func:`hyperband`, below).

**Hyperband** (Li et al. 2018): ``sweep.hyperband_min_rounds = r`` (with ``halving_rate`` η and the
distributions of ``sweep.params``) runs the brackets ``s = s_max .. 0`` one after another, each a
successive-halving study of ``ceil((s_max + 1)/(s + 1) η^s)`` settings of its own draws (seed
``sample_seed + s``) halved from ``r η^{s_max − s}`` rounds, under the run name ``<run>_bracket<s>``;
then one summary of every setting and the best of those that reached the last round.

**Population-based training** (Jaderberg et al. 2017): the experiments train together; every
``pbt_interval`` rounds (a multiple of ``eval_every``) they are ranked by ``sweep.select``, and each
of the bottom ``pbt_fraction`` copies the whole state (parameters, optimizer and algorithm state) of
one of the top as many, drawn at random, keeps its own key and explores the copied values
(:func:`exploit_sources`, :func:`explore`, :func:`fedtree.core.sweep.exploit`). The shapes do not
change, so the one compiled program runs the whole study. Each experiment's lineage (the round,
whom it copied, its new values) is in the summary and ``pbt_<run>.json``; the table has a row per
experiment with its final values. A run whose capabilities read the swept values on the host (a
privacy budget's accounting) is refused: its ε would no longer be the setting's.

A halving or PBT study with ``checkpoint_every`` keeps every boundary (the compacted or exploited
state and the driver's record) and checkpoints each stretch between them, so a stopped or killed
study resumes exactly (:mod:`fedtree.experiment.sweep_driver`).

**What a study keeps** (with a workdir): ``tuning_<run>.csv``, one row per (setting, seed,
evaluation round) with the setting's values, ``seed``, the fidelity ``round``, ``client_updates``
and every metric of the row (:func:`tabular`: the layout of FedHPO-Bench's tabular benchmarks, Wang
et al. 2022, with the metrics as columns rather than one packed ``result`` field), so a study can
be replayed without retraining; and ``best_<run>.py``, the best setting's config as a file that
runs as it is (:func:`best_config_text`): ``python -m fedtree.main --config=<workdir>/best_<run>.py``
(after PBT: the best experiment's final values, not its schedule, which ``pbt_<run>.json`` holds).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import pprint
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

DISTRIBUTIONS = ("loguniform", "uniform", "choice")
_CALL = re.compile(r"^\s*([a-z_]+)\s*\((.*)\)\s*$")


@dataclasses.dataclass(frozen=True)
class Distribution:
  """A swept path's distribution for random search.

  Attributes:
    kind: one of :data:`DISTRIBUTIONS`.
    args: ``(low, high)`` of ``loguniform``/``uniform``; the values of ``choice``.
  """

  kind: str
  args: tuple[float, ...]

  def check(self, path: str) -> None:
    """Raises ``ValueError`` naming ``path`` and the value when the bounds cannot be drawn from."""
    where = f"config.sweep.params[{path!r}]={self}"
    if self.kind not in DISTRIBUTIONS:
      raise ValueError(f"{where}: {self.kind!r} is not a distribution; choose one of {DISTRIBUTIONS}")
    if self.kind == "choice":
      if not self.args:
        raise ValueError(f"{where}: a choice needs at least one value")
      return
    if len(self.args) != 2:
      raise ValueError(f"{where}: {self.kind} takes two bounds (low, high); got {len(self.args)}")
    low, high = self.args
    if not low < high:
      raise ValueError(f"{where}: the low bound {low:g} must be below the high bound {high:g}")
    if self.kind == "loguniform" and low <= 0:
      raise ValueError(f"{where}: loguniform needs positive bounds (0 < low < high); got low={low:g}")

  def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` values drawn with ``rng``."""
    if self.kind == "choice":
      return np.asarray(self.args, np.float64)[rng.integers(0, len(self.args), n)]
    low, high = self.args
    if self.kind == "loguniform":
      return np.exp(rng.uniform(math.log(low), math.log(high), n))
    return rng.uniform(low, high, n)

  def __str__(self) -> str:
    return f"{self.kind}({','.join(f'{a:g}' for a in self.args)})"


def parse_distribution(text: str, path: str) -> Distribution | None:
  """``"loguniform(0.001,1)"`` -> its :class:`Distribution`; ``None`` when ``text`` is not a call
  (a plain list of values). Raises ``ValueError`` for an unknown name or a non-numeric argument."""
  m = _CALL.match(str(text))
  if m is None:
    return None
  kind, body = m.group(1), m.group(2)
  if kind not in DISTRIBUTIONS:
    raise ValueError(f"config.sweep.params[{path!r}]: {kind!r} is not a distribution; choose one of "
                     f"{DISTRIBUTIONS}")
  try:
    args = tuple(float(a) for a in body.split(",") if a.strip())
  except ValueError:
    raise ValueError(f"config.sweep.params[{path!r}]: {text!r} holds a non-numeric argument") from None
  return Distribution(kind, args)


def as_distribution(spec: Sequence[float] | Distribution) -> Distribution:
  """A swept path's values as a :class:`Distribution` (a list of values: a choice among them)."""
  return spec if isinstance(spec, Distribution) else Distribution("choice", tuple(float(v) for v in spec))


def draw(params: Mapping[str, Sequence[float] | Distribution], samples: int, seed: int
         ) -> list[dict[str, float]]:
  """``samples`` settings drawn from ``params`` (``{path: Distribution or list}``, a list a
  choice), path by path in sorted order with ``numpy.random.default_rng(seed)``: the same settings
  for the same paths, distributions, count and seed."""
  rng = np.random.default_rng(int(seed))
  values = {}
  for path in sorted(params):
    values[path] = as_distribution(params[path]).sample(rng, int(samples))
  return [{p: float(values[p][i]) for p in sorted(params)} for i in range(int(samples))]


# ------------------------------------------------------------------------ successive halving
class Halving(NamedTuple):
  """A successive-halving schedule.

  Attributes:
    rungs: the rounds at which settings stop, increasing, each before the run's last round.
    rate: at every rung the best ``max(1, floor(n / rate))`` of the ``n`` settings go on.
  """

  rungs: tuple[int, ...]
  rate: float

  def segments(self, rounds: int) -> list[int]:
    """The round each stretch of training ends at: the rungs, then ``rounds``."""
    return [*self.rungs, int(rounds)]


def parse_rungs(value) -> tuple[int, ...]:
  """``config.sweep.rungs`` (``"4,12"``, a tuple, or empty) as rounds; ``ValueError`` for anything
  but positive, increasing integers."""
  if value is None or (isinstance(value, str) and not value.strip()):
    return ()
  items = value.strip().strip("()[]").split(",") if isinstance(value, str) else list(value)
  try:
    rungs = [float(v) for v in items if str(v).strip()]
  except ValueError:
    raise ValueError(f"config.sweep.rungs={value!r}: give rounds as integers, e.g. '4,12'") from None
  if any(r != int(r) or r < 1 for r in rungs):
    raise ValueError(f"config.sweep.rungs={value!r}: every rung is a round >= 1 (an integer)")
  out = tuple(int(r) for r in rungs)
  if any(b <= a for a, b in zip(out, out[1:], strict=False)):
    raise ValueError(f"config.sweep.rungs={value!r}: the rungs must increase")
  return out


def halving_of(sw, rounds: int | None = None, label: str = "") -> Halving | None:
  """``config.sweep``'s successive-halving schedule (``None``: no rungs), checked: a halving rate
  below 2 and, given the run's ``rounds``, a rung at or past the run's last round are refused."""
  from fedtree.experiment.fields import sweep_field

  rungs = parse_rungs(sweep_field(sw, "rungs"))
  rate = sweep_field(sw, "halving_rate")
  try:
    rate = float(rate)
  except (TypeError, ValueError):
    raise ValueError(f"config.sweep.halving_rate={rate!r} is not a number; give a rate >= 2") from None
  if not rungs:
    return None
  if not rate >= 2:
    raise ValueError(f"config.sweep.halving_rate={rate:g}: a rate below 2 keeps more than half the settings "
                     f"at every rung; give a rate >= 2 (3 keeps the best third)")
  _before_last(f"rungs={','.join(map(str, rungs))}: rung {rungs[-1]}", rungs[-1], rounds, label,
               f"every rung must be in [1, {int(rounds or 2) - 1}]")
  return Halving(rungs, rate)


def _before_last(what: str, value: int, rounds: int | None, label: str, why: str) -> None:
  """``config.sweep.<what>`` refused when ``value`` is not before the run's last round ``rounds``."""
  if rounds is not None and int(value) >= int(rounds):
    run = f" of run {label!r}" if label else ""
    raise ValueError(f"config.sweep.{what} is not before the last round ({int(rounds)}){run}: {why}")


def ranked(scores: Sequence[float], *, lower_is_better: bool = False) -> list[int]:
  """The positions of ``scores``, best first (a NaN last; ties kept in order)."""
  sign = 1.0 if lower_is_better else -1.0
  return [i for _, i in sorted((math.inf if not np.isfinite(s) else sign * float(s), i)
                               for i, s in enumerate(scores))]


def survivors(scores: Sequence[float], rate: float, *, lower_is_better: bool = False) -> list[int]:
  """The positions of the settings that go on at a rung: the best ``max(1, floor(n / rate))`` of
  ``scores`` (:func:`ranked`), ascending."""
  keep = max(1, int(math.floor(len(scores) / float(rate))))
  return sorted(ranked(scores, lower_is_better=lower_is_better)[:keep])


# ------------------------------------------------------------------------ Hyperband
class Bracket(NamedTuple):
  """One bracket of Hyperband: ``settings`` drawn anew, halved at ``rungs`` by ``rate``.

  Attributes:
    s: the bracket's index (``s_max`` down to 0: the most settings and the earliest first rung first).
    settings: how many settings it draws.
    rungs: its successive-halving rungs (none for ``s = 0``: every setting to the last round).
  """

  s: int
  settings: int
  rungs: tuple[int, ...]


def hyperband(rounds: int, rate: float, min_rounds: int) -> list[Bracket]:
  """Hyperband's brackets (Li et al. 2018, Algorithm 1) with the resource in rounds:
  ``s_max = floor(log_rate(rounds / min_rounds))``; bracket ``s`` draws
  ``n = ceil((s_max + 1) / (s + 1) · rate^s)`` settings and halves them at
  ``r · rate^i`` rounds (``i < s``, ``r = rounds · rate^−s``), the survivors to ``rounds``."""
  s_max = int(math.floor(math.log(rounds / min_rounds) / math.log(rate) + 1e-9))
  out = []
  for s in range(s_max, -1, -1):
    n = int(math.ceil((s_max + 1) / (s + 1) * rate ** s - 1e-9))
    r = rounds * rate ** (-s)
    rungs = tuple(sorted({max(1, int(round(r * rate ** i))) for i in range(s)} - {int(rounds)}))
    out.append(Bracket(s, n, tuple(x for x in rungs if x < rounds)))
  return out


def hyperband_of(sw, rounds: int | None = None, label: str = "") -> list[Bracket] | None:
  """``config.sweep``'s Hyperband brackets (``None``: ``hyperband_min_rounds`` 0), checked: a minimum
  at or past the run's rounds, a rate below 2, and Hyperband beside rungs, PBT or ``samples`` (each
  bracket draws its own) are refused."""
  from fedtree.experiment.fields import sweep_field

  low = sweep_field(sw, "hyperband_min_rounds")
  if isinstance(low, bool) or not isinstance(low, (int, np.integer)) or low < 0:
    raise ValueError(f"config.sweep.hyperband_min_rounds={low!r} must be an int >= 0 (0: no Hyperband)")
  if not low:
    return None
  rate = float(sweep_field(sw, "halving_rate"))
  if not rate >= 2:
    raise ValueError(f"config.sweep.halving_rate={rate:g}: Hyperband's rate must be >= 2")
  for name in ("rungs", "pbt_interval", "samples"):
    if sweep_field(sw, name):
      raise ValueError(f"config.sweep.hyperband_min_rounds={low} sets every bracket's rungs and draws: leave "
                       f"config.sweep.{name} unset")
  _before_last(f"hyperband_min_rounds={low}", low, rounds, label,
               "Hyperband halves from the minimum up to the last round")
  return None if rounds is None else hyperband(int(rounds), rate, int(low))


def bracket_settings(params: Mapping[str, Any], paths: Sequence[str], brackets: Sequence[Bracket],
                     seed: int) -> list[list[dict[str, float]]]:
  """Every bracket's settings: ``bracket.settings`` drawn from ``params`` with seed ``seed + s``,
  each restricted to ``paths`` (a setting drawn twice within a bracket runs once)."""
  out = []
  for b in brackets:
    own: list[dict[str, float]] = []
    for setting in draw(params, b.settings, int(seed) + b.s):
      mine = {p: setting[p] for p in paths}
      if mine not in own:
        own.append(mine)
    out.append(own)
  return out


# ------------------------------------------------------------------------ population-based training
class PBT(NamedTuple):
  """A population-based training schedule (Jaderberg et al. 2017).

  Attributes:
    interval: rounds between exploit steps (a multiple of the evaluation cadence).
    fraction: the bottom ``fraction`` of the experiments copy one of the top ``fraction`` each.
    perturb: a copied value is multiplied by ``1 - perturb`` or ``1 + perturb`` (at random) ...
    resample: ... or, with this probability, drawn anew from its path's distribution or values.
  """

  interval: int
  fraction: float
  perturb: float
  resample: float

  def segments(self, rounds: int) -> list[int]:
    """The rounds of the exploit steps, then ``rounds``."""
    return [*range(self.interval, int(rounds), self.interval), int(rounds)]


def pbt_of(sw, rounds: int | None = None, eval_every: int | None = None, label: str = "") -> PBT | None:
  """``config.sweep``'s population-based training schedule (``None``: ``pbt_interval`` 0), checked:
  an interval that is not a multiple of ``eval_every`` (every exploit step reads a fresh evaluation)
  or not before the run's last round, a fraction outside (0, 0.5], a perturbation outside (0, 1), a
  resampling probability outside [0, 1], and PBT beside successive halving are refused."""
  from fedtree.experiment.fields import sweep_field

  interval = sweep_field(sw, "pbt_interval")
  if isinstance(interval, bool) or not isinstance(interval, (int, np.integer)) or interval < 0:
    raise ValueError(f"config.sweep.pbt_interval={interval!r} must be an int >= 0 (0: no PBT)")
  if not interval:
    return None
  fraction, perturb, resample = (float(sweep_field(sw, f"pbt_{k}"))
                                 for k in ("fraction", "perturb", "resample"))
  if not 0 < fraction <= 0.5:
    raise ValueError(f"config.sweep.pbt_fraction={fraction:g}: the bottom fraction that copies the top one "
                     f"must be in (0, 0.5]")
  if not 0 < perturb < 1:
    raise ValueError(f"config.sweep.pbt_perturb={perturb:g}: a copied value is scaled by 1 - perturb or "
                     f"1 + perturb; give a perturbation in (0, 1)")
  if not 0 <= resample <= 1:
    raise ValueError(f"config.sweep.pbt_resample={resample:g} is a probability: give it in [0, 1]")
  if parse_rungs(sweep_field(sw, "rungs")):
    raise ValueError("config.sweep.pbt_interval and config.sweep.rungs are two schedules: population-based "
                     "training or successive halving, not both")
  if eval_every is not None and interval % int(eval_every):
    raise ValueError(f"config.sweep.pbt_interval={interval} is not a multiple of config.eval_every="
                     f"{eval_every}: every exploit step ranks the experiments by an evaluation of that round")
  _before_last(f"pbt_interval={interval}", interval, rounds, label, "no exploit step would happen")
  return PBT(int(interval), fraction, perturb, resample)


def exploit_sources(scores: Sequence[float], fraction: float, rng: np.random.Generator, *,
                    lower_is_better: bool = False) -> list[int]:
  """Per experiment, whose state it goes on from: the bottom ``max(1, floor(n * fraction))`` by
  ``scores`` (a NaN at the bottom) each copy one of the top as many, drawn with ``rng``; the others
  themselves."""
  n = len(scores)
  k = max(1, int(math.floor(n * float(fraction))))
  order = ranked(scores, lower_is_better=lower_is_better)
  top, bottom = order[:k], order[n - k:]
  sources = list(range(n))
  for b in bottom:
    if b not in top:
      sources[b] = int(top[int(rng.integers(0, len(top)))])
  return sources


def explore(setting: Mapping[str, float], params: Mapping[str, Any], pbt: PBT,
            rng: np.random.Generator) -> dict[str, float]:
  """A copied ``setting`` explored: every value resampled from its path's distribution or listed
  values (``params``) with probability ``pbt.resample``, else scaled by ``1 - perturb`` or
  ``1 + perturb``; kept within the distribution's bounds (the listed values' range)."""
  out = {}
  for path in sorted(setting):
    dist = as_distribution(params[path])
    low, high = (min(dist.args), max(dist.args))
    if rng.uniform() < pbt.resample:
      value = float(dist.sample(rng, 1)[0])
    else:
      value = float(setting[path]) * (1.0 + pbt.perturb if rng.uniform() < 0.5 else 1.0 - pbt.perturb)
    out[path] = float(np.clip(value, low, high)) if low < high else value
  return out


# ------------------------------------------------------------------------ what a study keeps
def tabular(rows: Iterable[Mapping[str, Any]], paths: Sequence[str]) -> list[dict[str, Any]]:
  """One record per (setting, seed, evaluation round) of a sweep's ``metrics.jsonl`` ``rows`` (one
  run's): the setting's value of every swept ``paths`` (columns named by the path), ``seed``,
  ``round`` (the fidelity), and every numeric metric of the row (``client_updates`` the cost so
  far), and ``experiment`` (its index in the sweep: after PBT two experiments may share values and a
  seed). Rows without a setting (a single run's) are skipped; a round logged twice keeps the last."""
  out: dict[tuple, dict[str, Any]] = {}
  for row in rows:
    setting = row.get("setting", None)
    if not isinstance(setting, Mapping) or "seed" not in row:
      continue
    rec: dict[str, Any] = {p: setting.get(p) for p in paths}
    rec["seed"], rec["round"] = int(row["seed"]), int(row["round"])
    rec["experiment"] = int(row.get("experiment", -1))
    rec.update({k: v for k, v in row.items() if k not in ("run", "round", "seed", "setting", "experiment")
                and isinstance(v, (int, float)) and not isinstance(v, bool)})
    out[(rec["experiment"], rec["round"])] = rec
  return sorted(out.values(),
                key=lambda r: (tuple(r[p] for p in paths), r["seed"], r["experiment"], r["round"]))


def write_tabular(path: str, records: Sequence[Mapping[str, Any]], paths: Sequence[str]) -> None:
  """``records`` (:func:`tabular`) as a CSV with the swept paths, ``seed``, ``round`` and
  ``experiment`` first and the metrics after, sorted by name (an empty cell where a round has no such
  metric)."""
  metrics = sorted({k for r in records for k in r} - {*paths, "seed", "round", "experiment"})
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=[*paths, "seed", "round", "experiment", *metrics], restval="")
    w.writeheader()
    w.writerows(records)


KEPT_SWEEP_FIELDS = ("seeds", "select", "mode", "chunk")
"""What a best setting's config keeps of its study's ``config.sweep`` (every search field, the swept
values, the draws and the schedules, goes back to its default: nothing is swept or searched)."""


def best_config_text(config, label: str, setting: Mapping[str, float], why: str) -> str:
  """A config file (``get_config()``) of run ``label`` alone with ``setting`` applied and nothing
  swept (its seeds kept): the best setting of a study, ready to run. ``why`` heads its docstring."""
  import ml_collections

  from fedtree.experiment.fields import SWEEP_FIELDS, set_path

  cfg = ml_collections.ConfigDict(config.to_dict(), type_safe=False)
  for path, value in setting.items():
    set_path(cfg, path, value)
  cfg.runs = {label: cfg.runs[label].to_dict()}
  cfg.run_order = (label,)
  kept = {k: v for k, v in (cfg.sweep.to_dict() if "sweep" in cfg else {}).items() if k in KEPT_SWEEP_FIELDS}
  cfg.sweep = {**{k: v for k, v in SWEEP_FIELDS.items() if k not in KEPT_SWEEP_FIELDS}, **kept}
  body = pprint.pformat(cfg.to_dict(), indent=1, width=100, sort_dicts=True)
  return "\n".join([
    f'"""{why}',
    "",
    "Run it: python -m fedtree.main --config=<this file> --workdir=<a new folder>",
    '"""',
    "",
    "import ml_collections",
    "",
    'inf, nan = float("inf"), float("nan")',
    "",
    f"CONFIG = {body}",
    "",
    "",
    "def get_config():",
    "  return ml_collections.ConfigDict(CONFIG)",
    "",
  ])
