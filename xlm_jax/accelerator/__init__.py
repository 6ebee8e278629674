"""The accelerator tools: what a run file costs on its target, from the machine at hand.

One build path (`pod_memory.build`: the trainer's mesh, objectives, sharding rules, optimiser,
abstract state and jitted step, as `loop.train` builds them) under five commands:

  python -m xlm_jax.accelerator.smoke       first contact with a host: a training step per
                                            attention backend, compared
  python -m xlm_jax.accelerator.bench       throughput (step time, tokens/s, MFU) of a run file
  python -m xlm_jax.accelerator.pod_memory  per-device memory and collectives on a simulated pod
  python -m xlm_jax.accelerator.lower       the sharded step lowered for CUDA and TPU from a CPU
  python -m xlm_jax.accelerator.compile     compiled for a TPU slice or a GPU node from a CPU,
                                            memory against the chip's (`.run_table`: every
                                            run file on its target)
"""
