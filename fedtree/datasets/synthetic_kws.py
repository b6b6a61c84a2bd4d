"""A synthetic keyword-spotting task shaped like federated Google Speech Commands (paper 002,
FedKWS-UI), generated in-package so that its experiment runs with no download.

Examples are ``[frames, features]`` "MFCC maps". Recipe (all draws from ``seed``):

* Class templates: each keyword ``c`` is a sum of ``blobs`` plane waves in time-frequency
  (random spatial frequencies and phases: a local texture, as formants and their motion are)
  under Gaussian envelopes with random centers and widths; ``_silence_`` has a zero template;
  ``_unknown_`` draws each example's template from ``unknown_words`` extra words.
* Speakers (the users' "accents"): speaker ``s`` has a spectral offset ``a_s ~ N(0, accent²)``
  per feature, smoothed over the features, and a gain ``g_s ~ 1 + N(0, gain_spread²)``.
* An example of class ``c`` by speaker ``s``: ``g_s · shift(template, τ) + a_s + ε``, with a
  time shift ``τ`` uniform in ``±max_shift`` frames (zero fill) and ``ε ~ N(0, noise²)``.
* Training speakers (the clients) have ``n_s ~ lognormal(log(mean_examples), size_sigma)``
  examples clipped to ``[min_examples, max_examples]`` (quantity skew) and labels drawn from
  their own ``Dirichlet(label_alpha)`` class distribution (label skew).
* The global test set comes from ``test_speakers`` unseen speakers with uniform labels,
  ``test_examples`` each, dealt round-robin over the client rows (as in
  :func:`fedtree.datasets.speech_commands.federate`).

With 12 classes the class names are :data:`~fedtree.datasets.speech_commands.CLASSES_12`.
"""

from __future__ import annotations

import numpy as np

from fedtree.core.data import FederatedData
from fedtree.datasets.speech_commands import CLASSES_12, SILENCE, UNKNOWN, federate


def kws_class_names(num_classes: int) -> tuple[str, ...]:
  """``CLASSES_12`` for 12 classes, else ``word0 .. word{C-3}, _silence_, _unknown_``."""
  if num_classes == 12:
    return CLASSES_12
  if num_classes < 3:
    raise ValueError(f"num_classes={num_classes} must be >= 3 (keywords, silence, unknown)")
  return tuple(f"word{i}" for i in range(num_classes - 2)) + (SILENCE, UNKNOWN)


def _template(rng, frames, features, blobs):
  t = np.arange(frames)[:, None]
  f = np.arange(features)[None, :]
  out = np.zeros((frames, features))
  for _ in range(blobs):
    kt, kf = rng.uniform(0.04, 0.3) * rng.choice([-1, 1]), rng.uniform(0.04, 0.3)
    ct, cf = rng.uniform(0.3, 0.7) * frames, rng.uniform(0.2, 0.8) * features
    wt, wf = rng.uniform(0.15, 0.3) * frames, rng.uniform(0.15, 0.35) * features
    envelope = np.exp(-0.5 * (((t - ct) / wt) ** 2 + ((f - cf) / wf) ** 2))
    phase = rng.uniform(0, 2 * np.pi)
    out += rng.uniform(0.8, 1.5) * envelope * np.cos(2 * np.pi * (kt * t + kf * f) + phase)
  return out


def _shift(x, tau):
  out = np.zeros_like(x)
  if tau >= 0:
    out[tau:] = x[: len(x) - tau]
  else:
    out[:tau] = x[-tau:]
  return out


def synthetic_kws(
  *,
  num_speakers: int = 100,
  num_classes: int = 12,
  frames: int = 32,
  features: int = 40,
  blobs: int = 3,
  unknown_words: int = 8,
  accent: float = 0.4,
  gain_spread: float = 0.2,
  noise: float = 0.5,
  max_shift: int = 3,
  mean_examples: float = 20.0,
  size_sigma: float = 0.8,
  min_examples: int = 4,
  max_examples: int = 120,
  label_alpha: float = 0.5,
  test_speakers: int = 40,
  test_examples: int = 24,
  seed: int = 0,
) -> FederatedData:
  """The synthetic task (see the module docstring); ``x`` is ``float32 [C, M, frames, features]``."""
  if num_speakers < 1 or test_speakers < 1:
    raise ValueError(f"num_speakers={num_speakers} and test_speakers={test_speakers} must be >= 1")
  if not label_alpha > 0:
    raise ValueError(f"label_alpha={label_alpha} must be > 0")
  if not 1 <= min_examples <= max_examples:
    raise ValueError(f"need 1 <= min_examples={min_examples} <= max_examples={max_examples}")
  names = kws_class_names(num_classes)
  rng = np.random.default_rng(seed)
  templates = [_template(rng, frames, features, blobs) for _ in range(num_classes - 2)]
  templates.append(np.zeros((frames, features)))                                  # silence
  unknown = [_template(rng, frames, features, blobs) for _ in range(max(1, unknown_words))]
  idx = np.arange(features)
  smooth = np.exp(-0.5 * ((idx[:, None] - idx[None, :]) / 1.5) ** 2)
  smooth /= np.sqrt(np.sum(smooth**2, axis=1, keepdims=True))     # unit-norm rows: std kept

  def speaker(labels):
    offset = smooth @ rng.normal(0.0, accent, features)
    gain = 1.0 + rng.normal(0.0, gain_spread)
    xs = np.empty((len(labels), frames, features), np.float32)
    for i, c in enumerate(labels):
      base = unknown[rng.integers(len(unknown))] if names[c] == UNKNOWN else templates[c]
      tau = int(rng.integers(-max_shift, max_shift + 1))
      xs[i] = gain * _shift(base, tau) + offset + rng.normal(0.0, noise, (frames, features))
    return xs

  xs, ys = [], []
  for _ in range(num_speakers):
    n = int(np.clip(round(rng.lognormal(np.log(mean_examples), size_sigma)), min_examples, max_examples))
    q = rng.dirichlet(np.full(num_classes, label_alpha))
    y = rng.choice(num_classes, size=n, p=q).astype(np.int32)
    xs.append(speaker(y))
    ys.append(y)
  x_test, y_test = [], []
  for _ in range(test_speakers):
    y = rng.integers(num_classes, size=test_examples).astype(np.int32)
    x_test.append(speaker(y))
    y_test.append(y)
  return federate(xs, ys, np.concatenate(x_test), np.concatenate(y_test), num_classes)
