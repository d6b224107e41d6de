"""`flaxdoc.bench.kernel_sass`: the listing parser on a written listing, the Triton IR taken
from Pallas' lowering, and (with the `triton` package) kernels compiled to SASS whose
instruction counts are known in advance."""

import importlib.util

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from flaxdoc.bench import kernel_sass as ks
from flaxdoc.nn import etc_pallas as ep
from flaxdoc.nn import pallas_math as pm

LISTING = """
        .text.k:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/              @!P0 BRA `(.L_x_9) ;
.L_x_1:
        /*0020*/                   FFMA R2, R3, R4, R2 ;
        /*0030*/                   MUFU.EX2 R5, R2 ;
        /*0040*/              @!PT FADD.FTZ R6, R5, 1 ;
        /*0050*/                   IADD3 R7, R7, 0x1, RZ ;
        /*0060*/                   ISETP.GE.AND P1, PT, R7, 0x8, PT ;
        /*0070*/              @!P1 BRA `(.L_x_1) ;
.L_x_9:
        /*0080*/                   EXIT ;
.L_x_10:
        /*0090*/                   BRA `(.L_x_10);
        /*00a0*/                   NOP;
"""


def test_parser_finds_the_loop_and_counts_it():
  listing, loops = ks.parse_sass(LISTING)
  assert len(listing.instructions) == 11
  # Not loops: the forward branch to .L_x_9, and the padding's branch to itself after EXIT.
  assert loops == [(0x20, 0x70)]
  assert ks.hot_loop(listing, loops) == (0x20, 0x70)
  ops = listing.opcodes(0x20, 0x70)
  assert ops == {"FFMA": 1, "MUFU": 1, "FADD": 1, "IADD3": 1, "ISETP": 1, "BRA": 1}
  row = ks.summarize("k", LISTING, {"registers": 12, "local": 8, "stack": 0, "shared": 0}, 2,
                     warps=4)
  assert row["counted"] == "loop" and row["counted_instructions"] == 6
  assert row["per_element"] == 3 and row["mufu_per_element"] == 0.5
  assert row["fp32_per_element"] == 1 and row["int_per_element"] == 1
  assert row["spill_bytes"] == 8 and row["registers"] == 12 and row["warps_per_sm"] == 64
  # Without a loop the whole program counts, up to its last EXIT (not the padding after it).
  assert sum(listing.opcodes().values()) == 9 and listing.opcodes()["NOP"] == 0


@pytest.mark.parametrize("registers, warps, shared, want", [
    (240, 4, 0, 8),  # 7,680 registers a warp: two blocks of four warps in 64K
    (255, 4, 0, 8),  # 8,160 rounded up to 8,192 a warp: still two blocks
    (168, 2, 0, 12),  # 5,376 a warp, six blocks of two
    (32, 4, 0, 64),  # bound by the SM's 64 warps
    (32, 1, 0, 32),  # bound by its 32 blocks
    (64, 4, 100 * 1024, 8),  # bound by shared memory: two blocks of 101 KB in 228 KB
])
def test_resident_warps_as_the_occupancy_calculator_gives_them(registers, warps, shared, want):
  assert ks.warps_per_sm(registers, warps, shared) == want


def test_resources_from_cuobjdump():
  text = ("Resource usage:\n Function k:\n  REG:240 STACK:0 SHARED:1024 LOCAL:16 "
          "CONSTANT[0]:912 TEXTURE:0 SURFACE:0 SAMPLER:0\n")
  assert ks.resources(text) == {"registers": 240, "stack": 0, "local": 16, "shared": 1024}


def test_the_etc_kernels_ir_is_captured_with_their_settings():
  tiles = ep.Tiles(32, 64, 4, 32, 32, 2)
  fn, args, per_thread, unit, passes = ks.etc_problem(tiles)
  kernels = ks.lower_kernels(fn, args)
  assert sorted(k["name"] for k in kernels) == ["etc_rich_backward_dkv", "etc_rich_backward_dq",
                                                "etc_rich_forward"]
  for k in kernels:
    assert k["ir"].startswith("module") and "tt.func public @" + k["name"] in k["ir"]
    assert k["warps"] == (4 if k["name"] == "etc_rich_forward" else 2)
    assert k["stages"] == 2
  assert per_thread == {"etc_rich_forward": 16, "etc_rich_backward_dq": 16,
                        "etc_rich_backward_dkv": 16} and unit == "pair"
  assert passes == ks.etc_passes(tiles)
  # A function lowered before reaches no capture (JAX's cache): an error, not nothing.
  with pytest.raises(RuntimeError, match="cached lowering"):
    ks.lower_kernels(fn, args)
  # The lowering is left as it was: nothing captured outside the context, for a function
  # never lowered before.
  with ks.captured_triton_modules() as found:
    pass
  fresh, fresh_args, *_ = ks.etc_problem(tiles, length=64, heads=1)
  jax.jit(fresh).trace(*fresh_args).lower(lowering_platforms=("cuda",))
  assert found == []
  assert len(ks.lower_kernels(*ks.etc_problem(tiles, length=64, heads=1)[:2])) == 3


@pytest.mark.parametrize("tiles", [ep.DEFAULT_TILES, ep.Tiles(32, 64, 4, 32, 32, 4),
                                   ep.Tiles(16, 64, 2, 16, 64, 4),
                                   ep.Tiles(64, 32, 4, 64, 16, 4)])
def test_loop_passes_per_layer_by_brute_force(tiles):
  """Every (query tile, key tile) pair a kernel visits, counted from the band itself: the
  forward and `dq` cover the keys within `r` of a query of each query tile (of the keys
  there are) in as few whole key tiles as that many keys need; `dk, dv` likewise cover the
  queries within `r` of each key tile in whole query tiles."""
  n, r, heads, batch = 1024, 84, 12, 16

  def passes(rows, block, other_block):  # tiles of `block` covering each band
    total = 0
    for o in range(0, -(-n // other_block) * other_block, other_block):
      band = {j for j in range(-(-n // block) * block)
              if any(abs(i - j) <= r for i in range(o, o + other_block))}
      total += -(-len(band) // block)
    return rows * total

  rows = batch * heads
  bq, bk = tiles.backward_block_q, tiles.backward_block_k
  assert ks.etc_passes(tiles) == {
      "etc_rich_forward": passes(rows, tiles.block_k, tiles.block_q),
      "etc_rich_backward_dq": passes(rows, bk, bq),
      "etc_rich_backward_dkv": passes(rows, bq, bk)}


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="the triton package is absent (pip install triton)")


@needs_triton
@pytest.mark.parametrize("warps", [1, 2])
def test_compiled_kernels_have_the_instructions_their_math_says(warps):
  """A [16, 64] tile, `warps` warps: each thread holds 1,024 / (32 warps) elements, and
  `log_sigmoid` costs two special-function instructions each (ex2, lg2), the libdevice
  `log1p` none (a polynomial) but many more instructions."""
  def kernel(fast):
    def body(x_ref, o_ref):
      x = x_ref[...]
      if fast:
        o_ref[...] = pm.log_sigmoid(x, False)
      else:
        o_ref[...] = jnp.minimum(x, 0.0) - jnp.log1p(jnp.exp(-jnp.abs(x)))
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((16, 64), jnp.float32),
                          name="fast" if fast else "libdevice",
                          compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=1))

  x = jnp.zeros((16, 64), jnp.float32)
  per_thread = 16 * 64 // (32 * warps)
  rows = {}
  for fast in (True, False):
    [k] = ks.lower_kernels(kernel(fast), (x,))
    sass, usage = ks.compile_to_sass(k["ir"], k["warps"], k["stages"])
    rows[fast] = ks.summarize(k["name"], sass, usage, per_thread)
    assert rows[fast]["counted"] == "program" and rows[fast]["registers"] > 0
  assert rows[True]["mufu_per_element"] == 2
  assert rows[False]["mufu_per_element"] == 1  # __nv_expf's ex2; log1p is all FP32
  assert rows[False]["per_element"] > 3 * rows[True]["per_element"]
