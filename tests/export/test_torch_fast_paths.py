"""The PyTorch export's fast paths compute what the reference forms compute.

Fast (default): GCN second layer once per node, dense and ETC attention through
`scaled_dot_product_attention`. Reference (`set_fast_paths(model, False)`): per-edge
messages, einsum + masked softmax. Both against each other on random inputs, the
fast one against Flax, and the fast FormNet through `torch.export` and `torch.compile`.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_helpers as H  # noqa: E402

from flaxdoc.export import weights as weights_lib  # noqa: E402
from flaxdoc.export.torch import build_torch_model  # noqa: E402
from flaxdoc.export.torch import layers as L  # noqa: E402

MAX_LEN = 64
TOL = 1e-4


def _randomise(module, seed):
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in module.parameters():
      p.copy_(0.1 * torch.randn(p.shape, generator=g))


def _both(module, *args):
  with torch.no_grad():
    L.set_fast_paths(module, True)
    fast = module(*args)
    L.set_fast_paths(module, False)
    slow = module(*args)
    L.set_fast_paths(module, True)
  return fast.numpy(), slow.numpy()


def _etc_mask(total, globals_):
  """Two rows of `total` tokens: a padded tail, a run of padding inside a document and,
  with more than one global, an invalid global."""
  mask = torch.ones(2, total, dtype=torch.bool)
  mask[1, 12:] = False
  mask[0, globals_ + 4:globals_ + 9] = False  # a run of padding inside a document
  if globals_ > 1:
    mask[1, 1] = False  # an invalid global
  return mask


def _etc_fast_and_reference(attn, x, mask, terms, geom, grad):
  """`_both`, or with `grad` the fast path run with gradients on (the concatenating form:
  the CPU kernel with a log-sum-exp takes no gradient for the mask)."""
  if not grad:
    return _both(attn, x, mask, terms, geom)
  with torch.enable_grad():
    fast = attn(x, mask, terms, geom)
    assert fast.requires_grad
  L.set_fast_paths(attn, False)
  with torch.no_grad():
    slow = attn(x, mask, terms, geom)
  L.set_fast_paths(attn, True)
  return fast.detach().numpy(), slow.numpy()


@pytest.mark.parametrize("seed", [0, 1])
def test_gcn_once_per_node_equals_per_edge_messages(seed):
  g = torch.Generator().manual_seed(100 + seed)
  layer = L.GCNLayer(width=12, edge_features=5, hidden=29)
  _randomise(layer, seed)
  b, n, k = 2, 9, 4
  h = torch.randn(b, n, 12, generator=g)
  ids = torch.randint(-1, n + 2, (b, n, k), generator=g)  # out-of-range ids on masked slots
  nb_mask = torch.rand(b, n, k, generator=g) < 0.6
  nb_mask[0, 0] = False  # a node with no neighbour keeps LayerNorm(h)
  ids = torch.where(nb_mask, ids.clamp(0, n - 1), ids)
  feats = torch.randn(b, n, k, 5, generator=g)
  node_mask = torch.ones(b, n, dtype=torch.bool)
  node_mask[1, -3:] = False
  fast, slow = _both(layer, h, ids, feats, nb_mask, node_mask)
  np.testing.assert_allclose(fast, slow, atol=1e-5, rtol=0)


@pytest.mark.parametrize("with_terms", [False, True])
def test_dense_sdpa_equals_masked_softmax(with_terms):
  g = torch.Generator().manual_seed(7)
  attn = L.DenseSelfAttention(width=16, heads=4)
  rich = L.RichAttentionTerm(heads=4, head_dim=4, axes=("x", "y"))
  _randomise(attn, 1)
  _randomise(rich, 2)
  x = torch.randn(2, 10, 16, generator=g)
  mask = torch.ones(2, 10, dtype=torch.bool)
  mask[1, 6:] = False  # padded queries: zero output, like the reference
  geom = {"centers": 1000 * torch.rand(2, 10, 2, generator=g)}
  terms = [rich] if with_terms else []
  fast, slow = _both(attn, x, mask, terms, geom)
  np.testing.assert_allclose(fast, slow, atol=1e-5, rtol=0)


@pytest.mark.parametrize("relative,with_terms,grad,query_block,globals_", [
    (False, True, False, None, 2), (True, True, False, None, 2), (True, False, False, None, 2),
    (False, False, False, None, 2), (True, True, True, None, 2),
    # Query blocks of 1, one that does not divide the 17 tokens, and one longer than them.
    (True, True, False, 1, 2), (False, True, False, 5, 2), (True, True, False, 40, 2),
    (True, True, False, 3, 0), (False, True, True, 6, 1), (False, True, False, 28, 1),
    (True, False, False, 2, 1)])
def test_etc_sdpa_equals_blocked_masked_softmax(relative, with_terms, grad, query_block,
                                                globals_):
  # `grad`: parameters that require grad take the concatenating form (the CPU kernel with
  # a log-sum-exp takes no gradient for the mask) instead of the global-key merge.
  g = torch.Generator().manual_seed(11)
  attn = L.EtcAttention(width=16, heads=2, local_radius=3, num_globals=globals_,
                        relative_positions=relative)
  if query_block:
    attn.query_block = query_block
  rich = L.RichAttentionTerm(heads=2, head_dim=8, axes=("x", "y"))
  _randomise(attn, 3)
  _randomise(rich, 4)
  total = globals_ + 17  # 17 long tokens: the reference's 5 blocks of 4, the last padded
  x = torch.randn(2, total, 16, generator=g)
  mask = _etc_mask(total, globals_)
  geom = {"centers": 1000 * torch.rand(2, total, 2, generator=g)}
  terms = [rich] if with_terms else []
  fast, slow = _etc_fast_and_reference(attn, x, mask, terms, geom, grad)
  np.testing.assert_allclose(fast, slow, atol=1e-5, rtol=0)


def test_etc_global_merge_equals_concatenated_keys(monkeypatch):
  # The global keys merged through the kernel's log-sum-exp == appended to every window
  # (the form used off CPU, or without the op): both against the reference, two globals,
  # one of them invalid, and a document whose long tokens are all padding.
  from flaxdoc.export.torch import etc_attention as attention_lib
  g = torch.Generator().manual_seed(5)
  attn = L.EtcAttention(width=16, heads=2, local_radius=4, num_globals=2, relative_positions=True)
  rich = L.RichAttentionTerm(heads=2, head_dim=8, axes=("x", "y"))
  _randomise(attn, 6)
  _randomise(rich, 7)
  x = torch.randn(3, 2 + 23, 16, generator=g)
  mask = torch.ones(3, 2 + 23, dtype=torch.bool)
  mask[1, 0] = False
  mask[2, 2:] = False
  geom = {"centers": 1000 * torch.rand(3, 2 + 23, 2, generator=g)}
  assert attention_lib._flash_with_lse() is not None  # this torch has the CPU op: it is tested
  merged, slow = _both(attn, x, mask, [rich], geom)
  monkeypatch.setattr(attention_lib, "_flash_with_lse", lambda: None)
  concatenated, _ = _both(attn, x, mask, [rich], geom)
  np.testing.assert_allclose(merged, slow, atol=1e-5, rtol=0)
  np.testing.assert_allclose(concatenated, slow, atol=1e-5, rtol=0)


@pytest.mark.parametrize("relative,with_terms", [(False, False), (True, True)])
def test_etc_fast_path_gradients_equal_the_reference(relative, with_terms):
  # The log-sum-exp merge passes no gradient through the kernel's log-sum-exp, so with
  # gradients the fast path must take the concatenating form, even when the mask alone
  # (no relative ids, no terms) carries none.
  g = torch.Generator().manual_seed(21)
  attn = L.EtcAttention(width=16, heads=2, local_radius=3, num_globals=2,
                        relative_positions=relative)
  rich = L.RichAttentionTerm(heads=2, head_dim=8, axes=("x", "y"))
  _randomise(attn, 8)
  _randomise(rich, 9)
  x0 = torch.randn(2, 2 + 13, 16, generator=g)
  mask = torch.ones(2, 2 + 13, dtype=torch.bool)
  mask[1, 9:] = False
  geom = {"centers": 1000 * torch.rand(2, 2 + 13, 2, generator=g)}
  terms = [rich] if with_terms else []
  grads = []
  for fast in (True, False):
    L.set_fast_paths(attn, fast)
    x = x0.clone().requires_grad_(True)
    attn.zero_grad()
    (attn(x, mask, terms, geom) ** 2).sum().backward()
    grads.append((x.grad.numpy().copy(), attn.query.kernel.grad.numpy().copy()))
  L.set_fast_paths(attn, True)
  for got, want in zip(grads[0], grads[1]):
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


# Terms that read pairwise box geometry instead of projecting tokens (DocPolarBERT's polar
# tables, LAGaBi's Gaussian bias, the squircle / cross biases, Rich Attention's reference
# form) take `_window_terms`' other branch: the geometry blocked per query block and
# windowed per key window. Each kind, and Rich (projected) mixed with all three kinds as
# one ETC config can hold them, against the reference's three key blocks.
def _geometry_terms(kind, heads=2, head_dim=8):
  polar = {"polar_1d_buckets": 32, "polar_1d_max_distance": 128, "polar_distance_buckets": 4,
           "polar_angle": "released", "polar_1d": True, "polar_zero_bucket": False}
  terms = {
      "polar": lambda: [L.PolarTerm(polar, head_dim)],
      "polar_sectors8": lambda: [L.PolarTerm(dict(polar, polar_angle="sectors8", polar_1d=False,
                                                  polar_zero_bucket=True), head_dim)],
      "gaussian": lambda: [L.GaussianTerm(heads, "bottom_left", 4.0)],
      "gaussian_paper": lambda: [L.GaussianTerm(heads, "center", 4.0, angle="paper")],
      "squircle": lambda: [L.FixedBiasTerm("squircle")],
      "cross": lambda: [L.FixedBiasTerm("cross")],
      "rich_reference_form": lambda: [L.RichAttentionTerm(heads, head_dim, ("x", "y"))],
      "rich+polar+gaussian+squircle": lambda: [
          L.RichAttentionTerm(heads, head_dim, ("x", "index")), L.PolarTerm(polar, head_dim),
          L.GaussianTerm(heads, "top_left", 4.0), L.FixedBiasTerm("squircle")],
  }[kind]()
  for i, term in enumerate(terms):
    _randomise(term, 30 + i)
    if isinstance(term, L.GaussianTerm):  # widths at the pairs' scale: not a constant -alpha
      with torch.no_grad():
        term.mu_rho.add_(0.2)
        term.sigma_rho.add_(0.3)
        term.sigma_theta.add_(1.0)
  if kind == "rich_reference_form":
    terms[0].fast = False  # no `token_projections` path: the geometry branch
  return terms


GEOMETRY_KINDS = ["polar", "polar_sectors8", "gaussian", "gaussian_paper", "squircle", "cross",
                  "rich_reference_form", "rich+polar+gaussian+squircle"]


def _layout_geom(mask, globals_, g):
  """`EncoderModel`'s geometry for `mask [B, G + N]`: boxes on a coarse grid (shared rows
  and columns, one repeated box), two pages, quantile edges; zeros on the globals."""
  from flaxdoc.export.torch import geometry as geo
  batch, total = mask.shape
  n = total - globals_
  x0 = 50.0 * torch.randint(0, 18, (batch, n), generator=g)
  y0 = 40.0 * torch.randint(0, 24, (batch, n), generator=g)
  w = 10.0 * torch.randint(1, 12, (batch, n), generator=g)
  h = 10.0 * torch.randint(1, 4, (batch, n), generator=g)
  boxes = torch.stack([x0, y0, x0 + w, y0 + h], dim=-1)
  boxes[:, 3] = boxes[:, 2]  # two tokens in one box: distance 0, the angles' self-like codes
  pages = (torch.arange(n) >= n // 2).to(torch.int64).expand(batch, n)
  positions = torch.arange(n).expand(batch, n)
  geom = geo.layout_geometry(boxes, mask[:, globals_:], pages=pages, positions=positions,
                             distance_buckets_count=4)
  return {name: torch.cat([torch.zeros((batch, globals_) + tuple(v.shape[2:]), dtype=v.dtype),
                           v], dim=1) for name, v in geom.items()}


@pytest.mark.parametrize("kind", GEOMETRY_KINDS)
@pytest.mark.parametrize("relative,grad,query_block,globals_", [
    (False, False, None, 2), (True, False, 1, 2), (False, False, 5, 2), (True, False, 40, 2),
    (True, False, 3, 0), (False, True, 6, 1)])
def test_etc_sdpa_with_geometry_terms_equals_blocked_masked_softmax(kind, relative, grad,
                                                                    query_block, globals_):
  g = torch.Generator().manual_seed(13)
  attn = L.EtcAttention(width=16, heads=2, local_radius=3, num_globals=globals_,
                        relative_positions=relative)
  if query_block:
    attn.query_block = query_block
  _randomise(attn, 3)
  terms = _geometry_terms(kind)
  total = globals_ + 17  # not a multiple of the reference's blocks of 4, nor of 5, 6, 8
  x = torch.randn(2, total, 16, generator=g)
  mask = _etc_mask(total, globals_)
  geom = _layout_geom(mask, globals_, g)
  fast, slow = _etc_fast_and_reference(attn, x, mask, terms, geom, grad)
  np.testing.assert_allclose(fast, slow, atol=1e-5, rtol=0)
  bare, _ = _both(attn, x, mask, [], geom)
  assert np.abs(fast - bare).max() > 1e-3  # the terms move the output well past the tolerance


@pytest.mark.parametrize("kind", GEOMETRY_KINDS)
def test_etc_fast_path_gradients_with_geometry_terms_equal_the_reference(kind):
  g = torch.Generator().manual_seed(23)
  attn = L.EtcAttention(width=16, heads=2, local_radius=3, num_globals=2,
                        relative_positions=True)
  attn.query_block = 5  # 13 long tokens: the last block padded, as the reference's
  _randomise(attn, 8)
  terms = _geometry_terms(kind)
  x0 = torch.randn(2, 2 + 13, 16, generator=g)
  mask = torch.ones(2, 2 + 13, dtype=torch.bool)
  mask[1, 9:] = False
  geom = _layout_geom(mask, 2, g)
  term_params = [p for t in terms for p in t.parameters()]
  grads = []
  for fast in (True, False):
    L.set_fast_paths(attn, fast)
    x = x0.clone().requires_grad_(True)
    attn.zero_grad()
    for p in term_params:
      p.grad = None
    (attn(x, mask, terms, geom) ** 2).sum().backward()
    grads.append([x.grad.numpy().copy(), attn.query.kernel.grad.numpy().copy()]
                 + [p.grad.numpy().copy() for p in term_params])
  L.set_fast_paths(attn, True)
  assert len(grads[0]) == len(grads[1]) == 2 + len(term_params)
  for got, want in zip(grads[0], grads[1]):
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_etc_with_no_long_tokens_returns_the_globals_only():
  attn = L.EtcAttention(width=16, heads=2, local_radius=3, num_globals=2, relative_positions=False)
  _randomise(attn, 10)
  x = torch.randn(1, 2, 16)
  mask = torch.ones(1, 2, dtype=torch.bool)
  fast, slow = _both(attn, x, mask, [], {})
  assert fast.shape == (1, 2, 16)
  np.testing.assert_allclose(fast, slow, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def formnet():
  batch = H.synthetic_batch(MAX_LEN, graph=True)
  model, params, config = H.flax_model("formnet", "A1", batch, max_len=MAX_LEN, seed=3)
  expected = np.asarray(model.apply({"params": params}, batch)["tag_logits"])
  tmodel = build_torch_model(config, weights_lib.export_tensors(params)).eval()
  return H.torch_batch(batch), expected, tmodel


def test_formnet_fast_equals_reference_and_flax(formnet):
  batch, expected, tmodel = formnet
  assert any(getattr(m, "fast", False) for m in tmodel.modules())  # fast is the default
  fast, slow = _both(tmodel, batch)
  np.testing.assert_allclose(fast, slow, atol=1e-5, rtol=0)
  np.testing.assert_allclose(fast, expected, atol=TOL, rtol=0)


@pytest.mark.slow
def test_fast_formnet_is_torch_export_and_compile_clean(formnet):
  from flaxdoc.export.torch import compiled
  batch, expected, tmodel = formnet
  exported = torch.export.export(tmodel, (batch,), strict=False)
  with torch.no_grad():
    got = exported.module()(batch).numpy()
  np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)
  fn = compiled.compile_layers(tmodel)
  with torch.no_grad():
    got = fn(batch).numpy()
  np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)


def test_fast_formnet_is_one_dynamo_graph(formnet):
  # A graph break (e.g. a strided `out=`) splits torch.compile's fusion; the fast paths
  # must trace as one graph, or inductor cannot fuse Rich Attention into the mask.
  batch, _, tmodel = formnet
  torch._dynamo.reset()
  with torch.no_grad():
    explained = torch._dynamo.explain(tmodel)(batch)
  assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
  assert explained.graph_count == 1
