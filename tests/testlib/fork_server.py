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

Left out on purpose: `-c` snippets (the tests that check what a command imports use them),
and the server never runs a command itself.
"""
from __future__ import annotations

import atexit
import contextlib
import inspect
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What most of a command's start-up imports: xlm_jax's root first (its
# `_cpu_without_accelerators` runs before jax is imported, as in every command), then
# TensorFlow, as a command that reads data imports it first (`cli_help.quiet_tensorflow`).
PRELOAD = ("xlm_jax", "tensorflow", "seqio", "numpy", "jax", "jax.numpy", "flax.linen", "optax",
           "orbax.checkpoint", "sentencepiece", "gin")
# Variables that differ per test but are read by nobody at import time.
NOT_IMPORT_TIME = frozenset({"PYTEST_CURRENT_TEST"})
# Not part of a server's environment: a command's PYTHONPATH goes on its sys.path after the
# fork, where nothing on it shadows what the server imported (`_shadows`); its XLA_FLAGS (the
# host device count differs from test to test) are read when jax starts a backend, which the
# server's imports never do (`serve` refuses to serve when they did), so the command's own
# environment, set after the fork, is what its backend reads; the same holds for SLURM's
# variables, which `jax.distributed.initialize` reads when called. With them in the key, the
# suite started 26 servers (17 on one worker; measured with TEST_FORK_SERVER_LOG), each
# importing TensorFlow and jax again: 7% of the suite's sampled CPU time.
AFTER_FORK = frozenset({"PYTHONPATH", "XLA_FLAGS", "XLA_FLAGS_EXTRA"})
AFTER_FORK_PREFIXES = ("SLURM_",)
MAX_SERVERS = 3
READY_TIMEOUT_S = 180.0
_MSG = 1 << 20


# ----------------------------------------------------------------------------- the server

def _import_time(name: str) -> bool:
    """Whether the variable `name` is part of a server's environment (its key)."""
    return (name not in NOT_IMPORT_TIME and name not in AFTER_FORK
            and not name.startswith(AFTER_FORK_PREFIXES))


def _exit_code(code: object) -> int:
    """The exit status `sys.exit(code)` gives a Python process."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except Exception:  # noqa: BLE001 - as the interpreter: an unprintable code still exits 1
        pass
    return 1


def _run_command(req: dict) -> int:
    """In the forked child: runs the request's module or script as `__main__`; its exit code."""
    import runpy
    import traceback

    import builtins
    import types

    main = types.ModuleType("__main__")  # a fresh `__main__`, not the server's
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    code = 0
    try:
        if req["module"]:
            runpy._run_module_as_main(req["module"])  # what `python -m` calls
        else:  # as `python SCRIPT`: argv[0] as given, `__file__` absolute
            from importlib.machinery import SourceFileLoader

            path = os.path.abspath(req["argv0"])
            main.__file__, main.__cached__, main.__package__, main.__spec__ = path, None, None, None
            main.__loader__ = SourceFileLoader("__main__", path)
            with open(path, "rb") as f:
                exec(compile(f.read(), path, "exec"), main.__dict__)
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 - an uncaught exception: traceback, exit 1
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        threading._shutdown()  # what the interpreter does first at exit: join non-daemon threads
    except Exception:  # noqa: BLE001
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe: as Python, the code stands
            code = code or 120
    return code


def _child(req: dict, fds: list[int], conn: socket.socket, close: list, base_path: list[str],
           import_env: dict[str, str | None]) -> None:
    """In the forked child: becomes the command, and tells the caller its pid once its session,
    files and directory are set (as Popen returns once the exec succeeded); never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for thing in close:
            thing.close() if hasattr(thing, "close") else os.close(thing)
        if req["new_session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds):
            if fd > 2:
                os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for key, value in import_env.items():  # what the imports set, as the command's would
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        first = os.getcwd() if req["module"] else os.path.dirname(req["script"])
        extra = [os.path.abspath(p) for p in req["env"].get("PYTHONPATH", "").split(os.pathsep)
                 ] if req["env"].get("PYTHONPATH") else []
        sys.path[:] = [first, *extra, *base_path]
        sys.argv[:] = [req["argv0"], *req["args"]]
        sys.orig_argv = [sys.executable, *(["-m"] if req["module"] else []), req["argv0"],
                         *req["args"]]
        if "numpy" in sys.modules:  # a fresh process draws numpy's global seed from the OS
            sys.modules["numpy"].random.seed()
        conn.send(json.dumps({"pid": os.getpid()}).encode())
        conn.close()
        code = _run_command(req)
    finally:
        os._exit(code)


def _preload_quietly() -> bool:
    """Imports PRELOAD as the commands do (TensorFlow through `cli_help.quiet_tensorflow`, as
    every command that reads data imports it; not at all under XLM_JAX_DEBUG=1, whose commands
    print TF's import lines); False if anything was written to stdout or stderr meanwhile: a
    command forked from here would not show what its own imports print, so none is."""
    import importlib

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 1)
        os.dup2(captured.fileno(), 2)
        try:
            for name in PRELOAD:
                if name in ("tensorflow", "seqio") and os.environ.get("XLM_JAX_DEBUG"):
                    continue
                if name == "tensorflow":
                    importlib.import_module("xlm_jax.cli_help").quiet_tensorflow()
                else:
                    importlib.import_module(name)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        return captured.seek(0, os.SEEK_END) == 0


def _backend_started() -> bool:
    """Whether the imports started a jax backend: it would have read the server's XLA_FLAGS,
    and a command forked from here must read its own (`AFTER_FORK`)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(bridge, "_backends", None))


def _top_level_locations() -> dict[str, list[str]]:
    """{top-level module imported here: the real paths it was imported from}."""
    out: dict[str, list[str]] = {}
    for name, module in list(sys.modules.items()):
        if "." in name or module is None:
            continue
        where = list(getattr(module, "__path__", None) or [])
        if not where and getattr(module, "__file__", None):
            where = [module.__file__]
        out[name] = [os.path.realpath(w) for w in where]
    return out


def serve(path: str) -> None:
    """Imports PRELOAD, listens on `path`, forks a child per request until its parent exits."""
    before = dict(os.environ)
    base_path = list(sys.path[1:])
    sys.path[0] = os.path.dirname(path)  # not tests/testlib: nothing to import there
    if not _preload_quietly() or _backend_started():
        sys.exit(3)  # the client falls back to plain subprocesses for this environment
    import_env = {k: v for k, v in os.environ.items() if before.get(k) != v}
    import_env.update({k: None for k in before if k not in os.environ})
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".tmp")
    listener.listen(64)
    with open(path + ".modules", "w") as f:  # for the client's PYTHONPATH check
        json.dump(_top_level_locations(), f)
    os.rename(path + ".tmp", path)  # ready: a client connects only once the imports are done
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    children: dict[int, socket.socket] = {}

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = children.pop(pid, None)
            if conn is not None:
                try:
                    conn.send(json.dumps({"status": status}).encode())
                except OSError:
                    pass
                conn.close()

    try:
        while os.getppid() == parent:
            ready, _, _ = select.select([listener, wake_r], [], [], 1.0)
            if wake_r in ready:
                try:
                    while os.read(wake_r, 512):
                        pass
                except OSError:  # drained (non-blocking)
                    pass
            reap()
            if listener not in ready:
                continue
            conn, _ = listener.accept()
            try:
                msg, fds, _, _ = socket.recv_fds(conn, _MSG, 3)
                req = json.loads(msg)
            except (OSError, ValueError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                _child(req, fds, conn, [listener, wake_r, wake_w, *children.values()],
                       base_path, import_env)
            for fd in fds:
                os.close(fd)
            children[pid] = conn  # the child sends its pid once set up; this, its status
    finally:
        for conn in children.values():
            conn.close()
        listener.close()
        try:
            os.unlink(path)
        except OSError:
            pass


# ----------------------------------------------------------------------------- the client

class _Server:
    """One server process for one import-time environment."""

    def __init__(self, env: dict[str, str], directory: str, index: int):
        self.path = os.path.join(directory, f"s{index}")
        self.proc = subprocess.Popen(  # not eligible itself (`_request`)
            [sys.executable, os.path.abspath(__file__), self.path], env=env, cwd=directory,
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
                and script != os.path.realpath(__file__)):
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
        reply = conn.recv(_MSG)
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
        data = conn.recv(_MSG)
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


if __name__ == "__main__":
    serve(sys.argv[1])
