"""The fused kernels on a mesh that splits the batch: each device runs its own rows.

A `pallas_call` has no sharding rule, so without `flaxdoc.nn.batch_parallel` XLA would
gather the whole batch onto every device. Checked on 4 CPU devices (a subprocess, as
the device count is fixed when JAX starts): the same values and gradients as on one
device, the same dropout draws, and no all-gather in the compiled step.
"""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os, warnings
    # Added to the flags the tests run with (tests/conftest.py's compile level).
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=4")
    warnings.simplefilter("ignore")
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from flaxdoc.nn import batch_parallel, etc_pallas, gcn_pallas
    from flaxdoc.train import sharding

    rng = np.random.default_rng(0)
    normal = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
    B, L, K, F, H = 4, 20, 3, 5, 24
    gcn = dict(s=normal(B, L, H), n=normal(B, L, H), e=normal(B, L, K, F),
               ids=jnp.asarray(rng.integers(0, L, (B, L, K)), jnp.int32),
               mask=jnp.asarray(rng.random((B, L, K)) < 0.7))
    gcn_w = (normal(F, H) * 0.3, normal(H), normal(H))
    N, NH, D = 24, 2, 8
    etc = dict(q=normal(B, N, NH, D), k=normal(B, N, NH, D), v=normal(B, N, NH, D),
               kg=normal(B, 1, NH, D), vg=normal(B, 1, NH, D))

    def gcn_loss(s, n, we, b1, v, e, ids, mask, write_d_pre=False, fused=False):
      p, w = gcn_pallas.attention_pool(s, n, e, ids, mask, we, b1, v,
                                       tiles=gcn_pallas.Tiles(4, 8, 8), interpret=True,
                                       write_d_pre=write_d_pre or fused, fused_forward=fused,
                                       fused_backward=fused)
      return (p ** 2).sum() + (w * jnp.arange(K)).sum()

    def etc_out(q, k, v, kg, vg):
      return etc_pallas.long_query_attention(
          q, k, v, kg, vg, jnp.ones((B, N), bool), jnp.ones((B, 1), bool), local_radius=5,
          dropout_rate=0.3, dropout_seed=jnp.array([7], jnp.int32),
          tiles=etc_pallas.Tiles(16, 16, 4, 16, 16, 4), interpret=True)

    def etc_loss(q, k, v, kg, vg):  # and the output: the forward's dropout draws
      out = etc_out(q, k, v, kg, vg)  # (the same kernel as a call outside differentiation)
      return (out ** 2).sum(), out

    gcn_step = jax.jit(jax.value_and_grad(gcn_loss, argnums=(0, 1, 2, 3, 4)))
    # The recommended GCN form ("pallas_dpre"): its backward writes `d pre` between kernels.
    dpre_step = jax.jit(jax.value_and_grad(lambda *a: gcn_loss(*a, write_d_pre=True),
                                           argnums=(0, 1, 2, 3, 4)))
    # "pallas_fused": its kernels write whole rows of node arrays, 16 rows at a time.
    fused_step = jax.jit(jax.value_and_grad(lambda *a: gcn_loss(*a, fused=True),
                                            argnums=(0, 1, 2, 3, 4)))
    etc_step = jax.jit(jax.value_and_grad(etc_loss, argnums=(0, 1, 2, 3, 4), has_aux=True))
    gcn_args = (gcn["s"], gcn["n"]) + gcn_w + (gcn["e"], gcn["ids"], gcn["mask"])
    etc_args = tuple(etc.values())
    want = [gcn_step(*gcn_args), dpre_step(*gcn_args), fused_step(*gcn_args),
            etc_step(*etc_args)]
    # dpre_step runs the writing source kernel and the target side that sums what it wrote.
    dpre_jaxpr = str(jax.make_jaxpr(dpre_step)(*gcn_args))
    assert "gcn_backward_source_writing" in dpre_jaxpr, "write_d_pre was not passed on"
    assert "gcn_saved_backward_target" in dpre_jaxpr
    assert "gcn_fused_backward" in str(jax.make_jaxpr(fused_step)(*gcn_args))

    mesh = sharding.make_mesh({"data": 2, "fsdp": 2})
    rows = NamedSharding(mesh, P(("data", "fsdp")))
    put = lambda xs, split: tuple(jax.device_put(x, rows) if s else x for x, s in zip(xs, split))
    gcn_sharded = put(gcn_args, (1, 1, 0, 0, 0, 1, 1, 1))
    etc_sharded = put(etc_args, (1,) * 5)
    with jax.set_mesh(mesh):
      assert batch_parallel.batch_shards() == (("data", "fsdp"), 4)
      got = [gcn_step(*gcn_sharded), dpre_step(*gcn_sharded), fused_step(*gcn_sharded),
             etc_step(*etc_sharded)]
      for step, args in ((gcn_step, gcn_sharded), (dpre_step, gcn_sharded),
                         (fused_step, gcn_sharded), (etc_step, etc_sharded)):
        hlo = step.lower(*args).compile().as_text()
        assert "all-gather" not in hlo, "the batch was gathered"
    assert batch_parallel.batch_shards() == ((), 1)
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
      w, g = np.asarray(w), np.asarray(g)
      np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5 * max(np.abs(w).max(), 1.0))
    print("OK")
""")


def test_fused_kernels_run_per_batch_shard_with_the_same_results():
  out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().endswith("OK")
