r"""LayoutLinformer: LayoutLM + page embedding, keys and values projected from N = 2048 to k = 512.

BIO tags, 2048-token windows, the BERT recipe. No 2D attention bias is possible.

    python -m flaxdoc.main --config=configs/layout_linformer.py --workdir=/tmp/lin

`--config.model.linformer_proj_length=256` changes `k`; the projections are sized
for `config.data.max_len` (N).
"""

from flaxdoc.models import long_range
from flaxdoc.train import default_config


def get_config(arg=None):
  return default_config.make(arg, model="layout_linformer", variant="base", recipe="bert",
                             max_len=long_range.MAX_LEN, scheme="BIO")
