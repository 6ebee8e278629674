"""seqio task registrations, one module per data family.

  tasks.cc100     `register_cc100(data_dir, languages, spm_path, ...)` for CC-100 style
                  monolingual text (and `register_tfds_text` for TFDS text such as mC4)
  tasks.parallel  `register_opus(data_dir, pairs, spm_path, ...)` for OPUS/Moses or TSV
                  parallel text
  tasks.demo      registers the demo corpus of `tasks/demo_data` when imported

Beside them, `tasks.build_demo_corpus` is the script that rebuilds `tasks/demo_data` from the
Django and Wagtail wheels (`python -m tasks.build_demo_corpus --wheels wheels/ --out
tasks/demo_data`; see `tasks/demo_data/README.md`); it registers nothing.

A package at the repository root, installed with xlm_jax (also by a non-editable `pip install
.`, with its demo corpus): the command-line tools import it by name (`--module tasks.demo`,
`task_modules = ['tasks.demo']`) from any working directory. Registration functions are
plain python so that gin files can call them with `from __gin__ import dynamic_registration`.
"""
