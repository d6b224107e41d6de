r"""FormNet-A3: GCN Super-Tokens + ETC with Rich Attention, 1024 wide, 16 heads.

351M parameters with the BERT-multilingual vocabulary (paper: 345M; see
flaxdoc/models/formnet.py). BIOES tags, 1024-token windows, the FormNet optimisation recipe.

    python -m flaxdoc.main --config=configs/formnet_a3.py --workdir=/tmp/formnet_a3
    python -m flaxdoc.main --config=configs/formnet_a3.py:local,dataset=funsd --workdir=/tmp/x

`arg` (after ':'): `local`, `variant=A1|A2|A3`, `dataset=...`, `mode=pretrain`, and
`ablation=etc|etc_rich|etc_gcn` (FormNet's ablations, see flaxdoc/models/formnet.py).
"""

from flaxdoc.models import formnet
from flaxdoc.train import default_config


def get_config(arg=None):
  config = default_config.make(arg, model="formnet", variant="A3", recipe="formnet",
                               max_len=formnet.MAX_LEN, scheme="BIOES")
  ablation = default_config.parse_arg(arg, ablation="full").ablation
  formnet.ablate(config.model, ablation)
  return config
