"""`python -m flaxdoc.data.corpus`: unlabelled JSON Lines for MLM pre-training."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from flaxdoc.data import corpus, datasets
from flaxdoc.data.jsonl import write_jsonl
from flaxdoc.data.synthetic import make_document

CORD = Path(os.environ.get("FLAXDOC_DATA_DIR") or
            Path(__file__).resolve().parents[3] / "shared" / "datasets") / "cord"


def test_corpus_cli_writes_unlabelled_documents_the_jsonl_reader_takes(tmp_path):
  extra = tmp_path / "extra.jsonl"
  write_jsonl(extra, [make_document(5, 0)])
  out = tmp_path / "c.jsonl"
  assert corpus.main(["--out", str(out), "--synthetic", "3", "--jsonl", str(extra)]) == 0
  lines = [json.loads(line) for line in out.read_text().splitlines()]
  assert [o["id"] for o in lines] == ["synthetic/synthetic-1-0", "synthetic/synthetic-1-1",
                                      "synthetic/synthetic-1-2", "jsonl/synthetic-5-0"]
  assert all(not o.get("entities") and not o.get("relations") for o in lines)
  docs, _ = datasets.load_dataset(f"jsonl:{out}", "train", dev_fraction=0.0)
  original = make_document(1, 0)
  assert docs[0].words == original.words and docs[0].entities is None
  np.testing.assert_allclose(docs[0].boxes, original.boxes)


def test_corpus_needs_a_source(tmp_path):
  with pytest.raises(SystemExit):
    corpus.main(["--out", str(tmp_path / "c.jsonl")])


@pytest.mark.skipif(not CORD.is_dir(), reason=f"CORD not found at {CORD}")
def test_corpus_reads_the_whole_official_train_split_of_cord():
  docs = corpus.dataset_train_documents("cord", str(CORD))
  assert docs and all(d.id.startswith("cord/") and d.entities is None for d in docs)
  # All of it: the default loader's train split is that minus the carved dev split.
  train, _ = datasets.load_dataset("cord", "train", data_dir=CORD, on_error="skip")
  assert len(docs) == len(train) + datasets.dev_size("cord", len(docs))
