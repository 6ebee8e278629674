"""What a process sees of its start, for tests/fork_server_test.py: prints it as one JSON line.

  python tests/testlib/fork_probe.py [--exit N] [--sleep S] [--raise] [--devices] [ARGS...]

`--devices` adds jax's device count (its backend starts with the XLA_FLAGS the process has) and
the parent's pid.

Reads stdin when it is not a terminal, writes a line to stderr, leaves a non-daemon thread and
an atexit handler that print after main returns (a process joins the one and runs the other
before it exits).
"""
import atexit
import json
import os
import sys
import threading
import time


def main() -> int:
    args = sys.argv[1:]
    code = int(args[args.index("--exit") + 1]) if "--exit" in args else 0
    if "--sleep" in args:
        time.sleep(float(args[args.index("--sleep") + 1]))
    data = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    more = {}
    if "--devices" in args:
        import jax
        more = {"devices": jax.device_count(), "ppid": os.getppid()}
    print(json.dumps({**more, "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
                      "path1": sys.path[1],
                      "name": __name__, "env": os.environ.get("FORK_PROBE"),
                      "stdin": data, "sid": os.getsid(0) == os.getpid(),
                      "main_keys": sorted(k for k in globals() if not k.startswith("__"))}))
    print("to stderr", file=sys.stderr)
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread done", flush=True))).start()
    atexit.register(lambda: print("atexit ran", flush=True))
    if "--raise" in args:
        raise ValueError("raised by the probe")
    return code


if __name__ == "__main__":
    sys.exit(main())
