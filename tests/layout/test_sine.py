"""Sinusoidal position features (Vaswani et al.; LSPE eq. 1) against the formula in a loop."""

import math

import jax
import numpy as np
import pytest

from flaxdoc.layout import sine

_sine = jax.jit(sine.sine_features, static_argnums=(1, 2))


def test_matches_formula_loop():
  dim = 16
  positions = np.array([0, 1, 7, 511, 1000, 23456])
  got = np.asarray(_sine(positions, dim, 10000.0))
  assert got.shape == (6, dim) and got.dtype == np.float32
  for n, p in enumerate(positions):
    tol = 1e-6 + 2e-7 * p  # float32 angles: about two ulps of p * frequency
    for i in range(dim // 2):
      angle = p / 10000.0 ** (2 * i / dim)
      assert got[n, 2 * i] == pytest.approx(math.sin(angle), abs=tol)
      assert got[n, 2 * i + 1] == pytest.approx(math.cos(angle), abs=tol)


def test_position_zero_and_float_positions():
  np.testing.assert_allclose(_sine(np.array(0), 6, 10000.0), [0, 1, 0, 1, 0, 1], atol=1e-7)
  half = np.asarray(_sine(np.array([0.5, 999.5]), 8, 10000.0))
  np.testing.assert_allclose(half[0, 0], math.sin(0.5), rtol=1e-6)
  np.testing.assert_allclose(half[1, 2], math.sin(999.5 / 10000 ** (2 / 8)), rtol=1e-5)


def test_batch_dims_and_relative_property():
  rng = np.random.default_rng(0)
  pos = rng.integers(0, 2000, (2, 3, 5))
  got = np.asarray(_sine(pos, 32, 10000.0))
  assert got.shape == (2, 3, 5, 32)
  np.testing.assert_allclose(got[1, 2, 4], np.asarray(_sine(pos[1, 2, 4], 32, 10000.0)))
  # PE(p) . PE(p + k) = sum_i cos(k w_i): depends on the offset k only.
  k = 17
  a = np.asarray(_sine(np.array([3, 300, 1500]), 32, 10000.0))
  b = np.asarray(_sine(np.array([3 + k, 300 + k, 1500 + k]), 32, 10000.0))
  dots = (a * b).sum(-1)
  want = sum(math.cos(k / 10000.0 ** (2 * i / 32)) for i in range(16))
  np.testing.assert_allclose(dots, want, atol=2e-4)


def test_rejects_bad_dim():
  with pytest.raises(ValueError, match="even"):
    sine.sine_features(np.arange(3), 7)
  with pytest.raises(ValueError, match="max_period"):
    sine.sine_features(np.arange(3), 8, max_period=0.0)
