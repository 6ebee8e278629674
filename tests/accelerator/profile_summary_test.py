"""`xlm_jax.accelerator.profile_summary`: the time per step by op kind of a recorded CPU trace,
of a GPU-shaped trace written here (the layout of jax 0.10/0.11 GPU traces: kernels on
`/device:GPU:N` stream lines), of a TPU-shaped one (`XLA Ops`), and the CLI's exit codes.

testdata/cpu_two_steps.xplane.pb was recorded on a CPU (jax 0.10.2) by this program, 61 KB:

    @jax.jit
    def step(w, x):
        h = jax.lax.fori_loop(0, 2, lambda i, h: jnp.tanh(h @ w), x)
        return w - 0.01 * (x.T @ h), h.sum()

    w, x = jnp.full((64, 64), 0.01), jnp.ones((32, 64))
    w, loss = step(w, x)  # compiles outside the trace
    loss.block_until_ready()
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # no Python call events: a small file
    options.enable_hlo_proto = False
    with jax.profiler.trace(DIR, profiler_options=options):
        for _ in range(2):
            w, loss = step(w, x)
        loss.block_until_ready()
"""
import json
import os
import subprocess
import sys

import pytest

from xlm_jax.accelerator import profile_summary as ps

CPU_TRACE = os.path.join(os.path.dirname(__file__), "testdata", "cpu_two_steps.xplane.pb")


def serialized(text: str) -> bytes:
    from jax.profiler import ProfileData

    return ProfileData.text_proto_to_serialized_xspace(text)


def read(text: str):
    from jax.profiler import ProfileData

    return ProfileData.from_serialized_xspace(serialized(text))


# ------------------------------------------------------------------ the recorded CPU trace
def hlo_events(path: str) -> dict[str, list[tuple[str, int, int]]]:
    """(name, start ns, end ns) of the events with an hlo_op stat, per /host:CPU thread."""
    from jax.profiler import ProfileData

    out = {}
    for plane in ProfileData.from_file(path).planes:
        if plane.name == "/host:CPU":
            for ln in plane.lines:
                evs = [(e.name, int(e.start_ns), int(e.end_ns)) for e in ln.events
                       if "hlo_op" in dict(e.stats)]
                if evs:
                    out[ln.name] = evs
    return out


def test_recorded_cpu_trace_sums_each_ops_self_time():
    """The fixture's two steps ran on two executor threads; each step's `while.5` holds the
    ops of its two loop iterations, so its own time is its duration less theirs, and the op
    time is the time of the events nested in no other (every nanosecond counted once)."""
    threads = hlo_events(CPU_TRACE)
    assert len(threads) == 2 and all(len(t) == 13 for t in threads.values())
    top_level, while_own, matmul = 0, 0, 0
    for evs in threads.values():
        (w_start, w_end), = [(s, e) for n, s, e in evs if n == "while.5"]
        inside = [(n, s, e) for n, s, e in evs if w_start < s and e <= w_end]
        assert sorted(n for n, _, _ in inside) == ["wrapped_add", "wrapped_add",
                                                   "wrapped_tanh", "wrapped_tanh",
                                                   "ynn_fusion", "ynn_fusion"]
        top_level += sum(e - s for n, s, e in evs if (n, s, e) not in inside)
        while_own += (w_end - w_start) - sum(e - s for _, s, e in inside)
        matmul += sum(e - s for n, s, e in evs if n in ("ynn_fusion", "dot_general.3"))
    # the same figures, as read once by hand from the file
    assert (top_level, while_own, matmul) == (14_493_367, 11_533, 14_427_815)

    s = ps.summarize(ps.read_trace(CPU_TRACE), steps=2, trace="t")
    assert (s.source, s.devices) == (ps.CPU_OPS, 0)
    assert s.op_ns == top_level
    assert s.busy_ns == top_level  # the two steps' threads never ran at once
    assert s.span_ns == 2867334527 - 2852623211  # first op start to last op end
    assert s.transfer_ns == 0
    ops = {op.name: op for op in s.ops}
    assert ops["while.5"].ns == while_own and ops["while.5"].kind == "other"
    assert (ops["ynn_fusion"].count, ops["ynn_fusion"].ns) == (4, 14_312_499)
    assert {op.name: op.kind for op in s.ops if op.kind != "other"} == {
        "ynn_fusion": "matmul", "dot_general.3": "matmul", "copy.1": "copy/transpose",
        "copy.6": "copy/transpose", "wrapped_add": "elementwise/fusion",
        "wrapped_tanh": "elementwise/fusion", "wrapped_reduce-window": "elementwise/fusion",
        "wrapped_reduce": "elementwise/fusion", "multiply_subtract_fusion": "elementwise/fusion"}
    assert s.kind_ns()["matmul"] == matmul
    lines = s.format(top=3).splitlines()
    assert lines[0] == ("profile (t), host: XLA:CPU op time (summed over threads) per step "
                        "7.2 ms; busy 7.2 ms of a 7.4 ms span per step (first op start to last "
                        "op end)")
    assert lines[1] == "  matmul                    7.21 ms   99.5%"
    assert lines[-3:] == ["       7.16 ms   98.8%  ynn_fusion",
                          "       0.06 ms    0.8%  dot_general.3",
                          "       0.01 ms    0.1%  copy.1"]


# ------------------------------------------------------------------ a GPU-shaped trace
# (kernel name, start us, duration us, hlo_op stat) of one step; the second starts at 10 ms.
# A CUDA graph's kernels carry its command buffer as hlo_op; RNG runs during the attention
# kernel; a kernel whose name says nothing is classified by its hlo_op.
GPU_STEP = (
    ("memcpy32_post", 0, 100, "command_buffer_1"),
    ("nvjet_sm90_tst_128x160_64x5_1x2_h_bz_NNT", 100, 1000, "command_buffer_1"),
    ("relbias_flash_forward", 1100, 2000, "command_buffer_1"),
    ("loop_add_xor_fusion_19", 2500, 400, "command_buffer_1"),
    ("input_scatter_fusion_2", 3100, 800, "input_scatter_fusion.2"),
    ("loop_add_fusion_59", 3900, 300, "loop_add_fusion.59"),
    ("Memset 0", 4200, 100, None),
    ("kernel_7", 4300, 200, "all-gather-start.2"),
    ("sort_4_1", 4500, 100, "sort.4"),
)


def gpu_xspace(step_kernels=GPU_STEP, steps: int = 2) -> str:
    """A '/device:GPU:0' plane as jax 0.11 writes one: a compute stream of kernels with
    hlo_op/hlo_module stats (hlo_op by reference, as the profiler stores repeated strings),
    two memcpy-only streams, a non-stream line; a host plane without XLA:CPU ops."""
    names = sorted({k[0] for k in step_kernels})
    ops = sorted({k[3] for k in step_kernels if k[3]})
    meta = "".join(f'event_metadata {{ key: {i + 1} value {{ id: {i + 1} name: "{n}" }} }}\n'
                   for i, n in enumerate(names))
    meta += "".join(f'stat_metadata {{ key: {200 + i} value {{ id: {200 + i} name: "{o}" }} }}\n'
                    for i, o in enumerate(ops))
    kernels = ""
    for step in range(steps):
        for name, start, dur, hlo_op in step_kernels:
            stats = ('stats { metadata_id: 101 str_value: "jit_train_step" } '
                     'stats { metadata_id: 102 str_value: "regs:16 grid:64,1,1 block:256,1,1" }')
            if hlo_op:
                stats += f" stats {{ metadata_id: 100 ref_value: {200 + ops.index(hlo_op)} }}"
            kernels += (f"events {{ metadata_id: {names.index(name) + 1} "
                        f"offset_ps: {(10_000 * step + start) * 10**6} "
                        f"duration_ps: {dur * 10**6} {stats} }}\n")
    copies = "".join(f"events {{ metadata_id: 900 offset_ps: {10_000 * s * 10**6} "
                     f"duration_ps: 500000000 }}\n" for s in range(steps))
    return f"""
planes {{
  id: 1 name: "/device:GPU:0"
  lines {{ id: 14 name: "Stream #14(Memset,Compute)" timestamp_ns: 5000
{kernels}  }}
  lines {{ id: 15 name: "Stream #15(MemcpyH2D)" timestamp_ns: 4000 {copies} }}
  lines {{ id: 16 name: "Stream #16(MemcpyD2H)" timestamp_ns: 4000
           events {{ metadata_id: 901 offset_ps: 300000000 duration_ps: 200000000 }} }}
  lines {{ id: 2 name: "Launch Stats" events {{ metadata_id: 1 offset_ps: 0
                                              duration_ps: 999000000 }} }}
  {meta}
  event_metadata {{ key: 900 value {{ id: 900 name: "MemcpyH2D" }} }}
  event_metadata {{ key: 901 value {{ id: 901 name: "MemcpyD2H" }} }}
  stat_metadata {{ key: 100 value {{ id: 100 name: "hlo_op" }} }}
  stat_metadata {{ key: 101 value {{ id: 101 name: "hlo_module" }} }}
  stat_metadata {{ key: 102 value {{ id: 102 name: "kernel_details" }} }}
}}
planes {{
  id: 2 name: "/host:CPU"
  lines {{ id: 1 name: "python3" events {{ metadata_id: 1 offset_ps: 0 duration_ps: 7 }} }}
  event_metadata {{ key: 1 value {{ id: 1 name: "PjitFunction(train_step)" }} }}
}}
planes {{ id: 3 name: "/host:metadata" }}
"""


def test_gpu_trace_kernel_time_by_kind_busy_and_span():
    s = ps.summarize(read(gpu_xspace()), steps=2, trace="gpu.xplane.pb")
    assert (s.source, s.devices) == (ps.GPU_KERNELS, 1)
    # 5 ms of kernels per step; busy 4.6 ms (the RNG kernel ran inside the attention
    # kernel's 2 ms); the span runs from 0 to 14.6 ms: two steps of 4.6 ms, 5.4 ms idle between
    assert (s.ms(s.op_ns), s.ms(s.busy_ns), s.ms(s.span_ns)) == (5.0, 4.6, 7.3)
    assert s.ms(s.transfer_ns) == 0.6  # 2 x 0.5 ms H2D + 0.2 ms D2H, not kernels
    assert {k: s.ms(ns) for k, ns in s.kind_ns().items()} == {
        "attention kernel": 2.0, "matmul": 1.0, "gather/scatter": 0.8, "RNG": 0.4,
        "elementwise/fusion": 0.3, "copy/transpose": 0.2, "collective": 0.2, "other": 0.1}
    ops = {op.name: (op.kind, op.count) for op in s.ops}
    assert ops["kernel_7"] == ("collective", 2)  # by its hlo_op all-gather-start.2
    assert ops["Memset 0"] == ("copy/transpose", 2)
    assert "MemcpyH2D" not in ops and "PjitFunction(train_step)" not in ops
    lines = s.format(top=2).splitlines()
    assert lines[0] == ("profile (gpu.xplane.pb), 1 device: GPU kernel time per step 5.0 ms; "
                        "busy 4.6 ms of a 7.3 ms span per step (first op start to last op end)")
    assert lines[1] == "  attention kernel          2.00 ms   40.0%"
    assert lines[-4:] == ["  host<->device copies 0.60 ms per step (memcpy streams, not in the "
                          "op time)", "  top 2 ops:",
                          "       2.00 ms   40.0%  relbias_flash_forward",
                          "       1.00 ms   20.0%  nvjet_sm90_tst_128x160_64x5_1x2_h_bz_NNT"]


def test_several_gpus_are_reported_per_device():
    text = gpu_xspace()
    second = text.split("planes {")[1].replace('"/device:GPU:0"', '"/device:GPU:1"')
    s = ps.summarize(read(text + "planes {" + second), steps=2, trace="t")
    assert s.devices == 2 and (s.ms(s.op_ns), s.ms(s.busy_ns), s.ms(s.span_ns)) == (
        5.0, 4.6, 7.3)
    assert "2 devices, per device: GPU kernel time" in s.format()


TPU_XSPACE = """
planes {
  id: 1 name: "/device:TPU:0"
  lines { id: 1 name: "XLA Modules" events { metadata_id: 9 offset_ps: 0 duration_ps: 9000000 } }
  lines {
    id: 2 name: "XLA Ops"
    events { metadata_id: 1 offset_ps: 0 duration_ps: 3000000 }
    events { metadata_id: 2 offset_ps: 3000000 duration_ps: 1000000 }
    events { metadata_id: 1 offset_ps: 4000000 duration_ps: 3000000 }
    events { metadata_id: 3 offset_ps: 8000000 duration_ps: 2000000 }
  }
  lines { id: 3 name: "Stream #1(Compute)" events { metadata_id: 1 duration_ps: 5000000 } }
  event_metadata { key: 1 value { id: 1 name: "convolution.3" } }
  event_metadata { key: 2 value { id: 2 name: "fusion.12" } }
  event_metadata { key: 3 value { id: 3 name: "all-reduce.1" } }
  event_metadata { key: 9 value { id: 9 name: "jit_train_step" } }
}
planes { id: 2 name: "/host:CPU" }
"""


def test_tpu_trace_reads_the_xla_ops_line():
    """A device plane with an `XLA Ops` line: its ops only (not the module line, not a
    stream line, which would count the same time twice)."""
    s = ps.summarize(read(TPU_XSPACE), steps=2, trace="t")
    assert (s.source, s.devices) == (ps.DEVICE_OPS, 1)
    assert (s.op_ns, s.busy_ns, s.span_ns) == (9000, 9000, 10000)
    assert s.kind_ns() == {"matmul": 6000, "collective": 2000, "elementwise/fusion": 1000}


def test_kind_names_are_the_shared_table():
    assert ps.KINDS == ("matmul", "attention kernel", "elementwise/fusion", "RNG",
                        "gather/scatter", "copy/transpose", "collective", "optimizer update",
                        "other")
    assert {r.kind for r in ps.KIND_RULES} == set(ps.KINDS) - {"optimizer update", "other"}
    # names from a GPU trace of the MMLM step (jax 0.11.2) and XLA:CPU op names
    expected = {
        "nvjet_sm90_tss_256x128_64x4_1x4_h_bz_coopA_NTT": "matmul",
        "gemm_fusion_dot_103": "matmul", "relbias_flash_dkv": "attention kernel",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop": "attention kernel",
        "loop_xor_fusion_11": "RNG", "input_reduce_slice_fusion_33": "elementwise/fusion",
        "wrapped_convert_4": "elementwise/fusion", "fusion_13626": "elementwise/fusion",
        "wrapped_concatenate_23": "copy/transpose", "memcpy32_post": "copy/transpose",
        "reduce-scatter.3": "collective", "all-gather-start": "collective",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "collective",
        "dynamic-update-slice.2": "gather/scatter", "sort_8_1": "other",
    }
    assert {n: ps.op_kind(n) for n in expected} == expected
    assert ps.op_kind("kernel_7", "command_buffer_3") == "other"  # a CUDA graph says nothing
    assert ps.op_kind("kernel_7", "dot.4") == "matmul"


# ------------------------------------------------------------------ the CLI and bad input
def test_cli_prints_the_summary_and_writes_whole_json(tmp_path, capsys):
    trace = tmp_path / "run" / "plugins" / "profile" / "r1" / "host.xplane.pb"
    trace.parent.mkdir(parents=True)
    trace.write_bytes(serialized(gpu_xspace()))
    out = tmp_path / "s.json"
    assert ps.main([str(tmp_path / "run"), "--steps", "2", "--top", "1",
                    "--json", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"profile ({trace}), 1 device: GPU kernel time")
    assert printed[-1].endswith("relbias_flash_forward") and len(printed) == 12
    figures = json.loads(out.read_text())
    assert (figures["op_ms"], figures["busy_ms"], figures["span_ms"]) == (5.0, 4.6, 7.3)
    assert figures["kinds_ms"]["attention kernel"] == 2.0
    assert figures["ops"][0] == {"name": "relbias_flash_forward", "kind": "attention kernel",
                                 "ms": 2.0, "count": 2}
    assert sorted(os.listdir(tmp_path)) == ["run", "s.json"]  # no temporary file left


NO_TF = """
import sys
sys.modules['tensorflow'] = None  # jax-only hosts: importing it fails
from xlm_jax.accelerator.profile_summary import main
sys.exit(main(sys.argv[1:]))
"""


def test_trace_without_op_events_is_one_line_and_exit_1(tmp_path):
    """Only memcpy streams on the GPU plane and no XLA:CPU ops on the host: one line naming
    the file and what was looked for, exit 1, no JSON; run without TensorFlow."""
    no_kernels = gpu_xspace(step_kernels=())
    trace = tmp_path / "empty.xplane.pb"
    trace.write_bytes(serialized(no_kernels))
    with pytest.raises(ps.NoOpEventsError):
        ps.summarize(read(no_kernels), steps=1)
    r = subprocess.run([sys.executable, "-c", NO_TF, str(trace), "--steps", "1", "--json",
                        str(tmp_path / "s.json")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"error: {trace}: no op events (looked for kernels on the stream lines of "
        "/device:GPU:N planes, an 'XLA Ops' line on /device:* planes, XLA:CPU ops with an "
        "hlo_op stat on /host:CPU)")
    assert sorted(os.listdir(tmp_path)) == ["empty.xplane.pb"]


def test_missing_or_unreadable_trace_is_one_line_and_exit_2(tmp_path, capsys):
    assert ps.main([str(tmp_path / "nope.xplane.pb"), "--steps", "1"]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'nope.xplane.pb'}: no such trace "
                                       "file or directory\n")
    assert ps.main([str(tmp_path), "--steps", "1"]) == 2  # a directory without a trace
    assert capsys.readouterr().err == f"error: no trace (*.xplane.pb) found under {tmp_path}\n"
    bad = tmp_path / "bad.xplane.pb"
    bad.write_bytes(b"\x00\x01 not a protobuf" * 4)
    assert ps.main([str(bad), "--steps", "1", "--json", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: not a readable jax.profiler trace (") and \
        err.count("\n") == 1
    assert not (tmp_path / "s.json").exists()


def test_module_runs_as_a_script_on_the_recorded_trace():
    r = subprocess.run([sys.executable, "-m", "xlm_jax.accelerator.profile_summary", CPU_TRACE,
                        "--steps", "2", "--top", "1"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[-1] == "       7.16 ms   98.8%  ynn_fusion"
