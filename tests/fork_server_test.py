"""The suite's fork server (tests/testlib/fork_server.py) against plain subprocesses: a
command forked from it sees what it would see started by the interpreter (argv, cwd,
sys.path[0], `__main__`, environment, stdin), ends as it would (exit codes, tracebacks,
non-daemon threads joined, atexit run) and is a process the caller can time out, kill and
wait for."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.testlib import fork_server
from tests.testlib.xla_flags import xla_flags

ROOT = fork_server.ROOT
PROBE = os.path.join("tests", "testlib", "fork_probe.py")

pytestmark = pytest.mark.skipif(fork_server._POOL is None,
                                reason="the fork server is off (TEST_FORK_SERVER=0)")


def _both(args, **kw):
    """(forked, plain) `subprocess.run` results of the same command."""
    kw = {"cwd": ROOT, "capture_output": True, "text": True, "timeout": 120, **kw}
    with fork_server.bypassed():
        plain = subprocess.run(args, **kw)
    forked = subprocess.run(args, **kw)
    return forked, plain


def _probe(result):
    head, *rest = result.stdout.splitlines()
    return json.loads(head), rest


def test_a_forked_script_sees_and_ends_as_a_plain_one(tmp_path):
    env = {**os.environ, "FORK_PROBE": "from the caller"}
    for extra, code in (([], 0), (["--exit", "3"], 3)):
        forked, plain = _both([sys.executable, PROBE, "a b", *extra], env=env, input="typed")
        assert (forked.returncode, plain.returncode) == (code, code)
        assert _probe(forked) == _probe(plain)
        seen, rest = _probe(forked)
        assert seen["argv"] == [PROBE, "a b", *extra] and seen["name"] == "__main__"
        assert seen["path0"] == os.path.join(ROOT, "tests", "testlib")
        assert seen["env"] == "from the caller" and seen["stdin"] == "typed"
        assert seen["main_keys"] == ["atexit", "json", "main", "os", "sys", "threading", "time"]
        assert rest == ["thread done", "atexit ran"]  # the thread joined, then atexit
        assert forked.stderr == plain.stderr == "to stderr\n"


def test_each_command_s_backend_reads_its_own_xla_flags_from_one_server():
    """XLA_FLAGS are not part of a server's key (`fork_server.AFTER_FORK`): commands with
    other host device counts fork from the same server, and each backend sees its own."""
    parents = set()
    for devices in (1, 3, 2):
        env = {**os.environ, "XLA_FLAGS": xla_flags(devices)}
        forked, plain = _both([sys.executable, PROBE, "--devices"], env=env)
        assert forked.returncode == plain.returncode == 0, forked.stderr
        seen, _ = _probe(forked)
        assert seen["devices"] == _probe(plain)[0]["devices"] == devices
        parents.add(seen["ppid"])
    assert len(parents) == 1 and os.getpid() not in parents  # one server forked all three


def test_an_uncaught_exception_exits_1_with_its_traceback():
    forked, plain = _both([sys.executable, PROBE, "--raise"])
    assert forked.returncode == plain.returncode == 1
    assert forked.stderr.splitlines()[-1] == plain.stderr.splitlines()[-1] == \
        "ValueError: raised by the probe"
    assert "Traceback (most recent call last):" in forked.stderr


def test_a_module_runs_as_python_m_in_the_callers_directory(tmp_path):
    args = [sys.executable, "-m", "xlm_jax.data.prepared.verify", str(tmp_path / "missing")]
    forked, plain = _both(args, cwd=tmp_path)
    assert forked.returncode == plain.returncode != 0
    assert forked.stdout == plain.stdout
    assert forked.stderr.splitlines()[-1] == plain.stderr.splitlines()[-1]
    assert str(tmp_path / "missing") in forked.stderr


def test_the_caller_times_out_kills_and_waits_for_a_forked_command():
    proc = subprocess.Popen([sys.executable, PROBE, "--sleep", "60"], cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            start_new_session=True)
    assert fork_server.forked(proc)
    assert os.getsid(proc.pid) == proc.pid  # a session of its own, as asked
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    assert proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, PROBE, "--sleep", "60"], cwd=ROOT, timeout=1,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    assert time.monotonic() - start < 30


def test_only_commands_of_the_repository_are_forked():
    code = [sys.executable, "-c", "print(1)"]  # `-c`: what tests of a command's imports use
    assert not fork_server.forked(subprocess.Popen(code, stdout=subprocess.DEVNULL))
    for args in ([sys.executable, "-m", "pip", "--version"], ["true"],
                 [sys.executable, "-X", "utf8", PROBE]):
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL)
        assert not fork_server.forked(proc), args
        proc.wait(60)
    proc = subprocess.Popen([sys.executable, PROBE], cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL)
    assert fork_server.forked(proc) and proc.wait(60) == 0


def test_a_command_s_pythonpath_is_on_its_path_unless_it_shadows_the_servers_imports(tmp_path):
    """PYTHONPATH is applied after the fork; a directory on it that would change what the
    server imported (a sitecustomize, another copy of jax) sends the command to a plain start;
    the repository itself (the copy the editable install points at) does not."""
    args = [sys.executable, PROBE]
    forked, plain = _both(args, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert _probe(forked) == _probe(plain) and _probe(forked)[0]["path1"] == str(tmp_path)
    for pythonpath in (ROOT, os.pathsep.join([str(tmp_path), ROOT])):
        proc = subprocess.Popen(args, cwd=ROOT, env={**os.environ, "PYTHONPATH": pythonpath},
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        assert fork_server.forked(proc) and proc.wait(60) == 0, pythonpath
    for name, text in (("sitecustomize.py", ""), ("jax/__init__.py", "")):
        shadow = tmp_path / name.split("/")[0].replace(".py", "") / "d"
        shadow.mkdir(parents=True)
        (shadow / name).parent.mkdir(parents=True, exist_ok=True)
        (shadow / name).write_text(text)
        proc = subprocess.Popen(args, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(shadow)},
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        assert not fork_server.forked(proc), name
        proc.wait(60)
