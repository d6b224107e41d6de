"""Flax parameter trees <-> flat, dot-separated tensor names (safetensors files).

The exported file is the portable form of a flaxdoc model: one tensor per Flax
parameter, named by its path joined with dots, in the *Flax layout* (Dense kernels
`[in, out]`, attention kernels `[E, H, D]` / `[H, D, E]`):

    encoder.layer_0.attention.query.kernel   float32 [E, H, D]
    encoder.shared_term_0.table_1d           float32 [32, D]
    super_tokens.layer_1.message_in_kernel   float32 [2E + F, H]

Scanned encoders (`scan_layers=True`, parameters stacked under `encoder.layers`
with a leading `[L]` axis) are unstacked into `encoder.layer_{i}` on export, so a
file never depends on how the model was compiled; `stack_layers` goes back.

The PyTorch modules of `flaxdoc.export.torch` name their parameters exactly like
this, so loading is `module.load_state_dict(tensors)` with no renaming table. This
module needs numpy and safetensors only (no JAX): the torch side imports it too.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

SEPARATOR = "."
# Key under which the scanned encoder keeps its stacked layer parameters.
SCANNED_LAYERS = "layers"


class WeightsError(ValueError):
  """A weights file or tree that cannot be read or matched (message names the tensor)."""


def _as_mapping(tree: Any) -> Mapping[str, Any]:
  # flax FrozenDict, plain dict and `nn.unbox`ed trees all behave as mappings.
  if hasattr(tree, "items"):
    return tree
  raise WeightsError(f"expected a nested mapping of parameters, got {type(tree).__name__}")


def flatten_params(params: Any, prefix: str = "") -> dict[str, np.ndarray]:
  """Nested parameter tree -> `{"a.b.c": float32 np.ndarray}` (sorted by name).

  Boxed leaves (`nn.Partitioned`, anything with `.unbox()` or `.value`) are unboxed;
  JAX arrays are copied to host. Names may not contain the separator.
  """
  out: dict[str, np.ndarray] = {}
  for key, value in _as_mapping(params).items():
    key = str(key)
    if SEPARATOR in key:
      raise WeightsError(f"parameter name {key!r} (under {prefix or 'the root'!r}) contains "
                         f"{SEPARATOR!r}; cannot flatten unambiguously")
    name = f"{prefix}{SEPARATOR}{key}" if prefix else key
    if hasattr(value, "unbox"):
      value = value.unbox()
    if hasattr(value, "items"):
      out.update(flatten_params(value, name))
    else:
      out[name] = np.asarray(value)
  return dict(sorted(out.items()))


def unflatten_params(flat: Mapping[str, Any]) -> dict[str, Any]:
  """`{"a.b.c": array}` -> nested dict (the inverse of `flatten_params`)."""
  tree: dict[str, Any] = {}
  for name, value in flat.items():
    parts = name.split(SEPARATOR)
    node = tree
    for part in parts[:-1]:
      child = node.setdefault(part, {})
      if not isinstance(child, dict):
        raise WeightsError(f"tensor {name!r}: {part!r} is both a tensor and a prefix")
      node = child
    if parts[-1] in node:
      raise WeightsError(f"tensor {name!r} appears twice")
    node[parts[-1]] = value
  return tree


def unstack_layers(flat: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """`*.layers.<rest>` stacked `[L, ...]` (nn.scan) -> `*.layer_{i}.<rest>` `[...]`."""
  out: dict[str, np.ndarray] = {}
  marker = f"{SEPARATOR}{SCANNED_LAYERS}{SEPARATOR}"
  for name, value in flat.items():
    if marker not in name:
      out[name] = value
      continue
    head, rest = name.split(marker, 1)
    for i in range(value.shape[0]):
      out[f"{head}{SEPARATOR}layer_{i}{SEPARATOR}{rest}"] = np.asarray(value[i])
  return dict(sorted(out.items()))


def stack_layers(flat: Mapping[str, np.ndarray], owner: str = "encoder") -> dict[str, np.ndarray]:
  """`owner.layer_{i}.<rest>` -> `owner.layers.<rest>` stacked `[L, ...]` (for scanned models)."""
  groups: dict[str, dict[int, np.ndarray]] = {}
  out: dict[str, np.ndarray] = {}
  prefix = f"{owner}{SEPARATOR}layer_"
  for name, value in flat.items():
    if not name.startswith(prefix):
      out[name] = value
      continue
    index, rest = name[len(prefix):].split(SEPARATOR, 1)
    groups.setdefault(rest, {})[int(index)] = value
  for rest, layers in groups.items():
    if sorted(layers) != list(range(len(layers))):
      raise WeightsError(f"{owner}.layer_*.{rest}: layers {sorted(layers)} are not 0..L-1")
    out[f"{owner}{SEPARATOR}{SCANNED_LAYERS}{SEPARATOR}{rest}"] = np.stack(
        [layers[i] for i in range(len(layers))])
  return dict(sorted(out.items()))


def export_tensors(params: Any) -> dict[str, np.ndarray]:
  """The tensors to write for a Flax parameter tree: flat, unscanned, float32, contiguous."""
  flat = unstack_layers(flatten_params(params))
  out = {}
  for name, value in flat.items():
    value = np.asarray(value)
    if not np.issubdtype(value.dtype, np.floating):
      raise WeightsError(f"parameter {name!r} has non-float dtype {value.dtype}")
    if not np.all(np.isfinite(value)):
      raise WeightsError(f"parameter {name!r} holds NaN or inf; refusing to export it")
    out[name] = np.ascontiguousarray(value.astype(np.float32))
  return out


def save_tensors(tensors: Mapping[str, np.ndarray], path: str | os.PathLike,
                 metadata: Mapping[str, str] | None = None) -> None:
  """Writes a `.safetensors` file (string metadata only, per the format)."""
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  meta = {str(k): str(v) for k, v in (metadata or {}).items()}
  save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata=meta)


def load_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """Reads a `.safetensors` file into numpy arrays (no pickle involved)."""
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
  if not os.path.exists(path):
    raise WeightsError(f"weights file {os.fspath(path)!r} does not exist")
  return dict(load_file(str(path)))


def save_params(params: Any, path: str | os.PathLike,
                metadata: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
  """Flax params -> `.safetensors`; returns the tensors written. Metadata values are JSON'd."""
  tensors = export_tensors(params)
  meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in (metadata or {}).items()}
  save_tensors(tensors, path, meta)
  return tensors


def load_params(path: str | os.PathLike, scanned: bool = False) -> dict[str, Any]:
  """`.safetensors` -> nested Flax parameter dict (restacked when the model is scanned)."""
  flat = load_tensors(path)
  if scanned:
    flat = stack_layers(flat)
  return unflatten_params(flat)


def match_shapes(expected: Mapping[str, tuple[int, ...]],
                 given: Mapping[str, Any]) -> tuple[list[str], list[str], list[str]]:
  """(missing, unexpected, wrong-shape descriptions) of `given` against `expected` names."""
  missing = sorted(set(expected) - set(given))
  unexpected = sorted(set(given) - set(expected))
  wrong = [f"{k}: expected {tuple(expected[k])}, got {tuple(np.shape(given[k]))}"
           for k in sorted(set(expected) & set(given))
           if tuple(expected[k]) != tuple(np.shape(given[k]))]
  return missing, unexpected, wrong
