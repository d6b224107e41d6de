r"""LayoutLM base, optionally with Douzon et al.'s squircle / cross 2D attention bias.

BIO tags, 512-token windows, the BERT recipe. `arg` adds to the usual
(`local`, `variant`, `dataset`, `mode`):

* `bias=none|squircle|cross` - fixed 2D relative attention (no parameters);
* `split=window|page` - `page` cuts windows at page boundaries ("LayoutLM SplitPage"
  for long documents).

    python -m flaxdoc.main --config=configs/layoutlm_base.py:bias=squircle,split=page \
        --workdir=/tmp/layoutlm
"""

from flaxdoc.models import layoutlm
from flaxdoc.train import default_config


def get_config(arg=None):
  a = default_config.parse_arg(arg, bias="none", split="window")
  config = default_config.make(arg, model="layoutlm", variant="base", recipe="bert",
                               max_len=layoutlm.MAX_LEN, scheme="BIO", split=a.split)
  config.model.bias = a.bias
  return config
