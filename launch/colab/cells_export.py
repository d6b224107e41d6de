"""The cells of `export_pytorch.ipynb`: export a run with `python -m flaxdoc.export`, run
it in PyTorch next to JAX, trace it with `torch.export`.
"""

from __future__ import annotations

import nbformat

from cells_common import badge, code, devices_cell, helpers_cell, install_cell, md, small_cell


def export_pytorch() -> list[nbformat.NotebookNode]:
  return [
      small_cell(),
      md(f"""
          # Export a flaxdoc model to PyTorch

          {badge("export_pytorch")}

          `python -m flaxdoc.export --workdir RUN --out OUT/` writes the newest checkpoint of
          a run as `OUT/model.safetensors` (one tensor per Flax parameter) and
          `OUT/config.json` (model, features, tag names, tokenizer), and
          `flaxdoc.export.torch.load_exported(OUT)` rebuilds the model as a plain PyTorch
          module that needs no JAX. This notebook exports a run, checks that PyTorch and JAX
          give the same predictions, decodes entities from the PyTorch output, and traces
          the model with `torch.export`.

          Any runtime works (the export runs on a CPU). `WORKDIR` below: a trained run, for
          example the fine-tuning run of `pretrain_tpu.ipynb` on Drive or on GCS
          (`gs://bucket/path`: read in place, after signing in; the cell installs `gcsfs`,
          which `etils.epath` reads `gs://` with). Left empty, a small model is trained
          first.
          """),
      install_cell("torch"),
      devices_cell(),
      helpers_cell(),
      code("""
          # @title A trained run
          from flaxdoc.train import trainer

          WORKDIR = ""  # @param {type:"string"}
          reach_workdir(WORKDIR)  # Drive mounted; for gs://, signed in and gcsfs installed
          if WORKDIR:
            # The run's own config (the trainer saves it as WORKDIR/config.json).
            from etils import epath
            config = ml_collections.ConfigDict(
                json.loads((epath.Path(WORKDIR) / "config.json").read_text()))
          else:
            WORKDIR = str(RUNS / "export_demo")
            config = formnet_config("" if SMALL else "local")
            if SMALL:
              config.data.dataset_options = {"num_train": 12, "num_dev": 4}
              override(config, {"total_steps": 4, "eval_every": 4, "checkpoint_every": 4})
            else:
              override(config, {"total_steps": 300, "eval_every": 300, "checkpoint_every": 300})
            print(trainer.train_and_evaluate(config, WORKDIR))
          print(f"run {WORKDIR}: {config.model.name} on {config.data.dataset}")
          """),
      code("""
          # @title Export
          OUT = RUNS / "export"
          command = [sys.executable, "-m", "flaxdoc.export",
                     "--workdir", WORKDIR, "--out", str(OUT)]
          print("$", " ".join(command))
          done = subprocess.run(command, capture_output=True, text=True)
          print(done.stdout[-3000:], done.stderr[-3000:], sep="\\n")
          done.check_returncode()
          for path in sorted(OUT.iterdir()):
            print(f"  {path.name:24} {path.stat().st_size / 1e6:8.2f} MB")
          """),
      md("""
          ## Run it in PyTorch

          The PyTorch module takes the featuriser's arrays (`flaxdoc.data.features`, plain
          numpy) as a dict of tensors and returns tag logits `[batch, tokens, tags]`. Below,
          it plays the part of the JAX model in flaxdoc's own prediction path (windows ->
          words -> constrained Viterbi -> entities), so the two can be compared entity by
          entity.
          """),
      code("""
          # @title Load in PyTorch and compare with JAX
          import numpy as np
          import torch

          from flaxdoc.export.torch import load_exported
          from flaxdoc.train import evaluate as eval_lib
          from flaxdoc.train import inference
          from flaxdoc.train.input_pipeline import eval_batches, featurize_split

          torch_model = load_exported(str(OUT))  # eval mode, float32
          print(f"{type(torch_model).__name__}: "
                f"{sum(p.numel() for p in torch_model.parameters()):,} parameters")


          def torch_predict_fn(batch):
            \"\"\"Log-probabilities [B, L, T] from the PyTorch model (numpy in, numpy out).\"\"\"
            with torch.no_grad():
              logits = torch_model({k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()})
            return torch.log_softmax(logits, dim=-1).numpy()


          env, params, jax_predict_fn = inference.restore_for_inference(config, WORKDIR)
          docs = env.documents(config.data.eval_split)[:4]
          features = featurize_split(docs, env.tokenizer, env.feature_config)
          batch, valid = next(eval_batches(features, config.eval_batch_size))
          real = batch["attention_mask"].astype(bool) & valid[:, None]  # [B, L]
          gap = np.abs(torch_predict_fn(batch) - np.asarray(jax_predict_fn(batch)))[real].max()
          print(f"max |log p(PyTorch) - log p(JAX)| over {real.sum()} tokens: {gap:.2e}")
          assert gap < 1e-3, gap

          torch_preds = eval_lib.predict_split(features, torch_predict_fn, env.feature_config,
                                               config.eval_batch_size)
          jax_preds = eval_lib.predict_split(features, jax_predict_fn, env.feature_config,
                                             config.eval_batch_size)
          same = sum(t.word_tags == j.word_tags for t, j in zip(torch_preds, jax_preds))
          print(f"documents with the same entities from PyTorch and JAX: {same} of {len(docs)}")
          for entity in torch_preds[0].entities[:10]:
            print(f"  {entity.label:>16}  p={entity.score:.2f}  {entity.text[:60]!r}")
          """),
      md("""
          ## A graph for serving stacks: `torch.export`

          `torch.export.export` traces the module into an `ExportedProgram` (one graph, no
          Python), the input of AOTInductor, ExecuTorch and TorchServe pipelines. It takes
          the model's tensor inputs (`BATCH_KEYS` and `OPTIONAL_BATCH_KEYS` of
          `flaxdoc.export.torch`) with the window length fixed by the export config.
          """),
      code("""
          # @title Trace with torch.export
          from flaxdoc.export.torch import BATCH_KEYS, OPTIONAL_BATCH_KEYS

          inputs = {k: torch.from_numpy(np.asarray(batch[k]))
                    for k in BATCH_KEYS + OPTIONAL_BATCH_KEYS if k in batch}
          program = torch.export.export(torch_model, (inputs,))
          with torch.no_grad():
            traced_gap = (program.module()(inputs) - torch_model(inputs)).abs().max().item()
          print(f"exported program: {len(program.graph.nodes)} graph nodes; "
                f"max |traced - eager| logit difference {traced_gap:.2e}")
          assert traced_gap < 1e-4, traced_gap
          """),
      md("""
          ## Keep it

          `OUT` holds everything the PyTorch side needs. Copy it to Drive
          (`shutil.copytree(OUT, "/content/drive/MyDrive/flaxdoc/export")`) or download it
          (`!zip -r export.zip runs/export`, then `google.colab.files.download("export.zip")`).
          The PyTorch model needs `torch`, `safetensors`, numpy and `flaxdoc.export.torch`
          only; the featuriser (`flaxdoc.data.features`) is plain numpy.
          """),
  ]
