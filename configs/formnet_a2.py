r"""FormNet-A2: GCN Super-Tokens + ETC with Rich Attention, 768 wide, 12 heads.

221M parameters with the BERT-multilingual vocabulary (paper: 217M; see
flaxdoc/models/formnet.py). BIOES tags, 1024-token windows, the FormNet optimisation recipe.

    python -m flaxdoc.main --config=configs/formnet_a2.py --workdir=/tmp/formnet_a2
    python -m flaxdoc.main --config=configs/formnet_a2.py:local,dataset=funsd --workdir=/tmp/x

`arg` (after ':'): `local`, `variant=A1|A2|A3`, `dataset=...`, `mode=pretrain`, and
`ablation=etc|etc_rich|etc_gcn` (FormNet's ablations, see flaxdoc/models/formnet.py).
"""

from flaxdoc.models import formnet
from flaxdoc.train import default_config


def get_config(arg=None):
  config = default_config.make(arg, model="formnet", variant="A2", recipe="formnet",
                               max_len=formnet.MAX_LEN, scheme="BIOES")
  ablation = default_config.parse_arg(arg, ablation="full").ablation
  formnet.ablate(config.model, ablation)
  return config
