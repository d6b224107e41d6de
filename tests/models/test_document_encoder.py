"""Model-level properties of the shared document encoder (every family is one of its configs).

* ETC with a radius covering the sequence equals dense attention over
  `[globals; tokens]` with the same Rich terms (FormNet, GCN included);
* the contents of padded tokens never change real tokens' outputs, and fully padded
  rows stay finite;
* DocPolarBERT and LAGaBi (on RoBERTa / BERT) are invariant to translating every box;
* the pre-training heads: tied MLM output, 1-LOP mask vector, exact extra parameters;
* bad configs and batches fail with messages that name the field.

Models are tiny (width 32, one layer) and parameters come from
`random_parameters` (numpy), so each test compiles one small forward pass.
"""

import jax
import numpy as np
import pytest

from flaxdoc import models

LENGTH = 20
VOCAB = 64
TAGS = 5


def tiny_config(name, variant, **overrides):
  config = models.get_model_config(name, variant, local=True)
  config.update(dict(width=32, num_heads=2, mlp_dim=64, depth=1, dropout_rate=0.0,
                     attention_dropout_rate=0.0))
  if name == "layout_linformer":
    config.linformer_proj_length = 8
  if name == "formnet":
    config.local_radius = 6
    if config.gcn_layers:
      config.gcn_layers = config.gcn_depth = 1
  for key, value in overrides.items():
    config[key] = value
  return config


def build(config, pretraining=False, max_len=LENGTH, dtype="float32"):
  return models.build_model(config, vocab_size=VOCAB, num_tags=TAGS, max_len=max_len,
                            pretraining=pretraining, dtype=dtype)


def batch_for(config, batch_size=2, length=LENGTH, seed=0, **kwargs):
  return models.example_batch(batch_size, length, vocab_size=VOCAB, num_tags=TAGS,
                              graph=models.needs_graph(config), seed=seed, **kwargs)


def forward(model, params, batch):
  return jax.jit(lambda p, b: model.apply({"params": p}, b))(params, batch)


def stack(*batches):
  return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


# ----------------------------------------------------------------- ETC == dense
def test_etc_with_radius_covering_the_sequence_equals_dense_attention():
  """The core ETC check (DESIGN §3.1), at the model level: GCN, global token, Rich terms."""
  etc = tiny_config("formnet", "A1", local_radius=LENGTH)
  dense = tiny_config("formnet", "A1", attention="dense")
  small_radius = tiny_config("formnet", "A1", local_radius=3)
  batch = batch_for(etc, num_pages=2)
  models_ = [build(c) for c in (etc, dense, small_radius)]
  params = models.random_parameters(models_[0], batch, stddev=0.3)
  # Same parameter tree: the dense model's Rich terms sit where ETC's do.
  assert (jax.tree.structure(models.abstract_parameters(models_[1], batch))
          == jax.tree.structure(params))

  @jax.jit
  def run(p, b):
    return [m.apply({"params": p}, b)["tag_logits"] for m in models_]

  out_etc, out_dense, out_local = run(params, batch)
  real = batch["attention_mask"] > 0
  np.testing.assert_allclose(np.asarray(out_etc)[real], np.asarray(out_dense)[real],
                             rtol=1e-4, atol=1e-5)
  # A radius shorter than the sequence really is local: the outputs differ.
  assert np.abs(np.asarray(out_local) - np.asarray(out_dense))[real].max() > 1e-3


# ----------------------------------------------------------------- padding
FAMILIES = [
    ("formnet", "A1"),
    ("docpolarbert", "base"),
    ("lagabi", "roberta_base"),
    ("layout_linformer", "base"),
    ("layout_cosformer", "base/cross"),
]
SLOW_FAMILIES = [
    ("formnet", "A1/etc"),
    ("layoutlm", "base/squircle"),
    ("layoutlm", "base/lspe_sc"),
    ("formnet", "A1/etc_gcn"),
    ("lagabi", "layoutlm_base"),
    ("layoutlm", "base/cross"),
    ("layoutlm", "base/sine"),
    ("layout_cosformer", "base"),
    ("layout_cosformer", "base/squircle"),
]


def scramble_padding(batch, seed):
  """Random contents at padded positions, and graph edges from real tokens into padding."""
  rng = np.random.default_rng(seed)
  out = {k: np.array(v, copy=True) for k, v in batch.items()}
  pad = out["attention_mask"] == 0  # [B, L]
  n = pad.sum()
  out["input_ids"][pad] = rng.integers(0, VOCAB, n)
  out["boxes"][pad] = rng.integers(0, 1001, (n, 4))
  out["page_ids"][pad] = rng.integers(0, 3, n)
  out["positions"][pad] = rng.integers(0, LENGTH, n)
  if "neighbor_ids" in out:
    # Unused slots of real tokens get edges into padded tokens.
    free = ~out["neighbor_mask"][1]  # [L, K]
    padded_nodes = np.flatnonzero(pad[1])
    out["neighbor_ids"][1][free] = rng.choice(padded_nodes, free.sum())
    out["neighbor_mask"][1][free] = True
    out["neighbor_features"][pad] = rng.normal(size=out["neighbor_features"][pad].shape)
  return out


def check_padding_invariance(name, variant):
  config = tiny_config(name, variant)
  model = build(config)
  batch = batch_for(config, seed=1)
  assert batch["attention_mask"][1].min() == 0  # the second row has padding
  empty = {k: np.zeros_like(v[:1]) for k, v in batch.items()}  # an eval padding row
  both = stack(batch, scramble_padding(batch, seed=2), empty)
  params = models.random_parameters(model, batch, stddev=0.2)
  logits = np.asarray(forward(model, params, both)["tag_logits"])
  assert np.isfinite(logits).all()
  real = batch["attention_mask"] > 0
  np.testing.assert_allclose(logits[:2][real], logits[2:4][real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,variant", FAMILIES)
def test_padding_never_changes_real_tokens(name, variant):
  check_padding_invariance(name, variant)


@pytest.mark.slow
@pytest.mark.parametrize("name,variant", SLOW_FAMILIES)
def test_padding_never_changes_real_tokens_more_variants(name, variant):
  check_padding_invariance(name, variant)


# ----------------------------------------------------------------- translation
def check_translation_invariance(name, variant):
  config = tiny_config(name, variant)
  model = build(config)
  batch = batch_for(config, seed=3, num_pages=2)
  boxes = batch["boxes"] * 7 // 10  # within [0, 700]: room to move on the page
  moved = boxes + np.array([230, 170, 230, 170], np.int32)
  shuffled = boxes[:, ::-1].copy()
  params = models.random_parameters(model, batch, stddev=0.2)
  rows = stack(*(dict(batch, boxes=b) for b in (boxes, moved, shuffled)))
  logits = np.split(np.asarray(forward(model, params, rows)["tag_logits"]), 3)
  real = batch["attention_mask"] > 0
  np.testing.assert_allclose(logits[0][real], logits[1][real], rtol=1e-5, atol=2e-5)
  # ...while the layout does matter: other relative positions, other outputs.
  assert np.abs(logits[2] - logits[0])[real].max() > 1e-4


@pytest.mark.parametrize("name,variant", [("docpolarbert", "base"), ("lagabi", "roberta_base")])
def test_logits_unchanged_when_every_box_is_translated(name, variant):
  check_translation_invariance(name, variant)


@pytest.mark.slow
@pytest.mark.parametrize("name,variant", [("lagabi", "bert_base")])
def test_logits_unchanged_when_every_box_is_translated_more_variants(name, variant):
  check_translation_invariance(name, variant)


# ----------------------------------------------------------------- heads
def test_pretraining_heads_and_their_parameters():
  config = tiny_config("docpolarbert", "base")
  e, v = config.width, VOCAB
  batch = batch_for(config, pretraining=True)
  finetune = models.count_tree(models.abstract_parameters(build(config), batch))
  pretrain_model = build(config, pretraining=True)
  pretrain = models.count_tree(models.abstract_parameters(pretrain_model, batch))
  transform = e * e + e + 2 * e  # dense + LayerNorm
  mlm = transform + v  # the output matrix is the token table: only a bias is added
  lop = transform + e * 11 + 11
  assert pretrain - finetune == mlm + lop + e  # + the learned mask-position vector

  # No [V, E] output matrix above: the MLM logits go through the token table (tied).

  # 1-LOP: hidden tokens get the mask-position vector, so their embedding no longer
  # depends on their 1D position. Rows: the batch, the batch with the hidden tokens'
  # positions shifted, the batch without 1-LOP; one compiled call.
  hidden = batch["lop_mask"] & (batch["attention_mask"] > 0)
  assert hidden.any() and (~hidden).any()
  shifted = dict(batch, positions=np.where(hidden, (batch["positions"] + 5) % LENGTH,
                                           batch["positions"]))
  no_lop = dict(batch, lop_mask=np.zeros_like(batch["lop_mask"]))
  params = models.random_parameters(pretrain_model, batch, stddev=0.2)

  @jax.jit
  def run(p, b):
    out, state = pretrain_model.apply({"params": p}, b, capture_intermediates=True,
                                      mutable=["intermediates"])
    return out, state["intermediates"]["embeddings"]["__call__"][0]

  out, embedded = run(params, stack(batch, shifted, no_lop))
  assert out["mlm_logits"].shape == (6, LENGTH, VOCAB)
  assert out["lop_logits"].shape == (6, LENGTH, 11)
  assert out["tag_logits"].shape == (6, LENGTH, TAGS)
  a, b, c = np.split(np.asarray(embedded), 3)
  np.testing.assert_allclose(a[hidden], b[hidden], atol=1e-6)
  assert np.abs(c[hidden] - a[hidden]).max() > 1e-3  # the mask vector is really used
  assert np.abs(b[~hidden] - a[~hidden]).max() == 0


# ----------------------------------------------------------------- errors
def test_bad_configs_name_the_field():
  with pytest.raises(ValueError, match="unknown model"):
    models.get_model_config("bert2d", "base")
  with pytest.raises(ValueError, match="A4"):
    models.get_model_config("formnet", "A4")
  with pytest.raises(ValueError, match="ablation"):
    models.get_model_config("formnet", "A1/no_such")
  config = models.get_model_config("layout_linformer", "base", local=True)
  config.fixed_bias = "squircle"
  with pytest.raises(ValueError, match="pairwise layout terms"):
    build(config, max_len=512)
  config = models.get_model_config("layoutlm", "base", local=True)
  with pytest.raises(ValueError, match="max_position_embeddings"):
    build(config, max_len=600)
  config.num_heads = 5
  with pytest.raises(ValueError, match="num_heads"):
    build(config)
  config = models.get_model_config("layoutlm", "base", local=True)
  config.positions = "rope"
  with pytest.raises(ValueError, match="config.model.positions"):
    build(config)
  del config["name"]
  with pytest.raises(ValueError, match="name"):
    build(config)


def test_bad_batches_name_the_key():
  config = tiny_config("formnet", "A1")
  model = build(config)
  batch = batch_for(config)
  params = models.random_parameters(model, batch)

  def shape_of(b):
    return jax.eval_shape(lambda p, x: model.apply({"params": p}, x), params, b)

  assert shape_of(batch)["tag_logits"].shape == (2, LENGTH, TAGS)
  no_graph = {k: v for k, v in batch.items() if not k.startswith("neighbor")}
  with pytest.raises(ValueError, match="neighbor_ids.*needs_graph"):
    shape_of(no_graph)
  with pytest.raises(ValueError, match="attention_mask"):
    shape_of({k: v for k, v in batch.items() if k != "attention_mask"})
  with pytest.raises(ValueError, match=r"boxes"):
    shape_of(dict(batch, boxes=batch["boxes"][..., :2]))
  assert not models.needs_graph(tiny_config("formnet", "A1/etc_rich"))
  assert models.needs_graph(config)


# ----------------------------------------------------------------- real batches
def test_featurised_windows_run_through_the_models():
  """The featuriser's own batches (graph and 1-LOP keys included) feed FormNet and DocPolarBERT."""
  from flaxdoc.data import masking, tokenizers  # pylint: disable=import-outside-toplevel
  from flaxdoc.data.features import FeatureConfig, batch_features, featurize
  from flaxdoc.data.synthetic import make_document
  tokenizer = tokenizers.default_tokenizer()
  formnet_config = tiny_config("formnet", "A1")
  features = FeatureConfig(max_len=48, graph=models.needs_graph(formnet_config), labels=(),
                           scheme="BIOES")
  windows = featurize(make_document(0, 0), tokenizer, features)[:2]
  batch = batch_features((windows * 2)[:2])
  batch = masking.pretraining_targets(batch, np.random.default_rng(0), tokenizer, mlm_rate=0.3,
                                      lop_rate=0.3)
  polar_config = tiny_config("docpolarbert", "base")
  for config, pretraining in ((formnet_config, False), (polar_config, True)):
    model = models.build_model(config, vocab_size=tokenizer.vocab_size, num_tags=3, max_len=48,
                               pretraining=pretraining)
    params = models.random_parameters(model, batch, stddev=0.2)
    out = forward(model, params, batch)
    assert out["tag_logits"].shape == (2, 48, 3)
    assert all(np.isfinite(np.asarray(v)).all() for v in out.values())
    if pretraining:
      assert out["mlm_logits"].shape == (2, 48, tokenizer.vocab_size)
      assert out["lop_logits"].shape == (2, 48, 11)


# ----------------------------------------------------------------- row padding
PAD = 8
# Compile options for the padding comparisons: on a 2-core CPU LLVM's optimisation is most
# of a small model's gradient compile (11 s -> 4 s for the FormNet one); both sides of a
# comparison compile alike, so it cannot hide a difference between them.
QUICK_COMPILE = dict(xla_backend_optimization_level=0, xla_llvm_disable_expensive_passes=True)


def outputs_and_gradients(model, params, batch):
  """Tag and MLM logits, the gradient of a fixed random projection of both, and the rows the
  encoder's layers ran over (its captured output's)."""
  def loss(p):
    out, state = model.apply({"params": p}, batch, capture_intermediates=True,
                             mutable=["intermediates"])
    total = 0.0
    for i, key in enumerate(("tag_logits", "mlm_logits")):
      weights = jax.random.normal(jax.random.key(i), out[key].shape)
      total = total + (out[key] * weights).sum()
    encoded = state["intermediates"]["encoder"]["__call__"][0]  # [B, R, E]
    return total, ({k: out[k] for k in ("tag_logits", "mlm_logits")}, encoded)

  step = jax.jit(jax.value_and_grad(loss, has_aux=True))
  (_, (out, encoded)), grads = step.lower(params).compile(QUICK_COMPILE)(params)
  return out, grads, encoded.shape[1]


PADDED = [
    ("formnet", "A1", {}),  # ETC (XLA) + Rich Attention + GCN, one global: 21 -> 24 rows
    ("formnet", "A1", {"attention": "dense"}),  # the global in dense attention (LongPairsOnly)
    pytest.param("formnet", "A1", {"etc_kernel": "pallas"}, marks=pytest.mark.slow),
    pytest.param("docpolarbert", "base", {}, marks=pytest.mark.slow),  # no global: 20 -> 24
    pytest.param("layout_linformer", "base", {}, marks=pytest.mark.slow),
    pytest.param("layout_cosformer", "base/cross", {}, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name,variant,overrides", PADDED)
def test_padded_rows_change_no_output_and_no_gradient(name, variant, overrides):
  configs = [tiny_config(name, variant, pad_to_multiple_of=m, **overrides) for m in (1, PAD)]
  # Linformer's projections are sized for max_len, which must then be a multiple of PAD.
  max_len = 24 if name == "layout_linformer" else LENGTH
  unpadded, padded = (build(c, pretraining=True, max_len=max_len) for c in configs)
  batch = batch_for(configs[0], pretraining=True)
  assert batch["attention_mask"].min() == 0  # the batch's own padding is there too
  params = models.random_parameters(unpadded, batch, stddev=0.2)
  rows = LENGTH + configs[0].num_globals
  assert rows % PAD
  (out, grads, encoded_rows), (out_padded, grads_padded, padded_rows) = (
      outputs_and_gradients(m, params, batch) for m in (unpadded, padded))
  # The padded model really ran its layers over padded rows...
  assert (encoded_rows, padded_rows) == (rows, -(-rows // PAD) * PAD)
  # ...and computed the same outputs and gradients.
  for key in out:
    assert np.isfinite(np.asarray(out_padded[key])).all()
    np.testing.assert_allclose(out_padded[key], out[key], rtol=1e-5, atol=1e-5, err_msg=key)
  flat = dict(jax.tree_util.tree_leaves_with_path(grads))
  for path, g in jax.tree_util.tree_leaves_with_path(grads_padded):
    # Dense softmaxes sum over more (masked) keys, in another order: rounding, on the
    # scale of the leaf (gradients of up to ~5 here).
    scale = max(1.0, float(np.abs(flat[path]).max()))
    np.testing.assert_allclose(g, flat[path], rtol=1e-5, atol=1e-5 * scale,
                               err_msg=jax.tree_util.keystr(path))


def test_a_row_count_already_a_multiple_is_not_padded():
  configs = [tiny_config("formnet", "A1", pad_to_multiple_of=m) for m in (1, PAD)]

  def program(length):
    unpadded, padded = (build(c, max_len=length) for c in configs)
    batch = batch_for(configs[0], length=length)
    params = models.random_parameters(unpadded, batch)
    return [str(jax.make_jaxpr(lambda p, m=m: m.apply({"params": p}, batch))(params))
            for m in (unpadded, padded)]

  # 23 tokens and the global: 24 rows, so padding to 8 traces to the very same program...
  unpadded, padded = program(3 * PAD - 1)
  assert padded == unpadded
  # ...which it does not at 21 rows.
  unpadded, padded = program(LENGTH)
  assert padded != unpadded


def test_pad_rows_pads_with_masked_zero_rows():
  from flaxdoc.models.document_encoder import pad_rows  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 5, 3)).astype(np.float32)
  mask = np.ones((2, 5), bool)
  geom = {"centers": rng.normal(size=(2, 5, 2)).astype(np.float32),
          "positions": np.arange(10, dtype=np.int32).reshape(2, 5),
          "is_long": np.ones((2, 5), bool)}
  px, pmask, pgeom = pad_rows(x, mask, geom, 4)
  assert px.shape == (2, 8, 3) and pmask.shape == (2, 8)
  np.testing.assert_array_equal(px[:, :5], x)
  assert not np.asarray(px[:, 5:]).any() and not np.asarray(pmask[:, 5:]).any()
  assert pmask[:, :5].all()
  for key, leaf in geom.items():
    assert pgeom[key].shape == (2, 8) + leaf.shape[2:] and pgeom[key].dtype == leaf.dtype
    np.testing.assert_array_equal(pgeom[key][:, :5], leaf)
    assert not np.asarray(pgeom[key][:, 5:]).any()
  assert pad_rows(x, mask, None, 4)[2] is None
  # A multiple already (and 1, off): the very same arrays back.
  assert all(a is b for a, b in zip(pad_rows(x, mask, geom, 5), (x, mask, geom)))
  assert all(a is b for a, b in zip(pad_rows(x, mask, geom, 1), (x, mask, geom)))


def test_pad_to_multiple_of_is_checked():
  from flaxdoc.models.document_encoder import EncoderSpec  # pylint: disable=import-outside-toplevel
  for bad in (0, -8, 2.5, True, "8", None):
    with pytest.raises(ValueError, match="config.model.pad_to_multiple_of"):
      EncoderSpec(pad_to_multiple_of=bad).validate()
  assert EncoderSpec(pad_to_multiple_of=8).validate().pad_to_multiple_of == 8
  # Linformer: a full-length batch, rounded up, would not fit the projections' max_len.
  linformer = tiny_config("layout_linformer", "base", pad_to_multiple_of=PAD)
  with pytest.raises(ValueError, match=r"pad_to_multiple_of.*max_len=20\b"):
    build(linformer, max_len=LENGTH)
  model = build(linformer, max_len=24)
  batch = batch_for(linformer)
  # Built without validation (max_len changed after it), the model says so itself.
  with pytest.raises(ValueError, match="pad_to_multiple_of=8 pads the batch's 20 rows to 24"):
    jax.eval_shape(model.clone(max_len=LENGTH).init, jax.random.key(0), batch)
