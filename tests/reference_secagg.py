"""A client-by-client reference of secure aggregation (Bonawitz et al. 2017; SecAgg+ of Bell et al.
2020 on a neighbourhood graph), in plain Python integers: every client masks its field vector with
pairwise masks (from a toy Diffie-Hellman agreement) and a self mask, Shamir-shares its key and
its self-mask seed among its shareholders (itself and its neighbours), some drop before sending;
the server sums what arrived and removes the masks it can reconstruct. It reveals the sum of the
survivors' vectors modulo ``2^b``, or fails when a secret has fewer than ``t`` surviving shares.

Not secure (toy parameters): it checks the *semantics* the vectorized simulation relies on (the
masks cancel; recovery needs ``t`` shares per secret), not cryptography."""

from __future__ import annotations

import numpy as np

PRIME = 2 ** 61 - 1        # the Shamir field and the toy group's modulus
GENERATOR = 3


def prg(seed: int, length: int, bits: int) -> np.ndarray:
  """``length`` pseudo-random field elements modulo ``2^bits`` from ``seed`` (object ints)."""
  rng = np.random.default_rng(seed % (2 ** 63))
  return np.array([int(v) for v in rng.integers(0, 2 ** bits, size=length, dtype=np.uint64)], dtype=object)


def shamir_share(secret: int, holders: list[int], t: int, rng) -> dict[int, int]:
  """``{holder: share}``: ``t``-out-of-``len(holders)`` shares of ``secret`` (points ``x = holder + 1``)."""
  coeffs = [secret % PRIME] + [int(rng.integers(0, PRIME)) for _ in range(t - 1)]
  return {h: sum(c * pow(h + 1, k, PRIME) for k, c in enumerate(coeffs)) % PRIME for h in holders}


def shamir_reconstruct(shares: dict[int, int], t: int) -> int | None:
  """The secret from ``t`` of ``shares`` by Lagrange interpolation at 0; ``None`` with fewer."""
  if len(shares) < t:
    return None
  pts = list(shares.items())[:t]
  secret = 0
  for i, (hi, yi) in enumerate(pts):
    num, den = 1, 1
    for j, (hj, _) in enumerate(pts):
      if i != j:
        num = num * (-(hj + 1)) % PRIME
        den = den * ((hi + 1) - (hj + 1)) % PRIME
    secret = (secret + yi * num * pow(den, PRIME - 2, PRIME)) % PRIME
  return secret


def neighbourhood(n: int, neighbours: int | None, order: list[int]) -> dict[int, set[int]]:
  """Every client's neighbours: all others (SecAgg), or its ``neighbours / 2`` on each side of a
  ring where the clients sit in ``order`` (SecAgg+'s Harary graph)."""
  if neighbours is None or neighbours >= n - 1:
    return {i: set(range(n)) - {i} for i in range(n)}
  pos = {c: p for p, c in enumerate(order)}
  half = neighbours // 2
  return {i: {order[(pos[i] + o) % n] for o in range(-half, half + 1) if o} for i in range(n)}


def secure_sum(vectors: list[np.ndarray], dropped: set[int], bits: int, threshold: float,
               neighbours: int | None = None, order: list[int] | None = None, seed: int = 0):
  """``(sum of the survivors' vectors mod 2^bits as ints, or None when the round fails)``.

  Args:
    vectors: every client's field vector (ints in ``[0, 2^bits)``).
    dropped: the clients that never send their masked vector.
    bits: the field.
    threshold: ``t = ceil(threshold * (k + 1))`` shares recover a secret (``k`` neighbours; ``n - 1``
      for SecAgg); the round also fails below ``ceil(threshold * n)`` survivors.
    neighbours, order: SecAgg+'s ``k`` and the clients' places on the ring.
  """
  rng = np.random.default_rng(seed)
  n, length, mod = len(vectors), len(vectors[0]), 2 ** bits
  order = list(range(n)) if order is None else list(order)
  nb = neighbourhood(n, neighbours, order)
  k = len(nb[0])
  t = int(np.ceil(threshold * (k + 1)))
  sk = [int(rng.integers(1, PRIME - 1)) for _ in range(n)]
  pk = [pow(GENERATOR, s, PRIME) for s in sk]
  self_seed = [int(rng.integers(0, PRIME)) for _ in range(n)]
  holders = {i: sorted(nb[i] | {i}) for i in range(n)}
  shares_sk = {i: shamir_share(sk[i], holders[i], t, rng) for i in range(n)}
  shares_b = {i: shamir_share(self_seed[i], holders[i], t, rng) for i in range(n)}

  def pair_mask(i, j, secret_i):   # client i's mask with j: +PRG for i < j, -PRG for i > j
    m = prg(pow(pk[j], secret_i, PRIME), length, bits)
    return m if i < j else (-m) % mod

  masked = {}
  for i in range(n):
    if i in dropped:
      continue
    y = (np.array([int(v) for v in vectors[i]], dtype=object) + prg(self_seed[i], length, bits)) % mod
    for j in nb[i]:
      y = (y + pair_mask(i, j, sk[i])) % mod
    masked[i] = y
  survivors = set(masked)
  if len(survivors) < int(np.ceil(threshold * n)):
    return None
  total = sum(masked.values(), np.zeros(length, dtype=object)) % mod
  for i in range(n):
    if i in survivors:   # the self mask of a survivor: from its shareholders that survived
      got = shamir_reconstruct({h: s for h, s in shares_b[i].items() if h in survivors}, t)
      if got is None:
        return None
      total = (total - prg(got, length, bits)) % mod
    else:                # a dropped client's key: remove its masks with the survivors
      got = shamir_reconstruct({h: s for h, s in shares_sk[i].items() if h in survivors}, t)
      if got is None:
        return None
      for j in nb[i] & survivors:
        total = (total + pair_mask(i, j, got)) % mod   # j added -(i's mask as seen from j)
  return total
