"""The XLA flags every test process runs with: host devices plus fast compilation.

The suite's time is mostly XLA:CPU compiling tiny models, each run for a few steps. Three
backend flags trade run-time speed of the compiled code for compile time:
- `--xla_backend_optimization_level=0` (LLVM's -O0 instead of -O2 for the generated CPU code)
  and `--xla_llvm_disable_expensive_passes=true`. Measured on the every-objective mix
  (`tests/testlib/objective_mix.gin`, 20 steps, one device, no compilation cache): 39 s
  without, 25 s with, the same loss to the last bit.
- `--xla_cpu_use_fusion_emitters=false`: fusions are emitted by XLA:CPU's elemental LLVM
  emitter instead of its MLIR fusion emitters, which cost about 20 ms more for every compile,
  however small (the suite compiles about 8,000 programs). Measured on the 2-core machine, one
  fresh process each, no compilation cache: 100 tiny jitted functions 5.3 s -> 3.3 s of CPU;
  `demo/synthetic.gin` for 2 steps 6.0-6.5 s -> 4.2-4.4 s; the objective mix for 2 steps
  21-23 s -> 17-20 s; the losses equal to the digits printed.
The HLO optimisation passes (fusion, layout) are unchanged, and every comparison in the suite
is either within one configuration (a resumed run against an uninterrupted one, 8 devices
against 1) or against a numpy or `transformers` reference with a tolerance. Users' runs keep
XLA's defaults.
"""
from tests.testlib.versions import jaxlib_before

# jaxlib 0.11 has no `--xla_cpu_use_fusion_emitters` (its MLIR emitters are the only ones) and
# aborts every process that names an unknown flag: the flag is for the pinned jaxlib 0.10 only.
FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
                + (" --xla_cpu_use_fusion_emitters=false" if jaxlib_before(0, 11) else ""))


def xla_flags(devices: int) -> str:
    """XLA_FLAGS for a test process with `devices` host CPU devices."""
    return f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}"
