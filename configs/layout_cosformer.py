r"""LayoutCosformer: LayoutLM + page embedding with cosFormer's linear attention, O(N).

BIO tags, 2048-token windows (as the paper's long-range models), the BERT recipe.
`arg` adds `reweight=plain|squircle|cross`: cosFormer's own 1D cos re-weighting
(default), or Douzon et al.'s 2D squircle / cross re-weighting over box centres.

    python -m flaxdoc.main --config=configs/layout_cosformer.py:reweight=cross --workdir=/tmp/cos
"""

from flaxdoc.models import long_range
from flaxdoc.train import default_config


def get_config(arg=None):
  a = default_config.parse_arg(arg, reweight="plain")
  if a.reweight not in long_range.COSFORMER_REWEIGHTS:
    raise ValueError(f"configs/layout_cosformer.py: reweight={a.reweight!r}, expected one of "
                     f"{sorted(long_range.COSFORMER_REWEIGHTS)}")
  config = default_config.make(arg, model="layout_cosformer", variant="base", recipe="bert",
                               max_len=long_range.MAX_LEN, scheme="BIO")
  config.model.cosformer_reweight = long_range.COSFORMER_REWEIGHTS[a.reweight]
  return config
