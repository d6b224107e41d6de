"""Native CPU kernels of the PyTorch export, built with the system's C compiler at first use.

    from flaxdoc.export.torch import native
    native.available()            # True once `etc_rich.c` is compiled and loaded
    native.unavailable_reason()   # why not (no compiler, FLAXDOC_NATIVE=0, not Linux/macOS...)

Two kernels (`etc_rich.c`):

- `etc_rich_attention`: ETC's long-query attention with Rich Attention inside it (scores,
  Rich, mask, softmax over the window and the globals, values: one pass per block).
- `rich_window_bias`: Rich's logits over the sliding key windows alone, for layers with
  other terms too; in tensor form they took more time per layer than the attention.

The source is plain C (no PyTorch headers, so it builds in about a second), compiled
with `-O3 -march=native` into the user cache (`$FLAXDOC_CACHE_DIR`, else
`$XDG_CACHE_HOME/flaxdoc`, else `~/.cache/flaxdoc`) under a name that hashes the source,
the flags, the compiler and this CPU's feature flags. It is called through ctypes (which
releases the GIL) inside `torch.library` custom ops, so `torch.compile` and
`torch.export` see one opaque node each, with a known output shape.

Nothing requires it: without a compiler, or with `FLAXDOC_NATIVE=0`, the export runs its
tensor form (the same outputs; the tests compare the two).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("etc_rich.c")
# -fno-math-errno / -fno-trapping-math let the compiler vectorise the kernel's loops
# (branch-free selects, no errno); neither changes a result. No -ffast-math: it would
# let the compiler assume there are no infinities.
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared",
         "-pthread")

_state: dict = {}


def cache_dir() -> Path:
  if os.environ.get("FLAXDOC_CACHE_DIR"):
    return Path(os.environ["FLAXDOC_CACHE_DIR"])
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return Path(base) / "flaxdoc"


def _compiler() -> str:
  return os.environ.get("CC", "cc")


def _cpu_fingerprint() -> str:
  """Machine and CPU feature flags: a `-march=native` build is only reused on a like CPU."""
  flags = ""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
  except OSError:
    pass
  return platform.machine() + flags


def _build(target: Path) -> None:
  cc = _compiler()
  target.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
  os.close(fd)
  try:
    cmd = [cc, *FLAGS, "-o", tmp, str(SOURCE), "-lm"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if res.returncode != 0:
      raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
    os.replace(tmp, target)  # atomic: parallel test workers may build at once
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)


def library_path() -> Path:
  cc = _compiler()
  try:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
  except (OSError, subprocess.TimeoutExpired) as e:
    raise RuntimeError(f"no C compiler ({cc}): {e}") from e
  key = hashlib.sha256("\0".join([SOURCE.read_text(encoding="utf-8"), " ".join(FLAGS), cc,
                                  version, _cpu_fingerprint()]).encode()).hexdigest()[:16]
  return cache_dir() / f"etc_rich-{key}.so"


def _load():
  if "lib" in _state:
    return _state["lib"]
  lib, reason = None, None
  if os.environ.get("FLAXDOC_NATIVE", "1") == "0":
    reason = "FLAXDOC_NATIVE=0"
  elif sys.platform not in ("linux", "darwin"):
    reason = f"native kernels are built on Linux and macOS only, not {sys.platform}"
  else:
    try:
      path = library_path()
      if not path.exists():
        _build(path)
      lib = ctypes.CDLL(str(path))
      fn = lib.rich_window_bias
      fn.restype = ctypes.c_int
      fn.argtypes = [ctypes.c_void_p] * 10 + [ctypes.c_int64] * 6 + [ctypes.c_float,
                                                                       ctypes.c_int64]
      fn = lib.etc_rich_attention
      fn.restype = ctypes.c_int
      fn.argtypes = ([ctypes.c_void_p] * 16 + [ctypes.c_int64] * 9
                     + [ctypes.c_float, ctypes.c_float, ctypes.c_int64])
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
      lib, reason = None, str(e)
  if lib is None:
    logging.getLogger(__name__).warning(
        "flaxdoc: the native Rich Attention kernel is not available (%s); the PyTorch "
        "export uses its tensor form (same outputs, slower).", reason)
  _state["lib"], _state["reason"] = lib, reason
  return lib


def available() -> bool:
  """Builds (first call) and loads the kernel; False, with a logged reason, if it cannot."""
  return _load() is not None


def loaded() -> bool:
  """Whether `available()` has already succeeded: a plain read, safe inside `torch.compile`
  tracing (which must not run the compiler). `compile_layers` calls `available()` first."""
  return _state.get("lib") is not None


def unavailable_reason() -> str | None:
  _load()
  return _state["reason"]


def _call(name: str, *args) -> None:
  lib = _load()
  if lib is None:
    raise RuntimeError(f"flaxdoc::{name}: the native kernel is not available ({_state['reason']})")
  rc = getattr(lib, name)(*args)
  if rc != 0:
    raise RuntimeError(f"flaxdoc::{name} failed ({rc})")


def _f32(t: torch.Tensor) -> torch.Tensor:
  return t.detach().to(torch.float32).contiguous()


def _u8(t: torch.Tensor) -> torch.Tensor:
  return t.detach().to(torch.uint8).contiguous()


@torch.library.custom_op("flaxdoc::rich_window_bias", mutates_args=())
def rich_window_bias(oq: torch.Tensor, ok: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor,
                     th: torch.Tensor, cq: torch.Tensor, ck: torch.Tensor, vq: torch.Tensor,
                     vk: torch.Tensor, blocks: int, block: int, radius: int,
                     big_neg: float) -> torch.Tensor:
  """Rich Attention's logits plus the band/validity mask over sliding key windows.

  `oq`, `dq [A, B, H, nq]`, `ok`, `dk [A, B, H, nk]` (float32; `nq = blocks * block`,
  `nk = nq + 2 radius`): per-token order projections (queries with the bias `b`) and
  distance projections (queries with `c`), the latter times `th [H, A] = |theta| /
  sqrt 2`; `cq [A, B, nq]`, `ck [A, B, nk]` the coordinates; `vq [B, nq]`, `vk [B, nk]`
  validity (bool). Returns `[B, blocks, H, block, block + 2 radius]`: the logits where
  query and key are valid and `|key - query| <= radius`, else `big_neg`.
  """
  axes, batch, heads, nq = oq.shape
  kk = block + 2 * radius
  if nq != blocks * block or ok.shape[-1] != nq + 2 * radius:
    raise ValueError(f"rich_window_bias: {nq} queries and {ok.shape[-1]} keys do not fit "
                     f"{blocks} blocks of {block} with radius {radius}")
  args = [_f32(t) for t in (oq, ok, dq, dk, th, cq, ck)] + [_u8(vq), _u8(vk)]
  out = torch.empty((batch, blocks, heads, block, kk), dtype=torch.float32)
  _call("rich_window_bias", *[t.data_ptr() for t in args], out.data_ptr(), axes, batch, heads,
        blocks, block, radius, float(big_neg), torch.get_num_threads())
  return out


@rich_window_bias.register_fake
def _(oq, ok, dq, dk, th, cq, ck, vq, vk, blocks, block, radius, big_neg):
  axes, batch, heads, _ = oq.shape
  return oq.new_empty((batch, blocks, heads, block, block + 2 * radius))


@torch.library.custom_op("flaxdoc::etc_rich_attention", mutates_args=())
def etc_rich_attention(w_q: torch.Tensor, w_k: torch.Tensor, v_q: torch.Tensor,
                       v_k: torch.Tensor, b: torch.Tensor, c: torch.Tensor, th: torch.Tensor,
                       cq: torch.Tensor, ck: torch.Tensor, vq: torch.Tensor, vk: torch.Tensor,
                       q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       global_valid: torch.Tensor, blocks: int, block: int, radius: int,
                       scale: float, big_neg: float) -> torch.Tensor:
  """ETC's long queries with Rich Attention, fused: `[B, N, H, D]`.

  Rich Attention's parameters (`RichAttentionTerm`: `w_q`, `w_k`, `v_q`, `v_k [H, D, A]`,
  `b`, `c [H, A]`) and `th = |theta| / sqrt 2 [H, A]`; the coordinates `cq [A, B, nq]`, `ck
  [A, B, nk]` and validity `vq [B, nq]`, `vk [B, nk]` of the block and window positions
  as in `rich_window_bias`; `q`, `k`, `v [B, G + N, H, D]` the layer's projections, the
  `G` global tokens first (`G = global_valid.shape[1]`, `global_valid [B, G]` which are
  valid), `N <= blocks * block` long tokens (the kernel pads the blocks and windows and
  projects each token for Rich itself). Long query `i` attends to the long keys with
  `|key - query| <= radius` and all globals, valid ones only, with logits `scale q.k` plus
  Rich Attention on the long keys; a query that sees no key (or is not valid) gets 0.
  """
  heads, d_rich, axes = w_q.shape
  batch, nq = vq.shape
  g = global_valid.shape[1]
  d = q.shape[-1]
  n = q.shape[1] - g
  if (nq != blocks * block or q.dim() != 4 or q.shape[0] != batch or q.shape[2] != heads
      or d != d_rich or tuple(k.shape) != tuple(q.shape) or tuple(v.shape) != tuple(q.shape)
      or d % 8 != 0 or not 0 <= n <= nq or ck.shape[-1] != nq + 2 * radius):
    raise ValueError(f"etc_rich_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v "
                     f"{tuple(v.shape)} with {g} globals do not fit {blocks} blocks of {block} "
                     f"({heads} heads of {d_rich}) with radius {radius} and a head size that "
                     f"is a multiple of 8")
  # Kept in one list until the call returns: the pointers must outlive any copies.
  args = ([_f32(t) for t in (w_q, w_k, v_q, v_k, b, c, th, cq, ck)] + [_u8(vq), _u8(vk)]
          + [_f32(q), _f32(k), _f32(v), _u8(global_valid)])
  out = torch.empty((batch, n, heads, d), dtype=torch.float32)
  _call("etc_rich_attention", *[t.data_ptr() for t in args], out.data_ptr(),
        axes, batch, heads, blocks, block, radius, d, g, n, float(scale), float(big_neg),
        torch.get_num_threads())
  return out


@etc_rich_attention.register_fake
def _(w_q, w_k, v_q, v_k, b, c, th, cq, ck, vq, vk, q, k, v, global_valid, blocks, block,
      radius, scale, big_neg):
  g = global_valid.shape[1]
  return q.new_empty((q.shape[0], q.shape[1] - g, q.shape[2], q.shape[3]))
