r"""DocPolarBERT base: RoBERTa-base with relative polar attention, no absolute 2D embedding.

BIO tags, 512-token windows, the BERT recipe. Pre-training (`mode=pretrain`) uses the
paper's rates: MLM on 30% of tokens plus 1-LOP on 30% (loss weight `lop_weight=0.5`).

    python -m flaxdoc.main --config=configs/docpolarbert_base.py:dataset=funsd --workdir=/tmp/dpb
    python -m flaxdoc.main --config=configs/docpolarbert_base.py:mode=pretrain --workdir=/tmp/pt

Options: `--config.model.polar_distance_pool=batch` (released code's batch quantiles),
`--config.model.polar_angle=sectors8` (the paper's 8 sectors),
`--config.model.position_2d=learned` (ablation: add LayoutLM's absolute 2D tables).
"""

from flaxdoc.models import docpolarbert
from flaxdoc.train import default_config


def get_config(arg=None):
  return default_config.make(arg, model="docpolarbert", variant="base", recipe="bert",
                             max_len=docpolarbert.MAX_LEN, scheme="BIO",
                             mlm_rate=docpolarbert.MLM_RATE, lop_rate=docpolarbert.LOP_RATE)
