"""A jax without Pallas' Triton backend (deprecated in jax 0.11, to be removed): the models
still import and run, the GPU kernels are refused in one line, and `auto` chooses for itself.

Run in a fresh interpreter where `jax.experimental.pallas.triton` cannot be imported (what a
jax that has removed the module gives), so this process's modules are left as they are.
"""
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_PROBE = r"""
import json, sys
sys.modules["jax.experimental.pallas.triton"] = None  # `import` of it raises ImportError
import jax, jax.numpy as jnp, numpy as np
from xlm_jax.models import attention, attention_backends as ab, fused_attention as fa
out = {"missing": fa.TRITON_MISSING}
q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (2, 32, 2, 8), jnp.float32) for i in range(3))
b16 = q.astype(jnp.bfloat16)
out["cpu_reason"] = fa.pallas_unavailable_reason(q, k, v, None, 0.0, platform="cpu")
out["gpu_reason"] = fa.pallas_unavailable_reason(q, k, v, None, 0.0, platform="gpu")
choose = lambda backend, rate: ab.select(backend, b16, b16, b16, bias=None, mask=None,
                                         relative=None, dropout_rate=rate, layer="layers_0")
with ab.lowering_for("cuda"):
    out["auto_dropout"], out["auto_plain"] = choose("auto", 0.1), choose("auto", 0.0)
    try:
        out["pallas"] = choose("pallas", 0.1)
    except ab.AttentionBackendError as e:
        out["pallas"] = "refused: " + str(e)
out["logged"] = ab.logged()
# the kernels still run interpreted on this CPU
mask = jnp.arange(32)[None, None, None, :] < jnp.array([32, 19])[:, None, None, None]
out["kernel"] = np.asarray(fa.flash_attention(q, k, v, mask=mask, block_q=16, block_k=16)).tolist()
out["reference"] = np.asarray(attention.reference_attention(q, k, v, mask=mask)).tolist()
print(json.dumps(out))
"""


def test_models_import_and_choose_without_the_triton_backend():
    r = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    missing = out["missing"]
    assert missing and "no Pallas Triton backend" in missing and "\n" not in missing
    assert out["cpu_reason"] is None  # interpreted kernels need no Triton
    assert out["gpu_reason"] == missing
    # on a GPU target: cuDNN where it can serve (no dropout), XLA where it cannot, each said
    assert out["auto_plain"] == "cudnn"
    assert out["auto_dropout"] == "xla"
    assert any("auto" in m and "xla" in m and missing in m for m in out["logged"]), out["logged"]
    # an explicit request is refused in one line naming the layer and why
    refused = out["pallas"]
    assert refused.startswith("refused: ") and "layers_0" in refused and missing in refused
    assert "\n" not in refused
    np.testing.assert_allclose(out["kernel"], out["reference"], rtol=2e-5, atol=2e-6)


def test_with_the_triton_backend_nothing_is_missing():
    """The control: this jax has the backend, so the GPU kernels are offered."""
    from xlm_jax.models import fused_attention

    assert fused_attention.TRITON_MISSING is None
    q = np.zeros((1, 16, 2, 8), np.float32)
    assert fused_attention.pallas_unavailable_reason(q, q, q, None, 0.0, platform="gpu") is None
