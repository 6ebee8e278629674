"""Which objectives run at which step, and with which batch shape.

By default every objective of the mixture draws one batch of `loop.train.batch_size` rows of
`loop.train.seq_len` tokens at every step, and the step's gradient is the weighted sum of
their losses. Some recipes train otherwise:

- VECO alternates monolingual and bilingual batches (one phase per update) and gives the two
  streams different shapes (its Table 5: 1024 x 512 monolingual, 4096 x 128 bilingual).
- Any recipe may want a cheap objective at a larger batch or a short-row objective at a
  shorter length than the rest.

`ObjectiveSpec.every` / `offset` say that an objective runs on the 0-based steps `s` with
`s % every == offset` (every=2, offset=0 and every=2, offset=1 alternate); its
`batch_size` / `seq_len` override the run's. An objective's input stream advances only on the
steps it runs, so its data position after `n` steps is `runs_before(n)`: a resumed run
rebuilds each stream at its own position and sees exactly the batches of the uninterrupted
one. Each phase (each set of running objectives) compiles once: the train step is traced per
set of batch keys and shapes.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Shape:
    """One objective's place in the mixture: rows and length of its batches, and its steps."""

    batch_size: int
    seq_len: int
    every: int = 1
    offset: int = 0

    def runs_at(self, step: int) -> bool:
        """Whether the objective runs at 0-based step `step`."""
        return step % self.every == self.offset

    def runs_before(self, step: int) -> int:
        """How many of the steps 0..step-1 the objective runs at: its stream's position when
        the run (re)starts at `step`."""
        return max(0, -(-(step - self.offset) // self.every))


def resolve(specs: Mapping[str, Any], batch_size: int, seq_len: int) -> dict[str, Shape]:
    """`{name: Shape}` from the `loop.ObjectiveSpec`s' `batch_size`, `seq_len`, `every`, `offset`
    (None: the run's `batch_size` / `seq_len`). Raises ValueError, naming the objective and
    the setting, for a non-positive size or period, an offset outside [0, every), or a step
    at which no objective runs (every residue of the common period is checked)."""
    shapes: dict[str, Shape] = {}
    for name, spec in specs.items():
        rows = batch_size if spec.batch_size is None else spec.batch_size
        length = seq_len if spec.seq_len is None else spec.seq_len
        every, offset = spec.every, spec.offset
        for key, value in (("batch_size", rows), ("seq_len", length), ("every", every)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"objective '{name}': {key}={value!r} must be a positive "
                                 "integer")
        if not isinstance(offset, int) or not 0 <= offset < every:
            raise ValueError(f"objective '{name}': offset={offset!r} must be in [0, every="
                             f"{every})")
        shapes[name] = Shape(rows, length, every, offset)
    period = cycle_length(shapes)
    for step in range(period):
        if not any(s.runs_at(step) for s in shapes.values()):
            sched = ", ".join(f"{n} (every={s.every}, offset={s.offset})"
                              for n, s in shapes.items())
            raise ValueError(f"no objective runs at steps {step} (mod {period}) of the "
                             f"mixture: {sched}; give every step at least one objective")
    return shapes


def cycle_length(shapes: Mapping[str, Shape]) -> int:
    """The period after which the mixture's pattern of running objectives repeats."""
    return math.lcm(*(s.every for s in shapes.values())) if shapes else 1


def running(shapes: Mapping[str, Shape], step: int) -> list[str]:
    """The names of the objectives that run at 0-based step `step`, in mixture order."""
    return [name for name, s in shapes.items() if s.runs_at(step)]


def describe(shapes: Mapping[str, Shape]) -> str:
    """A one-line summary for the run log, e.g. 'veco_mono 1024x512 steps 0 mod 2; ...'."""
    parts = []
    for name, s in shapes.items():
        when = "every step" if s.every == 1 else f"steps {s.offset} mod {s.every}"
        parts.append(f"{name} {s.batch_size}x{s.seq_len} {when}")
    return "; ".join(parts)



def is_default(shapes: Mapping[str, Shape], batch_size: int, seq_len: int) -> bool:
    """True when every objective runs every step at the run's batch shape."""
    return all(s == Shape(batch_size, seq_len) for s in shapes.values())
