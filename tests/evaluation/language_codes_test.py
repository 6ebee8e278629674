"""File language codes (XTREME's Tatoeba `ara`, `cmn`, ...) meet a model's language list through
one table; retrieval of a model with language embeddings on XTREME's own file names works."""
import ast
import inspect
import json
import os

import jax
import numpy as np
import pytest

from xlm_jax.data import language_codes, sampling
from xlm_jax.data.features import default_language_list, language_index
from xlm_jax.evaluation import retrieval

# google-research/xtreme, third_party/evaluate_retrieval.py: `lang3_dict`, the codes of
# XTREME's Tatoeba files (the reference the table must agree with).
XTREME_LANG3 = {
    'ara': 'ar', 'heb': 'he', 'vie': 'vi', 'ind': 'id', 'jav': 'jv', 'tgl': 'tl', 'eus': 'eu',
    'mal': 'ml', 'tam': 'ta', 'tel': 'te', 'afr': 'af', 'nld': 'nl', 'eng': 'en', 'deu': 'de',
    'ell': 'el', 'ben': 'bn', 'hin': 'hi', 'mar': 'mr', 'urd': 'ur', 'fra': 'fr', 'ita': 'it',
    'por': 'pt', 'spa': 'es', 'bul': 'bg', 'rus': 'ru', 'jpn': 'ja', 'kat': 'ka', 'kor': 'ko',
    'tha': 'th', 'swh': 'sw', 'cmn': 'zh', 'kaz': 'kk', 'tur': 'tr', 'est': 'et', 'fin': 'fi',
    'hun': 'hu', 'pes': 'fa', 'aze': 'az', 'lit': 'lt', 'pol': 'pl', 'ukr': 'uk', 'ron': 'ro'}

XLMR = sorted(sampling.XLMR_LANGUAGES)
DEMO = sorted(sampling.DEMO_LANGUAGES)


def test_the_table_agrees_with_xtreme_and_has_no_key_twice():
    for code, want in XTREME_LANG3.items():
        assert language_codes.TO_REGISTRY[code] == want, code
    tree = ast.parse(inspect.getsource(language_codes))
    table = next(n.value for n in ast.walk(tree) if isinstance(n, ast.AnnAssign)
                 and getattr(n.target, "id", "") == "TO_REGISTRY")
    keys = [k.value for k in table.keys]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


def test_every_code_of_the_table_names_a_registry_language():
    known = sorted(sampling.KNOWN_LANGUAGES)
    for code in language_codes.TO_REGISTRY:
        assert language_codes.to_registry(code, known) in sampling.KNOWN_LANGUAGES, code


@pytest.mark.parametrize("code, languages, want", [
    ("ara", XLMR, "ar"), ("deu", DEMO, "de"), ("de", XLMR, "de"), ("swh", XLMR, "sw"),
    ("cmn", XLMR, "zh_Hans"), ("cmn", DEMO, "zh"), ("zho", ["zh_Hant", "en"], "zh_Hant"),
    ("nob", XLMR, "no"), ("nob", DEMO, "nb"), ("ckb", DEMO, "ckb"), ("iw", XLMR, "he"),
    ("ARA", XLMR, "ar")])
def test_to_registry(code, languages, want):
    assert language_codes.to_registry(code, languages) == want


def test_an_unmappable_code_is_one_line_with_the_close_codes():
    with pytest.raises(ValueError) as e:
        language_codes.to_registry("arx", ["ar", "arz", "en"])
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("language 'arx' is not in the language list (3 languages: ar, arz, en)")
    assert "close codes: ar" in msg and "arz" in msg
    with pytest.raises(ValueError, match=r"'cmn' .*; tried zh, zh_Hans, zh_Hant"):
        language_codes.to_registry("cmn", ["en", "de"])


ENGLISH = ["the cat sat on the mat", "a dog ran in the park", "we eat bread every day",
           "she reads a long book", "the sun is very hot", "my brother plays music"]


def _tiny_language_model(tmp_path):
    """A tiny random model with language embeddings for the default list, saved as a model
    directory with the demo's SentencePiece model."""
    import flax.linen as nn

    from xlm_jax.convert import hf
    from xlm_jax.models.config import ModelConfig
    from xlm_jax.models.transformer import Transformer

    spm = os.path.join(os.path.dirname(__file__), "..", "..", "tasks", "demo_data", "spm.model")
    spm_dir = tmp_path / "spm"
    spm_dir.mkdir()
    (spm_dir / "spm.model").write_bytes(open(spm, "rb").read())
    cfg = ModelConfig(vocab_size=8002, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
                      max_positions=42, dropout_rate=0.0, attention_dropout_rate=0.0,
                      num_languages=len(default_language_list()) + 1)
    ids = np.full((1, 4), 5, np.int32)
    params = nn.meta.unbox(Transformer(cfg).init(jax.random.PRNGKey(0), ids,
                                                 lang_ids=np.ones_like(ids))["params"])
    out = str(tmp_path / "model")
    hf.save_xlm_jax(out, cfg, jax.tree_util.tree_map(np.asarray, params), spm_from=str(spm_dir))
    return out


def _tatoeba(root, codes):
    """One folder: German-like (words reversed) and Arabic-like (words rotated) sides."""
    root.mkdir()
    eng = "\n".join(ENGLISH) + "\n"
    sides = {"de": [" ".join(reversed(s.split())) for s in ENGLISH],
             "ar": [" ".join(s.split()[1:] + s.split()[:1]) for s in ENGLISH]}
    for registry_code, code in codes.items():
        (root / f"tatoeba.{code}-eng.{code}").write_text("\n".join(sides[registry_code]) + "\n")
        (root / f"tatoeba.{code}-eng.eng").write_text(eng)
    return str(root)


def test_retrieval_of_a_language_model_on_xtreme_file_names(tmp_path):
    """Must-show: `tatoeba.ara-eng.ara` / `tatoeba.deu-eng.deu` are scored, each side embedded
    with the registry language's id: the same scores as the folder named with `ar` / `de`."""
    from xlm_jax.encoder import load_encoder

    model = _tiny_language_model(tmp_path)
    xtreme = _tatoeba(tmp_path / "xtreme", {"ar": "ara", "de": "deu"})
    registry = _tatoeba(tmp_path / "registry", {"ar": "ar", "de": "de"})
    results = {}
    for name, folder in (("xtreme", xtreme), ("registry", registry)):
        out = tmp_path / f"{name}.json"
        assert retrieval.main(["--checkpoint", model, "--tatoeba_dir", folder, "--layer", "1",
                               "--max_length", "32", "--output_json", str(out)]) == 0
        results[name] = json.loads(out.read_text())
    assert sorted(results["xtreme"]["per_language"]) == ["ara", "deu"]
    for file_code, code in (("ara", "ar"), ("deu", "de")):
        got, want = (results["xtreme"]["per_language"][file_code],
                     results["registry"]["per_language"][code])
        renamed = {k.replace(code, file_code): v for k, v in want.items()}
        renamed["hits"] = {k.replace(code, file_code): v for k, v in want["hits"].items()}
        assert got == renamed  # the scores and each sentence's hits
    enc = load_encoder(model)
    languages = default_language_list()
    assert enc.lang_id("ara") == language_index("ar", languages)
    assert enc.lang_id("deu") == language_index("de", languages) != enc.lang_id("ara")
