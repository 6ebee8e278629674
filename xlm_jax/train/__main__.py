"""`python -m xlm_jax.train` — see `xlm_jax.train.cli`."""
import sys

from xlm_jax.train.cli import main

sys.exit(main())
