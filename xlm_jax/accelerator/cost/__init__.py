"""A cost model the CPU can run: the compiled step's ops, their FLOPs and bytes, and a
calibrated roofline time on a target chip (`python -m xlm_jax.accelerator.cost`)."""
from xlm_jax.accelerator.cost.chips import CHIPS, Chip, Efficiency, chip_for
from xlm_jax.accelerator.cost.model import KINDS, CostReport, OpCost, analyze, classify

__all__ = ["CHIPS", "Chip", "CostReport", "Efficiency", "KINDS", "OpCost", "analyze",
           "chip_for", "classify"]
