r"""LAGaBi on RoBERTa-base: per-head Gaussian polar biases (48 parameters), no layout pre-training.

BIO tags, 512-token windows, the BERT recipe. `variant=bert_base` or
`variant=layoutlm_base` in the arg puts the Gaussian term on BERT or LayoutLM.

    python -m flaxdoc.main --config=configs/lagabi_roberta_base.py:dataset=cord --workdir=/tmp/lg

Options: `--config.model.gaussian_corner=top_left` (the paper's corner; default the
released bottom-left), `--config.model.gaussian_alpha=4.0`.
"""

from flaxdoc.models import lagabi
from flaxdoc.train import default_config


def get_config(arg=None):
  return default_config.make(arg, model="lagabi", variant="roberta_base", recipe="bert",
                             max_len=lagabi.MAX_LEN, scheme="BIO")
