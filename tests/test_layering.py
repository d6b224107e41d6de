"""The package's layers import only downward (DESIGN §1), and no two modules import each
other; both checked on the source text.

layout -> nn -> models -> train; export, bench and main sit on top. A file that
imports a higher layer, even inside a function, would tie a lower layer to it
(train importing export made `init_from=hf:` depend on the interop layer), so the
check reads every `import` in the tree with `ast` (no module is imported: cheap).
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flaxdoc"

# layer (package under flaxdoc) -> the layers above it, which it must not import.
FORBIDDEN = {
    "layout": ("nn", "models", "train", "export", "bench", "main"),
    "nn": ("models", "train", "export", "bench", "main"),
    "models": ("train", "export", "bench", "main"),
    "train": ("export", "bench", "main"),
}


def _package_of(path: Path) -> str:
  """The dotted package a file's relative imports start from."""
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1])


def _imports(source: str, package: str) -> set[str]:
  """Every module `source` imports (relative imports made absolute), at any depth."""
  found = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parent = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parent + ([base] if base else []))
      found.add(base)
      found.update(f"{base}.{alias.name}" for alias in node.names)  # `from flaxdoc import export`
  return found


def _layer_files(layer: str):
  return sorted((PACKAGE / layer).rglob("*.py"))


def test_lower_layers_do_not_import_higher_ones():
  wrong = []
  for layer, above in FORBIDDEN.items():
    files = _layer_files(layer)
    assert files, f"no files under flaxdoc/{layer}"
    for path in files:
      for name in sorted(_imports(path.read_text(encoding="utf-8"), _package_of(path))):
        for high in above:
          if name == f"flaxdoc.{high}" or name.startswith(f"flaxdoc.{high}."):
            wrong.append(f"{path.relative_to(PACKAGE.parent)} imports {name} ({layer} -> {high})")
  assert not wrong, "\n".join(wrong)


def test_the_check_sees_function_level_and_relative_imports():
  source = "def f():\n  from flaxdoc.export import hf_import\nfrom ..export import weights\n"
  found = _imports(source, "flaxdoc.train")
  assert "flaxdoc.export.hf_import" in found and "flaxdoc.export.weights" in found
  assert _package_of(PACKAGE / "train" / "hf_init.py") == "flaxdoc.train"


def _module_name(path: Path) -> str:
  return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def test_no_two_modules_import_each_other():
  # A module pair that imports each other (even lazily, inside a function) is one
  # concept split in two or a registry tied to what it registers; the data readers
  # and datasets.py, graph.py and edge_features.py, the OCR engines and their registry,
  # and the tokenizer loader and the Hugging Face folder reader (the tokenizer classes
  # moved to modules of their own) were untied this way. Package __init__ files, which
  # re-export, are left out.
  files = {_module_name(p): p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
  imports = {name: {m for m in _imports(path.read_text(encoding="utf-8"), _package_of(path))
                    if m in files and m != name}
             for name, path in files.items()}
  mutual = sorted((a, b) for a in imports for b in imports[a] if a < b and a in imports[b])
  assert len(files) > 100 and any(imports.values())  # the scan found the package's imports
  assert not mutual, "\n".join(f"{a} <-> {b}" for a, b in mutual)
