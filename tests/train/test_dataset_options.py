"""`config.data.dataset_options`: every reader's options can be set from the command line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from absl import flags
from ml_collections import config_flags

from flaxdoc.data import datasets
from flaxdoc.data.synthetic import SyntheticConfig
from flaxdoc.train import default_config, setup

ROOT = Path(__file__).resolve().parents[2]


def test_every_readers_option_is_declared_and_every_declared_one_is_taken():
  taken = set()
  for name in ("funsd", "cord", "sroie", "jsonl:docs.jsonl", "synthetic"):
    taken |= set(datasets.option_names(name))
  # Set in config files only: a SyntheticConfig object, and a tuple of form kinds.
  taken -= {"config", "kinds"}
  assert set(default_config.DATASET_OPTIONS) == taken
  fields = {f.name: f.type for f in dataclasses.fields(SyntheticConfig)}
  for name, kind in default_config.DATASET_OPTIONS.items():
    if name in fields:  # the flag parses to the generator's own type
      assert kind.__name__ == fields[name], name
  with pytest.raises(ValueError, match=r"no reader takes \['box_polcy'\]"):
    default_config.dataset_options(box_polcy="clip")


@pytest.mark.parametrize("flag, value, want", [
    ("box_policy", "clip", "clip"), ("min_similarity", "0.5", 0.5),
    ("use_images", "false", False), ("num_train", "12", 12), ("ocr_noise", "0.05", 0.05)])
def test_each_option_is_set_by_its_flag_and_only_set_ones_reach_the_reader(flag, value, want):
  argv = ["prog", f"--config={ROOT / 'configs' / 'formnet_a2.py'}:local",
          f"--config.data.dataset_options.{flag}={value}"]
  fv = flags.FlagValues()  # as flaxdoc.main defines its --config
  config_flags.DEFINE_config_file("config", flag_values=fv, sys_argv=argv)
  fv(argv)
  options = fv.config.data.dataset_options
  assert options[flag] == want and type(options[flag]) is type(want)
  # Unset options (None) are not passed; `:local`'s synthetic sizes are.
  passed = setup.reader_options("synthetic", options)
  assert passed == {"num_train": 2000, "num_dev": 60, flag: want} | (
      {"num_train": want} if flag == "num_train" else {})


def test_an_option_the_datasets_reader_does_not_take_is_a_config_error():
  options = default_config.dataset_options(min_similarity=0.5)  # SROIE's
  with pytest.raises(setup.ConfigError, match=r"dataset 'cord' takes no option "
                                              r"'min_similarity'; its options are "):
    setup.load_documents("cord", "train", **setup.reader_options("cord", options))
