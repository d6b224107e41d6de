"""Rows of a fused kernel against the XLA path it replaces: times and errors.

`flaxdoc.bench.etc_kernel` and `flaxdoc.bench.gcn_kernel` each build a problem (inputs,
the XLA form, the fused form for a given tiling, an output cotangent); `compare` times
both forms' forward and forward+backward (`jax.jit`, back-to-back calls) and reports
every row's error against the XLA path in float32 on the same (rounded) inputs: the
relative L2 error of the output, and the largest over the gradients. The XLA path's
own error in the benchmark's dtype is printed beside it: the kernel is as exact as the
path it replaces when the two are alike.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

from flaxdoc.bench import common


def relative_error(want, got) -> float:
  """`|got - want| / |want|` (L2, float32)."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  want, got = jnp.asarray(want, jnp.float32), jnp.asarray(got, jnp.float32)
  return float(jnp.linalg.norm(got - want) / jnp.maximum(jnp.linalg.norm(want), 1e-30))


def measure(fn, args, cotangent, iters: int):
  """`(fwd_ms, fwd_bwd_ms, output, gradients)` of `fn(*args)`; gradients of every arg."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  forward = jax.jit(lambda *x: fn(*x))  # a fresh function per row: no trace shared
  grads = jax.jit(jax.grad(lambda *x: jnp.sum(fn(*x).astype(jnp.float32) * cotangent),
                           argnums=tuple(range(len(args)))))
  fwd = common.time_back_to_back(lambda: forward(*args), iters=iters)
  both = common.time_back_to_back(lambda: grads(*args), iters=iters)
  return fwd * 1e3, both * 1e3, forward(*args), grads(*args)


def compare(args, xla: Callable, fused: Callable | dict[str, Callable], cotangent, tiles: list,
            iters: int, base: dict, check: bool = True) -> Iterator[dict]:
  """The XLA row, then one row per tiling (a tiling that fails gets an `error` row).

  `fused(tiles)` gives the fused form; a dict of them (by `impl` name) gives a row per
  form and tiling.
  """
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  reference = None
  if check:
    args32 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), args)
    _, _, ref_out, ref_grads = measure(xla, args32, cotangent, 1)
    reference = (ref_out, jax.tree.leaves(ref_grads))

  def errors(out, grads, prefix=""):
    if reference is None:
      return {}
    grad_err = max(relative_error(r, g) for r, g in zip(reference[1], jax.tree.leaves(grads)))
    return {f"{prefix}out_err": relative_error(reference[0], out), f"{prefix}grad_err": grad_err}

  fwd, both, out, grads = measure(xla, args, cotangent, iters)
  xla_errors = errors(out, grads, "xla_")
  yield dict(base, impl="xla", tiles="-", fwd_ms=fwd, fwd_bwd_ms=both, **xla_errors)
  forms = fused if isinstance(fused, dict) else {"pallas": fused}
  for impl, form in forms.items():
    for t in tiles:
      label = ",".join(str(v) for v in dataclasses.astuple(t))
      try:
        f, fb, out, grads = measure(form(t), args, cotangent, iters)
      except Exception as e:  # pylint: disable=broad-except  # a tiling Triton refuses
        yield dict(base, impl=impl, tiles=label, error=f"{type(e).__name__}: {e}"[:300])
        continue
      yield dict(base, impl=impl, tiles=label, fwd_ms=f, fwd_bwd_ms=fb,
                 speedup_fwd=fwd / f, speedup_fwd_bwd=both / fb, **errors(out, grads),
                 **xla_errors)


# --------------------------------------------------------------------------- command line
COLUMNS = ("impl", "tiles", "batch", "length", "dtype", "fwd_ms", "fwd_bwd_ms", "speedup_fwd",
           "speedup_fwd_bwd", "out_err", "grad_err", "xla_out_err", "xla_grad_err")


def add_arguments(ap, batch: int, length: int, tiles_help: str, sweep: tuple[str, ...]) -> None:
  """The flags both kernel benchmarks take."""
  ap.add_argument("--batch", type=int, default=batch)
  ap.add_argument("--length", type=int, default=length)
  ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
  ap.add_argument("--tiles", nargs="+", default=None,
                  help=f"{tiles_help} (default: the kernel's defaults)")
  ap.add_argument("--sweep", action="store_true", help=f"also the tilings {sweep}")
  ap.add_argument("--iters", type=int, default=20)
  ap.add_argument("--no_check", action="store_true", help="skip the float32 reference")
  ap.add_argument("--local", action="store_true", help="tiny sizes, for CPU smoke tests")
  ap.add_argument("--json", action="store_true")


def tilings(a, parse: Callable, default, sweep: tuple[str, ...]) -> list:
  """`--tiles` (or the default, or a list of defaults), then the sweep's tilings not
  already listed."""
  tiles = [parse(t) for t in a.tiles] if a.tiles else (
      list(default) if isinstance(default, list) else [default])
  if a.sweep:
    tiles += [parse(t) for t in sweep if parse(t) not in tiles]
  return tiles


def emit(rows: Iterator[dict], a, title: str, columns=COLUMNS) -> None:
  """Prints each row as it comes (unless `--json`), then the table or the JSON rows."""
  done = []
  for row in rows:
    done.append(row)
    if not a.json:
      print("#", row, flush=True)
  common.emit(done, as_json=a.json, title=title,
              columns=None if a.json else list(columns) + ["error"])
