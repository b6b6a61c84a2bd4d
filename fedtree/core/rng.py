"""Named PRNG streams: ``stream(key, "cohort")`` is independent of ``stream(key, "train")``.

Keys are derived, never global: a root key from the config, ``fold_in`` of the round, then of
a stream name (and of a client or node index where needed).
"""

from __future__ import annotations

import zlib

import jax


def stream(key: jax.Array, name: str) -> jax.Array:
  """The sub-key of ``key`` for the stream called ``name`` (stable across runs and hosts)."""
  return jax.random.fold_in(key, zlib.crc32(name.encode()) & 0x7FFFFFFF)
