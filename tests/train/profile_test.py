"""`loop.train(profile_steps=..., profile_first_step=...)` writes a `jax.profiler` trace of
exactly those steps where TensorBoard's profile plugin looks for it, readable by jax's reader."""
import glob
import os

from jax.profiler import ProfileData

from tests.testlib import tiny_run


def test_profile_steps_write_a_trace_of_those_steps_that_jax_reads(tmp_path):
    tiny_run.train_tiny(tmp_path, 5, profile_first_step=2, profile_steps=2)
    # TensorBoard's profile plugin lists runs as plugins/profile/RUN/HOST.xplane.pb
    files = glob.glob(os.path.join(tmp_path, "plugins", "profile", "*", "*.xplane.pb"))
    assert len(files) == 1
    data = ProfileData.from_file(files[0])
    host = [p for p in data.planes if p.name == "/host:CPU"]
    assert host, [p.name for p in data.planes]
    steps, xla_events = [], 0
    for line in host[0].lines:
        for event in line.events:
            if event.name == "train":  # the loop's StepTraceAnnotation
                steps.append(dict(event.stats)["step_num"])
            elif line.name != "python":
                xla_events += 1  # XLA's CPU client running the compiled step
    assert sorted(steps) == [2, 3]  # 0-based step indices 2 and 3, nothing else
    assert xla_events > 0
