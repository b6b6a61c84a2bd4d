"""Test-wide settings: rank promotion raises (as in flax's tests) and tests stay on CPU."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
