"""`python -m xlm_jax.train` — see `xlm_jax.train.train`."""
import sys

from xlm_jax.train.train import main

sys.exit(main())
