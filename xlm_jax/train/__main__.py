"""`python -m xlm_jax.train` — see `xlm_jax.train.cli`."""
import sys

from xlm_jax.cli_help import exit_with
from xlm_jax.train.cli import main

exit_with(main)
