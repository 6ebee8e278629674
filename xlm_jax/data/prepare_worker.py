"""The old name (before 0.3) of `xlm_jax.data.prepared.prepare_worker`.

An import of it reaches the new module, after one WARNING, until the release after 0.3
(`cli_help.MOVED`)."""
from xlm_jax import cli_help

__getattr__ = cli_help.moved_getattr("xlm_jax.data.prepare_worker")
