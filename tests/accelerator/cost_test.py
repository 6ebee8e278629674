"""`xlm_jax.accelerator.cost`: the ops of an optimised HLO text, their FLOPs and bytes counted
by hand here, their roofline times on a chip of round figures, and the CLI on a TPU target
compiled on this CPU (libtpu's compile-only devices) and on bad input.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys

import pytest

from xlm_jax.accelerator.cost import chips, hlo, model

B, T, H, D = 2, 512, 4, 64
HLO = f"""HloModule jit_train_step, entry_computation_layout={{(bf16[64,128]{{1,0}})->f32[]}}

%fused_dot (p0: bf16[64,128], p1: bf16[128,256]) -> bf16[64,256] {{
  %p0 = bf16[64,128]{{1,0}} parameter(0)
  %p1 = bf16[128,256]{{1,0}} parameter(1)
  ROOT %dot.1 = bf16[64,256]{{1,0}} dot(%p0, %p1), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}

%fused_multi (p0: f32[1024]) -> (f32[1024], bf16[1024]) {{
  %p0 = f32[1024]{{0}} parameter(0)
  %e = f32[1024]{{0}} exponential(%p0)
  %c = bf16[1024]{{0}} convert(%e)
  ROOT %t = (f32[1024]{{0}}, bf16[1024]{{0}}) tuple(%e, %c)
}}

%fused_add (p0: bf16[1024]) -> bf16[1024] {{
  %p0 = bf16[1024]{{0}} parameter(0)
  ROOT %a = bf16[1024]{{0}} add(%p0, %p0)
}}

%add_bf16 (x: bf16[], y: bf16[]) -> bf16[] {{
  %x = bf16[] parameter(0)
  %y = bf16[] parameter(1)
  ROOT %s = bf16[] add(%x, %y)
}}

%fused_scatter (p0: bf16[65536,64], p1: s32[100,1], p2: bf16[100,64]) -> bf16[65536,64] {{
  %p0 = bf16[65536,64]{{1,0}} parameter(0)
  %p1 = s32[100,1]{{1,0}} parameter(1)
  %p2 = bf16[100,64]{{1,0}} parameter(2)
  ROOT %sc = bf16[65536,64]{{1,0}} scatter(%p0, %p1, %p2), update_window_dims={{1}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=%add_bf16
}}

%fused_scatter32 (p0: f32[65536,64], p1: s32[100,1], p2: f32[100,64]) -> f32[65536,64] {{
  %p0 = f32[65536,64]{{1,0}} parameter(0)
  %p1 = s32[100,1]{{1,0}} parameter(1)
  %p2 = f32[100,64]{{1,0}} parameter(2)
  ROOT %sc = f32[65536,64]{{1,0}} scatter(%p0, %p1, %p2), update_window_dims={{1}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=%add_bf16
}}

%fused_dus (p0: f32[12,768,64], p1: f32[1,768,64], p2: s32[]) -> f32[12,768,64] {{
  %p0 = f32[12,768,64]{{2,1,0}} parameter(0)
  %p1 = f32[1,768,64]{{2,1,0}} parameter(1)
  %p2 = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %d = f32[12,768,64]{{2,1,0}} dynamic-update-slice(%p0, %p1, %p2, %z, %z)
}}

%fused_conv (p0: bf16[2,128,128,1], p1: bf16[128,4,32,1]) -> bf16[2,128,4,32] {{
  %p0 = bf16[2,128,128,1]{{2,1,3,0:T(8,128)(2,1)}} parameter(0)
  %p1 = bf16[128,4,32,1]{{0,2,1,3:T(8,128)(2,1)}} parameter(1)
  ROOT %conv = bf16[2,128,4,32]{{3,1,2,0:T(8,128)(2,1)}} convolution(%p0, %p1), window={{size=1x4 pad=0_0x3_3 rhs_reversal=0x1}}, dim_labels=0bf1_i1o0->0b1f
}}

%body (arg: (s32[], bf16[1024])) -> (s32[], bf16[1024]) {{
  %arg = (s32[], bf16[1024]{{0}}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %v = bf16[1024]{{0}} get-tuple-element(%arg), index=1
  %inner = bf16[1024]{{0}} fusion(%v), kind=kLoop, calls=%fused_add
  ROOT %out = (s32[], bf16[1024]{{0}}) tuple(%i, %inner)
}}

%cond (arg: (s32[], bf16[1024])) -> pred[] {{
  %arg = (s32[], bf16[1024]{{0}}) parameter(0)
  ROOT %p = pred[] constant(true)
}}

ENTRY %main (a: bf16[64,128], b: bf16[128,256], x: f32[1024], q: bf16[{B},{T},{H},{D}], tab: bf16[65536,64], ids: s32[100,1], upd: bf16[100,64], tab32: f32[65536,64], upd32: f32[100,64], init: (s32[], bf16[1024]), stack: f32[12,768,64], slice: f32[1,768,64], i: s32[], xq: bf16[2,128,128,1], wq: bf16[128,4,32,1]) -> f32[] {{
  %a = bf16[64,128]{{1,0}} parameter(0)
  %b = bf16[128,256]{{1,0}} parameter(1)
  %x = f32[1024]{{0}} parameter(2)
  %q = bf16[{B},{T},{H},{D}]{{3,2,1,0}} parameter(3)
  %tab = bf16[65536,64]{{1,0}} parameter(4)
  %ids = s32[100,1]{{1,0}} parameter(5)
  %upd = bf16[100,64]{{1,0}} parameter(6)
  %tab32 = f32[65536,64]{{1,0}} parameter(7)
  %upd32 = f32[100,64]{{1,0}} parameter(8)
  %init = (s32[], bf16[1024]{{0}}) parameter(9)
  %fusion.1 = bf16[64,256]{{1,0}} fusion(%a, %b), kind=kCustom, calls=%fused_dot, metadata={{op_name="jit(train_step)/mlp/dot_general"}}
  %fusion.2 = (f32[1024]{{0}}, bf16[1024]{{0}}) fusion(%x), kind=kLoop, calls=%fused_multi, metadata={{op_name="jit(train_step)/exp"}}
  %fusion.3 = bf16[1024]{{0}} fusion(%fusion.2#1), kind=kLoop, calls=%fused_add, metadata={{op_name="jit(train_step)/add"}}
  %gemm = (bf16[64,256]{{1,0}}, s8[4096]{{0}}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", backend_config={{"gemm_backend_config":{{"dot_dimension_numbers":{{"lhs_batch_dimensions":[],"lhs_contracting_dimensions":["1"],"rhs_batch_dimensions":[],"rhs_contracting_dimensions":["0"]}}}}}}
  %pallas = (bf16[{B},{T},{H},{D}]{{3,2,1,0}}, f32[{B},{H},{T}]{{2,1,0}}) custom-call(%q, %q, %q), custom_call_target="__gpu$xla.gpu.triton", metadata={{op_name="jit(train_step)/layers_0/attention/relbias_flash_forward/pallas_call"}}, backend_config={{debug = false, grid_x = {B} : i32, grid_y = {H} : i32, grid_z = 8 : i32}}
  %scatter = bf16[65536,64]{{1,0}} fusion(%tab, %ids, %upd), kind=kInput, calls=%fused_scatter, metadata={{op_name="jit(train_step)/embeddings/scatter-add"}}
  %scatter32 = f32[65536,64]{{1,0}} fusion(%tab32, %ids, %upd32), kind=kInput, calls=%fused_scatter32, metadata={{op_name="jit(train_step)/embeddings/scatter-add"}}
  %stack = f32[12,768,64]{{2,1,0}} parameter(10)
  %slice = f32[1,768,64]{{2,1,0}} parameter(11)
  %i = s32[] parameter(12)
  %dus = f32[12,768,64]{{2,1,0}} fusion(%stack, %slice, %i), kind=kLoop, calls=%fused_dus, metadata={{op_name="jit(train_step)/while/body/dynamic_update_slice"}}
  %xq = bf16[2,128,128,1]{{2,1,3,0}} parameter(13)
  %wq = bf16[128,4,32,1]{{0,2,1,3}} parameter(14)
  %proj = bf16[2,128,4,32]{{3,1,2,0}} fusion(%xq, %wq), kind=kOutput, calls=%fused_conv, metadata={{op_name="jit(train_step)/layers_0/attention/query/dot_general"}}
  %loop = (s32[], bf16[1024]{{0}}) while(%init), condition=%cond, body=%body, backend_config={{"known_trip_count":{{"n":"12"}}}}
  ROOT %r = f32[] constant(0)
}}
"""
# A chip of round figures, every efficiency 1 and no launch gap: each op's time is its
# roofline, computable by hand.
CHIP = chips.Chip("round", "gpu", bf16_flops=1e12, hbm_bytes_per_s=1e9, vector_ops_per_s=1e10,
                  special_ops_per_s=1e7, link_bytes_per_s=1e9, source="test",
                  efficiency=chips.Efficiency(atomic_updates_per_s=1e6))


def _ops() -> dict[str, model.OpCost]:
    return {o.name: o for o in model.analyze(HLO, CHIP, seq_len=T).ops}


def test_counts_flops_and_bytes_of_each_op():
    ops = _ops()
    dot = 2 * 64 * 256 * 128
    assert ops["fusion.1"].flops == dot and ops["gemm"].flops == dot
    assert ops["fusion.1"].bytes_read == (64 * 128 + 128 * 256) * 2
    assert ops["fusion.1"].bytes_written == 64 * 256 * 2
    assert ops["gemm"].bytes_written == 64 * 256 * 2  # the s8 workspace is not output
    # element 1 of fusion.2's tuple is bf16[1024]: 2 KiB read, not the whole tuple's 6 KiB
    assert ops["fusion.3"].bytes_read == 1024 * 2
    assert ops["fusion.2"].bytes_written == 1024 * 4 + 1024 * 2
    # a flash forward: Q.K^T and P.V, each 2.B.H.T.S.D
    assert ops["pallas"].flops == 2 * (2 * B * H * T * T * D)
    assert ops["pallas"].kind == "attention kernel"
    # in place: the updated rows, read and written, and the indices; not the whole table
    assert ops["scatter32"].bytes_written == 100 * 64 * 4
    assert ops["scatter32"].bytes_read == 100 * 4 + 100 * 64 * 4 + 100 * 64 * 4


def test_a_convolution_counts_only_the_taps_on_real_input():
    """XLA:TPU's per-head query projection (copied from a v5e compile of the tiny model): x
    [2 x 128 tokens, 128 features] times W [128, 4 heads x 32], written as a convolution whose
    window of 4 slides over the heads with 3 of padding each side, so one tap per output is
    real: 2 x 256 x 128 x 128 FLOPs, not 4 times that."""
    proj = _ops()["proj"]
    assert proj.kind == "matmul"
    assert proj.flops == 2 * (2 * 128) * 128 * 128


def test_an_update_in_place_moves_its_slice_not_the_buffer():
    """A scan writing one layer's gradient into the stacked [12, ...] array: XLA updates the
    buffer in place, so the op reads and writes the slice (and reads the index)."""
    dus = _ops()["dus"]
    assert dus.kind == "gather/scatter"
    assert dus.bytes_written == 768 * 64 * 4
    assert dus.bytes_read == 768 * 64 * 4 + 4
    assert dus.time_s == pytest.approx((2 * 768 * 64 * 4 + 4) / 1e9)


def test_kinds_and_loop_trip_counts():
    ops = _ops()
    kinds = {n: o.kind for n, o in ops.items()}
    assert kinds["fusion.1"] == kinds["gemm"] == "matmul"
    assert kinds["scatter"] == kinds["scatter32"] == "gather/scatter"
    assert kinds["fusion.2"] == "elementwise/fusion"
    assert ops["inner"].runs == 12 and ops["inner"].bytes_read == 12 * 1024 * 2


def test_times_are_the_roofline_of_the_larger_term():
    ops = _ops()
    dot = 2 * 64 * 256 * 128
    moved = (64 * 128 + 128 * 256 + 64 * 256) * 2
    assert ops["fusion.1"].time_s == pytest.approx(max(dot / 1e12, moved / 1e9))
    assert ops["fusion.1"].bound == "memory"
    # 1024 exponentials at 1e7/s outweigh the 10 KiB it moves at 1e9 B/s
    assert ops["fusion.2"].time_s == pytest.approx(1024 / 1e7)
    assert ops["fusion.2"].bound == "special"
    # bf16 adds into a 65536-row table: non-native atomics, 6400 updates at 1e6/s
    assert ops["scatter"].time_s == pytest.approx(6400 / 1e6)
    assert ops["scatter"].bound == "atomics"
    assert ops["scatter32"].bound == "memory"  # f32 adds are native atomics


def test_flash_kernels_are_timed_at_their_measured_efficiency_and_tiles():
    eff = chips.Efficiency(attention=(("forward", 0.1),), attention_small_tile_speedup=2.0)
    chip = dataclasses.replace(CHIP, efficiency=eff)
    small = {o.name: o for o in model.analyze(HLO, chip, seq_len=T).ops}["pallas"]
    flops = 2 * (2 * B * H * T * T * D)
    # grid_z 8 over T = 512: 64-row tiles, which the measured speedup applies to
    assert small.time_s == pytest.approx(flops / (1e12 * 0.1 * 2.0))
    big = {o.name: o for o in model.analyze(HLO, chip, seq_len=T * 2).ops}["pallas"]
    assert big.time_s == pytest.approx(flops / (1e12 * 0.1))  # 128-row tiles: no speedup


def test_report_sums_ops_and_mfu_uses_the_model_flops():
    report = model.analyze(HLO, CHIP, seq_len=T)
    assert report.predicted_s == pytest.approx(sum(o.time_s for o in report.ops))
    assert sum(report.by_kind().values()) == pytest.approx(report.predicted_s)
    report.model_flops = 1e9
    assert report.mfu(CHIP.bf16_flops) == pytest.approx(1e9 / report.predicted_s / 1e12)


def test_shapes_of_tuple_elements_and_a_text_that_is_no_module():
    shapes = hlo.Shapes({"t": "(f32[4,2]{1,0}, bf16[3]{0})"})
    assert shapes.get("t#1") == "bf16[3]" and shapes.get("t#0") == "f32[4,2]"
    with pytest.raises(ValueError, match="no ENTRY computation"):
        hlo.parse_module("not hlo")


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xlm_jax.accelerator.cost", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_cli_bad_input_is_one_line(tmp_path):
    bad = _cli("--target", "h900:1x1x1", "--gin_file=runs/xlmr_base_mmlm.gin")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "h900" in bad.stderr
    hlo_file = tmp_path / "x.txt"
    hlo_file.write_text("garbage")
    bad = _cli("--target", "h100:1x1x1", "--hlo", str(hlo_file))
    assert bad.returncode == 2 and "no ENTRY computation" in bad.stderr
    assert bad.stderr.strip().count("\n") == 0


def test_cli_reads_an_hlo_dump_and_writes_json(tmp_path):
    dump = tmp_path / "module.txt"
    dump.write_text(HLO)
    out = tmp_path / "cost.json"
    done = _cli("--target", "h100:1x1x1", "--hlo", str(dump), "--seq_len", str(T),
                "--model_flops", "1e9", "--json", str(out))
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert {"predicted_step_ms", "predicted_mfu", "ops"} <= set(data)
    assert len(data["ops"]) == 10  # every op but the free root constant
    assert data["predicted_step_ms"] == pytest.approx(sum(o["predicted_ms"] for o in data["ops"]))
    assert "predicted step" in done.stdout


needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu is not installed (the tpu environment has it)")


@needs_libtpu
@pytest.mark.slow  # a TPU compile of a whole step (40 s); the unit tests above read the same ops
def test_cli_compiles_a_run_file_for_a_tpu_and_sees_its_matmuls(tmp_path):
    out = tmp_path / "cost.json"
    done = _cli("--target", "v5e:2x2", "--gin_file=runs/xlmr_base_mmlm.gin", "--size", "tiny",
                "--depth", "1", "--batch_size", "8", "--seq_len", "128",
                "--attention_backend", "pallas", "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(out.read_text())
    kinds = {o["kind"] for o in data["ops"]}
    assert {"matmul", "attention kernel", "optimizer update"} <= kinds
    # The dots XLA compiled against the model's own count (xlm_jax.train.step_flops, every
    # token of the rows): the vocabulary projection and the layer's matmuls, 3 x forward.
    # XLA's dots add little besides (the gated-bias-free model has no other matmul), and the
    # attention's own products are inside the Mosaic kernels, counted from their shapes.
    seen = sum(o["flops"] for o in data["ops"] if o["kind"] in ("matmul", "attention kernel"))
    rows_flops = data["model_flops_per_device"] * 8 * 128 / data["tokens_per_step"]
    assert seen == pytest.approx(rows_flops, rel=0.15)
    assert data["predicted_mfu"] is not None and 0 < data["predicted_mfu"] < 1


@needs_libtpu
def test_cli_a_run_file_that_does_not_build_is_one_line():
    bad = _cli("--target", "v5e:2x2", "--gin_file=runs/xlmr_base_mmlm.gin", "--size", "tiny",
               "--depth", "1", "--batch_size", "8", "--seq_len", "128",
               "--gin.loop.model_config.overrides={'num_heads': 5}")
    assert bad.returncode in (1, 2) and bad.stderr.strip().count("\n") == 0, bad.stderr
    assert "xlmr_base_mmlm.gin" in bad.stderr


TPU_COPIES = """HloModule jit_train_step, entry_computation_layout={(bf16[8,512,3072]{2,1,0})->bf16[8,512,3072]{2,1,0}}

ENTRY %main (w: bf16[8,512,3072]) -> bf16[8,512,3072] {
  %w = bf16[8,512,3072]{2,1,0:T(8,128)(2,1)} parameter(0)
  %copy-start = (bf16[8,512,3072]{2,1,0:T(8,128)(2,1)}, bf16[8,512,3072]{2,1,0:T(8,128)(2,1)S(1)}, u32[]{:S(2)}) copy-start(%w)
  %copy = bf16[8,512,3072]{2,1,0:T(8,128)(2,1)} copy(%w)
  %same = (bf16[8,512,3072]{2,1,0}, bf16[8,512,3072]{2,1,0}, u32[]) copy-start(%copy)
  %copy-done = bf16[8,512,3072]{2,1,0:T(8,128)(2,1)S(1)} copy-done(%copy-start)
  ROOT %copy-done.1 = bf16[8,512,3072]{2,1,0} copy-done(%same)
}
"""


def test_async_copies_between_memory_spaces_overlap_and_are_not_in_the_step():
    """XLA:TPU's memory-space assignment prefetches buffers into VMEM (`S(1)`) with
    copy-start/copy-done pairs that overlap compute: they are listed, with the time they would
    take alone, but not summed into the step. Their bytes are the source read and the
    destination written, not the (source, destination, context) tuple. A copy within one
    memory space still counts."""
    assert hlo.memory_spaces("(bf16[8,128]{1,0:T(8,128)(2,1)}, bf16[8,128]{1,0:T(8,128)(2,1)"
                             "S(1)}, u32[]{:S(2)})") == [0, 1, 2]
    report = model.analyze(TPU_COPIES, CHIP)
    ops = {o.name: o for o in report.ops}
    size = 8 * 512 * 3072 * 2
    prefetch = ops["copy-start"]
    assert prefetch.overlapped and prefetch.kind == "copy/transpose"
    assert (prefetch.bytes_read, prefetch.bytes_written) == (size, size)
    assert prefetch.time_s == pytest.approx(2 * size / CHIP.hbm_bytes_per_s)  # if alone
    assert not ops["copy"].overlapped and not ops["same"].overlapped  # one memory space
    assert report.overlapped == [prefetch]
    assert report.predicted_s == pytest.approx(ops["copy"].time_s + ops["same"].time_s)
    assert sum(report.by_kind().values()) == pytest.approx(report.predicted_s)

    from xlm_jax.accelerator.cost.__main__ import format_report, report_data
    from xlm_jax.accelerator.compile import targets

    data = report_data(TPU_COPIES, targets.parse_target("v5p:2x2x1"), None, None, "dump", {})
    assert data["overlapped_copies"]["ops"] == 1
    assert data["overlapped_copies"]["bytes"] == 2 * size
    text = format_report(data, 3)
    assert "not in the step: 1 asynchronous copies between memory spaces" in text
    assert "| copy/transpose | copy-start |" not in text  # not among the step's top ops
