"""The cells of `quickstart_tpu.ipynb`: install, fine-tune FormNet on synthetic documents
and FUNSD, evaluate, draw predictions on a page.
"""

from __future__ import annotations

import nbformat

from cells_common import (REPO_URL, badge, code, devices_cell, helpers_cell, install_cell, md,
                          small_cell)


def quickstart() -> list[nbformat.NotebookNode]:
  return [
      small_cell(),
      md(f'''
          # flaxdoc quickstart: FormNet on a Colab TPU

          {badge("quickstart_tpu")}

          [flaxdoc]({REPO_URL}) trains layout-aware document transformers (FormNet,
          DocPolarBERT, LayoutLM variants, ...) with JAX and Flax. This notebook

          1. installs flaxdoc and checks the accelerators,
          2. fine-tunes FormNet (`configs/formnet_a2.py`) on synthetic forms, invoices and receipts,
          3. fine-tunes it on [FUNSD](https://guillaumejaume.github.io/FUNSD/) (uploaded, or
             downloaded from the official URL),
          4. evaluates it (entity-level F1 with seqeval) and draws its predictions on a page.

          Pick a TPU runtime (*Runtime > Change runtime type > TPU*) and run all cells. With
          `SMALL = True` (first cell) everything is tiny and runs on a CPU runtime in minutes:
          good for a first look, not for accuracy. The same steps from a shell:
          `python -m flaxdoc.main --config=configs/formnet_a2.py --workdir=DIR`.
          '''),
      install_cell(),
      devices_cell(),
      helpers_cell(),
      md('''
          ## The data

          A `flaxdoc.data.Document` holds words, their boxes in page pixels, pages, OCR
          segments and (for training) entities: labelled runs of words. The synthetic
          documents are generated on the fly, with entities whose meaning depends on the
          layout (a value is a `due_date` because of the key next to it or above it).
          '''),
      code('''
          # @title A synthetic document and its entities
          from flaxdoc import viz
          from flaxdoc.data import synthetic

          sample = synthetic.make_document(seed=0, index=3)
          print(f"{sample.id}: {len(sample)} words, {len(sample.entities)} entities; "
                f"labels: {', '.join(synthetic.LABELS)}")
          display(Image(filename=str(viz.draw_document(
              sample, RUNS / "pictures" / "synthetic_sample.png", entities=sample.entities))))
          '''),
      md('''
          ## Fine-tune FormNet on synthetic documents

          `trainer.train_and_evaluate(config, workdir)` is what `python -m flaxdoc.main`
          runs: it writes checkpoints, `metrics.jsonl` and TensorBoard files into the
          workdir, evaluates on the dev split every `eval_every` steps, and resumes from
          the newest checkpoint when run again on the same workdir. The mesh spans all
          devices (data parallel: `config.mesh.shape` is `data=-1`).
          '''),
      code('''
          # @title Train
          from flaxdoc.train import trainer

          SYN_RUN = RUNS / "formnet_synthetic"
          syn_config = formnet_config()
          if SMALL:
            syn_config.data.dataset_options = {"num_train": 24, "num_dev": 6}
            override(syn_config, {"total_steps": 8, "eval_every": 4, "checkpoint_every": 4})
          else:
            syn_config.data.dataset_options = {"num_train": 2000, "num_dev": 200}
            override(syn_config, {"total_steps": 3000, "eval_every": 500, "checkpoint_every": 500})
          print(f"FormNet: width {syn_config.model.width}, {syn_config.model.depth} layers, "
                f"{syn_config.data.max_len}-token windows, global batch {syn_config.batch_size}, "
                f"{syn_config.total_steps} steps, {syn_config.dtype}")
          syn_result = trainer.train_and_evaluate(syn_config, str(SYN_RUN))
          print(syn_result)
          plot_run(SYN_RUN, "FormNet on synthetic documents")
          '''),
      md('''
          ## FUNSD

          FUNSD has 199 scanned forms (149 train, 50 test) with `header`, `question`,
          `answer` and `other` entities. Its terms allow non-commercial research use only.
          The next cell finds a copy, in this order:

          1. `FUNSD_DIR`, or `$FLAXDOC_DATASETS/funsd`, or one unpacked here before;
          2. with `UPLOAD = True` (Colab): the official `dataset.zip`, uploaded from your computer;
          3. the official download URL (skipped when `FLAXDOC_NOTEBOOK_OFFLINE=1`).

          Without a copy, the FUNSD cells are skipped and the rest uses the synthetic run.
          A dev split is carved out of the official training split (20 forms, seeded).
          '''),
      code('''
          # @title Get FUNSD
          import io
          import urllib.request
          import zipfile

          from flaxdoc.data import datasets, funsd

          FUNSD_DIR = ""  # @param {type:"string"}
          UPLOAD = False  # @param {type:"boolean"}
          OFFLINE = os.environ.get("FLAXDOC_NOTEBOOK_OFFLINE") == "1"


          def has_funsd(path):
            try:
              return "train" in datasets.available_splits("funsd", path)
            except (OSError, ValueError):
              return False


          def unzip_funsd(data):
            """Unpacks the official dataset.zip (bytes) into DATA/funsd."""
            target = DATA / "funsd"
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
              # zipfile sanitises member paths; the macOS resource forks are not needed.
              archive.extractall(target, [m for m in archive.namelist()
                                          if not m.startswith("__MACOSX")])
            return target


          candidates = [FUNSD_DIR, DATA / "funsd"]
          if os.environ.get("FLAXDOC_DATASETS"):
            candidates.insert(1, Path(os.environ["FLAXDOC_DATASETS"]) / "funsd")
          FUNSD = next((Path(c) for c in candidates if c and has_funsd(c)), None)
          if FUNSD is None and UPLOAD and IN_COLAB:
            from google.colab import files
            uploaded = files.upload()  # choose dataset.zip
            FUNSD = unzip_funsd(next(iter(uploaded.values())))
          if FUNSD is None and not OFFLINE:
            try:
              with urllib.request.urlopen(funsd.URL, timeout=120) as response:
                FUNSD = unzip_funsd(response.read())
            except (OSError, zipfile.BadZipFile) as e:
              print(f"could not download {funsd.URL}: {e}")
          if FUNSD is not None and not has_funsd(FUNSD):
            print(f"{FUNSD} does not hold FUNSD's training_data/annotations")
            FUNSD = None
          if FUNSD is None:
            print("FUNSD is not available: the FUNSD cells below are skipped.")
          else:
            print(f"FUNSD in {FUNSD}: splits {datasets.available_splits('funsd', FUNSD)}")
          '''),
      code('''
          # @title Fine-tune FormNet on FUNSD
          FUNSD_RUN = RUNS / "formnet_funsd"
          if FUNSD is not None:
            funsd_config = formnet_config("dataset=funsd")
            funsd_config.data.data_dir = str(FUNSD)
            if SMALL:
              override(funsd_config, {"data.max_train_docs": 8, "data.max_dev_docs": 4,
                                      "total_steps": 8, "eval_every": 4, "checkpoint_every": 4})
            else:
              # From scratch FormNet reaches a modest F1 on 129 forms: pre-training on a
              # large corpus (pretrain_tpu.ipynb) is what the paper's numbers rely on.
              override(funsd_config, {"total_steps": 4000, "eval_every": 500,
                                      "checkpoint_every": 500})
            funsd_result = trainer.train_and_evaluate(funsd_config, str(FUNSD_RUN))
            print(funsd_result)
            plot_run(FUNSD_RUN, "FormNet on FUNSD")
          else:
            print("skipped: no FUNSD")
          '''),
      md('''
          ## Evaluate

          `inference.run_eval` (what `--config.mode=eval` runs) restores the newest
          checkpoint, predicts every window, stitches the windows back into documents,
          decodes entities with a constrained Viterbi and scores them with seqeval. It
          scores FUNSD's official test split when the copy has it, else the dev split.
          '''),
      code('''
          # @title Evaluate the newest checkpoint
          from flaxdoc.train import inference

          if FUNSD is not None:
            EVAL_RUN, eval_config = FUNSD_RUN, funsd_config.copy_and_resolve_references()
            if "test" in datasets.available_splits("funsd", FUNSD):
              eval_config.data.eval_split = "test"
              if SMALL:
                eval_config.data.max_test_docs = 4
          else:
            EVAL_RUN, eval_config = SYN_RUN, syn_config.copy_and_resolve_references()
          eval_config.mode = "eval"
          scores = inference.run_eval(eval_config, str(EVAL_RUN))
          print(f"F1 {scores['f1']:.3f}")
          '''),
      md('''
          ## Predictions on a page

          The same restored model, on one document: gold entities on the left, predicted
          ones on the right (colours by label). For your own documents, write them as
          flaxdoc JSON Lines (`flaxdoc.data.jsonl`) or give PDFs, and run
          `python -m flaxdoc.main --config=... --workdir=RUN --config.mode=predict
          --config.predict.input=my_docs.jsonl --config.predict.draw=True`: it writes
          `RUN/predictions.jsonl` and one PNG per page.
          '''),
      code('''
          # @title Draw gold and predicted entities
          from flaxdoc.train import evaluate as eval_lib
          from flaxdoc.train.input_pipeline import featurize_split

          env, params, predict_fn = inference.restore_for_inference(eval_config, str(EVAL_RUN))
          doc = env.documents(eval_config.data.eval_split)[0]
          features = featurize_split([doc], env.tokenizer, env.feature_config)
          [prediction] = eval_lib.predict_split(features, predict_fn, env.feature_config,
                                                eval_config.eval_batch_size)
          labels = env.feature_config.labels
          scan = next(FUNSD.rglob(f"{doc.id}.png"), None) if FUNSD is not None else None
          pictures = []
          for kind, entities in (("gold", doc.entities), ("predicted", prediction.entities)):
            pictures.append(viz.draw_document(
                doc, RUNS / "pictures" / f"{doc.id}_{kind}.png", entities=entities,
                labels=labels, background=scan, title=f"{doc.id}: {kind}"))
          display(*(Image(filename=str(p)) for p in pictures))
          print(f"{len(prediction.entities)} predicted entities, e.g.:")
          for entity in prediction.entities[:12]:
            print(f"  {entity.label:>14}  p={entity.score:.2f}  {entity.text[:60]!r}")
          '''),
      md('''
          ## Next

          * `pretrain_tpu.ipynb`: MLM pre-training on your own corpus, sharded over all TPU
            cores, with checkpoints on Google Drive or GCS, then fine-tuning from it.
          * `export_pytorch.ipynb`: export a trained run to PyTorch.
          * `launch/README.md`: TPU pod slices and SLURM clusters, mesh shapes.
          '''),
  ]
