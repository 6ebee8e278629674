"""Periodic downstream eval in the training loop: Tatoeba retrieval on the current parameters.

What: `loop.train(retrieval=RetrievalEvalConfig(tatoeba_dir=..., every=N))` scores Tatoeba
retrieval (`xlm_jax.evaluation.retrieval.evaluate`, the code the demo and the retrieval CLI
run) every N steps and writes the scalars with the run's metrics writer under `eval/`
(metrics.jsonl and TensorBoard):

  retrieval/acc1            mean acc@1 (%) over languages and both directions, at the layer
                            asked for (several layers: the best of them, as the CLI reports)
  retrieval/layer           that layer (several layers only)
  retrieval/acc1_layer{k}   each layer's mean acc@1 (%) (several layers only)
  retrieval/seconds         the eval's wall time (gather + embed + rank)

These are also the metrics that `CheckpointConfig.keep_best` ranks checkpoints by. Rule: the
metric of a checkpoint must be the one computed at its own step, so with keep_best > 0 the
retrieval eval also runs at every save step (periodic and final; not at a preemption save,
which has no time to spare and is then kept only as one of the newest `keep`).

Why this way: the eval needs whole parameters on one device, so the encoder's parameters are
gathered first: on one process a device-to-device copy onto the first local device; on
several, `multihost_utils.process_allgather`, which every process takes part in, and then
every process embeds and ranks (the same numbers everywhere, so every process hands the same
metrics to the checkpoint manager; only process 0's writer writes). The copy runs under a
one-device mesh, so the model's activation constraints do not span the training mesh.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Sequence
from typing import Any

import jax
from jax.experimental import multihost_utils

from xlm_jax import model_dir as md
from xlm_jax.evaluation import retrieval
from xlm_jax.models.config import ModelConfig
from xlm_jax.train import checkpoints as ckpt_lib
from xlm_jax.train import partitioning

PREFIX = "retrieval"
ACC1 = f"{PREFIX}/acc1"


@dataclasses.dataclass(frozen=True)
class RetrievalEvalConfig:
    """Tatoeba retrieval during training (`loop.train.retrieval`); validated on creation."""

    # Directory of the Tatoeba files tatoeba.{xx}-eng.{xx} + tatoeba.{xx}-eng.eng.
    tatoeba_dir: str = ""
    # Run when step % every == 0 (and at save steps too with CheckpointConfig.keep_best > 0).
    every: int = 1000
    # A layer (0 = embeddings, num_layers = last), a list of layers, or "all"; several
    # layers are embedded in one forward pass and retrieval/acc1 is the best of them.
    layers: int | str | Sequence[int] = "all"
    pool: str = "mean"  # "mean" over real tokens or "cls"
    languages: Sequence[str] | None = None  # None: every language in tatoeba_dir
    max_sentences: int | None = None  # the first N lines of each language (None: all)
    max_length: int | None = None  # tokens per sentence (None: the Encoder's default, 128)
    batch_size: int = 64

    def __post_init__(self) -> None:
        if not self.tatoeba_dir:
            raise ValueError("RetrievalEvalConfig.tatoeba_dir is not set: a directory with "
                             f"{retrieval.FILE_PATTERN}")
        for name in ("every", "batch_size", "max_sentences", "max_length"):
            value = getattr(self, name)
            if value is None and name in ("max_sentences", "max_length"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"RetrievalEvalConfig.{name}={value!r} is invalid: must be an "
                                 "integer >= 1")
        if self.pool not in retrieval.POOLS:
            raise ValueError(f"RetrievalEvalConfig.pool={self.pool!r} is invalid: must be one "
                             f"of {', '.join(retrieval.POOLS)}")

    def layer_list(self, num_layers: int) -> list[int]:
        """The layers scored, checked against the model (a one-line error when out of range)."""
        try:
            if isinstance(self.layers, (int, str)):
                return retrieval.check_layer(self.layers, num_layers)
            return sorted({l for x in self.layers for l in retrieval.check_layer(x, num_layers)})
        except ValueError as e:
            raise ValueError(f"RetrievalEvalConfig.layers: {e}") from None

    def metric_names(self, num_layers: int) -> list[str]:
        """The scalar names one eval writes (without the `eval/` split)."""
        layers = self.layer_list(num_layers)
        several = [f"{PREFIX}/layer"] + [f"{PREFIX}/acc1_layer{k}" for k in layers]
        return [ACC1, *(several if len(layers) > 1 else []), f"{PREFIX}/seconds"]


def check_keep_best(checkpoint: ckpt_lib.CheckpointConfig, cfg: RetrievalEvalConfig | None,
                    model: ModelConfig) -> None:
    """One-line ValueError, before anything is compiled, when keep-best cannot work: no
    retrieval eval to rank by, or a `best_metric` that the eval does not write."""
    if not checkpoint.keep_best:
        return
    if cfg is None:
        raise ValueError(f"CheckpointConfig.keep_best={checkpoint.keep_best} ranks checkpoints "
                         f"by the eval metric {checkpoint.best_metric!r}, but loop.train."
                         "retrieval is not set (set it to a RetrievalEvalConfig)")
    names = [n for n in cfg.metric_names(model.num_layers) if n != f"{PREFIX}/seconds"]
    if checkpoint.best_metric not in names:
        raise ValueError(f"CheckpointConfig.best_metric={checkpoint.best_metric!r} is not a "
                         f"metric of the retrieval eval (it writes {', '.join(names)})")


class PeriodicRetrieval:
    """The retrieval eval of one run: checks its inputs at creation (before training), then
    `due(step, saving)` / `run(step, params, writer)` from the loop; `close()` at the end."""

    def __init__(self, cfg: RetrievalEvalConfig, model: ModelConfig, model_dir: str,
                 spm_model: str | None, languages: Sequence[str] | None,
                 rules: partitioning.Rules, at_saves: bool = False):
        self.cfg = cfg
        self.at_saves = at_saves
        self._layers = cfg.layer_list(model.num_layers)
        where = f"loop.train.retrieval.tatoeba_dir={cfg.tatoeba_dir!r}"
        try:
            found = retrieval.find_languages(cfg.tatoeba_dir)
            langs = list(cfg.languages or found)
            unknown = [l for l in langs if l not in found]
            if unknown:
                raise FileNotFoundError(f"no files for language(s) {', '.join(unknown)} "
                                        f"(found: {', '.join(found)})")
            pairs = [retrieval.read_pair(cfg.tatoeba_dir, l) for l in langs]
        except (FileNotFoundError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
        spm = spm_model or md.find_spm(model_dir)
        if not spm:
            raise ValueError(f"{where}: the eval needs a SentencePiece model to tokenise the "
                             "sentences; set loop.train.spm_model")
        # A local directory of this process's own: the SentencePiece model the Encoder reads
        # (found by name; every process has it, whatever the model_dir's filesystem), and
        # the first max_sentences lines of each language when the eval is cut short.
        self._dir = tempfile.mkdtemp(prefix="xlm_jax_retrieval_")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, True)  # also on errors
        md.copy_spm(spm, self._dir)
        self._tatoeba_dir = cfg.tatoeba_dir
        if cfg.max_sentences:
            for p in pairs:
                for path, lines in ((p.src_path, p.src), (p.eng_path, p.eng)):
                    with open(os.path.join(self._dir, os.path.basename(path)), "w",
                              encoding="utf-8") as f:
                        f.write("".join(f"{s}\n" for s in lines[:cfg.max_sentences]))
            self._tatoeba_dir = self._dir
        self._languages = langs
        self._model = model
        self._language_list = list(languages) if languages else None
        self._encoder: Any = None  # built at the first run; kept, so its jit cache is reused
        self._mesh = partitioning.make_mesh(None, jax.local_devices()[:1])
        self._rules = rules

    def due(self, step: int, saving: bool) -> bool:
        """Whether the eval runs after `step`: every `every` steps, and at saves when the
        checkpoints are ranked by it (`at_saves`)."""
        return step % self.cfg.every == 0 or (self.at_saves and saving)

    def run(self, step: int, params: Any, writer: Any) -> dict[str, float]:
        """Scores the encoder of `params` (the train state's params, any sharding; every
        process must call this), writes the scalars at `step` and returns them."""
        from xlm_jax.encoder import Encoder

        t0 = time.perf_counter()
        local = _on_one_device(params["encoder"], self._mesh.devices.flat[0])
        if self._encoder is None:
            self._encoder = Encoder(config=self._model, params=local, path=self._dir,
                                    language_list=self._language_list)
        self._encoder.params = local
        try:
            with partitioning.activate(self._mesh, self._rules):
                result = retrieval.evaluate(
                    self._encoder, self._tatoeba_dir, self._layers, self._languages,
                    pool=self.cfg.pool, max_length=self.cfg.max_length,
                    batch_size=self.cfg.batch_size, step=step)
        finally:
            self._encoder.params = None  # the state's buffers are donated to the next step
        scalars = {ACC1: 100.0 * result.average}
        if len(self._layers) > 1:
            scalars[f"{PREFIX}/layer"] = float(result.reported_layer)
            scalars.update({f"{PREFIX}/acc1_layer{k}": 100.0 * v
                            for k, v in result.per_layer.items()})
        scalars[f"{PREFIX}/seconds"] = time.perf_counter() - t0
        writer.write_scalars(step, scalars, prefix="eval")
        return scalars

    def close(self) -> None:
        """Removes the eval's local directory (also done when the object is collected)."""
        self._cleanup()


def _on_one_device(tree: Any, device: jax.Device) -> Any:
    """`tree`'s arrays whole on `device`: an array spread over other processes' devices is
    first gathered (a collective: every process must call this at the same point)."""
    def one(x: Any) -> Any:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            x = multihost_utils.process_allgather(x)
        return jax.device_put(x, device)

    return jax.tree_util.tree_map(one, tree)
