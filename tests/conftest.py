"""Test-wide setup: 8 fake CPU devices and the CPU platform, set before jax is imported.

The sharding tests need 8 host devices (mesh data=2, fsdp=2, tensor=2); single-device
computations simply run on device 0, so every test can share this setting.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
