"""`python -m xlm_jax.accelerator.lower` for several argument lists in one fresh process.

    python tests/testlib/lower_many.py '[["--gin_file=runs/x.gin", "--platform", "cuda"], ...]'

prints one JSON list with, per argument list, `returncode`, `stdout` and `stderr` of
`xlm_jax.accelerator.lower.main(argv)`. Each call starts from an empty gin configuration, and every
call must ask for the same number of devices (the first call sets them up, as the CLI does). The
lowering tests use it so that a dozen lowerings pay for one interpreter, one jax start-up and one
import of the library instead of a dozen (about 2 s of CPU each on 2 cores).
"""
from __future__ import annotations

import contextlib
import io
import json
import sys


def run(argv_lists: list[list[str]]) -> list[dict]:
    """The CLI's exit status and what it printed, per argument list."""
    import gin

    from xlm_jax.accelerator import lower

    results = []
    for argv in argv_lists:
        gin.clear_config()
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = lower.main(list(argv))
        results.append({"argv": argv, "returncode": rc, "stdout": out.getvalue(),
                        "stderr": err.getvalue()})
    return results


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))))
