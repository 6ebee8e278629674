"""HF import/export (`python -m xlm_jax.convert import-hf|export-hf`): XLM-R-shaped models as
XLM-R (`hf`), every other model as a self-contained remote-code model (`remote`)."""
