"""Moved: `python -m xlm_jax.accelerator.compile` (see `xlm_jax/compile/__init__.py`)."""
from xlm_jax import cli_help

if __name__ == "__main__":
    cli_help.run_moved("xlm_jax.compile")
