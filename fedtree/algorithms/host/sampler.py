"""The host's cohort sampler: fixed-size cohorts or Poisson sampling, checked before anything compiles."""

from __future__ import annotations

import numpy as np

from fedtree.core.sampling import check_sampling, cohort_sampler, overflow_probability, poisson_sampler


def build_sampler(parent, *, sampling: str, cohort_size, poisson_q, chunk_size):
  """The clients' sampler: fixed-size cohorts (:func:`~fedtree.core.sampling.cohort_sampler`) or
  Poisson sampling with rate ``poisson_q`` (:func:`~fedtree.core.sampling.poisson_sampler`, whose
  slots per parent are ``cohort_size``, default from the overflow probability)."""
  if sampling != "poisson":
    check_sampling(sampling)
    check_poisson_q(sampling, poisson_q)
    return cohort_sampler(parent, cohort_size, chunk_size=chunk_size)
  if poisson_q is None:
    raise ValueError("sampling='poisson' needs poisson_q, every client's probability of taking part")
  every = cohort_size is None or (np.isscalar(cohort_size) and int(cohort_size) == -1)
  slots = None if every else cohort_size
  sampler = poisson_sampler(parent, poisson_q, max_slots=slots, chunk_size=chunk_size,
                            slots_name="cohort_size")
  if not every:
    check_poisson_slots(parent, poisson_q, sampler.sizes)
  return sampler


def check_poisson_q(sampling: str, poisson_q) -> None:
  """Refuses ``poisson_q`` with another sampling than ``"poisson"``, which never reads it."""
  if sampling != "poisson" and poisson_q is not None:
    raise ValueError(f"poisson_q={poisson_q!r} is only read with sampling='poisson' "
                     f"(got sampling={sampling!r})")


POISSON_OVERFLOW = 1e-6
"""The largest overflow probability per round and parent that a Poisson run's ``cohort_size`` (its
slots) may have: a draw over the slots stops the run (none is dropped)."""


def check_poisson_slots(parent, poisson_q: float, slots) -> None:
  """Refuses, before anything compiles, Poisson slots (``cohort_size``) that a round overflows with
  probability above :data:`POISSON_OVERFLOW` under some parent, naming the field and the smallest
  value that fits (the default slots, ``cohort_size=None``, overflow with probability 1e-12)."""
  counts = np.bincount(np.asarray(parent, np.int64))
  p = overflow_probability(counts, float(poisson_q), slots)
  g = int(np.argmax(p))
  if p[g] > POISSON_OVERFLOW:
    need = poisson_sampler(np.zeros(int(counts[g]), np.int64), poisson_q).sizes[0]
    raise ValueError(
      f"cohort_size={int(np.asarray(slots)[g])} with sampling='poisson', poisson_q={poisson_q!r}: parent "
      f"{g}'s {int(counts[g])} clients overflow its {int(np.asarray(slots)[g])} slots with probability "
      f"{p[g]:.3g} per round (the run stops at the first such draw); set cohort_size >= {need} (overflow "
      f"<= 1e-12 per round), or leave cohort_size unset (None) for slots sized from poisson_q")
