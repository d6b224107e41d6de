"""Tests for flaxdoc.nn.heads: shapes, the tied MLM head, 1-LOP targets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from scipy.special import erf

from flaxdoc.nn.embeddings import Embeddings
from flaxdoc.nn.heads import (LOCAL_ORDER_CLASSES, LocalOrderHead, MLMHead, TaggingHead,
                              local_order_targets)

BATCH, LENGTH, WIDTH, VOCAB = 2, 5, 8, 30


def np_gelu(x):
  return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def np_layer_norm(x, p, eps=1e-12):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * np.asarray(p["scale"]) + np.asarray(p["bias"])


def states(seed=0):
  return np.random.default_rng(seed).normal(size=(BATCH, LENGTH, WIDTH)).astype(np.float32)


class MaskedLM(nn.Module):
  """Embeddings + tied MLM head; the head reads `x` directly so that the only path
  from the token table to the logits is the tied output layer."""

  @nn.compact
  def __call__(self, ids, x):
    embeddings = Embeddings(VOCAB, WIDTH, position_2d="none", name="embeddings")
    del ids
    return MLMHead(embedding=embeddings, vocab_size=VOCAB, name="mlm")(x)


@pytest.mark.parametrize("hidden", [False, True])
def test_tagging_head_shapes_and_linear_form(hidden):
  x = states(1)
  module = TaggingHead(num_tags=9, hidden=hidden)
  variables = module.init(jax.random.key(0), x)
  logits = jax.jit(module.apply)(variables, x)
  assert logits.shape == (BATCH, LENGTH, 9) and logits.dtype == jnp.float32
  p = nn.unbox(variables)["params"]
  h = x
  if hidden:
    h = np.tanh(x @ np.asarray(p["hidden"]["kernel"]) + np.asarray(p["hidden"]["bias"]))
  want = h @ np.asarray(p["output"]["kernel"]) + np.asarray(p["output"]["bias"])
  np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-6)
  assert variables["params"]["output"]["kernel"].names[-1] == "classes"


def test_mlm_head_is_tied_to_the_token_table():
  x = states(2)
  ids = np.zeros((BATCH, LENGTH), np.int32)
  model = MaskedLM()
  variables = model.init(jax.random.key(0), ids, x)
  p = nn.unbox(variables)["params"]
  # No separate output matrix: the only [*, VOCAB] parameter is the token table.
  shapes = [a.shape for a in jax.tree.leaves(p)]
  assert sum(VOCAB in s for s in shapes) == 2  # the table [V, E] and the bias [V]
  assert p["embeddings"]["word_embeddings"]["embedding"].shape == (VOCAB, WIDTH)
  assert p["mlm"]["bias"].shape == (VOCAB,)

  logits = jax.jit(model.apply)(variables, ids, x)
  t = p["mlm"]["transform"]
  h = np_gelu(x @ np.asarray(t["dense"]["kernel"]) + np.asarray(t["dense"]["bias"]))
  h = np_layer_norm(h, t["layer_norm"])
  table = np.asarray(p["embeddings"]["word_embeddings"]["embedding"])
  np.testing.assert_allclose(logits, h @ table.T + np.asarray(p["mlm"]["bias"]),
                             rtol=1e-4, atol=1e-5)

  # The MLM loss trains the token table through the output layer.
  targets = np.random.default_rng(3).integers(0, VOCAB, (BATCH, LENGTH))

  def loss(params):
    out = model.apply({"params": params}, ids, x)
    return -jnp.take_along_axis(jax.nn.log_softmax(out), targets[..., None], -1).mean()

  grads = jax.jit(jax.grad(loss))(p)
  table_grad = np.asarray(grads["embeddings"]["word_embeddings"]["embedding"])
  assert (np.abs(table_grad).sum(axis=1) > 0).all()  # every row gets softmax gradient


def test_mlm_head_vocab_mismatch_raises():
  class Wrong(nn.Module):
    @nn.compact
    def __call__(self, x):
      emb = Embeddings(VOCAB, WIDTH, position_2d="none", name="embeddings")
      return MLMHead(embedding=emb, vocab_size=VOCAB + 1)(x)

  with pytest.raises(ValueError, match="vocab_size"):
    Wrong().init(jax.random.key(0), states(4))


@pytest.mark.parametrize("transform", [True, False])
def test_local_order_head(transform):
  x = states(5)
  module = LocalOrderHead(transform=transform)
  variables = module.init(jax.random.key(0), x)
  logits = jax.jit(module.apply)(variables, x)
  assert logits.shape == (BATCH, LENGTH, LOCAL_ORDER_CLASSES) == (BATCH, LENGTH, 11)
  assert ("transform" in variables["params"]) == transform


def test_local_order_targets_match_loop():
  rng = np.random.default_rng(6)
  segments = np.repeat(rng.integers(0, 4, (3, 40)), rng.integers(1, 6, 40), axis=1)[:, :60]
  segments[2, :] = 7  # one segment longer than 11 tokens
  valid = np.ones(segments.shape, bool)
  valid[1, -5:] = False
  got = np.asarray(local_order_targets(segments, valid))
  want = np.zeros(segments.shape, np.int32)
  for b in range(segments.shape[0]):
    run = 0
    for i in range(segments.shape[1]):
      run = run + 1 if i and segments[b, i] == segments[b, i - 1] else 0
      want[b, i] = min(run, 10) if valid[b, i] else 0
  np.testing.assert_array_equal(got, want)
  assert got.max() == 10
