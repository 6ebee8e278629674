"""The old name (before 0.3) of `xlm_jax.data.prepared.verify`.

It runs the new command (an import reaches the new module), after one WARNING, until the
release after 0.3 (`cli_help.MOVED`)."""
from xlm_jax import cli_help

__getattr__ = cli_help.moved_getattr("xlm_jax.data.verify")

if __name__ == "__main__":
    cli_help.run_moved("xlm_jax.data.verify")
