"""The native Rich Attention kernel (`flaxdoc.export.torch.native`) against references.

The kernel computes Rich Attention's logits and ETC's window mask over sliding key
windows in one pass. Checked against a numpy loop over every (query, key, head) on
small shapes, against the Rich term's reference form on a larger one, inside
`EtcAttention` against the tensor form and the reference blocking (and that the kernel
is what ran), under `torch.compile` and `torch.export`, and its fallbacks.
"""

import math
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flaxdoc.export.torch import etc_attention as A  # noqa: E402
from flaxdoc.export.torch import layers as L  # noqa: E402
from flaxdoc.export.torch import native  # noqa: E402

BIG_NEG = -1e9

needs_kernel = pytest.mark.skipif(
    not native.available(), reason=f"native kernel not built: {native.unavailable_reason()}")


def _rich(heads, head_dim, axes, scale, seed):
  term = L.RichAttentionTerm(heads, head_dim, axes)
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in term.parameters():
      p.copy_(scale * torch.randn(p.shape, generator=g))
  return term


def _kernel_inputs(term, q, k, coords, valid, block, radius):
  """The kernel's arguments for `q`, `k [B, N, H, D]`, `coords [A, B, N]`, `valid [B, N]`."""
  a = len(term.axes)
  nb = -(-q.shape[1] // block)
  nq = nb * block
  th = term.theta.abs() * math.sqrt(0.5)
  per_head = th.T[:, None, :, None]
  pq = term.token_projections(A._pad_long(q, nq), "q")
  pk = term.token_projections(A._pad_for_windows(k, block, radius, nb), "k")
  return (pq[:a] + term.b.T[:, None, :, None], pk[:a],
          (pq[a:] + term.c.T[:, None, :, None]) * per_head, pk[a:] * per_head, th,
          A._pad_for_windows(coords, block, 0, nb, dim=-1),
          A._pad_for_windows(coords, block, radius, nb, dim=-1),
          A._pad_for_windows(valid, block, 0, nb, dim=-1),
          A._pad_for_windows(valid, block, radius, nb, dim=-1), nb, block, radius, BIG_NEG)


def _rich_parameters(term):
  """The attention kernel's Rich arguments: the weights, biases and |theta| / sqrt 2."""
  return (term.w_q, term.w_k, term.v_q, term.v_k, term.b, term.c,
          term.theta.abs() * math.sqrt(0.5))


def _numpy_reference(term, q, k, coords, valid, block, radius):
  """Every (batch, block, head, query, window key) by the paper's formula, in float64."""
  q, k = q.double().numpy(), k.double().numpy()
  coords, valid = coords.double().numpy(), valid.numpy()
  w_q, w_k, v_q, v_k = (getattr(term, n).detach().double().numpy()
                        for n in ("w_q", "w_k", "v_q", "v_k"))
  b_, c_, theta = (getattr(term, n).detach().double().numpy() for n in ("b", "c", "theta"))
  batch, n_tokens, heads, _ = q.shape
  nb = -(-n_tokens // block)
  kk = block + 2 * radius
  out = np.full((batch, nb, heads, block, kk), BIG_NEG)
  for b in range(batch):
    for n in range(nb):
      for i in range(block):
        qi = n * block + i
        for t in range(kk):
          kj = n * block + t - radius  # the key's token index
          if not (qi < n_tokens and 0 <= kj < n_tokens and abs(kj - qi) <= radius
                  and valid[b, qi] and valid[b, kj]):
            continue
          for h in range(heads):
            total = 0.0
            for ax in range(len(term.axes)):
              ci, cj = coords[ax, b, qi], coords[ax, b, kj]
              z = q[b, qi, h] @ w_q[h, :, ax] + k[b, kj, h] @ w_k[h, :, ax] + b_[h, ax]
              # log p or log(1 - p), p = sigmoid(z), without rounding p to 1
              order = -np.logaddexp(0.0, -z) if ci < cj else -np.logaddexp(0.0, z)
              mu = q[b, qi, h] @ v_q[h, :, ax] + k[b, kj, h] @ v_k[h, :, ax] + c_[h, ax]
              total += order - 0.5 * theta[h, ax] ** 2 * (math.log1p(abs(ci - cj)) - mu) ** 2
            out[b, n, h, i, t] = total
  return out


@needs_kernel
@pytest.mark.parametrize("axes,tokens,block,radius,scale", [
    (("x", "y"), 13, 4, 3, 0.3),   # 4 blocks, the last one padded
    (("x",), 11, 3, 2, 0.3),
    (("x", "y"), 9, 1, 4, 0.3),    # one query per block
    (("x", "y"), 10, 16, 3, 0.3),  # one block longer than the document
    (("y", "x"), 12, 5, 2, 2.0),   # order logits far into both tails of the sigmoid
])
def test_kernel_equals_a_numpy_loop(axes, tokens, block, radius, scale):
  g = torch.Generator().manual_seed(tokens + block)
  heads, d = 2, 4
  term = _rich(heads, d, axes, scale, seed=block)
  q = torch.randn(2, tokens, heads, d, generator=g)
  k = torch.randn(2, tokens, heads, d, generator=g)
  coords = torch.round(40 * torch.rand(len(axes), 2, tokens, generator=g))  # with ties
  valid = torch.ones(2, tokens, dtype=torch.bool)
  valid[1, tokens - 3:] = False  # padding at the end of a row
  valid[0, 2] = False  # and one inside a document
  with torch.no_grad():
    got = native.rich_window_bias(*_kernel_inputs(term, q, k, coords, valid, block, radius))
  want = _numpy_reference(term, q, k, coords, valid, block, radius)
  visible = want != BIG_NEG
  assert visible.sum() > 0 and (~visible).sum() > 0
  np.testing.assert_array_equal(got.numpy()[~visible], BIG_NEG)
  np.testing.assert_allclose(got.numpy()[visible], want[visible], rtol=2e-6, atol=2e-5)
  if scale > 1:  # the tails were reached: some order terms near -|z|
    assert want[visible].min() < -50


@needs_kernel
def test_kernel_equals_the_rich_reference_form_at_a_larger_size():
  # 300 tokens, 4 heads, r = 20, blocks of 7, coordinates in page pixels.
  g = torch.Generator().manual_seed(5)
  heads, d, block, radius, tokens = 4, 16, 7, 20, 300
  term = _rich(heads, d, ("x", "y"), 0.1, seed=2)
  q = torch.randn(1, tokens, heads, d, generator=g)
  k = torch.randn(1, tokens, heads, d, generator=g)
  coords = 1000 * torch.rand(2, 1, tokens, generator=g)
  valid = torch.ones(1, tokens, dtype=torch.bool)
  args = _kernel_inputs(term, q, k, coords, valid, block, radius)
  with torch.no_grad():
    got = native.rich_window_bias(*args)
    nb = args[9]
    term.fast = False  # the reference form: from q and k, no token projections
    ql = A._split_blocks(A._pad_long(q, nb * block), block)
    kw = A._windows(A._pad_for_windows(k, block, radius, nb), block, radius)
    centers = coords.permute(1, 2, 0)  # [B, N, 2]
    q_geom = {"centers": A._split_blocks(A._pad_long(centers, nb * block), block)}
    k_geom = {"centers": A._windows(A._pad_for_windows(centers, block, radius, nb), block,
                                    radius)}
    want = term(ql, kw, q_geom, k_geom)  # [B, nb, H, c, kk]
  band = torch.ones(block, block + 2 * radius, dtype=torch.bool).triu(0).tril(2 * radius)
  pos = torch.arange(nb * block).reshape(nb, block)
  key = pos[:, None, :1] + torch.arange(block + 2 * radius) - radius  # [nb, 1, kk]
  visible = band & (pos[..., None] < tokens) & (key >= 0) & (key < tokens)  # [nb, c, kk]
  visible = visible[None, :, None].expand_as(got)
  np.testing.assert_allclose(got[visible].numpy(), want[visible].numpy(), rtol=1e-5, atol=1e-4)
  assert bool((got[~visible] == BIG_NEG).all())


@pytest.fixture
def kernel_calls(monkeypatch):
  """Counts the layer's calls of the native ops, by name."""
  calls = []
  for name in ("rich_window_bias", "etc_rich_attention"):
    real = getattr(A.native, name)

    def counted(*args, _real=real, _name=name):
      calls.append(_name)
      return _real(*args)
    monkeypatch.setattr(A.native, name, counted)
  return calls


def _etc_case(relative, globals_, extra_terms, seed=3):
  g = torch.Generator().manual_seed(seed)
  attn = L.EtcAttention(width=32, heads=4, local_radius=5, num_globals=globals_,
                        relative_positions=relative)
  attn.query_block = 3
  with torch.no_grad():
    for p in attn.parameters():
      p.copy_(0.1 * torch.randn(p.shape, generator=g))
  terms = [_rich(4, 8, ("x", "y"), 0.1, seed=seed + 1)]
  if extra_terms:
    terms.append(L.FixedBiasTerm("squircle"))
  total = globals_ + 23
  x = torch.randn(2, total, 32, generator=g)
  mask = torch.ones(2, total, dtype=torch.bool)
  mask[1, 15:] = False
  mask[0, globals_ + 4:globals_ + 8] = False
  geom = {"centers": 1000 * torch.rand(2, total, 2, generator=g)}
  return attn, terms, x, mask, geom


@needs_kernel
@pytest.mark.parametrize("relative,globals_,extra_terms,kernel", [
    # Rich alone (FormNet): the whole attention in one kernel; with ETC's relative ids or
    # another term: the Rich logits from the kernel, the attention from SDPA.
    (False, 1, False, "etc_rich_attention"), (False, 0, False, "etc_rich_attention"),
    (False, 2, False, "etc_rich_attention"), (True, 2, False, "rich_window_bias"),
    (True, 0, True, "rich_window_bias"), (False, 2, True, "rich_window_bias")])
def test_etc_layer_with_the_kernel_equals_tensor_form_and_reference(kernel_calls, relative,
                                                                    globals_, extra_terms,
                                                                    kernel):
  attn, terms, x, mask, geom = _etc_case(relative, globals_, extra_terms)
  with torch.no_grad():
    got = attn(x, mask, terms, geom)
    assert kernel_calls == [kernel]  # the kernel ran
    attn.native = False
    tensor_form = attn(x, mask, terms, geom)
    assert kernel_calls == [kernel]  # and the tensor form did not call it
    attn.native = True
    L.set_fast_paths(attn, False)
    reference = attn(x, mask, terms, geom)
    L.set_fast_paths(attn, True)
  np.testing.assert_allclose(got.numpy(), tensor_form.numpy(), atol=1e-5, rtol=0)
  np.testing.assert_allclose(got.numpy(), reference.numpy(), atol=1e-5, rtol=0)
  attn.native = False
  with torch.no_grad():
    bare = attn(x, mask, [], geom)
  assert np.abs(got.numpy() - bare.numpy()).max() > 1e-3  # Rich moved the output


@needs_kernel
def test_gradients_take_the_tensor_form(kernel_calls):
  # The kernel has no backward: with gradients on, the layer must not call it.
  attn, terms, x, mask, geom = _etc_case(True, 1, False)
  x = x.requires_grad_(True)
  attn(x, mask, terms, geom).sum().backward()
  assert not kernel_calls
  assert x.grad is not None and torch.isfinite(x.grad).all()


class _Layer(torch.nn.Module):
  def __init__(self, attn, terms):
    super().__init__()
    self.attn, self.terms = attn, torch.nn.ModuleList(terms)

  def forward(self, x, mask, centers):
    return self.attn(x, mask, list(self.terms), {"centers": centers})


# `aot_eager` runs what `torch.compile` checks of the ops (one Dynamo graph, no break; their
# fake implementations through AOTAutograd's tracing) without inductor's code generation,
# whose first C++ build took 150-290 s of the default run; inductor itself, which calls
# the ops as extern kernels, is in the slow set.
@needs_kernel
@pytest.mark.parametrize("relative,op,backend", [
    (True, "flaxdoc.rich_window_bias", "aot_eager"),
    (False, "flaxdoc.etc_rich_attention", "aot_eager"),
    pytest.param(True, "flaxdoc.rich_window_bias", "inductor", marks=pytest.mark.slow),
    pytest.param(False, "flaxdoc.etc_rich_attention", "inductor", marks=pytest.mark.slow)])
def test_the_kernel_is_one_node_for_torch_compile_and_torch_export(relative, op, backend):
  attn, terms, x, mask, geom = _etc_case(relative, 1, False)
  layer = _Layer(attn, terms).eval()
  with torch.no_grad():
    want = layer(x, mask, geom["centers"])
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend=backend)  # a break would raise
    got = compiled(x, mask, geom["centers"])
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5, rtol=0)
    exported = torch.export.export(layer, (x, mask, geom["centers"]), strict=False)
  assert op in exported.graph_module.code
  with torch.no_grad():
    got = exported.module()(x, mask, geom["centers"])
  np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5, rtol=0)
  # With gradients on (export's default) the kernels do not run: a portable tensor form.
  portable = torch.export.export(layer, (x, mask, geom["centers"]), strict=False)
  assert "flaxdoc" not in portable.graph_module.code
  with torch.no_grad():
    got = portable.module()(x, mask, geom["centers"])
  np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5, rtol=0)


@needs_kernel
def test_mismatched_shapes_are_a_clear_error():
  term = _rich(2, 4, ("x", "y"), 0.1, seed=0)
  q = torch.randn(1, 8, 2, 4)
  args = list(_kernel_inputs(term, q, q, torch.rand(2, 1, 8), torch.ones(1, 8, dtype=bool),
                             4, 2))
  args[1] = args[1][..., :-1]  # keys one short of the windows
  with pytest.raises(ValueError, match="do not fit"):
    native.rich_window_bias(*args)


def _fresh_process(code, env):
  import os
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=300, check=False)
  assert res.returncode == 0, res.stderr
  return res.stdout.strip()


def test_switched_off_or_without_a_compiler_the_export_falls_back(tmp_path):
  code = ("from flaxdoc.export.torch import native; "
          "print(native.available(), '|', native.unavailable_reason())")
  assert _fresh_process(code, {"FLAXDOC_NATIVE": "0"}) == "False | FLAXDOC_NATIVE=0"
  out = _fresh_process(code, {"CC": str(tmp_path / "no-such-cc"),
                              "FLAXDOC_CACHE_DIR": str(tmp_path / "cache")})
  assert out.startswith("False | no C compiler"), out
  # And the layer still runs, in its tensor form.
  code = ("import torch; from flaxdoc.export.torch import layers as L; "
          "a = L.EtcAttention(16, 2, 3, 1, False); r = L.RichAttentionTerm(2, 8, ('x', 'y')); "
          "x = torch.randn(1, 9, 16); m = torch.ones(1, 9, dtype=torch.bool); "
          "g = {'centers': torch.rand(1, 9, 2)}\n"
          "with torch.no_grad(): print(bool(torch.isfinite(a(x, m, [r], g)).all()))")
  assert _fresh_process(code, {"FLAXDOC_NATIVE": "0"}).endswith("True")


@needs_kernel
def test_the_build_is_cached_per_source_flags_and_cpu(tmp_path):
  code = ("from flaxdoc.export.torch import native; print(native.available(), "
          "native.library_path())")
  first = _fresh_process(code, {"FLAXDOC_CACHE_DIR": str(tmp_path)})
  assert first.startswith("True ")
  path = first.split(" ", 1)[1]
  assert path.startswith(str(tmp_path)) and "etc_rich-" in path
  mtime = (tmp_path / path.rsplit("/", 1)[1]).stat().st_mtime_ns
  assert _fresh_process(code, {"FLAXDOC_CACHE_DIR": str(tmp_path)}) == first
  assert (tmp_path / path.rsplit("/", 1)[1]).stat().st_mtime_ns == mtime  # not rebuilt


def _attention_numpy(term, q, k, v, coords, valid, kg, vg, g_valid, radius, scale):
  """The long queries' outputs `[B, N, H, D]` by the definition, in float64: softmax over
  the valid keys with |key - query| <= radius (logits `scale q.k` + Rich) and the valid
  globals (`scale q.k`), for a valid query; 0 for a query that sees no key."""
  bias = _numpy_reference(term, q, k, coords, valid, 1, radius)[:, :, :, 0]  # [B, N, H, 1+2r]
  q, k, v = q.double().numpy(), k.double().numpy(), v.double().numpy()
  kg, vg, g_valid = kg.double().numpy(), vg.double().numpy(), g_valid.numpy()
  batch, n_tokens, heads, d = q.shape
  out = np.zeros((batch, n_tokens, heads, d))
  for b in range(batch):
    for i in range(n_tokens):
      if not valid[b, i]:
        continue
      for h in range(heads):
        logits, values = [], []
        for t in range(2 * radius + 1):
          j = i + t - radius
          if bias[b, i, h, t] != BIG_NEG:
            logits.append(scale * q[b, i, h] @ k[b, j, h] + bias[b, i, h, t])
            values.append(v[b, j, h])
        for g in range(kg.shape[1]):
          if g_valid[b, g]:
            logits.append(scale * q[b, i, h] @ kg[b, g, h])
            values.append(vg[b, g, h])
        if logits:
          w = np.exp(np.asarray(logits) - max(logits))
          out[b, i, h] = (w / w.sum()) @ np.asarray(values)
  return out


@needs_kernel
@pytest.mark.parametrize("tokens,block,radius,d,globals_,scale", [
    (13, 4, 3, 8, 1, 0.3),    # the factored Rich rows (|oq| + |ok| well under 40)
    (17, 5, 2, 16, 2, 0.3),   # a block that is not a multiple of the 4-row tiles; D = 16
    (9, 3, 4, 8, 0, 0.3),     # no globals; blocks smaller than a tile
    (12, 6, 3, 8, 2, 6.0),    # order logits past the factoring bound: the exact rows
])
def test_attention_kernel_equals_a_numpy_reference(tokens, block, radius, d, globals_, scale):
  g = torch.Generator().manual_seed(tokens * 7 + d)
  heads = 2
  term = _rich(heads, d, ("x", "y"), scale, seed=tokens)
  q, k, v = (torch.randn(2, tokens, heads, d, generator=g) for _ in range(3))
  kg, vg = (torch.randn(2, globals_, heads, d, generator=g) for _ in range(2))
  g_valid = torch.ones(2, globals_, dtype=torch.bool)
  if globals_ > 1:
    g_valid[1, 1] = False
  coords = torch.round(40 * torch.rand(2, 2, tokens, generator=g))
  valid = torch.ones(2, tokens, dtype=torch.bool)
  valid[1, tokens - 4:] = False
  valid[0, 3:6] = False
  args = _kernel_inputs(term, q, k, coords, valid, block, radius)
  nb = args[9]
  oq, ok = args[0], args[1]
  bound = oq.abs().amax(dim=(1, 2, 3)) + ok.abs().amax(dim=(1, 2, 3))
  assert bool((bound > 40).any()) == (scale > 1)  # which of the kernel's two forms runs
  qg = torch.randn(2, globals_, heads, d, generator=g)  # the globals' queries: not used here
  with torch.no_grad():
    got = native.etc_rich_attention(
        *_rich_parameters(term), *args[5:9], torch.cat([qg, q], 1), torch.cat([kg, k], 1),
        torch.cat([vg, v], 1), g_valid, nb, block, radius, 1 / math.sqrt(d), BIG_NEG)
  assert got.shape == (2, tokens, heads, d)
  want = _attention_numpy(term, q, k, v, coords, valid, kg, vg, g_valid, radius,
                          1 / math.sqrt(d))
  np.testing.assert_allclose(got.numpy(), want, atol=2e-5, rtol=1e-4)
  assert np.abs(want[valid.numpy()]).min() < np.abs(want).max()  # not all equal / zero
  np.testing.assert_array_equal(got[~valid].numpy(), 0.0)  # padding queries: 0


@needs_kernel
def test_attention_kernel_is_the_same_on_one_or_two_threads():
  attn, terms, x, mask, geom = _etc_case(False, 2, False)
  threads = torch.get_num_threads()
  try:
    with torch.no_grad():
      torch.set_num_threads(1)
      one = attn(x, mask, terms, geom)
      torch.set_num_threads(2)
      two = attn(x, mask, terms, geom)
  finally:
    torch.set_num_threads(threads)
  np.testing.assert_array_equal(one.numpy(), two.numpy())  # each block on one thread


@needs_kernel
def test_attention_kernel_rejects_mismatched_shapes():
  term = _rich(2, 8, ("x", "y"), 0.1, seed=0)
  q = torch.randn(1, 8, 2, 8)
  args = _kernel_inputs(term, q, q, torch.rand(2, 1, 8), torch.ones(1, 8, dtype=bool), 4, 2)
  rich = (*_rich_parameters(term), *args[5:9])
  with pytest.raises(ValueError, match="do not fit"):  # keys one token short
    native.etc_rich_attention(*rich, q, q[:, :-1], q, torch.ones(1, 1, dtype=bool), 2, 4, 2,
                              0.3, BIG_NEG)
  with pytest.raises(ValueError, match="do not fit"):  # more tokens than the blocks hold
    native.etc_rich_attention(*rich, torch.cat([q, q], 1), torch.cat([q, q], 1),
                              torch.cat([q, q], 1), torch.ones(1, 1, dtype=bool), 2, 4, 2, 0.3,
                              BIG_NEG)
