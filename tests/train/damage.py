"""Ways a committed checkpoint step gets damaged, as a full disk, a lost file or a bad drive leave it."""

import os

DAMAGE_KINDS = ("truncated", "missing_file", "bit_flip", "no_commit_marker", "bad_metadata")


def largest_array_file(step_path: str) -> str:
  """The biggest file under `state/` (an OCDBT data file: the arrays themselves)."""
  files = []
  for root, _, names in os.walk(os.path.join(step_path, "state")):
    files += [os.path.join(root, n) for n in names]
  return max(files, key=os.path.getsize)


def damage(step_path: str, kind: str) -> str:
  """Damages the step folder `step_path` in place; returns the path it touched."""
  if kind == "no_commit_marker":
    path = os.path.join(step_path, "commit_success.txt")
    os.remove(path)
    return path
  if kind == "bad_metadata":
    path = os.path.join(step_path, "meta", "metadata")
    with open(path, "w", encoding="utf-8") as f:
      f.write('{"step": 6, "trunc')
    return path
  path = largest_array_file(step_path)
  if kind == "missing_file":
    os.remove(path)
  elif kind == "truncated":
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 2)
  elif kind == "bit_flip":
    with open(path, "r+b") as f:
      f.seek(os.path.getsize(path) // 2)
      byte = f.read(1)[0]
      f.seek(-1, os.SEEK_CUR)
      f.write(bytes([byte ^ 0x10]))
  else:
    raise ValueError(kind)
  return path
