"""The demo report: the before/after table's numbers (checked by hand), the loss curves read
from a synthetic metrics.jsonl, the two-panel PNG, the CLI and its input errors."""
import json
import os
import subprocess
import sys

import pytest

from xlm_jax.evaluation import report
from xlm_jax.evaluation.retrieval import LanguageScore, RetrievalResult

METRICS = [
    # Written out of step order, with a resumed run re-logging step 20 and a NaN step.
    {"step": 20, "split": "train", "mmlm/loss": 7.0, "tlm/loss": 7.5, "loss": 99.0,
     "learning_rate": 1e-4},
    {"step": 0, "split": "train", "mmlm/loss": 9.0, "tlm/loss": 9.2, "loss": 18.2,
     "learning_rate": 0.0},
    {"step": 10, "split": "train", "mmlm/loss": 8.0, "tlm/loss": 8.4, "loss": 16.4,
     "learning_rate": 5e-5},
    {"step": 20, "split": "train", "mmlm/loss": 7.0, "tlm/loss": 7.5, "loss": 14.5,
     "learning_rate": 1e-4},
    {"step": 30, "split": "train", "mmlm/loss": float("nan"), "loss": 13.0},
    {"step": 20, "split": "eval", "loss": 15.0, "accuracy": 0.1},
]


def _result(layer, scores):
    per_language = {lang: LanguageScore(a, b, 100) for lang, (a, b) in scores.items()}
    return RetrievalResult(layer=layer, reported_layer=layer, per_language=per_language,
                           per_layer_language={layer: per_language})


# Means: before de 0.15, fr 0.40 -> average 0.275; after de 0.70, fr 0.80 -> average 0.75.
BEFORE = _result(4, {"de": (0.10, 0.20), "fr": (0.30, 0.50)})
AFTER = _result(4, {"de": (0.60, 0.80), "fr": (0.70, 0.90)})


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    with open(d / "metrics.jsonl", "w") as f:
        for row in METRICS:
            f.write(json.dumps(row) + "\n")
        f.write("\n")  # a trailing blank line is fine
    return str(d)


def _png_ok(path: str, min_size: int = 15000) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > min_size


def _rows(table: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split()[1:] for line in table.splitlines()[2:]
            if line and not line.startswith("-")}


def test_table_numbers_by_hand(model_dir, tmp_path):
    out = str(tmp_path / "report.png")
    table = report.write_report(model_dir, BEFORE, AFTER, out)
    rows = _rows(table)
    assert rows["de"] == ["15.0", "70.0", "+55.0"]
    assert rows["fr"] == ["40.0", "80.0", "+40.0"]
    assert rows["average"] == ["27.5", "75.0", "+47.5"]
    assert list(rows) == ["de", "fr", "average"]
    assert table.splitlines()[1].split() == ["language", "before", "after", "delta"]
    assert "layer 4" in table.splitlines()[0]
    assert _png_ok(out)


def test_missing_language_and_negative_delta():
    after = _result(6, {"de": (0.05, 0.15), "ja": (0.5, 0.5)})
    rows = _rows(report.format_table(BEFORE, after))
    assert rows["de"] == ["15.0", "10.0", "-5.0"]
    assert rows["fr"] == ["40.0", "-", "-"]
    assert rows["ja"] == ["-", "50.0", "-"]
    assert rows["average"] == ["27.5", "30.0", "+2.5"]  # after: (0.10 + 0.50) / 2


def test_loss_curves_from_metrics(model_dir):
    curves = {c.label: c for c in report.read_loss_curves(os.path.join(model_dir, "metrics.jsonl"))}
    assert list(curves) == ["loss", "mmlm/loss", "tlm/loss", "eval: loss"]  # no learning_rate
    assert curves["loss"].steps == [0, 10, 20, 30]
    assert curves["loss"].values == [18.2, 16.4, 14.5, 13.0]  # the re-logged step 20 wins
    assert curves["mmlm/loss"].steps == [0, 10, 20]  # the NaN at step 30 is left out
    assert curves["tlm/loss"].values == [9.2, 8.4, 7.5]
    assert curves["eval: loss"].steps == [20] and curves["eval: loss"].values == [15.0]


def test_per_run_metrics_files_are_found(tmp_path):
    d = tmp_path / "gcs_like"
    d.mkdir()
    (d / "metrics.1700000000.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0}) + "\n")
    (d / "metrics.1700000500.jsonl").write_text(json.dumps({"step": 2, "loss": 2.0}) + "\n")
    files = report.find_metrics_files(str(d))
    assert [os.path.basename(f) for f in files] == ["metrics.1700000000.jsonl",
                                                    "metrics.1700000500.jsonl"]
    (curve,) = report.read_loss_curves(files)
    assert curve.steps == [1, 2] and curve.values == [3.0, 2.0]


def test_cli(model_dir, tmp_path):
    paths = {}
    for name, res in (("before", BEFORE), ("after", AFTER)):
        paths[name] = str(tmp_path / f"{name}.json")
        with open(paths[name], "w") as f:
            json.dump(res.to_json(), f)
    out = str(tmp_path / "cli" / "report.png")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-m", "xlm_jax.evaluation.report", "--model_dir",
                        model_dir, "--before", paths["before"], "--after", paths["after"],
                        "--out", out], capture_output=True, text=True, cwd=root, env=env)
    assert r.returncode == 0, r.stderr
    rows = _rows(r.stdout)
    assert rows["average"][:3] == ["27.5", "75.0", "+47.5"]
    assert _png_ok(out)


def test_json_round_trip_keeps_scores():
    back = RetrievalResult.from_json(json.loads(json.dumps(AFTER.to_json())))
    assert back.per_language == AFTER.per_language
    assert back.average == pytest.approx(0.75) and back.reported_layer == 4


def _cli_error(capsys, argv) -> str:
    rc = report.main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    return err


def test_errors(model_dir, tmp_path, capsys):
    good = str(tmp_path / "good.json")
    with open(good, "w") as f:
        json.dump(BEFORE.to_json(), f)
    out = str(tmp_path / "r.png")

    empty = tmp_path / "empty"
    empty.mkdir()
    err = _cli_error(capsys, ["--model_dir", str(empty), "--before", good, "--after", good,
                              "--out", out])
    assert str(empty / "metrics.jsonl") in err and "not found" in err

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": \n')
    err = _cli_error(capsys, ["--model_dir", str(broken), "--before", good, "--after", good,
                              "--out", out])
    assert f"{broken / 'metrics.jsonl'}:2: not valid JSON" in err

    (broken / "metrics.jsonl").write_text('{"loss": 2.0}\n')
    err = _cli_error(capsys, ["--model_dir", str(broken), "--before", good, "--after", good,
                              "--out", out])
    assert f"{broken / 'metrics.jsonl'}:1: missing or non-integer 'step'" in err

    bad = str(tmp_path / "bad.json")
    data = BEFORE.to_json()
    del data["per_language"]["de"]["eng->de"]
    with open(bad, "w") as f:
        json.dump(data, f)
    err = _cli_error(capsys, ["--model_dir", model_dir, "--before", bad, "--after", good,
                              "--out", out])
    assert bad in err and "'eng->de'" in err and "per_language['de']" in err

    data = BEFORE.to_json()
    data["per_language"]["fr"]["fr->eng"] = 30.0  # a percentage where a fraction belongs
    with open(bad, "w") as f:
        json.dump(data, f)
    err = _cli_error(capsys, ["--model_dir", model_dir, "--before", good, "--after", bad,
                              "--out", out])
    assert bad in err and "['fr->eng']=30.0 is not an accuracy in [0, 1]" in err

    missing = str(tmp_path / "nope.json")
    err = _cli_error(capsys, ["--model_dir", model_dir, "--before", missing, "--after", good,
                              "--out", out])
    assert missing in err and "not found" in err
    assert not os.path.exists(out)
