"""What a run ends with: the summary metrics kept, the divergence check on final models, the
errors a stopped or diverged run raises, the keyword classes of FA/FR metrics and the other
evaluation options of ``config.metrics`` (:func:`evaluation_options`).

Used by the runner (:mod:`fedtree.experiment.runner`) for single runs and sweeps alike.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import ml_collections
import numpy as np

from fedtree.core.metrics import MULTI_LABEL_METRICS


class RunStopped(RuntimeError):
  """A run was asked to stop (SIGINT/SIGTERM) and did so after a compiled call."""


def kept_on_stop(ckpt, state) -> str:
  """The end of a stopped run's message: ``state`` (reached between rounds) is checkpointed when
  the run checkpoints (``ckpt``, a :class:`fedtree.experiment.checkpoint.Checkpointer`, or
  ``None``), and the message says what a re-run resumes from."""
  if ckpt is None:
    return ("; nothing is kept (no checkpoints: set --config.checkpoint_every and --workdir to "
            "resume), so re-running starts from round 0")
  ckpt.maybe_save(state, force=True)
  r = ckpt.latest_round()
  if r is None:
    return "; nothing is kept, so re-running starts from round 0"
  return f"; its checkpoints are kept in {ckpt.directory}: re-running resumes from round {r}"


class DivergedError(FloatingPointError):
  """A final model scores a non-finite loss: it is not written as a result."""


SUMMARY_METRICS = ("accuracy", "loss", "perplexity", "sentence_perplexity", "false_accept_rate",
                   "false_reject_rate", "intra_cluster_accuracy", "inter_cluster_accuracy", "num_clusters",
                   "adjusted_rand_index", "attack_success_rate", "central_accuracy", "central_loss",
                   "central_perplexity") + MULTI_LABEL_METRICS + tuple(
                     f"central_{m}" for m in MULTI_LABEL_METRICS)


def check_summaries(label: str, round_: int, summaries: dict[str, dict[str, Any]]) -> None:
  """Raises :class:`DivergedError` when a model's evaluation loss (on the clients' test data, else
  on the central test split) is not finite."""
  for name, s in summaries.items():
    loss = s.get("loss", s.get("central_loss", 0.0))
    if loss is not None and not np.isfinite(loss):
      raise DivergedError(
        f"run {label!r} diverged at round {round_}: model {name!r} has a test loss of {loss} "
        "(a server or local learning rate too large?); nothing is written for this run"
      )


def positive_classes_from_config(config: ml_collections.ConfigDict, num_classes: int | None = None):
  """The keyword (positive) class mask of ``config.metrics`` (``class_names`` and
  ``negative_classes``, e.g. FedKWS-UI's silence and unknown), or ``None`` when the config
  asks for no false-accept/reject rates."""
  metrics = config.get("metrics", None)
  if metrics is None or metrics.get("negative_classes", None) is None:
    return None
  from fedtree.core.metrics import keyword_split

  if metrics.get("class_names", None) is None:
    raise ValueError("config.metrics.negative_classes needs config.metrics.class_names")
  mask = keyword_split(tuple(metrics.class_names), tuple(metrics.negative_classes))
  if num_classes is not None and len(mask) != num_classes:
    raise ValueError(
      f"config.metrics.class_names has {len(mask)} names but the data has {num_classes} classes"
    )
  return mask


class EvaluationOptions(NamedTuple):
  """How a config's runs are scored besides the defaults (``config.metrics``).

  Attributes:
    ignore_labels: labels left out of accuracy, loss and perplexity (Reddi et al. 2021's Stack
      Overflow next-word accuracy counts no OOV, BOS or EOS token: fedtree's ids ``(1, 2, 3)``).
    top_k: also report ``top{k}_accuracy``, or ``None``.
    central: also score every global model on the data's central test split
      (``central_accuracy``, ...), as benchmarks that evaluate the server's model on the dataset's
      test split report it.
  """

  ignore_labels: tuple[int, ...] = ()
  top_k: int | None = None
  central: bool = False


def evaluation_options(config: ml_collections.ConfigDict, *, num_classes: int,
                       has_central: bool, has_local: bool) -> EvaluationOptions:
  """``config.metrics``' ``ignore_labels``, ``top_k`` and ``central``, checked against the data
  before anything compiles.

  Raises:
    ValueError: a label outside ``[1, num_classes)`` (padding, 0, never counts anyway), ``top_k``
      outside ``[1, num_classes]``, ``central=True`` on data without a central test split, or
      data without any client test example and no central test to score on.
  """
  metrics = config.get("metrics", None) or ml_collections.ConfigDict()
  ignore = tuple(int(v) for v in (metrics.get("ignore_labels", None) or ()))
  bad = [v for v in ignore if not 0 < v < num_classes]
  if bad:
    raise ValueError(f"config.metrics.ignore_labels={ignore}: label {bad[0]} is not in [1, {num_classes}) "
                     "(padding, 0, is never counted)")
  top_k = metrics.get("top_k", None)
  if top_k is not None and not 1 <= int(top_k) <= num_classes:
    raise ValueError(f"config.metrics.top_k={top_k} must be in [1, {num_classes}] (the data's classes)")
  central = bool(metrics.get("central", False))
  source = config.data.get("name", "?") if "data" in config else "?"
  if central and not has_central:
    raise ValueError(f"config.metrics.central=True but config.data (name={source!r}) has no central test "
                     "split; set central=False or use data with one (e.g. a TFDS test split)")
  if not has_local and not central:
    raise ValueError(f"config.data (name={source!r}) gives no client any test example: set "
                     "config.metrics.central=True to score on the central test split, or hold out a "
                     "test_fraction > 0")
  return EvaluationOptions(ignore, None if top_k is None else int(top_k), central)
