"""Documents, dataset readers, the synthetic generator, tokenizers and featurisation.

The most used names are re-exported here; dataset readers are imported lazily
by `load_dataset`.
"""

from flaxdoc.data.document import Document, DocumentError, Entity
from flaxdoc.data.report import LoadReport


def load_dataset(name, split, data_dir=None, **kwargs):
  """See `flaxdoc.data.datasets.load_dataset`."""
  from flaxdoc.data import datasets  # pylint: disable=import-outside-toplevel
  return datasets.load_dataset(name, split, data_dir, **kwargs)


__all__ = ["Document", "DocumentError", "Entity", "LoadReport", "load_dataset"]
