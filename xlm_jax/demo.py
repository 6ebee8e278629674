"""`python -m xlm_jax.demo --model_dir=demo_output` — what `make demo` runs.

One paper's recipe continued from the objective league's base, beside the control (MMLM
continued) at the same training FLOPs, on the embedded Django/Wagtail demo corpus:

1. the base: the league's MMLM base (gin_configs/league/base.gin, 4 x 128, 3000 steps): the
   one the package ships (tasks/demo_data/league_base, written by `python -m xlm_jax.league
   --ship_base`) when the league's base settings are the shipped one's; otherwise (other
   settings, --base_dir or --train_base) trained on first use (about 20-25 minutes on 2 CPU
   cores) and cached in --base_dir (default $XDG_CACHE_HOME/xlm_jax/league_base/HASH, HASH
   naming its settings), reused afterwards;
2. the paper's recipe (--gin_file, default demo/infoxlm.gin: MMLM + TLM + XLCo; also
   demo/xlme.gin, demo/ernie_m.gin, demo/veco.gin) continued from it for --budget_tflop
   training TFLOPs (the trainer's FLOP count), into --model_dir/model;
3. the control, league/mmlm.gin (MMLM continued), for the same FLOPs, into --model_dir/control;
4. Tatoeba-style retrieval (acc@1, both directions, mean-pooled hidden states) on the held-out
   split for the base, the control and the paper's model: a per-language table (each model at
   its best layer unless --layer names one), report.png (the paper run's loss curves and
   base/paper bars) and the three result JSONs in --model_dir. A score computed already is
   read, not computed again: the shipped base's (`retrieval.json` beside it) and the paper
   run's own eval of its last step (`model/eval/retrieval_stepN.json`), each only when it
   scored what this scoring would (`stored_result`).

Every training runs in a subprocess (`python -m xlm_jax.train`) and resumes when rerun; the
paper's run and the control train side by side (`SideBySide`), and the base and the control are
scored while the paper's run is still training.
`python -m xlm_jax.league` runs every recipe over seeds with the transfer task too
(docs/league.md).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import sys
import threading
import time
from typing import Any

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_GIN = "demo/infoxlm.gin"


def main(argv: list[str] | None = None) -> int:
    from xlm_jax import cli_help
    from xlm_jax.league import runner
    from xlm_jax.train import cli, gin_utils

    p = cli_help.Parser(prog="python -m xlm_jax.demo", description=__doc__)
    p.add_argument("--model_dir", default="demo_output",
                   help="where the two continued models, the retrieval JSONs and report.png go")
    p.add_argument("--gin_file", action="append", default=None,
                   help=f"the paper's demo file (repeatable; None: {DEFAULT_GIN})")
    p.add_argument("--gin_bindings", action="append", default=[],
                   help="extra gin bindings of the paper's run; --gin.NAME=VALUE is short for "
                        "this (--gin.TRAIN_STEPS=N fixes its steps instead of the budget)")
    p.add_argument("--base_dir", default=None,
                   help="where the league base is built and reused (None: "
                        "$XDG_CACHE_HOME/xlm_jax/league_base/HASH of its settings)")
    p.add_argument("--base_steps", type=int, default=runner.DEFAULT_BASE_STEPS,
                   help="training steps of the base (as python -m xlm_jax.league)")
    p.add_argument("--train_base", action="store_true",
                   help="train the base (once, into --base_dir) even where the package ships "
                        f"one of the same settings ({runner.SHIPPED_BASE})")
    p.add_argument("--budget_tflop", type=float, default=runner.DEFAULT_BUDGET_TFLOP,
                   help="training TFLOPs of each continuation (as python -m xlm_jax.league)")
    p.add_argument("--league_gin", action="append", default=[],
                   help="league settings (LeagueConfig) for the base and both runs, e.g. a "
                        "smaller model; none: the league's defaults")
    p.add_argument("--layer", default="all",
                   help="layer for the table ('all': each model at its best layer)")
    p.add_argument("--tatoeba_dir", default=gin_utils.shipped_path("tasks/demo_data/tatoeba")
                   or os.path.join(REPO_ROOT, "tasks", "demo_data", "tatoeba"),
                   help="held-out Tatoeba-layout folder the retrieval is scored on")
    args = p.parse_args(gin_utils.rewrite_gin_args(list(sys.argv[1:] if argv is None
                                                        else argv)))
    # TensorFlow (the input pipeline only) logs C++ INFO/WARNING lines that say nothing about
    # the demo; set before TF is imported (the children inherit it); an explicit value wins.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return cli.run_reporting(lambda: _run(args))


def default_base_dir(settings_json: dict) -> str:
    """`$XDG_CACHE_HOME/xlm_jax/league_base/HASH` (XDG's default ~/.cache), HASH = the first
    16 hex digits of the sha256 of the base's settings record."""
    digest = hashlib.sha256(json.dumps(settings_json, sort_keys=True).encode()).hexdigest()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "xlm_jax", "league_base", digest[:16])


def resolve_base(args: argparse.Namespace, config: Any, base_settings: Any) -> str:
    """The base's model directory: the one the package ships (`runner.shipped_base`) when its
    settings are the ones asked for and neither --base_dir nor --train_base is given; else
    trained once into --base_dir (default: the cache) and reused."""
    from xlm_jax.league import runner

    shipped = (None if args.base_dir or args.train_base
               else runner.shipped_base(base_settings))
    if shipped:
        print(f"base: the shipped league base {shipped} (its settings: "
              f"{os.path.join(shipped, runner.SHIPPED_RECORD)}; --train_base trains it anew)",
              flush=True)
        return shipped
    base_dir = args.base_dir or default_base_dir(base_settings.to_json())
    return runner.ensure_base(base_dir, config, base_settings)


def user_steps(bindings: list[str]) -> int | None:
    """TRAIN_STEPS as the user bound it (`--gin.TRAIN_STEPS=N`, the last one wins), else None."""
    import ast

    from xlm_jax.train import gin_utils

    given = [b for b in bindings if gin_utils.binding_macro(b) == "TRAIN_STEPS"]
    return int(ast.literal_eval(given[-1].split("=", 1)[1].strip())) if given else None


def _run(args: argparse.Namespace) -> int:
    """Base (cached), paper run, control run, three retrieval scores, table and PNG."""
    from xlm_jax.league import runner
    from xlm_jax.league import plan
    from xlm_jax import model_dir as md
    from xlm_jax.encoder import load_encoder
    from xlm_jax.evaluation import report, retrieval
    from xlm_jax.train import gin_utils

    gin_files = args.gin_file or [DEFAULT_GIN]
    gin_utils.parse(args.league_gin, [])
    config = plan.league_config()
    paper_bindings = [*config.shared_bindings, *args.gin_bindings]
    fixed_steps = user_steps(args.gin_bindings)
    # Both configurations are parsed (and costed) first: a typo fails before anything is built.
    cost = plan.recipe_cost(gin_files, paper_bindings if fixed_steps else
                            [*paper_bindings, "TRAIN_STEPS = 1"])
    control_cost = plan.recipe_cost(config.recipe_gin(plan.CONTROL),
                                    [*config.bindings_for(plan.CONTROL), "TRAIN_STEPS = 1"])
    budget = cost.train_flops(fixed_steps) if fixed_steps else args.budget_tflop * 1e12
    steps = fixed_steps or cost.steps_for(budget)
    if steps < 1:
        raise ValueError(f"--budget_tflop={args.budget_tflop:g} is smaller than one step "
                         f"({cost.cycle * cost.flops_per_step / 1e12:.4g} TFLOP) of "
                         f"{' '.join(gin_files)}")
    # the control at the same FLOPs (whole mixture cycles, at least one)
    control_steps = max(control_cost.steps_for(budget), control_cost.cycle)

    model_dir = md.resolve(args.model_dir)
    base_settings, _ = runner.base_settings(config, args.base_steps)
    t0 = time.time()
    base_model = resolve_base(args, config, base_settings)
    runs = {"paper": (gin_files, paper_bindings, steps, cost, os.fspath(model_dir / "model")),
            "control": (config.recipe_gin(plan.CONTROL), list(config.bindings_for(plan.CONTROL)),
                        control_steps, control_cost, os.fspath(model_dir / "control"))}
    for name, (files, _, n, c, _) in runs.items():
        print(f"{name}: {' '.join(files)}, {n} steps ({c.train_flops(n) / 1e12:.3g} TFLOP) "
              f"from the base {base_model}", flush=True)
    trainings = {name: (files, [*bindings, f"TRAIN_STEPS = {n}",
                                f"loop.train.init_from = {base_model!r}"], train_dir)
                 for name, (files, bindings, n, _, train_dir) in runs.items()}
    results = {}
    layer = args.layer if args.layer == "all" else int(args.layer)

    def score(name: str, what: str, path: str, out: Any) -> None:
        out.write(f"scoring: Tatoeba retrieval of {what} on {args.tatoeba_dir}\n")
        out.flush()
        enc = load_encoder(path)
        res = retrieval.evaluate(enc, args.tatoeba_dir, layers=layer, checkpoint=path)
        md.write_json(model_dir / f"retrieval_{name}.json", res.to_json())
        results[name] = res

    # The base is scored while the two train (or its shipped result read), the control once it
    # has finished (the paper's run, with its evaluator, takes longer), the paper's model last
    # (or its run's own eval of the last step read).
    shipped = shipped_base_result(base_model, args.tatoeba_dir, layer)
    with SideBySide(trainings) as training:
        if shipped is None:
            score("base", "the base (while the two train)", base_model, training.echo)
        else:  # scored when it was shipped (the same evaluation; the suite scores it again)
            training.echo.write("scoring: Tatoeba retrieval of the base: the result shipped "
                                f"beside it ({runner.SHIPPED_RETRIEVAL})\n")
            results["base"] = shipped
            md.write_json(model_dir / "retrieval_base.json", shipped.to_json())
        training.wait("control")
        score("control", "the control", runs["control"][4], training.echo)
        training.wait("paper")
    reused = in_loop_result(runs["paper"][4], steps, args.tatoeba_dir, layer)
    if reused is None:
        score("after", "the paper's model", runs["paper"][4], sys.stdout)
    else:  # the run scored its last step itself: the same evaluation, not run twice
        path, results["after"] = reused
        print(f"scoring: Tatoeba retrieval of the paper's model: its run's own eval of step "
              f"{steps} ({path})", flush=True)
        md.write_json(model_dir / "retrieval_after.json", results["after"].to_json())
    png = os.fspath(model_dir / "report.png")
    report.write_report(runs["paper"][4], results["base"], results["after"], png)
    print(format_table(results, " ".join(gin_files)))
    print(f"wrote {png}; {(time.time() - t0) / 60:.1f} min in all")
    return 0


def in_loop_result(train_dir: str, step: int, tatoeba_dir: str, layer: int | str
                   ) -> tuple[str, Any] | None:
    """(path, RetrievalResult) of the run's own Tatoeba eval of `step`
    (`evaluators.TatoebaRetrieval`'s result file) when it scored what the demo's scoring
    would: every language of `tatoeba_dir`, every layer (the demo's `--layer all`), and
    `retrieval.evaluate`'s defaults (mean pooling, default length, batches of 64); else None.
    The run's live parameters at `step` are its checkpoint's, so the numbers are the ones a
    second scoring of the checkpoint gives (`tests/train/periodic_eval_test.py`)."""
    import dataclasses

    from xlm_jax.evaluation import retrieval
    from xlm_jax.train import evaluators

    path = evaluators.result_path(train_dir, "retrieval", step)
    result = stored_result(path, tatoeba_dir, layer)
    if result is None or result.step != step:
        return None
    return path, dataclasses.replace(result, checkpoint=train_dir)


def shipped_base_result(base_model: str, tatoeba_dir: str, layer: int | str) -> Any:
    """The retrieval result shipped beside the base (`runner.SHIPPED_RETRIEVAL`, written by
    `python -m xlm_jax.league --ship_base`) when it scored what the demo's scoring would
    (as `in_loop_result`), else None."""
    from xlm_jax.league import runner

    return stored_result(os.path.join(base_model, runner.SHIPPED_RETRIEVAL), tatoeba_dir, layer)


def stored_result(path: str, tatoeba_dir: str, layer: int | str) -> Any:
    """The `RetrievalResult` of `path` when its recorded settings are the demo's scoring's
    (every language of `tatoeba_dir`, every layer, `retrieval.evaluate`'s defaults) and it
    holds each sentence's hits (the table's bootstrap needs them); else None. A relative
    `tatoeba_dir` in the file is the package's (`gin_utils.shipped_path`)."""
    from xlm_jax.evaluation import retrieval
    from xlm_jax.train import gin_utils

    if layer != "all" or not os.path.isfile(path):
        return None
    data = retrieval.read_result_json(path)
    settings = data.get("settings") or {}
    same = retrieval.scoring_settings(tatoeba_dir, retrieval.find_languages(tatoeba_dir))
    scored_on = settings.get("tatoeba_dir") or "?"
    if not os.path.isabs(scored_on):  # the package's folder, in a checkout or a wheel
        scored_on = gin_utils.shipped_path(scored_on) or scored_on
    if (any(settings.get(k, "?") != v for k, v in same.items() if k != "tatoeba_dir")
            or os.path.realpath(scored_on) != os.path.realpath(tatoeba_dir)):
        return None
    result = retrieval.RetrievalResult.from_json(data, source=path)  # the file read once
    if any(s.hits is None for s in result.per_language.values()):
        return None
    return result


class _Lines:
    """A stream that several threads write whole lines to, one `write` at a time."""

    def __init__(self, stream: Any):
        self.stream, self.lock = stream, threading.Lock()

    def write(self, text: str) -> None:
        with self.lock:
            self.stream.write(text)

    def flush(self) -> None:
        with self.lock:
            self.stream.flush()


class SideBySide:
    """Trains each `name: (gin_files, bindings, model_dir)` as its own child process, all at
    once, their progress echoed to `out` as `  NAME: LINE`:

        with SideBySide(runs) as training:
            ...                       # work of this process while they train (scoring)
            training.wait("control")  # its wall-clock seconds, once it has finished

    Side by side, not one after the other (our choice): one after the other, the demo kept
    1.67 of 2 CPU cores busy (a training child of its small model leaves part of them idle,
    most of all in its single-threaded set-up: input pipelines, tracing, XLA); side by side,
    with the base scored while they train and the control once it has finished, 1.93, and it
    took 20% less time (measured back to back, docs/NOTES.md). Each run's batches and numbers
    are those it has alone (its own process, seed and data). A failed run stops the others
    (SIGTERM: a trainer saves and exits, a rerun resumes) and its error is what `wait` and
    leaving the block raise; leaving the block on an error of this process stops them too."""

    def __init__(self, runs: dict[str, tuple[list[str], list[str], str]], out: Any = None):
        self.runs = runs
        self.echo = _Lines(out if out is not None else sys.stdout)
        self.procs: list[Any] = []
        self.failed: list[BaseException] = []
        self.lock = threading.Lock()
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(runs))
        self.futures: dict[str, concurrent.futures.Future] = {}

    def __enter__(self) -> "SideBySide":
        for name, run in self.runs.items():
            self.futures[name] = self.pool.submit(self._one, name, *run)
        return self

    def _started(self, proc: Any) -> None:
        with self.lock:
            self.procs.append(proc)
            if self.failed:
                proc.terminate()

    def _stop(self, error: BaseException) -> None:
        with self.lock:
            self.failed.append(error)
            for proc in self.procs:
                if proc.poll() is None:
                    proc.terminate()

    def _one(self, name: str, files: list[str], bindings: list[str], train_dir: str) -> float:
        from xlm_jax.league import runner

        try:
            seconds = runner.train(train_dir, files, bindings, train_dir + "_train.log",
                                   f"{name} training", echo=self.echo, label=name,
                                   started=self._started)
        except BaseException as e:
            self._stop(e)
            raise
        self.echo.write(f"{name}: trained in {seconds / 60:.1f} min "
                        f"(log: {train_dir}_train.log)\n")
        self.echo.flush()
        return seconds

    def wait(self, name: str) -> float:
        """Seconds `name` trained, once it has; the first failure of any run raises."""
        concurrent.futures.wait([self.futures[name]])
        if self.failed:
            raise self.failed[0]
        return self.futures[name].result()

    def __exit__(self, kind: Any, error: Any, tb: Any) -> None:
        if error is not None and not self.failed:
            self._stop(error)
        concurrent.futures.wait(self.futures.values())
        self.pool.shutdown()
        if error is None and self.failed:
            raise self.failed[0]


def format_table(results: dict, paper: str, resamples: int = 1000) -> str:
    """acc@1 (%) per language: the base, the control, the paper's model, and paper - control
    with its spread over the held-out sentences (`retrieval.paired_bootstrap`), then what the
    layers and the absolute scores mean."""
    from xlm_jax.evaluation import retrieval

    base, control, after = results["base"], results["control"], results["after"]
    spread = retrieval.paired_bootstrap(control, after, resamples)
    langs = sorted(after.per_language)
    width = max(8, *(len(lang) for lang in langs))
    head = (f"{'language':<{width}}  {'base':>7}  {'control':>7}  {'paper':>7}  "
            f"{'delta':>7}  {'+-':>5}")
    lines = [f"Tatoeba acc@1 (%), mean of xx->eng and eng->xx; base = the league base (layer "
             f"{base.reported_layer}), control = MMLM continued (layer "
             f"{control.reported_layer}), paper = {paper} (layer {after.reported_layer}), "
             "delta = paper - control", head, "-" * len(head)]

    def row(name: str, b: float, c: float, a: float, sd: float) -> str:
        return (f"{name:<{width}}  {100 * b:>7.1f}  {100 * c:>7.1f}  {100 * a:>7.1f}  "
                f"{100 * (a - c):>+7.1f}  {100 * sd:>5.1f}")

    for lang in langs:
        lines.append(row(lang, base.per_language[lang].mean, control.per_language[lang].mean,
                         after.per_language[lang].mean, spread.per_language[lang]))
    lines += ["-" * len(head),
              row("average", base.average, control.average, after.average, spread.average)]
    return "\n".join(lines + table_notes(results, spread))


def table_notes(results: dict, spread: Any) -> list[str]:
    """What the table's columns and layers mean, and how to read its absolute scores."""
    after, control = results["after"], results["control"]
    sizes = sorted({s.num_pairs for s in after.per_language.values()})
    chance = (f"{100 / sizes[0]:.1f}%" if len(sizes) == 1
              else f"{100 / sizes[-1]:.1f}-{100 / sizes[0]:.1f}%")
    delta, sd = after.average - control.average, spread.average
    verdict = ("within 2 x its spread: these sentences do not tell the two models apart"
               if abs(delta) <= 2 * sd else
               f"beyond 2 x its spread: on these sentences the paper's model is "
               f"{'better' if delta > 0 else 'worse'} than this control; whether the recipe is "
               "takes seeds, which this spread does not hold (python -m xlm_jax.league)")
    layers = sorted({r.reported_layer for r in results.values()})
    notes = [
        f"+- = the standard deviation of delta over {spread.resamples} paired bootstrap "
        "resamples of the held-out sentences (the same draw for both models); the average's "
        f"delta {100 * delta:+.1f} is {verdict}.",
        f"Absolute scores: each sentence is matched against every sentence of its language's "
        f"file ({sizes[0]}-{sizes[-1]} sentences), so chance is {chance}; a model this "
        "small, trained for minutes on the demo's UI strings, is far from XLM-R's scale: "
        "what the demo compares is the paper's recipe against the control at the same "
        "FLOPs, not the absolute level."]
    if 0 in layers:
        notes.append(
            "layer 0 is the embedding layer's output (word + position embeddings, before any "
            "Transformer layer); each model is read at its best layer. At this scale the "
            "embeddings, which share subword pieces across languages (names, placeholders, "
            "loanwords of the UI strings), retrieve as well as or better than the upper layers, "
            "which a short continued run has tuned to predict masked pieces (our reading; the "
            "per-layer scores are in the retrieval JSON files).")
    return notes


if __name__ == "__main__":
    sys.exit(main())
