"""A fork server for the suite's Python commands: `python -m xlm_jax.X ARGS` without the imports.

Why: sampled across every process the suite starts, about a third of its CPU went to the
start-up imports of the commands the tests run as users do (`python -m xlm_jax.train`,
`prepare`, the multi-process readers): TensorFlow, seqio, jax, flax and orbax, a few hundred
times (measured: 2.6 s of a 9.6 s tiny training command; half of a process that reads
prepared data through TF). The commands must stay separate processes (their exit codes,
signals, files and `jax.distributed` are what the tests are about); only their imports are
shared.

How: one server process per distinct import-time environment (every variable except
`PYTEST_CURRENT_TEST`; `PYTHONPATH`, which goes on the command's `sys.path` after the fork
unless a directory on it, or the command's own first path entry, holds a sitecustomize or
another copy of a module the server imported; `XLA_FLAGS`, which XLA reads when jax starts its
first backend, in the command, never in the server's imports; and SLURM's, which
`jax.distributed` reads when called) imports, once, what a command's start-up imports:
xlm_jax's root (it may set JAX_PLATFORMS before jax is imported, as in every command), TensorFlow the way the
commands import it (`cli_help.quiet_tensorflow`; not under XLM_JAX_DEBUG=1, whose commands
print TF's import lines), seqio, jax, flax, optax, orbax. A server whose imports print
anything serves nothing (a forked command would not show it). Then it forks a child per
command: the child takes the caller's stdin/stdout/stderr (passed over a Unix socket),
working directory, environment (plus what the server's imports set, as the command's own
imports would), argv and session, runs the module or script as `__main__` as `python -m` /
`python SCRIPT` would, joins its threads, runs `atexit` and exits with the code Python would.
Nothing of xlm_jax beyond its root and `cli_help`, and nothing that registers a seqio task, is
imported before the fork, so a command's own imports of the library happen in the command,
in its order.

What the caller sees is a `subprocess.Popen` (`install` routes `Popen._execute_child`, `_wait`
and `_internal_poll` of eligible calls here): `pid` is the command's, signals go to it,
`wait`/`poll`/`communicate`/timeouts work, and the exit status is the server's `waitpid` of it.
Eligible: `[sys.executable, "-m", "xlm_jax..."]` or `[sys.executable, "SCRIPT.py"]` under the
repository, no interpreter options, no shell/preexec_fn/pass_fds/user or group changes, an
existing cwd. Everything else (and everything when TEST_FORK_SERVER=0) runs as before. A
server starts the first time its environment is seen, and the command waits for its imports
(what its own would have cost); at most `MAX_SERVERS` per pytest process, the least recently
used idle one retired for a new one.

This file is the client (the pytest side); a server's process runs
`tests/testlib/fork_serve.py`.

Left out on purpose: `-c` snippets (the tests that check what a command imports use them),
and the server never runs a command itself.
"""
from __future__ import annotations

import contextlib
import inspect
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time

from tests.testlib import fork_serve  # the standard library only

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Variables that differ per test but are read by nobody at import time.
NOT_IMPORT_TIME = frozenset({"PYTEST_CURRENT_TEST"})
# Not part of a server's environment: a command's PYTHONPATH goes on its sys.path after the
# fork, where nothing on it shadows what the server imported (`_shadows`); its XLA_FLAGS (the
# host device count differs from test to test) are read when jax starts a backend, which the
# server's imports never do (`fork_serve.serve` refuses to serve when they did), so the command's own
# environment, set after the fork, is what its backend reads; the same holds for SLURM's
# variables, which `jax.distributed.initialize` reads when called. With them in the key, the
# suite started 26 servers (17 on one worker; measured with TEST_FORK_SERVER_LOG), each
# importing TensorFlow and jax again: 7% of the suite's sampled CPU time.
AFTER_FORK = frozenset({"PYTHONPATH", "XLA_FLAGS", "XLA_FLAGS_EXTRA"})
AFTER_FORK_PREFIXES = ("SLURM_",)
MAX_SERVERS = 3
READY_TIMEOUT_S = 180.0
SERVER_SCRIPT = os.path.abspath(fork_serve.__file__)  # what a server process runs


def _import_time(name: str) -> bool:
    """Whether the variable `name` is part of a server's environment (its key)."""
    return (name not in NOT_IMPORT_TIME and name not in AFTER_FORK
            and not name.startswith(AFTER_FORK_PREFIXES))



# ----------------------------------------------------------------------------- the client

class _Server:
    """One server process for one import-time environment."""

    def __init__(self, env: dict[str, str], directory: str, index: int):
        self.path = os.path.join(directory, f"s{index}")
        self.proc = subprocess.Popen(  # not eligible itself (`_request`)
            [sys.executable, SERVER_SCRIPT, self.path], env=env, cwd=directory,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.live = 0  # commands started and not yet waited for
        self._modules: dict[str, list[str]] | None = None
        self.used = time.monotonic()

    def wait_ready(self, timeout: float) -> bool:
        """Whether the server is listening, waiting up to `timeout` s for its imports."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if os.path.exists(self.path):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return False

    def modules(self) -> dict[str, list[str]]:
        if self._modules is None:
            with open(self.path + ".modules") as f:
                self._modules = json.load(f)
        return self._modules

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class _Pool:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="xlmjax-fork-")
        self.servers: dict[frozenset, _Server] = {}
        self.refused: set[frozenset] = set()
        self.count = 0
        self.lock = threading.Lock()
        self.forked = self.fallback = 0
        self.base = {k: v for k, v in os.environ.items() if _import_time(k)}  # for the log

    def server_for(self, env: dict[str, str], first_dirs: list[str]) -> _Server | None:
        """The ready server for `env`'s import-time environment, started (and waited for:
        its imports cost what the command's own would) when there is none; None where no
        server can be had (the limit reached with none idle, or one failed to start) or
        where one of `first_dirs` (the command's sys.path[0] and PYTHONPATH) shadows it."""
        key = frozenset((k, v) for k, v in env.items() if _import_time(k))
        with self.lock:
            if key in self.refused:
                return None
            server = self.servers.get(key)
            if server is None:
                if len(self.servers) >= MAX_SERVERS:
                    idle = [(s.used, n, k) for n, (k, s) in enumerate(self.servers.items())
                            if s.live == 0]
                    if not idle:
                        return None
                    self.servers.pop(min(idle)[2]).close()
                self.count += 1
                server = self.servers[key] = _Server(dict(key), self.dir, self.count)
                _log_server(self.count, dict(key), self.base)
            if not server.wait_ready(READY_TIMEOUT_S):
                self.servers.pop(key).close()
                self.refused.add(key)  # not again: each try costs what a command's imports do
                return None
            if _shadows(first_dirs, server.modules()):
                return None
            server.used = time.monotonic()
            return server

    def close(self) -> None:
        for server in self.servers.values():
            server.close()
        self.servers.clear()
        try:
            for name in os.listdir(self.dir):
                os.unlink(os.path.join(self.dir, name))
            os.rmdir(self.dir)
        except OSError:
            pass


def _shadows(dirs: list[str], modules: dict[str, list[str]]) -> bool:
    """Whether one of `dirs` holds a sitecustomize/usercustomize or another copy
    of a top-level module the server imported (the command would import that one, or run it
    at start); the same copy (the repository the editable install points at) does not count."""
    for entry in dirs:
        if not os.path.isdir(entry):
            if os.path.exists(entry):  # a zip on the path: not looked into
                return True
            continue
        for name in os.listdir(entry):
            path = os.path.join(entry, name)
            if os.path.isdir(path):
                stem = name if name.isidentifier() else ""  # not `x.egg-info`: no package
            else:
                stem, _, suffix = name.partition(".")
                stem = stem if suffix.endswith(("py", "pyc", "so")) else ""
            if stem in ("sitecustomize", "usercustomize"):
                return True
            if stem in modules and os.path.realpath(path) not in modules[stem]:
                return True
    return False


_POOL: _Pool | None = None
_ORIGINAL: dict[str, object] = {}


def _request(args: object, executable: object, shell: bool, preexec_fn: object,
             pass_fds: tuple, cwd: object, extra: dict) -> dict | None:
    """The request for an eligible command, or None."""
    if (shell or preexec_fn is not None or pass_fds or executable is not None
            or not isinstance(args, (list, tuple)) or len(args) < 2
            or any(extra.get(k) is not None for k in ("gid", "gids", "uid"))
            or extra.get("umask", -1) >= 0 or extra.get("process_group") not in (None, -1)
            or not extra.get("restore_signals", True) or not extra.get("close_fds", True)):
        return None
    args = [os.fspath(a) if isinstance(a, os.PathLike) else a for a in args]
    if not all(isinstance(a, str) for a in args) or args[0] != sys.executable:
        return None
    cwd = os.fspath(cwd) if cwd is not None else os.getcwd()
    if not os.path.isdir(cwd):
        return None
    if args[1] == "-m" and len(args) >= 3 and args[2].split(".")[0] == "xlm_jax":
        return {"module": args[2], "script": None, "argv0": args[2], "args": args[3:],
                "cwd": cwd}
    if args[1].endswith(".py") and not args[1].startswith("-"):
        script = os.path.realpath(os.path.join(cwd, args[1]))
        if (script.startswith(ROOT + os.sep) and os.path.isfile(script)
                and script != os.path.realpath(SERVER_SCRIPT)):
            return {"module": None, "script": script, "argv0": args[1], "args": args[2:],
                    "cwd": cwd}
    return None


_LOCAL = threading.local()


@contextlib.contextmanager
def bypassed():
    """Commands this thread starts inside run as plain subprocesses (to compare with)."""
    before = getattr(_LOCAL, "bypass", False)
    _LOCAL.bypass = True
    try:
        yield
    finally:
        _LOCAL.bypass = before


def forked(proc: subprocess.Popen) -> bool:
    """Whether `proc` was forked by a server (not started as a plain subprocess)."""
    return getattr(proc, "_fork_server", None) is not None


def _log(how: str, req: dict) -> None:
    """With TEST_FORK_SERVER_LOG=PATH: a line per command, forked or started, and its file."""
    if os.environ.get("TEST_FORK_SERVER_LOG"):
        with open(os.environ["TEST_FORK_SERVER_LOG"], "a") as f:
            f.write(f"{how} {req['module'] or req['argv0']} "
                    f"{os.environ.get('PYTEST_CURRENT_TEST', '').split('::')[0]}\n")


def _log_server(index: int, env: dict[str, str], base: dict[str, str]) -> None:
    """With TEST_FORK_SERVER_LOG=PATH: a line per server started, with the variables in which
    its environment differs from `base` (this process's at the start): what made it needed."""
    if os.environ.get("TEST_FORK_SERVER_LOG"):
        differ = sorted({k for k in {**base, **env} if base.get(k) != env.get(k)})
        with open(os.environ["TEST_FORK_SERVER_LOG"], "a") as f:
            f.write(f"server {os.getpid()}/s{index} "
                    f"{os.environ.get('PYTEST_CURRENT_TEST', '').split('::')[0]} "
                    f"differs in: {' '.join(differ) or 'nothing'}\n")


def _execute_child(self, *args, **kwargs):  # noqa: ANN001 - Popen's own signature
    bound = _SIGNATURE.bind(self, *args, **kwargs).arguments
    original = _ORIGINAL["Popen._execute_child"]
    if _POOL is None or getattr(_LOCAL, "bypass", False):
        return original(self, *args, **kwargs)
    req = _request(bound["args"], bound["executable"], bound["shell"], bound["preexec_fn"],
                   tuple(bound["pass_fds"] or ()), bound["cwd"], bound)
    env = bound["env"]
    env = dict(os.environ if env is None else env)
    env = {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
    server = None
    if req is not None:
        first = req["cwd"] if req["module"] else os.path.dirname(req["script"])
        extra = env.get("PYTHONPATH", "")
        server = _POOL.server_for(env, [first, *(os.path.join(req["cwd"], p) for p in
                                                 extra.split(os.pathsep))] if extra else [first])
    if server is None:
        if req is not None:
            _POOL.fallback += 1
            _log("start", req)
        return original(self, *args, **kwargs)
    req.update(env=env, new_session=bool(bound["start_new_session"]))
    fds = [bound["p2cread"], bound["c2pwrite"], bound["errwrite"]]
    fds = [fd if fd != -1 else i for i, fd in enumerate(fds)]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(server.path)
        socket.send_fds(conn, [json.dumps(req).encode()], fds)
        reply = conn.recv(fork_serve.MESSAGE_BYTES)
        pid = json.loads(reply)["pid"]
    except (OSError, ValueError, KeyError):
        conn.close()
        _POOL.fallback += 1
        return original(self, *args, **kwargs)
    server.live += 1
    _POOL.forked += 1
    _log("fork", req)
    self.pid = pid
    self._child_created = True
    self._fork_server = (conn, server)
    self._close_pipe_fds(bound["p2cread"], bound["p2cwrite"], bound["c2pread"],
                         bound["c2pwrite"], bound["errread"], bound["errwrite"])


def _status(self, timeout: float | None) -> bool:
    """Reads the forked command's wait status when it is there within `timeout`."""
    conn, server = self._fork_server
    if conn.fileno() == -1:
        return self.returncode is not None
    ready, _, _ = select.select([conn], [], [], timeout)
    if not ready:
        return False
    try:
        data = conn.recv(fork_serve.MESSAGE_BYTES)
    except OSError:
        data = b""
    conn.close()
    server.live -= 1
    if data:
        self._handle_exitstatus(json.loads(data)["status"])
    else:  # the server went away before the command: its status is lost
        self.returncode = 255
    return True


def _internal_poll(self, *args, **kwargs):  # noqa: ANN001
    if getattr(self, "_fork_server", None) is None:
        return _ORIGINAL["Popen._internal_poll"](self, *args, **kwargs)
    if self.returncode is None and self._waitpid_lock.acquire(False):
        try:  # as Popen: never blocks here (`__del__` calls it)
            if self.returncode is None:
                _status(self, 0)
        finally:
            self._waitpid_lock.release()
    return self.returncode


def _wait(self, timeout):  # noqa: ANN001
    if getattr(self, "_fork_server", None) is None:
        return _ORIGINAL["Popen._wait"](self, timeout)
    with self._waitpid_lock:
        if self.returncode is None and not _status(self, timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
    return self.returncode


_SIGNATURE = inspect.signature(subprocess.Popen._execute_child)


def install() -> bool:
    """Routes eligible `subprocess.Popen` calls of this process through fork servers; False
    (nothing changed) with TEST_FORK_SERVER=0 or where fork is not available."""
    global _POOL
    if os.environ.get("TEST_FORK_SERVER", "1") == "0" or not hasattr(os, "fork") or _POOL:
        return False
    _ORIGINAL.update({"Popen._execute_child": subprocess.Popen._execute_child,
                      "Popen._internal_poll": subprocess.Popen._internal_poll,
                      "Popen._wait": subprocess.Popen._wait})
    _POOL = _Pool()
    subprocess.Popen._execute_child = _execute_child
    subprocess.Popen._internal_poll = _internal_poll
    subprocess.Popen._wait = _wait
    return True


def uninstall() -> tuple[int, int]:
    """Puts `subprocess.Popen` back and stops the servers; (forked, fallback) counts."""
    global _POOL
    if _POOL is None:
        return 0, 0
    subprocess.Popen._execute_child = _ORIGINAL["Popen._execute_child"]
    subprocess.Popen._internal_poll = _ORIGINAL["Popen._internal_poll"]
    subprocess.Popen._wait = _ORIGINAL["Popen._wait"]
    pool, _POOL = _POOL, None
    pool.close()
    return pool.forked, pool.fallback
