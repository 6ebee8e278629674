"""seqio task registrations, one module per data family.

  tasks.cc100     `register_cc100(data_dir, languages, spm_path, ...)` for CC-100 style
                  monolingual text (and `register_tfds_text` for TFDS text such as mC4)
  tasks.parallel  `register_opus(data_dir, pairs, spm_path, ...)` for OPUS/Moses or TSV
                  parallel text
  tasks.demo      registers the demo corpus of `tasks/demo_data` when imported

A plain package at the repository root (not installed): the command-line tools import it by
name (`--module tasks.demo`) when run from the repository root. Registration functions are
plain python so that gin files can call them with `from __gin__ import dynamic_registration`.
"""
