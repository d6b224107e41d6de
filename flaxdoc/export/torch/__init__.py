"""Plain PyTorch modules for every flaxdoc family, loading `flaxdoc.export` files (no JAX)."""

from flaxdoc.export.torch.load import build_torch_model, load_exported, read_export_config
from flaxdoc.export.torch.models import BATCH_KEYS, OPTIONAL_BATCH_KEYS, TorchDocumentEncoder

__all__ = ["load_exported", "build_torch_model", "read_export_config", "TorchDocumentEncoder",
           "BATCH_KEYS", "OPTIONAL_BATCH_KEYS"]
