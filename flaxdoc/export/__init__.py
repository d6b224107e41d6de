"""Interop: export to PyTorch (safetensors + plain torch modules) and Hugging Face import.

* `flaxdoc.export.weights`: Flax params <-> flat dot-named tensors (`.safetensors`).
* `flaxdoc.export.exporter` / `python -m flaxdoc.export`: a training run -> `OUT/`.
* `flaxdoc.export.torch`: PyTorch modules for every family, `load_exported(OUT)`
  (no JAX needed).
* `flaxdoc.export.hf_import`: RoBERTa / BERT / LayoutLM checkpoints -> flaxdoc params.

Importing this package imports neither JAX nor torch.
"""
