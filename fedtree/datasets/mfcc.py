"""MFCC features in numpy, as FedKWS-UI (paper 002) extracts them from Google Speech Commands:
40 coefficients per 30 ms window with a 10 ms stride at 16 kHz.

The pipeline is the textbook one: frame the signal (no padding: a 1 s clip gives
``1 + (16000 - 480) // 160 = 98`` frames), multiply each frame by a periodic Hann window,
take the power spectrum ``|rfft(frame, n_fft)|²`` (``n_fft`` = the next power of two of the
window), apply a bank of triangular filters evenly spaced on the HTK mel scale
``m(f) = 2595 log10(1 + f / 700)``, take ``log(· + log_offset)`` and an orthonormal DCT-II,
and keep the first ``num_coefficients``.
"""

from __future__ import annotations

import dataclasses

import numpy as np


def hz_to_mel(f):
  """HTK mel scale."""
  return 2595.0 * np.log10(1.0 + np.asarray(f, np.float64) / 700.0)


def mel_to_hz(m):
  """Inverse of :func:`hz_to_mel`."""
  return 700.0 * (10.0 ** (np.asarray(m, np.float64) / 2595.0) - 1.0)


def hann_window(length: int) -> np.ndarray:
  """Periodic Hann window ``0.5 - 0.5 cos(2πn / length)``."""
  n = np.arange(length)
  return 0.5 - 0.5 * np.cos(2.0 * np.pi * n / length)


def mel_filterbank(num_bins: int, n_fft: int, sample_rate: int, low_hz: float, high_hz: float) -> np.ndarray:
  """``[n_fft // 2 + 1, num_bins]`` triangular filters with centers evenly spaced in mel."""
  edges = mel_to_hz(np.linspace(hz_to_mel(low_hz), hz_to_mel(high_hz), num_bins + 2))
  freqs = np.arange(n_fft // 2 + 1) * sample_rate / n_fft
  lo, center, hi = edges[:-2], edges[1:-1], edges[2:]
  up = (freqs[:, None] - lo) / (center - lo)
  down = (hi - freqs[:, None]) / (hi - center)
  return np.maximum(0.0, np.minimum(up, down))


def dct2_matrix(n: int, num_coefficients: int) -> np.ndarray:
  """``[n, num_coefficients]`` orthonormal DCT-II: ``c_k = s_k Σ_m x_m cos(π k (2m + 1) / 2n)``."""
  m = np.arange(n)[:, None]
  k = np.arange(num_coefficients)[None, :]
  scale = np.where(k == 0, np.sqrt(1.0 / n), np.sqrt(2.0 / n))
  return scale * np.cos(np.pi * k * (2 * m + 1) / (2 * n))


@dataclasses.dataclass(frozen=True)
class MFCC:
  """An MFCC extractor; ``mfcc(signal [..., S]) -> [..., frames, num_coefficients]`` (float32).

  Attributes:
    sample_rate: Hz.
    window_ms: window length (30 ms in the paper).
    stride_ms: hop (10 ms).
    num_mel_bins: mel filters.
    num_coefficients: kept DCT coefficients (40 in the paper; at most ``num_mel_bins``).
    low_hz, high_hz: the filterbank's frequency range (``high_hz`` at most Nyquist).
    log_offset: added before the log.
  """

  sample_rate: int = 16000
  window_ms: float = 30.0
  stride_ms: float = 10.0
  num_mel_bins: int = 40
  num_coefficients: int = 40
  low_hz: float = 20.0
  high_hz: float = 7600.0
  log_offset: float = 1e-6

  def __post_init__(self):
    if self.num_coefficients > self.num_mel_bins:
      raise ValueError(f"num_coefficients={self.num_coefficients} > num_mel_bins={self.num_mel_bins}")
    if not 0 <= self.low_hz < self.high_hz <= self.sample_rate / 2:
      raise ValueError(f"need 0 <= low_hz={self.low_hz} < high_hz={self.high_hz} <= {self.sample_rate / 2}")

  @property
  def window(self) -> int:
    return int(round(self.sample_rate * self.window_ms / 1000.0))

  @property
  def stride(self) -> int:
    return int(round(self.sample_rate * self.stride_ms / 1000.0))

  @property
  def n_fft(self) -> int:
    return 1 << (self.window - 1).bit_length()

  def num_frames(self, num_samples: int) -> int:
    return 1 + (num_samples - self.window) // self.stride

  def frames(self, signal: np.ndarray) -> np.ndarray:
    """``[..., frames, window]`` overlapping frames (no padding)."""
    t = self.num_frames(signal.shape[-1])
    idx = np.arange(t)[:, None] * self.stride + np.arange(self.window)[None, :]
    return signal[..., idx]

  def __call__(self, signal: np.ndarray) -> np.ndarray:
    signal = np.asarray(signal, np.float64)
    frames = self.frames(signal) * hann_window(self.window)
    power = np.abs(np.fft.rfft(frames, n=self.n_fft, axis=-1)) ** 2
    fb = mel_filterbank(self.num_mel_bins, self.n_fft, self.sample_rate, self.low_hz, self.high_hz)
    log_mel = np.log(power @ fb + self.log_offset)
    return (log_mel @ dct2_matrix(self.num_mel_bins, self.num_coefficients)).astype(np.float32)
