"""Two `jax.distributed` processes on localhost reading one prepared task: each reads its own
share (disjoint, together exactly the one-process read), and a process killed with SIGKILL
after saving its input position resumes to the uninterrupted run's batches, bit for bit; read
as two input shards, a run killed on two processes resumes on one, and one killed on one
resumes on two, each to the global batches of the uninterrupted run.

Each process is `tests/testlib/prepared_reader.py`: it reads as the trainer does
(`train.streams.make_stream` with jax's process index and count, positions at
`train.data_state`'s paths)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.testlib import prepared_corpus as pc
from tests.testlib import process_state
from tests.testlib.cli_run import ROOT, env

# seqio's registries and the prepared-data switch put back after each test: the tests
# register tasks again over the prepared data (issue 56).
pytestmark = pytest.mark.usefixtures("seqio_isolated")

TASK = "pd_mono"  # the German (plain text, several units) and French (xz) documents


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = pc.write(str(tmp_path_factory.mktemp("corpus")))
    out = os.path.join(root, "prepared")
    # prep_tasks importable for the module's tests, which register its tasks again over the
    # prepared data; seqio, the prepared-data switch and sys.path as before after them
    with process_state.restored("seqio", "prepared data"), pc.on_path(root):
        pc.prepare_here(root, out, pattern=TASK)
        yield root, out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _readers(corpus, tmp_path, name, processes, *extra):
    """Starts `processes` readers (one jax.distributed job when > 1); returns them."""
    root, out = corpus
    port, procs = _port(), []
    for i in range(processes):
        args = [sys.executable, os.path.join(ROOT, "tests", "testlib", "prepared_reader.py"),
                "--corpus", root, "--prepared", out, "--task", TASK,
                "--out", str(tmp_path / f"{name}_{i}.npz"), "--state_dir", str(tmp_path / "run"),
                *extra]
        if processes > 1:
            args += ["--coordinator", f"localhost:{port}", "--num_processes", str(processes),
                     "--process_id", str(i)]
        log = tmp_path / f"{name}_{i}.log"
        with open(log, "w") as f:
            proc = subprocess.Popen(args, cwd=ROOT, env=env(), stdout=f, stderr=subprocess.STDOUT)
        proc.log = log
        procs.append(proc)
    return procs


def _wait(procs):
    """Exit codes of `procs` and the ends of their logs (all killed after 240 s)."""
    try:
        codes = [p.wait(240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return codes, [p.log.read_text()[-2000:] for p in procs]


def _docs(npz) -> list[tuple[int, ...]]:
    flat, lengths = npz["docs"], npz["doc_lengths"]
    ends = np.cumsum(lengths)
    return [tuple(flat[e - n:e].tolist()) for e, n in zip(ends, lengths)]


def _batches(npz, steps) -> dict[str, np.ndarray]:
    return {k: npz[k] for k in npz.files if k.startswith(tuple(f"step_{s}_" for s in steps))}


def _killed_after_save(corpus, tmp_path, name, processes, *extra):
    """Starts `processes` readers that save at step 3 and park; SIGKILLs them all once every
    one has saved."""
    killed = _readers(corpus, tmp_path, name, processes, "--save_at", "3", "--park_after_save",
                      *extra)
    saved = [tmp_path / f"{name}_{i}.npz.saved" for i in range(processes)]
    deadline = time.monotonic() + 240
    while not all(p.exists() for p in saved) and time.monotonic() < deadline:
        assert all(p.poll() is None for p in killed), _wait(killed)[1]
        time.sleep(0.05)
    for p in killed:
        p.send_signal(signal.SIGKILL)
    codes, logs = _wait(killed)
    assert codes == [-9] * processes, logs


def test_two_processes_read_disjoint_shares_and_resume_bit_identical_after_sigkill(
        corpus, tmp_path):
    procs = _readers(corpus, tmp_path, "two", 2) + _readers(corpus, tmp_path, "one", 1)
    codes, logs = _wait(procs)
    assert codes == [0, 0, 0], logs
    two = [np.load(tmp_path / f"two_{i}.npz") for i in range(2)]
    one = np.load(tmp_path / "one_0.npz")
    # process p reads global positions p, p + 2, ...: the one-process order, interleaved
    assert [npz["process"].tolist() for npz in (*two, one)] == [[0, 2], [1, 2], [0, 1]]
    a, b, single = _docs(two[0]), _docs(two[1]), _docs(one)
    assert len(a) == len(b) == len(single) == 24
    assert [d for pair in zip(a[:12], b[:12]) for d in pair] == single
    assert a != b and two[0]["step_0_input_ids"].shape == (4, 32)  # 8 rows over 2 processes

    # killed (SIGKILL) once both processes saved their positions at step 3, then resumed
    _killed_after_save(corpus, tmp_path, "killed", 2)
    codes, logs = _wait(_readers(corpus, tmp_path, "resumed", 2, "--restore_at", "3"))
    assert codes == [0, 0], logs
    for i in range(2):
        resumed = np.load(tmp_path / f"resumed_{i}.npz")
        want, got = _batches(two[i], [3, 4, 5]), _batches(resumed, [3, 4, 5])
        assert len(want) == 15 and want.keys() == got.keys()  # 3 steps x 5 features
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"process {i} {key}")
        assert not _batches(resumed, [0, 1, 2])  # nothing re-read before the saved position


def test_two_input_shards_resume_the_global_sequence_on_another_process_count(corpus, tmp_path):
    shards = ("--input_shards", "2")
    codes, logs = _wait(_readers(corpus, tmp_path, "straight", 1, *shards))
    assert codes == [0], logs
    straight = np.load(tmp_path / "straight_0.npz")
    assert straight["shards"].tolist() == [0, 1] and straight["step_0_input_ids"].shape == (8, 32)

    # two processes (one shard each) killed after saving at step 3, resumed on one process
    _killed_after_save(corpus, tmp_path, "two", 2, *shards)
    codes, logs = _wait(_readers(corpus, tmp_path, "on_one", 1, "--restore_at", "3", *shards))
    assert codes == [0], logs
    on_one = np.load(tmp_path / "on_one_0.npz")
    want, got = _batches(straight, [3, 4, 5]), _batches(on_one, [3, 4, 5])
    assert len(want) == 15 and want.keys() == got.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=f"2 -> 1 processes: {key}")

    # one process (both shards) killed after saving at step 3, resumed on two processes
    _killed_after_save(corpus, tmp_path, "one", 1, *shards)
    codes, logs = _wait(_readers(corpus, tmp_path, "on_two", 2, "--restore_at", "3", *shards))
    assert codes == [0, 0], logs
    halves = [np.load(tmp_path / f"on_two_{i}.npz") for i in range(2)]
    assert [h["shards"].tolist() for h in halves] == [[0], [1]]
    for key, value in _batches(straight, [3, 4, 5]).items():
        joined = np.concatenate([h[key] for h in halves])  # process 0's rows, then process 1's
        np.testing.assert_array_equal(joined, value, err_msg=f"1 -> 2 processes: {key}")
