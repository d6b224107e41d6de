"""Tests for flaxdoc.nn.embeddings: LSPE against numpy, LayoutLM tables, switches, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from scipy.special import erf

from flaxdoc.layout.sine import sine_features
from flaxdoc.nn.embeddings import LSPE, Embeddings

VOCAB, WIDTH, BATCH, LENGTH = 40, 16, 2, 7
EPS = 1e-12


def np_gelu(x):
  return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def np_layer_norm(x, p, eps=EPS):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * np.asarray(p["scale"]) + np.asarray(p["bias"])


def np_sine(positions, dim):
  # The sine features themselves are tested in tests/layout; here they are an input.
  return np.asarray(sine_features(jnp.asarray(positions, jnp.float32), dim), np.float64)


def np_lspe(p, positions, skip):
  """LSPE(p) = W2 gelu(W1 PE_sine(p) + b1) + b2 (+ PE_sine(p)), written out in numpy."""
  s = np_sine(positions, WIDTH)
  h = np_gelu(s @ np.asarray(p["fc1"]["kernel"]) + np.asarray(p["fc1"]["bias"]))
  out = h @ np.asarray(p["fc2"]["kernel"]) + np.asarray(p["fc2"]["bias"])
  return out + s if skip else out


def make_inputs(seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, VOCAB, (BATCH, LENGTH)).astype(np.int32)
  x = np.sort(rng.integers(0, 1001, (BATCH, LENGTH, 2)), axis=-1)
  y = np.sort(rng.integers(0, 1001, (BATCH, LENGTH, 2)), axis=-1)
  boxes = np.stack([x[..., 0], y[..., 0], x[..., 1], y[..., 1]], -1).astype(np.int32)
  pages = rng.integers(0, 3, (BATCH, LENGTH)).astype(np.int32)
  types = rng.integers(0, 2, (BATCH, LENGTH)).astype(np.int32)
  positions = rng.permutation(LENGTH * 3)[:BATCH * LENGTH].reshape(BATCH, LENGTH).astype(np.int32)
  return ids, boxes, pages, types, positions


def init(module, *args, **kwargs):
  # Jitted: one compilation instead of op-by-op dispatch keeps the file fast.
  variables = jax.jit(module.init)(jax.random.key(0), *args, **kwargs)
  return variables, nn.unbox(variables)["params"]


def apply(module, variables, *args, **kwargs):
  return jax.jit(module.apply)(variables, *args, **kwargs)


def table(p, name):
  return np.asarray(p[name]["embedding"], np.float64)


def test_lspe_matches_numpy_reference():
  positions = np.array([[0.0, 1.0, 2.5, 999.0], [1000.0, 17.25, 3.0, 512.0]])
  module = LSPE(WIDTH, hidden_features=24)
  variables, p = init(module, positions)
  assert p["fc1"]["kernel"].shape == (WIDTH, 24)
  got = apply(module, variables, positions)
  np.testing.assert_allclose(got, np_lspe(p, positions, skip=False), rtol=1e-5, atol=1e-6)


def test_lspe_skip_adds_exactly_the_sine_term():
  positions = np.linspace(0, 1000, 11)
  variables, _ = init(LSPE(WIDTH), positions)
  plain = apply(LSPE(WIDTH), variables, positions)
  skip = apply(LSPE(WIDTH, skip=True), variables, positions)
  np.testing.assert_allclose(skip - plain, np_sine(positions, WIDTH), atol=1e-6)


def test_learned_layoutlm_tables_match_reference():
  ids, boxes, pages, types, positions = make_inputs(1)
  module = Embeddings(VOCAB, WIDTH, max_length=32, page=True, max_pages=4, type_vocab_size=2)
  variables, p = init(module, ids, positions=positions, boxes=boxes, pages=pages,
                      token_types=types)
  got = apply(module, variables, ids, positions=positions, boxes=boxes, pages=pages,
                     token_types=types)
  x_t, y_t = table(p, "x_position_embeddings"), table(p, "y_position_embeddings")
  want = np.zeros((BATCH, LENGTH, WIDTH))
  for b in range(BATCH):
    for i in range(LENGTH):
      x0, y0, x1, y1 = boxes[b, i]
      want[b, i] = (table(p, "word_embeddings")[ids[b, i]]
                    + table(p, "position_embeddings")[positions[b, i]]
                    + x_t[x0] + y_t[y0] + x_t[x1] + y_t[y1]
                    + table(p, "h_position_embeddings")[y1 - y0]
                    + table(p, "w_position_embeddings")[x1 - x0]
                    + table(p, "page_embeddings")[pages[b, i]]
                    + table(p, "token_type_embeddings")[types[b, i]])
  np.testing.assert_allclose(got, np_layer_norm(want, p["layer_norm"]), rtol=1e-4, atol=1e-5)
  assert p["x_position_embeddings"]["embedding"].shape == (1024, WIDTH)


@pytest.mark.parametrize("skip", [False, True])
def test_lspe_position_term_matches_reference(skip):
  ids, boxes, _, _, positions = make_inputs(2)
  boxes = boxes.astype(np.float32) + 0.5  # LSPE accepts fractional coordinates
  kind = "lspe_skip" if skip else "lspe"
  module = Embeddings(VOCAB, WIDTH, position_1d=kind, position_2d=kind)
  variables, p = init(module, ids, positions=positions, boxes=boxes)
  got = apply(module, variables, ids, positions=positions, boxes=boxes)
  # LSPE_1d(p) + LSPE_x(x0) + LSPE_y(y0) + LSPE_x(x1) + LSPE_y(y1): separate networks.
  term = (np_lspe(p["position_lspe"], positions, skip)
          + np_lspe(p["x_lspe"], boxes[..., 0], skip) + np_lspe(p["y_lspe"], boxes[..., 1], skip)
          + np_lspe(p["x_lspe"], boxes[..., 2], skip) + np_lspe(p["y_lspe"], boxes[..., 3], skip))
  want = np_layer_norm(table(p, "word_embeddings")[ids] + term, p["layer_norm"])
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert not {"x_position_embeddings", "position_embeddings"} & set(p)


def test_sine_2d_sums_the_four_corners():
  ids, boxes, _, _, _ = make_inputs(12)
  module = Embeddings(VOCAB, WIDTH, position_1d="none", position_2d="sine")
  variables, p = init(module, ids, boxes=boxes)
  got = apply(module, variables, ids, boxes=boxes)
  sines = sum(np_sine(boxes[..., c], WIDTH) for c in range(4))
  want = np_layer_norm(table(p, "word_embeddings")[ids] + sines, p["layer_norm"])
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert set(p) == {"word_embeddings", "layer_norm"}


def test_sine_1d_and_default_positions():
  ids = make_inputs(3)[0]
  module = Embeddings(VOCAB, WIDTH, position_1d="sine", position_2d="none")
  variables, p = init(module, ids)
  got = apply(module, variables, ids)  # positions default to 0..N-1
  sine = np_sine(np.broadcast_to(np.arange(LENGTH), (BATCH, LENGTH)), WIDTH)
  want = np_layer_norm(table(p, "word_embeddings")[ids] + sine, p["layer_norm"])
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert set(p) == {"word_embeddings", "layer_norm"}


@pytest.mark.parametrize("kwargs,expected", [
    (dict(position_1d="none", position_2d="none"), {"word_embeddings", "layer_norm"}),
    (dict(position_2d="none"), {"word_embeddings", "position_embeddings", "layer_norm"}),
    (dict(box_size=False), {"word_embeddings", "position_embeddings", "x_position_embeddings",
                            "y_position_embeddings", "layer_norm"}),
    (dict(position_1d="lspe", position_2d="none", page=True, mask_position=True),
     {"word_embeddings", "position_lspe", "page_embeddings", "mask_position_embedding",
      "layer_norm"}),
])
def test_switches_create_only_their_parameters(kwargs, expected):
  ids, boxes, pages, _, _ = make_inputs(4)
  module = Embeddings(VOCAB, WIDTH, **kwargs)
  variables, p = init(module, ids, boxes=boxes, pages=pages)
  assert set(p) == expected
  out = apply(module, variables, ids, boxes=boxes, pages=pages)
  assert out.shape == (BATCH, LENGTH, WIDTH)


def test_everything_off_is_layer_norm_of_tokens():
  ids = make_inputs(5)[0]
  module = Embeddings(VOCAB, WIDTH, position_1d="none", position_2d="none")
  variables, p = init(module, ids)
  want = np_layer_norm(table(p, "word_embeddings")[ids], p["layer_norm"])
  np.testing.assert_allclose(apply(module, variables, ids), want, rtol=1e-4, atol=1e-5)


def test_position_mask_replaces_only_the_1d_term():
  ids, boxes, _, _, _ = make_inputs(6)
  position_mask = np.zeros((BATCH, LENGTH), bool)
  position_mask[0, [1, 4]] = True
  position_mask[1, 0] = True
  module = Embeddings(VOCAB, WIDTH, box_size=False, mask_position=True)
  variables, p = init(module, ids, boxes=boxes)
  got = apply(module, variables, ids, boxes=boxes, position_mask=position_mask)
  pos = np.broadcast_to(table(p, "position_embeddings")[:LENGTH], (BATCH, LENGTH, WIDTH))
  pos = np.where(position_mask[..., None], np.asarray(p["mask_position_embedding"]), pos)
  layout = (table(p, "x_position_embeddings")[boxes[..., 0]]
            + table(p, "y_position_embeddings")[boxes[..., 1]]
            + table(p, "x_position_embeddings")[boxes[..., 2]]
            + table(p, "y_position_embeddings")[boxes[..., 3]])
  want = np_layer_norm(table(p, "word_embeddings")[ids] + pos + layout, p["layer_norm"])
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  plain = apply(module, variables, ids, boxes=boxes)
  np.testing.assert_array_equal(np.asarray(got)[~position_mask], np.asarray(plain)[~position_mask])


def test_dropout_and_determinism():
  ids, boxes, _, _, _ = make_inputs(7)
  module = Embeddings(VOCAB, WIDTH, dropout_rate=0.5)
  variables, _ = init(module, ids, boxes=boxes)
  run = jax.jit(lambda v, rng, train: module.apply(v, ids, boxes=boxes, deterministic=not train,
                                                   rngs={"dropout": rng}), static_argnums=2)
  a = run(variables, jax.random.key(1), False)
  np.testing.assert_array_equal(a, run(variables, jax.random.key(2), False))
  c = np.asarray(run(variables, jax.random.key(1), True))
  assert np.mean(c == 0) > 0.2
  kept = c != 0
  np.testing.assert_allclose(c[kept], 2 * np.asarray(a)[kept], rtol=1e-5)


def test_bfloat16_compute_and_logical_axes():
  ids, boxes, _, _, _ = make_inputs(8)
  module = Embeddings(VOCAB, WIDTH, dtype=jnp.bfloat16)
  variables = jax.jit(module.init)(jax.random.key(0), ids, boxes=boxes)
  assert apply(module, variables, ids, boxes=boxes).dtype == jnp.bfloat16
  boxed = variables["params"]["word_embeddings"]["embedding"]
  assert isinstance(boxed, nn.LogicallyPartitioned) and boxed.names == ("vocab", "embed")
  assert boxed.value.dtype == jnp.float32


def test_attend_is_the_transposed_token_table():
  ids = make_inputs(9)[0]
  module = Embeddings(VOCAB, WIDTH, position_2d="none")
  variables, p = init(module, ids)
  query = np.random.default_rng(0).normal(size=(3, WIDTH)).astype(np.float32)
  got = module.apply(variables, query, method=Embeddings.attend)
  assert got.shape == (3, VOCAB)
  np.testing.assert_allclose(got, query @ table(p, "word_embeddings").T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vocab", [VOCAB, 128, 300])
def test_attend_pads_the_product_not_the_values(vocab):
  # The product runs over the table padded to a multiple of 128 rows; the logits and
  # both gradients are those of the plain product, and the parameter keeps its size.
  from flaxdoc.nn.embeddings import VOCAB_PRODUCT_MULTIPLE
  ids = np.arange(7).reshape(1, 7)
  module = Embeddings(vocab, WIDTH, position_2d="none", dtype=jnp.bfloat16)
  variables, p = init(module, ids)
  assert p["word_embeddings"]["embedding"].shape == (vocab, WIDTH)
  query = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, WIDTH)), jnp.float32)
  weights = jnp.asarray(np.random.default_rng(2).normal(size=(2, 3, vocab)), jnp.float32)

  def loss(v, q):
    logits = module.apply(v, q, method=Embeddings.attend)
    return (logits.astype(jnp.float32) * weights).sum(), logits

  (_, logits), (g_v, g_q) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
      variables, query)
  t = jnp.asarray(p["word_embeddings"]["embedding"]).astype(jnp.bfloat16)
  q16 = query.astype(jnp.bfloat16)
  want = jnp.einsum("bqe,ve->bqv", q16, t)
  assert logits.shape == (2, 3, vocab) and logits.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(logits, np.float32), np.asarray(want, np.float32))
  w = np.asarray(weights, np.float64)
  g_table = nn.unbox(g_v)["params"]["word_embeddings"]["embedding"]
  assert g_table.shape == (vocab, WIDTH)
  np.testing.assert_allclose(g_table, np.einsum("bqv,bqe->ve", w, np.asarray(q16, np.float64)),
                             rtol=2e-2, atol=2e-2)
  np.testing.assert_allclose(g_q, np.einsum("bqv,ve->bqe", w, np.asarray(t, np.float64)),
                             rtol=2e-2, atol=2e-2)
  padded = -(-vocab // VOCAB_PRODUCT_MULTIPLE) * VOCAB_PRODUCT_MULTIPLE
  text = jax.jit(lambda v, q: module.apply(v, q, method=Embeddings.attend)).lower(
      variables, query).as_text()
  product = text.split("dot_general")[1].split("\n")[0]
  assert product.endswith(f"-> tensor<2x3x{padded}xbf16>"), product


def test_bad_inputs_raise_clear_errors():
  ids, boxes, pages, _, _ = make_inputs(10)
  module = Embeddings(VOCAB, WIDTH, page=True, max_pages=4)
  variables = jax.jit(module.init)(jax.random.key(0), ids, boxes=boxes, pages=pages)
  with pytest.raises(ValueError, match="boxes"):
    module.apply(variables, ids, pages=pages)
  with pytest.raises(ValueError, match="pages"):
    module.apply(variables, ids, boxes=boxes)
  with pytest.raises(ValueError, match="input_ids"):
    module.apply(variables, np.full_like(ids, VOCAB), boxes=boxes, pages=pages)
  with pytest.raises(ValueError, match="pages"):
    module.apply(variables, ids, boxes=boxes, pages=pages + 4)
  with pytest.raises(ValueError, match=r"boxes\[x\]"):
    module.apply(variables, ids, boxes=boxes + 1024, pages=pages)
  with pytest.raises(ValueError, match="shape"):
    module.apply(variables, ids, boxes=boxes[:, :3], pages=pages)
  with pytest.raises(ValueError, match="position_mask"):
    module.apply(variables, ids, boxes=boxes, pages=pages,
                 position_mask=np.ones_like(ids, bool))
  with pytest.raises(ValueError, match="position_1d"):
    Embeddings(VOCAB, WIDTH, position_1d="rotary").init(jax.random.key(0), ids)


def test_out_of_range_ids_under_jit_stay_finite():
  ids, boxes, _, _, _ = make_inputs(11)
  module = Embeddings(VOCAB, WIDTH)
  variables = jax.jit(module.init)(jax.random.key(0), ids, boxes=boxes)
  jitted = jax.jit(lambda v, i, bx: module.apply(v, i, boxes=bx))
  out = jitted(variables, ids + 10 * VOCAB, boxes + 5000)
  assert np.isfinite(np.asarray(out)).all()
