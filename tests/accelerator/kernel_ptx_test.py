"""`xlm_jax.accelerator.kernel_ptx`: the kernels' compiled loops counted.

The PTX reading is checked on a hand-written module (nesting, what a loop's own body is, the
kinds); the CLI's refusals in `make test`; the real count, with the CUDA plugin's compile-only
GPU, in `make test-slow` (`XLM_JAX_CUDA_COMPILE`, as compile_gpu_test): the softmax's
exponential is the bare `ex2.approx` (not libdevice's `expf`, whose range reduction cost 7
instructions a score), and the dropout hash shows as integer work that dropout 0 removes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from xlm_jax.accelerator import kernel_ptx

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGIN = (os.path.abspath(os.environ["XLM_JAX_CUDA_COMPILE"])
          if os.environ.get("XLM_JAX_CUDA_COMPILE") else None)

PTX = """
.visible .entry relbias_flash_forward(
	.param .u64 p0
)
{
	mov.u32 	%r1, 0;
$L__BB0_1:
	wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1}, %rd1, %rd2, 1, 1, 1;
	mul.rn.f32 	%f2, %f1, 0f3E000000;
	xor.b32 	%r2, %r1, %r3;
	mul.lo.s32 	%r4, %r2, -2048144789;
	// a comment
$L__BB0_2:
	selp.f32 	%f3, %f2, 0f00000000, %p1;
	@%p2 bra 	$L__BB0_2;
	ex2.approx.f32 	%f4, %f3;
	ld.shared.v2.b8 	{%rs1, %rs2}, [%r5];
	add.s32 	%r1, %r1, 1;
	setp.lt.s32 	%p3, %r1, 8;
	@%p3 bra 	$L__BB0_1;
	st.global.b32 	[%rd3], %f4;
	ret;
}
"""


def test_loops_nest_and_count_their_own_body():
    assert kernel_ptx.entries(PTX) == ["relbias_flash_forward"]
    outer, inner = kernel_ptx.loops(PTX)
    assert (outer.depth, inner.depth) == (0, 1)
    assert inner.opcodes == {"selp.f32": 1, "bra": 1}
    # the outer body without the inner loop's two lines, its branch included
    assert outer.opcodes == {"wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16": 1,
                             "mul.rn.f32": 1, "xor.b32": 1, "mul.lo.s32": 1,
                             "ex2.approx.f32": 1, "ld.shared.v2.b8": 1, "add.s32": 1,
                             "setp.lt.s32": 1, "bra": 1}
    assert outer.by_kind() == {"tensor core": 1, "special function": 1, "integer": 3,
                               "float": 1, "compare/select": 1, "memory": 1, "other": 1}


def test_two_branches_back_to_one_label_are_one_loop():
    ptx = """
$L__BB0_1:
	add.s32 	%r1, %r1, 1;
	@%p1 bra 	$L__BB0_1;
	mul.lo.s32 	%r2, %r1, 3;
$L__BB0_2:
	xor.b32 	%r3, %r2, %r1;
	@%p2 bra 	$L__BB0_2;
	@%p3 bra 	$L__BB0_1;
	ret;
"""
    outer, inner = kernel_ptx.loops(ptx)
    assert (outer.depth, inner.depth) == (0, 1)
    assert outer.opcodes == {"add.s32": 1, "bra": 2, "mul.lo.s32": 1}
    assert inner.opcodes == {"xor.b32": 1, "bra": 1}


@pytest.mark.parametrize("opcode,kind", [
    ("fma.rn.f32", "float"), ("add.s64", "integer"), ("mul.lo.s32", "integer"),
    ("sub.rn.bf16x2", "float"), ("shr.u32", "integer"), ("max.f32", "compare/select"),
    ("rcp.approx.ftz.f32", "special function"), ("cp.async.cg.shared.global", "memory"),
    ("cvt.rn.bf16.f32", "other"), ("mov.b32", "other")])
def test_kind_of(opcode, kind):
    assert kernel_ptx.kind_of(opcode) == kind


def _run(*args: str, plugin: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([p for p in (plugin, REPO) if p])
    return subprocess.run([sys.executable, "-m", "xlm_jax.accelerator.kernel_ptx", *args],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=600)


@pytest.mark.parametrize("args,says", [
    (["--target", "v5p"], "--target 'v5p'"),
    (["--bias", "alibi"], "--bias 'alibi'"),
    (["--launch", "forward=65x64w4s3"], "65"),
])
def test_bad_flags_are_one_line_and_exit_2(args, says):
    proc = _run(*args, plugin=PLUGIN)
    assert proc.returncode == 2, proc.stderr[-1000:]
    lines = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and says in lines[0], proc.stderr[-1000:]


@pytest.mark.skipif(bool(PLUGIN), reason="the CUDA plugin is on the path")
def test_without_the_cuda_plugin_it_says_what_to_install():
    proc = _run("--bias", "none")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: the CUDA plugin is not installed"), proc.stderr[-1000:]


@pytest.mark.slow
@pytest.mark.skipif(not PLUGIN, reason="XLM_JAX_CUDA_COMPILE (the CUDA plugin's folder, "
                    "`make test-slow` installs it) is not set")
def test_the_kernels_loops_counted_for_an_h200(tmp_path):
    rows = {}
    for dropout in ("0.1", "0"):
        out = tmp_path / f"d{dropout}.json"
        proc = _run("--bias", "none", "--shape", "4,512,12,64", "--dropout", dropout,
                    "--json", str(out), plugin=PLUGIN)
        assert proc.returncode == 0, proc.stderr[-2000:]
        rows[dropout] = {r["kernel"]: r for r in json.loads(out.read_text())["rows"]}
    for kernel in ("forward", "dkv", "dq"):
        with_dropout, without = rows["0.1"][kernel], rows["0"][kernel]
        ops = with_dropout["opcodes"]
        assert with_dropout["by_kind"]["tensor core"] > 0  # the loop of the products
        # murmur3's two multiplies per score: 32 scores a thread at 64 x 64, 4 warps
        assert with_dropout["by_kind"]["integer"] - without["by_kind"]["integer"] >= 2 * 32
        assert ops.get("fma.rm.f32", 0) == 0  # libdevice's expf reduction is not there
    fwd = rows["0.1"]["forward"]
    assert fwd["by_kind"]["special function"] >= 32  # one ex2 a score
    assert fwd["per_score"] < 35, fwd  # 40.6 with libdevice's expf and the scale per score
