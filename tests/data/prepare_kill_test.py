"""`python -m xlm_jax.data.prepared.prepare` killed (SIGKILL, the whole process group: the driver and
its Beam workers) while its workers write, then run again: it completes, and every file it
leaves is byte for byte what an uninterrupted preparation writes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.testlib import prepared_corpus as pc
from tests.testlib.cli_run import ROOT, env
from xlm_jax.data import make_corpus


def _shard_counts(directory: str) -> int:
    return sum(name.endswith(".json") and name.startswith("shard-")
               for _, _, names in os.walk(directory) for name in names)


def test_prepare_killed_mid_way_and_rerun_writes_what_an_uninterrupted_run_writes(
        tmp_path, seqio_isolated):
    root = pc.write(str(tmp_path / "corpus"))
    de = os.path.join(root, "mono", "de.txt")  # 12 MB of German documents: ~90 work units
    make_corpus.write_language(de, make_corpus.sentences(make_corpus.demo_mono_dir(), "de"),
                               12, seed=3)
    split = 128 << 10
    units = -(-os.path.getsize(de) // split) + 1  # + fr's one unit

    reference = str(tmp_path / "reference")
    pc.prepare_here(root, reference, pattern="pd_mono", split_bytes=split)

    out = str(tmp_path / "prepared")
    args = [sys.executable, "-m", "xlm_jax.data.prepared.prepare", "--module", pc.MODULE, "--tasks",
            "pd_mono", "--output_dir", out, "--split_bytes", str(split),
            "--direct_num_workers=2"]
    run_env = env(PYTHONPATH=os.pathsep.join([root, ROOT]))
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen(args, cwd=root, env=run_env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while _shard_counts(out) == 0 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(60)
    done = _shard_counts(out)
    assert 0 < done < units, (done, units, (tmp_path / "killed.log").read_text()[-2000:])
    assert not any(os.path.exists(os.path.join(out, t, "manifest.json"))
                   for t in ("pd_mono_de", "pd_mono_fr"))

    r = subprocess.run(args, cwd=root, env=run_env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"prepare: {units - done} work units of" in r.stdout  # the finished ones are kept
    got, want = pc.tree(out), pc.tree(reference)
    assert sorted(got) == sorted(want) and len(want) == 3 * units + 4  # + plans, manifests
    assert all(got[k] == want[k] for k in want)
