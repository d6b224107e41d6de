"""Documents, dataset readers, the synthetic generator, tokenizers and featurisation."""

from flaxdoc.data.document import Document, DocumentError, Entity

__all__ = ["Document", "DocumentError", "Entity"]
