"""flaxdoc: layout-aware document transformers in JAX/Flax.

FormNet, DocPolarBERT, LSPE, LayoutLinformer / LayoutCosformer and LAGaBi as
configurations of one encoder. See README.md and DESIGN notes in the docs.
"""

__version__ = "0.1.0"
