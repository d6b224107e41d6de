"""The linking head's scores against a numpy reference on a tiny batch."""

import jax
import numpy as np
import pytest
from scipy.special import erf

from flaxdoc.nn.linking import LinkingHead, pair_geometry


def _gelu(x):
  return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def _batch(rng, B=2, L=11, H=8, E=5, V=3, C=4):
  hidden = rng.normal(size=(B, L, H)).astype(np.float32)
  token_entity = np.full((B, L), -1, np.int32)
  first = np.zeros((B, E), np.int32)
  for b in range(B):  # entity e covers tokens 1 + 2e, 2 + 2e (the last one shorter)
    for e in range(E):
      toks = [t for t in (1 + 2 * e, 2 + 2 * e) if t < L - 1]
      token_entity[b, toks] = e
      first[b, e] = toks[0]
  link = {
      "link_first": first, "link_token_entity": token_entity,
      "link_label": rng.integers(0, 3, size=(B, E)).astype(np.int32),
      "link_box": rng.uniform(0, 1000, size=(B, E, 4)).astype(np.float32),
      "link_value": rng.integers(0, E, size=(B, V)).astype(np.int32),
      "link_candidates": rng.integers(0, E, size=(B, V, C)).astype(np.int32),
      "link_candidate_mask": rng.random((B, V, C)) < 0.7,
  }
  return hidden, link


def _reference(p, hidden, link, pooling, geometry):
  B, L, H = hidden.shape
  E = link["link_first"].shape[1]
  out = []
  for b in range(B):
    reps = []
    for e in range(E):
      toks = np.flatnonzero(link["link_token_entity"][b] == e)
      x = hidden[b, link["link_first"][b, e]] if pooling == "first" else hidden[b, toks].mean(0)
      reps.append(x + p["label_embedding"][link["link_label"][b, e]])
    reps = np.stack(reps)

    def ffn(q, x):
      h = _gelu(x @ q["dense_in"]["kernel"] + q["dense_in"]["bias"])
      return h @ q["dense_out"]["kernel"] + q["dense_out"]["bias"]
    keys, values = ffn(p["key_ffn"], reps), ffn(p["value_ffn"], reps)
    rows = []
    for s, v in enumerate(link["link_value"][b]):
      t = values[v]
      row = []
      for c, k in enumerate(link["link_candidates"][b, s]):
        score = t @ p["bilinear"] @ keys[k] + keys[k] @ p["key_bias"]
        if geometry:
          f = np.asarray(pair_geometry(link["link_box"][b, k], link["link_box"][b, v]))
          g = _gelu(f @ p["geometry_in"]["kernel"] + p["geometry_in"]["bias"])
          score += (g @ p["geometry_out"]["kernel"] + p["geometry_out"]["bias"])[0]
        row.append(score if link["link_candidate_mask"][b, s, c] else -1e9)
      row.append((t @ p["no_key"]["kernel"] + p["no_key"]["bias"])[0])
      rows.append(row)
    out.append(rows)
  return np.asarray(out)


@pytest.mark.parametrize("pooling,geometry", [("first", False), ("mean", False), ("mean", True)])
def test_scores_equal_numpy_reference(pooling, geometry):
  hidden, link = _batch(np.random.default_rng(0))
  head = LinkingHead(num_labels=3, dim=6, pooling=pooling, geometry=geometry)
  params = jax.tree.map(np.asarray, head.init(jax.random.PRNGKey(1), hidden, link)["params"])
  params = jax.tree.map(lambda x: getattr(x, "value", x), params,
                        is_leaf=lambda x: hasattr(x, "value"))
  # Non-zero biases so the reference checks them too.
  params = jax.tree.map(lambda x: x + 0.05, params)
  got = np.asarray(head.apply({"params": params}, hidden, link))
  want = _reference(params, hidden, link, pooling, geometry)
  assert got.shape == (2, 3, 5)
  np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_cost_is_linear_in_candidate_pairs():
  """No intermediate grows with tokens x tokens: doubling L with fixed pairs adds O(L) memory."""
  hidden, link = _batch(np.random.default_rng(0), L=64)
  head = LinkingHead(num_labels=3, dim=6, pooling="mean")
  variables = head.init(jax.random.PRNGKey(1), hidden, link)
  jaxpr = jax.make_jaxpr(lambda h: head.apply(variables, h, link))(hidden)
  sizes = [int(np.prod(v.aval.shape)) for eqn in jaxpr.jaxpr.eqns for v in eqn.outvars]
  assert max(sizes) < 64 * 64  # hidden is [2, 64, 8] = 1024; no [L, L] tensor
