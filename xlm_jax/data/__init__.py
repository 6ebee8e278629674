import os

# TensorFlow's oneDNN graph rewrite runs on every function instantiation (an op-registry
# lookup per node): ~17% of the CPU time a 77-task seqio mixture spent starting up, while the
# input pipeline has no op it would rewrite. TF reads the variable once, when it is imported,
# so it is set here, before any xlm_jax.data module imports TF (this file imports nothing
# heavy). Process-wide, like all TF settings; an explicit value in the environment is kept.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
