"""The old name (before 0.2) of `python -m xlm_jax.accelerator.compile.run_table`.

It runs the new command, after one WARNING, until the release after 0.2 (`cli_help.MOVED`)."""
from xlm_jax import cli_help

__getattr__ = cli_help.moved_getattr("xlm_jax.compile.run_table")

if __name__ == "__main__":
    cli_help.run_moved("xlm_jax.compile.run_table")
