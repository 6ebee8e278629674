"""The trainer's console at the start of a run and during it: the loss's composition in the
names of the reported metrics (`step.loss_composition`), and the progress line of every demo
run file within `writers.MAX_LINE` characters with each of its objectives' losses shown."""
import glob
import io
import os

import gin
import pytest

from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import WeightedObjective
from xlm_jax.objectives.mlm import MaskedLM
from xlm_jax.objectives.xlme import ReplacedTokenDetection as XLME
from xlm_jax.train import gin_utils, step, writers

# gin to each test itself: its registry, bindings and operative config put back after it
# (tests/testlib/gin_state.py; issue 56).
pytestmark = pytest.mark.usefixtures("gin_isolated")

DEMOS = sorted(glob.glob(os.path.join(gin_utils.PACKAGE_ROOT, "gin_configs", "demo", "*.gin")))


def _net():
    return Transformer(get_config("tiny", vocab_size=64, num_layers=1, hidden_size=32,
                                  num_heads=2, mlp_dim=64, max_positions=40))


def test_loss_composition_names_the_reported_metrics():
    net = _net()
    mlm = [WeightedObjective(MaskedLM(net, name="mmlm")),
           WeightedObjective(MaskedLM(net, name="tlm", kind="pair"), 0.5)]
    assert step.loss_composition(mlm, "per_objective") == "mmlm/loss + 0.5 x tlm/loss"
    xlme = [WeightedObjective(XLME(net, name="mrtd", generator_layers=1)), WeightedObjective(XLME(net, name="trtd", generator_layers=1,
                                                                            kind="pair"))]
    assert step.loss_composition(xlme, "per_objective") == (
        "mrtd/mlm_loss + 50 x mrtd/rtd_loss + trtd/mlm_loss + 50 x trtd/rtd_loss")
    assert step.loss_composition(mlm[:1] + xlme[:1], "pooled") == (
        "share(mmlm) x mmlm/loss + share(mrtd) x (mrtd/mlm_loss + 50 x mrtd/rtd_loss); "
        "share(o) = o's units / all objectives' units (pooled)")


@pytest.mark.parametrize("path", DEMOS, ids=os.path.basename)
def test_every_demo_progress_line_fits_and_shows_each_objective(path):
    """Each demo run file's objectives (as gin parses it) with wide values at its last step:
    the line is at most MAX_LINE characters and no objective is left out."""
    gin.clear_config()
    gin_utils.parse([path], list(gin_utils.SYNTHETIC_RUN_MACROS))
    names = list(gin.query_parameter("loop.train.objectives"))
    steps = gin.query_parameter("%TRAIN_STEPS")  # the widest step count a demo could show
    gin.clear_config()
    assert names and steps >= 1
    scalars = {"loss": -123.4567, "grad_norm": 1.0, "learning_rate": 1e-4,
               "tokens_per_sec": 123456.7} | {f"{n}/loss": 1234.567 for n in names}
    scalars |= {f"{n}/accuracy": 0.5 for n in names}
    now = [0.0]
    out = io.StringIO()
    p = writers.Progress(steps, out=out, log_every=1, clock=lambda: now[0])
    p.note_step(1)
    now[0] = 10.0 * (steps - 2)  # 0.1 step/s
    p.update(steps - 1, scalars)
    line = out.getvalue().rstrip("\n")
    assert len(line) <= writers.MAX_LINE, (len(line), line)
    assert all(f" {n}=1235 " in line for n in names) and "+" not in line, line
    assert line.endswith(" 0.10 step/s eta 0:00:10") and "123k tok/s" in line, line
