"""Orbax checkpoints: round trip, retention (latest N + best F1), restore onto another mesh."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np

from flaxdoc.train import checkpoint as ckpt_lib
from flaxdoc.train.state import TrainState


def _state(seed):
  rng = np.random.default_rng(seed)
  return TrainState(step=jnp.asarray(seed, jnp.int32),
                    params={"dense": {"kernel": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)}},
                    opt_state={"mu": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)},
                    rng=jnp.asarray([seed, 7], jnp.uint32))


def _abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)


def test_round_trip_with_iterator_state(tmp_path):
  mngr = ckpt_lib.make_manager(str(tmp_path), keep=2, save_every=1, async_save=False)
  s = _state(3)
  ckpt_lib.save(mngr, 3, s, data_state={"next_index": 17}, meta={"note": "x"})
  mngr.wait_until_finished()
  restored, data_state, meta = ckpt_lib.restore(mngr, _abstract(s))
  jax.tree.map(np.testing.assert_array_equal, restored, s)
  assert data_state == {"next_index": 17} and meta["step"] == 3 and meta["note"] == "x"


def test_keeps_latest_n_plus_best_f1(tmp_path):
  mngr = ckpt_lib.make_manager(str(tmp_path), keep=2, save_every=1, async_save=False)
  f1s = {1: 0.2, 2: 0.9, 3: 0.5, 4: 0.4, 5: 0.3}
  for step, f1 in f1s.items():
    ckpt_lib.save(mngr, step, _state(step), metrics={"eval/f1": f1})
    mngr.wait_until_finished()
  assert sorted(mngr.all_steps()) == [2, 4, 5]  # best (2) + the latest two


def test_restore_onto_a_different_mesh(tmp_path):
  """Written sharded over 8 devices on one mesh, read back on another mesh shape."""
  script = textwrap.dedent(f"""
      import os
      os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
      import jax, jax.numpy as jnp, numpy as np
      from jax.sharding import NamedSharding, PartitionSpec as P
      from flaxdoc.train import checkpoint as ckpt_lib, sharding
      x = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
      m1 = sharding.make_mesh({{"data": 8}})
      a = jax.device_put(x, NamedSharding(m1, P("data", None)))
      mngr = ckpt_lib.make_manager({str(tmp_path)!r}, async_save=False, save_every=1)
      ckpt_lib.save(mngr, 1, {{"w": a}})
      mngr.wait_until_finished()
      m2 = sharding.make_mesh({{"data": 1, "fsdp": 2, "tensor": 4}})
      target = NamedSharding(m2, P("fsdp", "tensor"))
      abstract = {{"w": jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=target)}}
      restored, _, _ = ckpt_lib.restore(mngr, abstract)
      w = restored["w"]
      assert w.sharding == target, w.sharding
      assert len(w.addressable_shards) == 8
      assert w.addressable_shards[0].data.shape == (32, 2)
      np.testing.assert_array_equal(np.asarray(w), x)
      print("OK")
  """)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       timeout=300)
  assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]
