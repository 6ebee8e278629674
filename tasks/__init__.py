"""seqio task registrations, one module per data family.

  xlm_jax_tasks.cc100     `register_cc100(data_dir, languages, spm_path, ...)` for CC-100
                          style monolingual text (and `register_tfds_text` for TFDS text
                          such as mC4)
  xlm_jax_tasks.parallel  `register_opus(data_dir, pairs, spm_path, ...)` for OPUS/Moses or
                          TSV parallel text
  xlm_jax_tasks.demo      registers the demo corpus of `tasks/demo_data` when imported

Beside them, `xlm_jax_tasks.build_demo_corpus` is the script that rebuilds `tasks/demo_data`
from the Django and Wagtail wheels (`python -m xlm_jax_tasks.build_demo_corpus --wheels
wheels/ --out tasks/demo_data`; see `tasks/demo_data/README.md`); it registers nothing.

The repository's `tasks/` folder, installed with xlm_jax as the package `xlm_jax_tasks` (also
by a non-editable `pip install .`, with its demo corpus; setup.py maps the folder to that
name, so that no other project's top-level `tasks` package collides with it): the
command-line tools import it by that name (`--module xlm_jax_tasks.demo`,
`task_modules = ['xlm_jax_tasks.demo']`) from any working directory. Registration functions are
plain python so that gin files can call them with `from __gin__ import dynamic_registration`.
"""
