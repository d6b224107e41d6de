r"""FormNet ablation: ETC + Rich Attention (no GCN), the paper's 'ETC-standard + RichAtt'.

FormNet-A2 sizes by default (the paper's Payment ablation trains A2 from scratch);
`variant=A1` or `variant=A3` in the arg changes the size, not the ablation.

    python -m flaxdoc.main --config=configs/formnet_etc_rich.py:local --workdir=/tmp/x
"""

from flaxdoc.models import formnet
from flaxdoc.train import default_config


def get_config(arg=None):
  config = default_config.make(arg, model="formnet", variant="A2", recipe="formnet",
                               max_len=formnet.MAX_LEN, scheme="BIOES")
  formnet.ablate(config.model, "etc_rich")
  return config
