"""HF XLM-R import/export (`python -m xlm_jax.convert import-hf|export-hf`)."""
