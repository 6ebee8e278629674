"""The league's runner: its settings record, the base (trained once, or the shipped one), every
cell trained from it for the same training FLOPs, each scored, and the tables rewritten after
each cell. `python -m xlm_jax.league` (`__main__.py`) is its command line; `plan` sizes the
cells, `score` scores a model, `results` writes the tables and tests the claims."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from xlm_jax.league import plan
from xlm_jax.league import score as score_lib
from xlm_jax.league.score import read_json, write_json_atomic

# Defaults of the 2-CPU-core league (docs/league.md says how they were measured).
DEFAULT_BASE_STEPS = 3000
DEFAULT_BUDGET_TFLOP = 6.0
DEFAULT_SEEDS = 3
SETTINGS_FILE = "league_settings.json"
# A child process gets SIGKILL when the league dies (Linux prctl PR_SET_PDEATHSIG), so a killed
# league leaves no trainer writing into a cell that the next command resumes.
_CHILD = ("import ctypes, os, runpy, sys\n"
          "try:\n    ctypes.CDLL(None).prctl(1, 9)\nexcept Exception:\n    pass\n"
          "if os.getppid() != int(sys.argv[1]):\n    sys.exit('parent exited')\n"
          "sys.argv = sys.argv[2:]\nrunpy.run_module(sys.argv[0], run_name='__main__')\n")


def child_command(module: str, args: Sequence[str]) -> list[str]:
    """`python -m MODULE ARGS` as a child that dies with this process."""
    return [sys.executable, "-c", _CHILD, str(os.getpid()), module, *args]


# ----------------------------------------------------------------------------- settings

@dataclasses.dataclass(frozen=True)
class BaseSettings:
    """What the base is: its gin files and bindings, its steps, its configuration's digest."""

    gin_files: tuple[str, ...]
    bindings: tuple[str, ...]
    steps: int
    config_digest: str

    def to_json(self) -> dict[str, Any]:
        return {"gin_files": list(self.gin_files), "bindings": list(self.bindings),
                "steps": self.steps, "config_digest": self.config_digest}


@dataclasses.dataclass(frozen=True)
class LeagueSettings:
    """The record in `--out/league_settings.json`: base, budget, recipes (with their
    configuration digests) and seeds. A league's cells are only comparable under equal
    settings, so another base, budget or recipe set in the same --out is refused."""

    base: BaseSettings
    budget_tflop: float
    recipes: tuple[str, ...]
    recipe_digests: dict[str, str]
    seeds: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"base": self.base.to_json(), "budget_tflop": self.budget_tflop,
                "recipes": list(self.recipes), "recipe_digests": dict(self.recipe_digests),
                "seeds": list(self.seeds)}

    def conflict_with(self, old: dict[str, Any], out: str) -> str | None:
        """One line naming the flag and the value that differ from `old` (a record), or None.
        Seeds may differ: more seeds extend a league, fewer report a subset."""
        def line(flag: str, value: Any, was: Any) -> str:
            return (f"{flag}={value} conflicts with the league in {out} ({flag}={was} there); "
                    "use another --out, or that league's settings")

        ob = old.get("base", {})
        if ob.get("steps") != self.base.steps:
            return line("--base_steps", self.base.steps, ob.get("steps"))
        if ob.get("config_digest") != self.base.config_digest:
            ours = [*self.base.gin_files, *self.base.bindings]
            theirs = [*ob.get("gin_files", []), *ob.get("bindings", [])]
            mine = [b for b in ours if b not in theirs]
            other = [b for b in theirs if b not in ours]
            return line("--gin_file/--gin (the base's configuration)",
                        "; ".join(mine) or f"sha256 {self.base.config_digest[:12]}",
                        "; ".join(other) or f"sha256 {str(ob.get('config_digest'))[:12]}")
        if float(old.get("budget_tflop", -1)) != self.budget_tflop:
            return line("--budget_tflop", _num(self.budget_tflop), _num(old.get("budget_tflop")))
        if list(old.get("recipes", [])) != list(self.recipes):
            return line("--recipes", ",".join(self.recipes), ",".join(old.get("recipes", [])))
        for r in self.recipes:
            if old.get("recipe_digests", {}).get(r) != self.recipe_digests[r]:
                return line(f"--gin_file/--gin (recipe {r}'s configuration)",
                            self.recipe_digests[r][:12],
                            str(old.get("recipe_digests", {}).get(r))[:12])
        return None


def _num(x: Any) -> str:
    return f"{x:g}" if isinstance(x, (int, float)) else str(x)


@dataclasses.dataclass(frozen=True)
class Cell:
    """One recipe x seed: its trainer model directory and its planned training."""

    recipe: str
    seed: int
    dir: str
    steps: int
    cost: plan.RecipeCost

    @property
    def model_dir(self) -> str:
        return os.path.join(self.dir, "model")

    @property
    def train_tflop(self) -> float:
        return self.cost.train_flops(self.steps) / 1e12


@dataclasses.dataclass(frozen=True)
class CellScore:
    """A finished cell's numbers (what league.json lists per seed). Accuracies in %."""

    recipe: str
    seed: int
    model_dir: str
    steps: int
    tokens_per_step: float
    flops_per_token: float
    train_tflop: float
    retrieval_acc1: float
    retrieval_layer: int
    retrieval_per_layer: dict[str, float]
    transfer_avg: float | None
    transfer_en: float | None
    transfer_gap: float | None
    train_seconds: float
    score_seconds: float

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CellScore":
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything the league will do, decided before anything is trained."""

    config: plan.LeagueConfig
    settings: LeagueSettings
    base_cost: plan.RecipeCost
    cells: tuple[Cell, ...]
    out: str


# ----------------------------------------------------------------------------- planning

def parse_recipes(text: str) -> tuple[str, ...]:
    """The comma-separated recipe names, each checked (ValueError naming --recipes)."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise ValueError(f"--recipes={text!r}: no recipe named (recipes: "
                         f"{', '.join(plan.RECIPES)})")
    for name in names:
        if name not in plan.RECIPES:
            raise ValueError(f"--recipes={text}: unknown recipe {name!r} (recipes: "
                             f"{', '.join(plan.RECIPES)})")
    return names


def base_settings(config: plan.LeagueConfig, steps: int) -> tuple[BaseSettings,
                                                                   plan.RecipeCost]:
    """The base's settings and cost (its gin parsed, nothing built)."""
    bindings = config.base_bindings_all()
    cost = plan.recipe_cost(config.base_gin, [*bindings, f"TRAIN_STEPS = {steps}"])
    return BaseSettings(tuple(config.base_gin), tuple(bindings), steps,
                        cost.config_digest), cost


def make_plan(config: plan.LeagueConfig, recipes: Sequence[str], seeds: int,
              base_steps: int, budget_tflop: float, out: str) -> Plan:
    """Checks the flags, costs every recipe and sizes its cells for the budget. One-line
    ValueErrors name the flag and value: --seeds, --base_steps, --budget_tflop below one step
    (one mixture cycle) of a recipe."""
    if seeds < 1:
        raise ValueError(f"--seeds={seeds}: must be >= 1")
    if base_steps < 1:
        raise ValueError(f"--base_steps={base_steps}: must be >= 1")
    if not budget_tflop > 0:
        raise ValueError(f"--budget_tflop={_num(budget_tflop)}: must be > 0")
    base, base_cost = base_settings(config, base_steps)
    costs, steps = {}, {}
    for r in recipes:
        # TRAIN_STEPS does not change the cost; a fixed value keeps the digest step-free
        costs[r] = plan.recipe_cost(config.recipe_gin(r), [*config.bindings_for(r),
                                                           "TRAIN_STEPS = 1"])
        steps[r] = costs[r].steps_for(budget_tflop * 1e12)
        if steps[r] == 0:
            unit = (f"one step ({costs[r].flops_per_step / 1e12:.4g} TFLOP)" if
                    costs[r].cycle == 1 else f"one cycle of its {costs[r].cycle}-step mixture "
                    f"({costs[r].cycle * costs[r].flops_per_step / 1e12:.4g} TFLOP)")
            raise ValueError(f"--budget_tflop={_num(budget_tflop)} is smaller than {unit} of "
                             f"recipe {r}")
    settings = LeagueSettings(base, float(budget_tflop), tuple(recipes),
                              {r: costs[r].config_digest for r in recipes},
                              tuple(range(seeds)))
    cells = tuple(Cell(r, s, os.path.join(out, "cells", r, f"seed_{s}"), steps[r], costs[r])
                  for s in range(seeds) for r in recipes)  # seed-major: early full rows
    return Plan(config, settings, base_cost, cells, out)


def claim_out(p: Plan) -> None:
    """Writes the settings record into a new --out, or checks an existing one (a conflict is
    a ValueError naming the flag and value; nothing in --out is written then)."""
    path = os.path.join(p.out, SETTINGS_FILE)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        clash = p.settings.conflict_with(old, p.out)
        if clash:
            raise ValueError(clash)
        if old.get("seeds") == list(p.settings.seeds):
            return
    os.makedirs(p.out, exist_ok=True)
    write_json_atomic(path, p.settings.to_json())


# ----------------------------------------------------------------------------- training

def trained_to(model_dir: str, steps: int) -> bool:
    """Whether the trainer directory holds a finished checkpoint at `steps`."""
    from xlm_jax import model_dir as md

    return os.path.isdir(model_dir) and steps in md.checkpoint_steps(model_dir)


def train(model_dir: str, gin_files: Sequence[str], bindings: Sequence[str], log_path: str,
          what: str, echo: Any = None, label: str = "",
          started: Callable[[Any], None] | None = None) -> float:
    """`python -m xlm_jax.train` into `model_dir` (resuming whatever is there) as a child
    process, output appended to `log_path` (and its progress and phase lines to `echo`, as
    `  LABEL: LINE`, see `score.run_logged`, which gives `started` the child's Popen);
    returns the wall-clock seconds."""
    args = [f"--model_dir={model_dir}", *[f"--gin_file={f}" for f in gin_files],
            *[f"--gin_bindings={b}" for b in bindings]]
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    t0 = time.time()
    with open(log_path, "a", encoding="utf-8") as log:
        score_lib.run_logged(child_command("xlm_jax.train", args), log, what, echo, label,
                             started)
    return time.time() - t0


def ensure_base(base_dir: str, config: plan.LeagueConfig, settings: BaseSettings,
                out: Any = sys.stdout) -> str:
    """The base's trainer model directory, trained to `settings.steps` (once: a finished base
    is reused, a partial one resumed); `base_dir/base_settings.json` records what it is, and a
    base of other settings there is a ValueError."""
    model_dir = os.path.join(base_dir, "model")
    record = os.path.join(base_dir, "base_settings.json")
    old = read_json(record)
    if old is not None and old != settings.to_json():
        raise ValueError(f"{base_dir} holds a base of other settings ({old.get('steps')} steps, "
                         f"gin {' '.join(old.get('gin_files', []))}); use another directory")
    if old is None:
        os.makedirs(base_dir, exist_ok=True)
        write_json_atomic(record, settings.to_json())
    timing = os.path.join(base_dir, "train_time.json")
    if not trained_to(model_dir, settings.steps):
        print(f"base: training MMLM for {settings.steps} steps in {model_dir} (log: "
              f"{base_dir}/train.log)", file=out, flush=True)
        seconds = train(model_dir, config.base_gin,
                        [*settings.bindings, f"TRAIN_STEPS = {settings.steps}"],
                        os.path.join(base_dir, "train.log"), "base training")
        write_json_atomic(timing, {"train_seconds": seconds})
        print(f"base: trained in {seconds / 60:.1f} min", file=out, flush=True)
    return model_dir


# The league's base as the package ships it (parameters only, written by `--ship_base`): the
# demo continues from it instead of training the base (18-25 minutes on 2 CPU cores) when its
# settings record equals the base the demo asks for.
SHIPPED_BASE = "tasks/demo_data/league_base"
SHIPPED_RECORD = "base_settings.json"  # the league's record of the base (steps, gin, digest)
SHIPPED_SCORES = "scores.json"  # the held-out figures measured on the shipped parameters
# Tatoeba retrieval of the shipped parameters on the demo's held-out files, every layer and
# each sentence's hits (`RetrievalResult` JSON with the settings it was scored with): the
# demo's base column, read instead of scored again (tests/league/league_base_test.py scores
# it again)
SHIPPED_RETRIEVAL = "retrieval.json"


def shipped_base(settings: BaseSettings) -> str | None:
    """The shipped base's model directory when its settings record equals `settings` (the
    same base gin, bindings, steps and configuration digest), else None."""
    from xlm_jax.train import gin_utils

    root = gin_utils.shipped_path(SHIPPED_BASE)
    if root is None or read_json(os.path.join(root, SHIPPED_RECORD)) != settings.to_json():
        return None
    return root


def ship_base(base_dir: str, out_dir: str, tatoeba: str | None = None) -> str:
    """Writes the trained base of `base_dir` (its model_dir's last checkpoint: the encoder
    with its MLM head, what `init_from` reads) as a parameters-only model directory
    `out_dir`, with the league's settings record and the base's held-out scores beside it,
    and (given the `tatoeba` folder) its retrieval result (`SHIPPED_RETRIEVAL`)."""
    from xlm_jax import model_dir as md
    from xlm_jax.convert import hf as hf_lib

    model_dir = os.path.join(base_dir, "model")
    cfg, params = hf_lib.load_xlm_jax(model_dir)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    hf_lib.save_xlm_jax(out_dir, cfg, params, spm_from=model_dir)
    # orbax's commit marker names the absolute directory it was written to: only its presence
    # counts, so the shipped copy names its place in the package instead
    marker = os.path.join(out_dir, "params", "commit_success.txt")
    if os.path.exists(marker):
        with open(marker, "w", encoding="utf-8") as f:
            f.write(f"Checkpoint commit was successful to {SHIPPED_BASE}/params\n")
    for name in (md.LANGUAGES_FILE, "operative_config.gin"):  # the languages; how it trained
        if os.path.exists(os.path.join(model_dir, name)):
            shutil.copy(os.path.join(model_dir, name), out_dir)
    for name in (SHIPPED_RECORD, "score.json", "train_time.json"):
        data = read_json(os.path.join(base_dir, name))
        if isinstance(data, dict) and "model_dir" in data:  # where it was trained: not shipped
            data["model_dir"] = SHIPPED_BASE
        if data is not None:
            write_json_atomic(os.path.join(out_dir, SHIPPED_SCORES if name == "score.json"
                                           else name), data)
    if tatoeba:
        write_json_atomic(os.path.join(out_dir, SHIPPED_RETRIEVAL),
                          shipped_retrieval(out_dir, tatoeba))
    return out_dir


def shipped_retrieval(model_dir: str, tatoeba: str) -> dict[str, Any]:
    """Tatoeba retrieval of `model_dir` on `tatoeba` as the demo scores a model (every
    layer, `retrieval.evaluate`'s defaults), with its settings; paths inside the package are
    written relative to the package root (the shipped file names no machine's paths)."""
    from xlm_jax.encoder import load_encoder
    from xlm_jax.evaluation import retrieval
    from xlm_jax.train import gin_utils

    result = retrieval.evaluate(load_encoder(model_dir), tatoeba, layers="all",
                                checkpoint=SHIPPED_BASE)
    root = os.path.realpath(gin_utils.PACKAGE_ROOT)
    where = os.path.realpath(tatoeba)
    if where.startswith(root + os.sep):
        where = os.path.relpath(where, root)
    return {**result.to_json(),
            "settings": retrieval.scoring_settings(where, retrieval.find_languages(tatoeba))}


def cell_bindings(config: plan.LeagueConfig, cell: Cell, base_model: str) -> list[str]:
    """The training bindings of a cell: the recipe's, its steps, the base, its seed."""
    return [*config.bindings_for(cell.recipe), f"TRAIN_STEPS = {cell.steps}",
            f"loop.train.init_from = {base_model!r}", f"loop.train.seed = {cell.seed}"]


# ----------------------------------------------------------------------------- scoring

def tatoeba_dir(config: plan.LeagueConfig) -> str:
    """`config.tatoeba_dir`, found from the working directory or the package root (as the
    gin files' shipped paths are)."""
    from xlm_jax.train import gin_utils

    path = config.tatoeba_dir
    if os.path.isabs(path) or os.path.exists(path):
        return os.path.abspath(path)
    return gin_utils.shipped_path(path) or os.path.join(gin_utils.PACKAGE_ROOT, path)


def score_model(model_dir: str, work_dir: str, config: plan.LeagueConfig, log_path: str
                ) -> tuple[score_lib.RetrievalScore, score_lib.TransferScore | None]:
    """Retrieval (cached in `work_dir/retrieval.json`) and transfer (fine-tuned in
    `work_dir/transfer`, which caches itself) of a trained model directory."""
    cached = read_json(os.path.join(work_dir, "retrieval.json"))
    if cached is None:
        ret = score_lib.retrieval_scores(model_dir, tatoeba_dir(config), config.languages)
        write_json_atomic(os.path.join(work_dir, "retrieval.json"), dataclasses.asdict(ret))
    else:
        ret = score_lib.RetrievalScore(cached["acc1"], cached["best_layer"],
                                       {int(k): v for k, v in cached["per_layer"].items()})
    transfer = None
    if config.transfer_gin:
        with open(log_path, "a", encoding="utf-8") as log:
            transfer = score_lib.transfer_scores(
                model_dir, os.path.join(work_dir, "transfer"), config.transfer_gin,
                config.transfer_bindings, log, command=lambda a: child_command(
                    "xlm_jax.finetune", a))
    return ret, transfer


def base_scores(base_dir: str, config: plan.LeagueConfig, out: Any = sys.stdout
                ) -> dict[str, Any]:
    """The base's masked-LM check, retrieval and transfer (cached in `base_dir/score.json`)."""
    path = os.path.join(base_dir, "score.json")
    cached = read_json(path)
    if cached is not None:
        return cached
    model_dir = os.path.join(base_dir, "model")
    settings = read_json(os.path.join(base_dir, "base_settings.json"))
    t0 = time.time()
    mlm = score_lib.masked_lm_heldout(model_dir, tatoeba_dir(config), _seq_len(model_dir),
                                      config.languages)
    print(f"base: held-out masked LM loss {mlm.loss:.3f} nats (unigram entropy "
          f"{mlm.unigram_entropy:.3f}), accuracy {100 * mlm.accuracy:.1f}% (most frequent "
          f"token {mlm.most_frequent_token!r}: {100 * mlm.most_frequent_rate:.1f}%)",
          file=out, flush=True)
    ret, transfer = score_model(model_dir, base_dir, config, os.path.join(base_dir, "score.log"))
    timing = read_json(os.path.join(base_dir, "train_time.json")) or {}
    value = {"model_dir": os.path.abspath(model_dir), "steps": settings["steps"],
             "mlm": {**dataclasses.asdict(mlm), "uses_context": mlm.uses_context,
                     "beyond_language": mlm.beyond_language},
             **_score_fields(ret, transfer),
             "train_seconds": timing.get("train_seconds"),
             "score_seconds": time.time() - t0}
    write_json_atomic(path, value)
    return value


def _seq_len(model_dir: str) -> int:
    """The training row length of a trainer directory (its operative gin configuration)."""
    import re

    with open(os.path.join(model_dir, "operative_config.gin"), encoding="utf-8") as f:
        m = re.search(r"^\s*seq_len = (\d+)", f.read(), re.M)
    return int(m.group(1)) if m else 128


def _score_fields(ret: score_lib.RetrievalScore, transfer: score_lib.TransferScore | None
                  ) -> dict[str, Any]:
    return {"retrieval_acc1": ret.acc1, "retrieval_layer": ret.best_layer,
            "retrieval_per_layer": {str(k): v for k, v in sorted(ret.per_layer.items())},
            "transfer_avg": None if transfer is None else transfer.avg,
            "transfer_en": None if transfer is None else transfer.en,
            "transfer_gap": None if transfer is None else transfer.gap}


def run_cell(cell: Cell, p: Plan, base_model: str, out: Any = sys.stdout) -> CellScore:
    """Trains (or resumes) and scores one cell; its score is cached in `cell.dir/score.json`."""
    path = os.path.join(cell.dir, "score.json")
    cached = read_json(path)
    if cached is not None:
        return CellScore.from_json(cached)
    timing_path = os.path.join(cell.dir, "train_time.json")
    log = os.path.join(cell.dir, "train.log")
    if not trained_to(cell.model_dir, cell.steps):
        print(f"{cell.recipe} seed {cell.seed}: training {cell.steps} steps "
              f"({cell.train_tflop:.3g} TFLOP) from the base (log: {log})", file=out, flush=True)
        seconds = train(cell.model_dir, p.config.recipe_gin(cell.recipe),
                        cell_bindings(p.config, cell, base_model), log,
                        f"{cell.recipe} seed {cell.seed} training")
        write_json_atomic(timing_path, {"train_seconds": seconds})
    t0 = time.time()
    ret, transfer = score_model(cell.model_dir, cell.dir, p.config,
                                os.path.join(cell.dir, "score.log"))
    fields = _score_fields(ret, transfer)
    result = CellScore(
        recipe=cell.recipe, seed=cell.seed, model_dir=os.path.abspath(cell.model_dir),
        steps=cell.steps, tokens_per_step=cell.cost.tokens_per_step,
        flops_per_token=cell.cost.flops_per_token, train_tflop=cell.train_tflop,
        train_seconds=(read_json(timing_path) or {}).get("train_seconds", float("nan")),
        score_seconds=time.time() - t0, **fields)
    write_json_atomic(path, dataclasses.asdict(result))
    gap = "" if result.transfer_gap is None else (
        f", transfer {result.transfer_avg:.1f} (gap {result.transfer_gap:.1f})")
    print(f"{cell.recipe} seed {cell.seed}: retrieval {result.retrieval_acc1:.1f} (layer "
          f"{result.retrieval_layer}){gap}", file=out, flush=True)
    return result


# ----------------------------------------------------------------------------- the league

def run_league(p: Plan, command: str, out: Any = sys.stdout) -> dict[str, Any]:
    """Claims --out, trains and scores the base and every cell (skipping finished ones),
    rewriting league.json/.md/.png after each cell; returns what league.json holds."""
    from xlm_jax.league import results as report

    claim_out(p)
    base_dir = os.path.join(p.out, "base")
    base_model = ensure_base(base_dir, p.config, p.settings.base, out)
    base = base_scores(base_dir, p.config, out)
    done: list[CellScore] = []
    for i, cell in enumerate(p.cells):
        print(f"[{i + 1}/{len(p.cells)}] {cell.recipe} seed {cell.seed}", file=out, flush=True)
        done.append(run_cell(cell, p, base_model, out))
        league = report.league_json(p, base, done, command)
        report.write_all(p.out, league)
    league = report.league_json(p, base, done, command)
    report.write_all(p.out, league)
    print(f"wrote {os.path.join(p.out, 'league.md')}, league.json and league.png",
          file=out, flush=True)
    return league
