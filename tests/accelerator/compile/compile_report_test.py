"""`xlm_jax.accelerator.compile.fit_report` and `targets`: pure functions, checked against
hand-computed values (no compiling)."""
from __future__ import annotations

import dataclasses

import pytest

from xlm_jax.accelerator.compile import fit_report as report, targets


@dataclasses.dataclass
class Layout:
    """What `report.padded_bytes` reads of a jax Layout."""

    major_to_minor: tuple[int, ...]
    tiling: tuple[tuple[int, ...], ...]
    sub_byte_element_size_in_bits: int = 0


@pytest.mark.parametrize("shape,itemsize,layout,expected", [
    # the four arguments XLA:TPU assigned 7680 bytes for (measured, v5e:2x2)
    ((128,), 4, Layout((0,), ((128,),)), 512),  # replicated [128] f32: one tile row
    ((2, 100), 2, Layout((0, 1), ((2, 128), (2, 1))), 512),  # bf16 shard, 100 -> 128
    ((2,), 4, Layout((0,), ((128,),)), 512),  # the rng key: 2 -> 128 elements
    ((4, 3, 128), 4, Layout((1, 0, 2), ((4, 128),)), 6144),  # permuted: [3, 4, 128]
    ((), 4, Layout((), ((128,),)), 512),  # a scalar takes a tile row
    ((8002,), 4, Layout((0,), ((1024,),)), 8192 * 4),  # 8002 -> 8192
    ((3, 5), 4, None, 60),  # no layout (GPU/CPU): the plain size
    ((3, 5), 4, Layout((0, 1), ()), 60),
    ((16,), 1, Layout((0,), (), 4), 8),  # 4-bit elements
])
def test_padded_bytes(shape, itemsize, layout, expected):
    assert report.padded_bytes(shape, itemsize, layout) == expected


def test_out_of_memory_reads_both_messages_of_xla_tpu():
    g = 2**30
    assert report.out_of_memory("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. "
                                "Used 21.88G of 15.75G hbm. Exceeded hbm capacity by 6.13G.") == (
        int(21.88 * g), int(15.75 * g))
    assert report.out_of_memory("Ran out of memory on HBM, the total memory required for HLO "
                                "temporaries (76.39G) exceeds available HBM (15.75G).") == (
        int(76.39 * g), int(15.75 * g))
    assert report.out_of_memory("INTERNAL: Mosaic failed to compile") is None


def test_first_knob_order():
    k = report.Knobs(remat="none", mesh={"data": 8, "fsdp": 1, "tensor": 1}, devices=8,
                     accum_steps=1, rows_per_device=4)
    assert report.first_knob(k).startswith("rematerialise every layer (--remat full")
    k = dataclasses.replace(k, remat="full")
    assert report.first_knob(k).startswith("shard parameters and optimiser state over all 8 "
                                           "devices (--mesh fsdp=8)")
    k = dataclasses.replace(k, mesh={"data": 1, "fsdp": 4, "tensor": 2})
    assert report.first_knob(k) == ("accumulate gradients (--accum_steps 2: 2 rows per device "
                                    "per microbatch)")
    k = dataclasses.replace(k, accum_steps=4)
    assert report.first_knob(k).startswith("fewer rows per device")


def test_verdict_and_total():
    mem = {"argument": 10, "output": 10, "alias": 10, "temp": 5, "generated_code": 1}
    stats = type("Stats", (), {f"{k}_size_in_bytes": v for k, v in mem.items()})()
    got = report.memory_per_device(stats)
    assert got["total"] == 16 and got["peak"] == 0
    r = {"memory_per_device_bytes": {"total": 3 * 2**30}, "device_memory_bytes": 2 * 2**30,
         "first_knob": "K"}
    assert report.verdict(r) == ("does not fit: 3.00 GiB per device, 2.00 GiB available "
                                 "(1.00 GiB over); first knob: K")


@pytest.mark.parametrize("text,platform,chips", [
    ("v5p:2x2x1", "tpu", 4), ("V4:4x4x4", "tpu", 64), ("v5e:16x16", "tpu", 256),
    ("h100:1x1x8", "cuda", 8), ("b200:1x4x8", "cuda", 32),
])
def test_parse_target(text, platform, chips):
    t = targets.parse_target(text)
    assert (t.platform, t.chips) == (platform, chips)


@pytest.mark.parametrize("text,message", [
    ("a100:1x1x8", "unknown chip 'a100'"), ("v5p", "expected CHIP:TOPOLOGY"),
    ("v5p:2x", "expected CHIP:TOPOLOGY"),
])
def test_parse_target_refuses(text, message):
    with pytest.raises(targets.TargetError, match=message):
        targets.parse_target(text)


@pytest.mark.parametrize("card,gb", [("h100", 80), ("h200", 141), ("b200", 180)])
def test_gpu_descriptions_ship_with_their_memory(card, gb):
    assert targets.gpu_memory_bytes(card) == gb * 10**9
    text = targets.gpu_description(card)
    assert 'platform_name: "CUDA"' in text and "cuda_compute_capability" in text
