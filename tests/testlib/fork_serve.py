"""The fork server's own process (`tests/testlib/fork_server.py` starts it as a script and
sends it commands): imports, once, what a command's start-up imports (`PRELOAD`), then forks a
child per command, which becomes that command as `python -m` / `python SCRIPT` would make it.

The standard library only at import: this file runs as a script, with nothing of the test
package on its path, and must not import anything a command would import on its own before the
fork (the module docstring of `fork_server` says what is shared and what is not).
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import sys
import tempfile
import threading

# What most of a command's start-up imports: xlm_jax's root first (its
# `_cpu_without_accelerators` runs before jax is imported, as in every command), then
# TensorFlow, as a command that reads data imports it first (`cli_help.quiet_tensorflow`).
PRELOAD = ("xlm_jax", "tensorflow", "seqio", "numpy", "jax", "jax.numpy", "flax.linen", "optax",
           "orbax.checkpoint", "sentencepiece", "gin")
MESSAGE_BYTES = 1 << 20  # the largest request or reply read from the socket


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
                msg, fds, _, _ = socket.recv_fds(conn, MESSAGE_BYTES, 3)
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


if __name__ == "__main__":
    serve(sys.argv[1])
