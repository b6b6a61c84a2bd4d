"""Federated Google Speech Commands (Warden 2018) from its raw directory, as FedKWS-UI
(paper 002, "Avoid overfitting user specific information in federated keyword spotting")
uses it: one client per speaker, 40 MFCC features per 30 ms window with a 10 ms stride.

The directory is the dataset's own layout, ``<root>/<word>/<speaker>_nohash_<n>.wav``
(16 kHz, 16-bit mono PCM, up to 1 s), ``<root>/_background_noise_/*.wav`` and, when present,
``testing_list.txt`` / ``validation_list.txt``. Nothing is downloaded here.

* Tasks: ``task=12``: the 10 keywords of :data:`KEYWORDS`, ``_silence_`` (1 s cut from the
  background-noise clips at a random volume in [0, 1)) and ``_unknown_`` (every other word);
  ``task=35``: every word folder is its own class (35 in v2).
* Split: files named in ``testing_list.txt`` are test, those in ``validation_list.txt`` are
  left out; without the lists, the dataset's own hash rule on the speaker id
  (:func:`which_set`) decides, so a speaker is wholly in one split.
* Clients: one per training speaker (sorted ids). Each gets ``ceil(silence_fraction · n)``
  silence clips in the 12-class task. The test set is global (the paper evaluates the
  aggregated model on it); its examples are dealt round-robin over the client rows so that
  the overall (example-weighted) test accuracy is the global test accuracy.
* Augmentation of the training clips (paper: as in the dataset's reference pipeline): a
  random time shift in ±``shift_ms`` (zero fill) and, with probability ``noise_prob``,
  background noise at volume ``noise_volume``, drawn from ``seed``. Features are
  precomputed, so with ``views=1`` (default) it is drawn once per clip and every epoch sees
  the same augmented clip. With ``views=V > 1`` each training clip gets ``V`` independent
  augmentations (``x_train [C, M, V, frames, 40]``; a silence clip gets ``V`` noise cuts) and
  a model built with ``views=V`` (:func:`fedtree.models.kws.with_views`) reads one of them,
  drawn per example from the step's key, every time it reads the clip: the augmentation is
  redrawn at every epoch, inside jit, from a pool of ``V`` per clip (the reference pipeline
  draws a fresh one each time: ``V`` large is that limit, at ``V`` times the memory). Test
  clips are not augmented (with ``views``, each of their ``V`` views is the clean clip).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import wave

import numpy as np

from fedtree.core.data import FederatedData
from fedtree.datasets.mfcc import MFCC

KEYWORDS = ("yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go")
SILENCE, UNKNOWN = "_silence_", "_unknown_"
CLASSES_12 = KEYWORDS + (SILENCE, UNKNOWN)
NEGATIVE_12 = (SILENCE, UNKNOWN)
BACKGROUND = "_background_noise_"
TASKS = (12, 35)
SAMPLE_RATE = 16000
_MAX_PER_CLASS = 2**27 - 1


def read_wav(path: str) -> np.ndarray:
  """A 16-bit mono PCM WAV file as float32 in [-1, 1) (``ValueError`` for other formats)."""
  with wave.open(path, "rb") as f:
    if f.getsampwidth() != 2 or f.getnchannels() != 1:
      raise ValueError(f"{path}: need 16-bit mono PCM, got {8 * f.getsampwidth()}-bit, {f.getnchannels()} ch")
    if f.getframerate() != SAMPLE_RATE:
      raise ValueError(f"{path}: sample rate {f.getframerate()}, need {SAMPLE_RATE}")
    raw = f.readframes(f.getnframes())
  return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0


def fix_length(signal: np.ndarray, length: int = SAMPLE_RATE) -> np.ndarray:
  """Zero-pads or cuts ``signal`` to ``length`` samples."""
  out = np.zeros(length, np.float32)
  out[: min(length, len(signal))] = signal[:length]
  return out


def speaker_of(filename: str) -> str:
  """``<speaker>_nohash_<n>.wav`` -> ``<speaker>``."""
  return re.sub(r"_nohash_.*$", "", os.path.basename(filename))


def which_set(filename: str, validation_percentage: float = 10.0, testing_percentage: float = 10.0) -> str:
  """The dataset's split rule: a stable hash of the speaker id in [0, 100) picks
  ``"validation"``, ``"testing"`` or ``"training"``."""
  h = int(hashlib.sha1(speaker_of(filename).encode("utf-8")).hexdigest(), 16)
  pct = (h % (_MAX_PER_CLASS + 1)) * (100.0 / _MAX_PER_CLASS)
  if pct < validation_percentage:
    return "validation"
  if pct < validation_percentage + testing_percentage:
    return "testing"
  return "training"


def augment(signal: np.ndarray, rng: np.random.Generator, noises: list[np.ndarray], *,
            shift_ms: float, noise_volume: float, noise_prob: float) -> np.ndarray:
  """Random time shift in ±``shift_ms`` (zero fill), then with probability ``noise_prob``
  ``noise_volume`` × a random 1 s cut of a random background clip."""
  n = len(signal)
  max_shift = int(round(shift_ms * SAMPLE_RATE / 1000.0))
  shift = int(rng.integers(-max_shift, max_shift + 1)) if max_shift else 0
  out = np.zeros_like(signal)
  if shift >= 0:
    out[shift:] = signal[: n - shift]
  else:
    out[:shift] = signal[-shift:]
  if noises and rng.random() < noise_prob:
    out = out + noise_volume * noise_cut(rng, noises, n)
  return np.clip(out, -1.0, 1.0)


def noise_cut(rng: np.random.Generator, noises: list[np.ndarray], length: int) -> np.ndarray:
  """A random ``length``-sample cut of a random background clip (zero-padded if short)."""
  clip = noises[int(rng.integers(len(noises)))]
  if len(clip) <= length:
    return fix_length(clip, length)
  start = int(rng.integers(len(clip) - length + 1))
  return clip[start:start + length]


def _read_list(root: str, name: str) -> set[str] | None:
  path = os.path.join(root, name)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return {line.strip() for line in f if line.strip()}


def scan(root: str, task: int = 12) -> tuple[list[tuple[str, str, str, str]], tuple[str, ...]]:
  """``([(relative path, word, speaker, split)], class names)`` of the directory ``root``."""
  if int(task) not in TASKS:
    raise ValueError(f"speech commands task={task!r}; choose one of {TASKS}")
  if not os.path.isdir(root):
    raise ValueError(f"speech commands root={root!r} is not a directory")
  words = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and d != BACKGROUND)
  if not words:
    raise ValueError(f"no word folders under {root!r}")
  tests, vals = _read_list(root, "testing_list.txt"), _read_list(root, "validation_list.txt")
  files = []
  for word in words:
    for name in sorted(os.listdir(os.path.join(root, word))):
      if not name.endswith(".wav"):
        continue
      rel = f"{word}/{name}"
      if tests is not None or vals is not None:
        split = "testing" if rel in (tests or ()) else "validation" if rel in (vals or ()) else "training"
      else:
        split = which_set(name)
      files.append((rel, word, speaker_of(name), split))
  classes = CLASSES_12 if int(task) == 12 else tuple(words)
  return files, classes


def label_of(word: str, task: int, classes: tuple[str, ...]) -> int:
  if int(task) == 12:
    return KEYWORDS.index(word) if word in KEYWORDS else classes.index(UNKNOWN)
  return classes.index(word)


def load_speech_commands(
  root: str,
  *,
  task: int = 12,
  silence_fraction: float = 0.1,
  unknown_keep: float = 1.0,
  augmentation: bool = True,
  shift_ms: float = 100.0,
  noise_volume: float = 0.1,
  noise_prob: float = 0.8,
  max_clients: int | None = None,
  max_examples: int | None = None,
  seed: int = 0,
  mfcc: dict | None = None,
  views: int = 1,
) -> tuple[FederatedData, np.ndarray, tuple[np.ndarray, np.ndarray]]:
  """Federated Speech Commands from ``root`` (see the module docstring).

  Args:
    root: the dataset directory.
    task: 12 or 35 classes.
    silence_fraction: silence clips per client, as a fraction of its word clips (task 12).
    unknown_keep: probability that an ``_unknown_`` clip is kept (task 12; to rebalance).
    augmentation: time shift and background noise on training clips.
    shift_ms, noise_volume, noise_prob: the augmentation (paper: 100 ms, 0.1, 0.8).
    max_clients: keep only the first speakers (sorted ids); ``None``: all.
    max_examples: keep at most this many word clips per speaker (bounds the padded length
      ``M``: the data is stored ``[C, M, 98, 40]``, and the full 12-class task's largest
      client has 141 clips, i.e. about 5 GB of float32); ``None``: all.
    seed: seeds the augmentation, silence cuts and unknown subsampling.
    mfcc: keyword arguments of :class:`~fedtree.datasets.mfcc.MFCC`.
    views: augmented views per training clip (see the module docstring); 1: one, no views
      axis.

  Returns:
    ``(data, groups [C] (zeros), central test (x, y))``; ``x`` is ``float32 [.., frames, 40]``
    (``[.., views, frames, 40]`` with ``views > 1``).
  """
  if int(views) < 1:
    raise ValueError(f"views={views} must be >= 1")
  for name, v in (("silence_fraction", silence_fraction), ("unknown_keep", unknown_keep),
                  ("noise_prob", noise_prob)):
    if not 0.0 <= float(v) <= 1.0:
      raise ValueError(f"{name}={v} must be in [0, 1]")
  files, classes = scan(root, task)
  features = MFCC(**(mfcc or {}))
  rng = np.random.default_rng(seed)
  bg_dir = os.path.join(root, BACKGROUND)
  noises = []
  if os.path.isdir(bg_dir):
    noises = [read_wav(os.path.join(bg_dir, f)) for f in sorted(os.listdir(bg_dir)) if f.endswith(".wav")]
  if int(task) == 12 and silence_fraction > 0 and not noises:
    raise ValueError(f"task 12 with silence_fraction={silence_fraction} needs wav files in {bg_dir}")

  train: dict[str, list[tuple[np.ndarray, int]]] = {}
  test: list[tuple[np.ndarray, int]] = []
  for rel, word, speaker, split in files:
    if split == "validation":
      continue
    label = label_of(word, task, classes)
    if int(task) == 12 and classes[label] == UNKNOWN and rng.random() >= unknown_keep:
      continue
    signal = fix_length(read_wav(os.path.join(root, rel)))
    if split == "testing":
      test.append((signal, label))
    else:
      train.setdefault(speaker, []).append((signal, label))
  speakers = sorted(train)[: None if max_clients is None else int(max_clients)]
  if not speakers:
    raise ValueError(f"no training clips under {root!r}")
  silence = classes.index(SILENCE) if int(task) == 12 else None
  xs, ys = [], []
  for speaker in speakers:
    clips = train[speaker][: None if max_examples is None else int(max_examples)]
    per_view = []
    for _ in range(int(views)):
      sig = [augment(s, rng, noises, shift_ms=shift_ms, noise_volume=noise_volume, noise_prob=noise_prob)
             if augmentation else s for s, _ in clips]
      if silence is not None:
        for _ in range(math.ceil(silence_fraction * len(clips))):
          sig.append(np.float32(rng.random()) * noise_cut(rng, noises, SAMPLE_RATE))
      per_view.append(features(np.stack(sig)))
    lab = [y for _, y in clips] + [silence] * (len(per_view[0]) - len(clips))
    xs.append(per_view[0] if int(views) == 1 else np.stack(per_view, axis=1))
    ys.append(np.asarray(lab, np.int32))
  if silence is not None and test:
    for _ in range(math.ceil(silence_fraction * len(test))):
      test.append((np.float32(rng.random()) * noise_cut(rng, noises, SAMPLE_RATE), silence))
  if not test:
    raise ValueError(f"no test clips under {root!r} (check testing_list.txt or the split rule)")
  x_central = features(np.stack([s for s, _ in test]))
  y_central = np.asarray([y for _, y in test], np.int32)
  x_views = x_central if int(views) == 1 else np.repeat(x_central[:, None], int(views), axis=1)
  data = federate(xs, ys, x_views, y_central, len(classes))
  return data, np.zeros(data.num_clients, np.int32), (x_views, y_central)


def federate(xs: list[np.ndarray], ys: list[np.ndarray], x_test: np.ndarray, y_test: np.ndarray,
             num_classes: int) -> FederatedData:
  """Per-client training arrays and one global test set dealt round-robin over the client
  rows, padded into a :class:`FederatedData`."""
  c = len(xs)
  shape = xs[0].shape[1:]
  m = max(len(x) for x in xs)
  x_train = np.zeros((c, m) + shape, np.float32)
  y_train = np.zeros((c, m), np.int32)
  n_train = np.asarray([len(x) for x in xs], np.int32)
  for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
    x_train[i, : len(x)], y_train[i, : len(y)] = x, y
  owner = np.arange(len(y_test)) % c
  mt = max(1, math.ceil(len(y_test) / c))
  x_t = np.zeros((c, mt) + shape, np.float32)
  y_t = np.zeros((c, mt), np.int32)
  n_test = np.bincount(owner, minlength=c).astype(np.int32)
  pos = np.arange(len(y_test)) // c
  x_t[owner, pos], y_t[owner, pos] = x_test, y_test
  return FederatedData(x_train=x_train, y_train=y_train, n_train=n_train, x_test=x_t, y_test=y_t,
                       n_test=n_test, num_classes=int(num_classes))
