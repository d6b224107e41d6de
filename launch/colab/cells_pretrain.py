"""The cells of `pretrain_tpu.ipynb`: MLM pre-training on a JSON Lines corpus with FSDP
over every TPU core, checkpoints on Drive or GCS, then fine-tuning from that checkpoint.
"""

from __future__ import annotations

import nbformat

from cells_common import badge, code, devices_cell, helpers_cell, install_cell, md, small_cell


def pretrain() -> list[nbformat.NotebookNode]:
  return [
      small_cell(),
      md(f'''
          # Pre-train FormNet on your documents (Colab TPU), then fine-tune it

          {badge("pretrain_tpu")}

          Masked-language-model pre-training on a corpus of unlabelled documents in flaxdoc
          JSON Lines, with the model, its gradients and Adam's moments **sharded over every
          TPU core** (FSDP: on a TPU v2-8 or v3-8 runtime, 8 cores), checkpoints on **Google
          Drive or GCS** so that a recycled runtime loses nothing, and then fine-tuning from
          that checkpoint (`config.init_from`). Re-running a training cell with the same
          `WORKDIR` resumes from its newest checkpoint.

          With `SMALL = True` (first cell) the model is tiny and the corpus is 40 synthetic
          documents: it runs on a CPU runtime in minutes.
          '''),
      install_cell(),
      devices_cell(),
      helpers_cell(),
      md('''
          ## Where the checkpoints go

          `WORKDIR` holds both runs, `WORKDIR/pretrain` and `WORKDIR/finetune`:

          * `/content/drive/MyDrive/...`: Google Drive, mounted by the next cell;
          * `gs://bucket/path`: a GCS bucket (the next cell asks for your Google credentials;
            the bucket should be in the TPU's region);
          * empty: Drive in Colab (`/content/drive/MyDrive/flaxdoc`), else a local folder.
            With `SMALL = True` always a local folder.
          '''),
      code('''
          # @title WORKDIR
          WORKDIR = ""  # @param {type:"string"}
          if not WORKDIR:
            WORKDIR = "/content/drive/MyDrive/flaxdoc" if IN_COLAB and not SMALL else str(RUNS)
          reach_workdir(WORKDIR)  # Drive mounted; for gs://, signed in and gcsfs installed
          PRETRAIN_DIR = WORKDIR.rstrip("/") + "/pretrain"
          FINETUNE_DIR = WORKDIR.rstrip("/") + "/finetune"
          print("pre-training run:", PRETRAIN_DIR)
          print("fine-tuning run: ", FINETUNE_DIR)
          '''),
      md('''
          ## The corpus

          One document per line in the `flaxdoc.document/1` JSON Lines format
          (`flaxdoc/data/jsonl.py`): `{"format": "flaxdoc.document/1", "id": ..., "words":
          [...], "boxes": [[x0, y0, x1, y1], ...], "page_sizes": [[w, h]]}` plus optional
          `pages` and `segments` (OCR lines). PDFs with a text layer convert with
          `flaxdoc.data.pdf.read_pdfs` and `jsonl.write_jsonl`. Set `CORPUS` to a local
          path (upload it, or copy it from Drive or with `gcloud storage cp`); a
          tenth of it is held out as a dev split. Left empty, synthetic documents without
          their labels stand in for a corpus.
          '''),
      code('''
          # @title CORPUS
          from flaxdoc.data import jsonl, synthetic

          CORPUS = ""  # @param {type:"string"}
          if not CORPUS:
            CORPUS = str(DATA / "demo_corpus.jsonl")
            n = 40 if SMALL else 5000
            # Seed 1: documents other than the synthetic fine-tuning set (seed 0) below.
            jsonl.write_jsonl(CORPUS, (d.replace(entities=None)
                                       for d in synthetic.generate(n, seed=1)))
          corpus_docs, corpus_report = jsonl.read_jsonl(CORPUS)
          print(corpus_report.summary())
          print(f"{len(corpus_docs)} documents, {sum(len(d) for d in corpus_docs):,} words; "
                "the first one:")
          print(json.dumps(jsonl.document_to_json(corpus_docs[0]))[:300], "...")
          del corpus_docs
          '''),
      md('''
          ## MLM pre-training, sharded over every core

          `config.mesh.shape` lays all devices out as `(data, fsdp, tensor)`. Here
          `(1, -1, 1)`: FSDP over every core, so each core keeps 1/N of the parameters and
          of the optimizer state and gathers each layer's weights just in time; the global
          batch is split over the cores too (so it must be a multiple of their number).
          `launch/README.md` lists other layouts (data parallel, tensor parallel) and what
          must divide what.
          '''),
      code('''
          # @title Pre-train
          from flaxdoc.train import trainer

          pre_config = formnet_config("mode=pretrain")
          pre_config.data.dataset = f"jsonl:{CORPUS}"
          pre_config.data.dataset_options = {}
          # FSDP over every device (the fine-tuning below uses the same mesh).
          FSDP_MESH = {"mesh.shape.data": 1, "mesh.shape.fsdp": -1, "mesh.shape.tensor": 1}
          override(pre_config, FSDP_MESH)
          if SMALL:
            override(pre_config, {"batch_size": max(8, N_DEVICES), "total_steps": 6,
                                  "checkpoint_every": 3})
          else:
            # 4 windows of 1024 tokens per core; checkpoints often, as Colab runtimes end.
            override(pre_config, {"batch_size": 4 * N_DEVICES, "total_steps": 20_000,
                                  "log_every": 50, "checkpoint_every": 500})
          pre_config.batch_size = -(-pre_config.batch_size // N_DEVICES) * N_DEVICES
          print(f"mesh (data, fsdp, tensor) = (1, {N_DEVICES}, 1) over {N_DEVICES} {PLATFORM} "
                f"device(s); global batch {pre_config.batch_size}, {pre_config.total_steps} steps")
          pre_result = trainer.train_and_evaluate(pre_config, PRETRAIN_DIR)
          print(pre_result)
          plot_run(PRETRAIN_DIR, "MLM pre-training")
          '''),
      md('''
          ## Fine-tune from the pre-trained checkpoint

          `config.init_from = PRETRAIN_DIR` loads every pre-trained tensor whose name and
          shape match (the encoder, embeddings, graph layers); the tagging head is new and
          the MLM head is left behind (the log line `init_from ...` lists both). The model
          config must be the one used for pre-training, and so must the tokenizer.

          `FINETUNE_DATA`: a labelled JSON Lines file (entities with labels; dev carved
          from it), with its labels in `LABELS` (comma-separated; left empty, they are
          read from the documents' `label_set`). Left empty, the synthetic training set is
          used.
          '''),
      code('''
          # @title Fine-tune
          FINETUNE_DATA = ""  # @param {type:"string"}
          LABELS = ""  # @param {type:"string"}

          ft_config = formnet_config()
          if FINETUNE_DATA:
            ft_config.data.dataset = f"jsonl:{FINETUNE_DATA}"
            ft_config.data.dataset_options = {}
            ft_config.data.labels = tuple(l.strip() for l in LABELS.split(",") if l.strip())
          elif SMALL:
            ft_config.data.dataset_options = {"num_train": 24, "num_dev": 6}
          else:
            ft_config.data.dataset_options = {"num_train": 2000, "num_dev": 200}
          override(ft_config, FSDP_MESH)
          if SMALL:
            override(ft_config, {"batch_size": max(8, N_DEVICES), "total_steps": 6,
                                 "eval_every": 3, "checkpoint_every": 3})
          else:
            override(ft_config, {"total_steps": 3000, "eval_every": 500, "checkpoint_every": 500})
          ft_config.batch_size = -(-ft_config.batch_size // N_DEVICES) * N_DEVICES
          ft_config.init_from = PRETRAIN_DIR
          ft_result = trainer.train_and_evaluate(ft_config, FINETUNE_DIR)
          print(ft_result)
          plot_run(FINETUNE_DIR, "fine-tuning from the pre-trained encoder")
          '''),
      code('''
          # @title What is in WORKDIR
          from etils import epath

          for run in (PRETRAIN_DIR, FINETUNE_DIR):
            steps = sorted(int(p.name) for p in (epath.Path(run) / "checkpoints").iterdir()
                           if p.name.isdigit())
            print(f"{run}: checkpoints at steps {steps}")
          '''),
      md('''
          The fine-tuned run evaluates and predicts like any other
          (`inference.run_eval` / `run_predict`, or `--config.mode=eval|predict`, as in
          `quickstart_tpu.ipynb`), and `export_pytorch.ipynb` exports it to PyTorch (set
          its `WORKDIR` to `FINETUNE_DIR`). A run on GCS needs no local copy for them:
          eval, predict and the export read and write the `gs://` run in place (through
          Orbax and `etils.epath`, with the `gcsfs` installed above). On a TPU pod slice
          the same configs run with `launch/tpu/pod.sh` (see `launch/README.md`).
          '''),
  ]
