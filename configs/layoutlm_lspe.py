r"""LayoutLM with learnable sinusoidal positional encodings (LSPE) for the 1D index and x, y.

BIO tags, 512-token windows, the BERT recipe. `arg` adds
`positions=lspe|lspe_sc|sine|learnvec` (the four encodings the LSPE paper compares;
default `lspe`). The paper's augmentations are data options:
`--config.data.block_shuffle=0.5` (global block shuffling) and
`--config.data.neighbour_swap=0.5` (neighbour block swapping, sigma = 1).

    python -m flaxdoc.main --config=configs/layoutlm_lspe.py:dataset=sroie --workdir=/tmp/lspe
"""

from flaxdoc.models import layoutlm
from flaxdoc.train import default_config


def get_config(arg=None):
  a = default_config.parse_arg(arg, positions="lspe")
  config = default_config.make(arg, model="layoutlm", variant="base", recipe="bert",
                               max_len=layoutlm.MAX_LEN, scheme="BIO")
  config.model.positions = a.positions
  return config
