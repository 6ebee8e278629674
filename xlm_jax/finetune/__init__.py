"""Fine-tuning and cross-lingual evaluation on XTREME-style tasks (`python -m xlm_jax.finetune`);
see `xlm_jax.finetune.run`."""
