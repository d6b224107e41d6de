"""The embedded synthetic dataset: seeded forms, invoices and receipts.

    from flaxdoc.data.synthetic import SyntheticConfig, make_document, load_synthetic
    doc = make_document(seed=0, index=7)
    train, report = load_synthetic("train", num_train=2000)

See `generator.py` for the design (what makes layout necessary) and
`python -m flaxdoc.data.synthetic --num 1000` for statistics.
"""

from flaxdoc.data.synthetic.generator import (
    LABELS, LABELS_WITH_KEYS, SPLIT_STARTS, SyntheticConfig, corpus_text, generate, load_synthetic, make_document,
    split_range)
from flaxdoc.data.synthetic.kinds import KINDS

__all__ = ["KINDS", "LABELS", "LABELS_WITH_KEYS", "SPLIT_STARTS", "SyntheticConfig", "corpus_text", "generate",
           "load_synthetic", "make_document", "split_range"]
