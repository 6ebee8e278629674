"""The demo's table (`demo.format_table`): each delta beside its bootstrap spread over the
held-out sentences, the average's verdict against that spread, chance for the files' sizes,
and what layer 0 is when a model is read there. Built from results of known per-sentence
hits; the spread is compared with `retrieval.paired_bootstrap` and with the plug-in standard
error it tends to."""
import re

import numpy as np
import pytest

from xlm_jax import demo
from xlm_jax.evaluation import retrieval


def _result(hits, layer):
    scores = {lang: retrieval.LanguageScore(float(np.mean(f)), float(np.mean(b)), len(f),
                                            hits=(f, b)) for lang, (f, b) in hits.items()}
    return retrieval.RetrievalResult("all", layer, scores, {layer: scores})


def _hits(rate, n, seed):
    rng = np.random.default_rng(seed)
    return rng.random(n) < rate, rng.random(n) < rate


ROW = re.compile(r"^(\w+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([+-][\d.]+)\s+([\d.]+)$", re.M)


def _changed(hits, gained, lost):
    """`hits` with the first `gained` misses of each direction turned into hits and the last
    `lost` hits into misses."""
    out = []
    for h in hits:
        h = h.copy()
        misses, found = np.flatnonzero(~h), np.flatnonzero(h)
        h[misses[:gained]] = True
        h[found[len(found) - lost:]] = False
        out.append(h)
    return tuple(out)


@pytest.mark.parametrize("gained, lost, verdict", [
    (6, 6, "do not tell the two models apart"),  # as many sentences lost as found: delta 0
    (60, 0, "the paper's model is better than this control; whether the recipe is takes "
            "seeds")])
def test_the_table_gives_each_delta_its_spread_and_frames_the_scores(gained, lost, verdict):
    """The paper's model finds what the control found, `gained` more sentences each way and
    `lost` fewer."""
    sizes = {"de": 200, "fr": 150}
    base = _result({l: _hits(0.2, n, 1) for l, n in sizes.items()}, layer=0)
    control = _result({l: _hits(0.3, n, 2) for l, n in sizes.items()}, layer=2)
    after = _result({l: _changed(control.per_language[l].hits, gained, lost) for l in sizes},
                    layer=0)
    text = demo.format_table({"base": base, "control": control, "after": after},
                             "demo/infoxlm.gin", resamples=2000)
    rows = {m.group(1): [float(m.group(k)) for k in range(2, 7)] for m in ROW.finditer(text)}
    assert set(rows) == {"de", "fr", "average"}
    spread = retrieval.paired_bootstrap(control, after, resamples=2000)
    for lang in sizes:
        b, c, p, delta, sd = rows[lang]
        assert p == pytest.approx(100 * after.per_language[lang].mean, abs=0.051)
        assert delta == pytest.approx(p - c, abs=0.11)
        assert sd == pytest.approx(100 * spread.per_language[lang], abs=0.051)
        # and the spread is the size a paired mean difference has: sd(d) / sqrt(n)
        f_a, b_a = control.per_language[lang].hits
        f_b, b_b = after.per_language[lang].hits
        d = ((f_b.astype(float) + b_b) - (f_a.astype(float) + b_a)) / 2
        assert sd == pytest.approx(100 * d.std() / np.sqrt(len(d)), rel=0.1, abs=0.15)
    assert rows["average"][4] == pytest.approx(100 * spread.average, abs=0.051)
    assert verdict in text
    assert "chance is 0.5-0.7%" in text and "(150-200 sentences)" in text
    assert "layer 0 is the embedding layer's output" in text
    # no model at layer 0: no note about it
    at_two = _result({l: after.per_language[l].hits for l in sizes}, layer=2)
    base_two = _result({l: base.per_language[l].hits for l in sizes}, layer=1)
    text = demo.format_table({"base": base_two, "control": control, "after": at_two}, "x")
    assert "layer 0 is" not in text
