"""Translation evaluation: beam search with a cache over a fine-tuned encoder-decoder
(`xlm_jax.objectives.translation.Translation`), detokenised, scored with sacreBLEU.

`evaluate(model_dir)` is gin-configurable (`translation_eval.evaluate.source_file`,
`target_file`, `source_lang`, `target_lang`, `decoder_layers`, `beam_size`, `length_penalty`,
`max_length`); `python -m xlm_jax.translate` fine-tunes and then calls it. Each decoding step
costs one token (`Transformer.decode_step` keeps every layer's keys and values).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gin
import jax
import jax.numpy as jnp
import numpy as np

from xlm_jax import model_dir as md
from xlm_jax.data.features import language_index
from xlm_jax.models import decoding
from xlm_jax.models.transformer import Transformer, default_positions
from xlm_jax.objectives.translation import Translation


def _read_lines(path: str, what: str) -> list[str]:
    """The lines of a UTF-8 text file, local or gs://, split where Python's text mode splits
    them (LF, CRLF or CR only, so that line-aligned files stay aligned)."""
    try:
        text = md.read_text(path)
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        if lines[-1] == "":
            lines.pop()
    except FileNotFoundError:
        raise FileNotFoundError(f"translate: {what} {path} does not exist") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"translate: {what} {path} is not valid UTF-8 ({e.reason} at byte "
                         f"{e.start})") from None
    if not lines:
        raise ValueError(f"translate: {what} {path} is empty")
    return lines


def translate_batch(objective: Translation, params: Any, source_ids: jax.Array,
                    source_lang: int, target_lang: int, beam_size: int, length_penalty: float,
                    max_length: int, bos_id: int, eos_id: int, pad_id: int
                    ) -> decoding.DecodeResult:
    """Beam search (greedy for beam 1) from the encoder's output of `source_ids` [B, S]
    (`<s> x </s>` rows; with language-id tokens the `<s>` becomes the source language's token
    and decoding starts from the target language's, `Translation.first_tokens`)."""
    rows = source_ids.shape[0]
    source_ids = jnp.asarray(source_ids)
    valid = source_ids != pad_id
    source_first, start_id = objective.first_tokens(source_lang, target_lang, bos_id)
    source_ids = source_ids.at[:, 0].set(jnp.where(valid[:, 0], source_first, source_ids[:, 0]))
    positions = default_positions(valid)
    batch = {"x_input_ids": source_ids, "x_positions": positions,
             "x_segment_ids": valid.astype(jnp.int32),
             "x_lang_ids": jnp.where(valid, source_lang, 0)}
    memory = objective.encode_source(params, batch)
    dec_params = objective.decoder_params(params)
    cfg = objective.decoder_config
    net = objective.decoder

    def logits_fn(prefix, step, cache):
        layers, mem, mem_valid = cache
        token = jax.lax.dynamic_slice_in_dim(prefix, step, 1, axis=1)
        lang = jnp.full(token.shape, target_lang, jnp.int32)
        h, layers = net.apply({"params": dec_params}, token, step, layers, encoder_states=mem,
                              cross_mask=mem_valid[:, None, None, :], lang_ids=lang,
                              method=Transformer.decode_step)
        logits = net.apply({"params": dec_params}, h, jnp.zeros((h.shape[0], 1), jnp.int32),
                           method=Transformer.mlm_logits)[:, 0]
        return logits, (layers, mem, mem_valid)

    cache = (Transformer.init_cache(cfg, rows, max_length), memory, valid)
    if beam_size == 1:
        return decoding.greedy_search(logits_fn, cache, rows, max_length, start_id, eos_id,
                                      pad_id)
    return decoding.beam_search(logits_fn, cache, rows, beam_size, max_length, start_id, eos_id,
                                pad_id, length_penalty)


@gin.configurable(denylist=["model_dir"])
def evaluate(model_dir: str, *, source_file: str = gin.REQUIRED,
             target_file: str = gin.REQUIRED, source_lang: str = gin.REQUIRED,
             target_lang: str = gin.REQUIRED, decoder_layers: int = 6, beam_size: int = 4,
             length_penalty: float = 0.6, max_length: int = 64, max_source_length: int = 64,
             batch_size: int = 32, step: int | None = None,
             language_tokens: Sequence[str] | None = None,
             check_only: bool = False) -> dict[str, Any]:
    """Translates `source_file` (one sentence per line) with the checkpoint in `model_dir`
    and scores it against `target_file` with sacreBLEU; returns and writes `bleu.json`.
    `check_only` validates the settings and the test files and returns (the CLI does this
    before training, so a bad file fails in seconds, not after the fine-tuning).
    `language_tokens`: the `Translation` objective's setting (the same gin macro)."""
    import sacrebleu

    from xlm_jax.data.vocab import XLMRTokenizer

    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"translate.evaluate: beam_size={beam_size!r} must be >= 1")
    sources = _read_lines(source_file, "source_file")
    references = _read_lines(target_file, "target_file")
    if len(sources) != len(references):
        raise ValueError(f"translate: {source_file} has {len(sources)} lines but {target_file} "
                         f"has {len(references)}; the files must be line-aligned")
    if language_tokens is not None:
        for what, lang in (("source_lang", source_lang), ("target_lang", target_lang)):
            if lang not in language_tokens:
                raise ValueError(f"translate: {what}={lang!r} has no language-id token "
                                 f"(language_tokens={list(language_tokens)})")
    if check_only:
        return {"sentences": len(sources)}
    cfg = md.read_config(model_dir)
    languages = md.read_languages(model_dir)
    if not languages:
        raise ValueError(f"translate: {model_dir} has no languages.txt; the translation model "
                         "names its languages through the trainer's language list")
    src_id, tgt_id = (language_index(lang, languages) for lang in (source_lang, target_lang))
    tok = XLMRTokenizer(md.find_spm(model_dir))
    objective = Translation(Transformer(cfg), decoder_layers=decoder_layers,
                            language_tokens=language_tokens, languages=languages)
    params = md.restore_subtree(md.trainer_state_dir(model_dir, step), ("params",))
    run = jax.jit(lambda p, ids: translate_batch(
        objective, p, ids, src_id, tgt_id, beam_size, length_penalty, max_length,
        tok.bos_id, tok.eos_id, tok.pad_id))
    hypotheses = []
    for start in range(0, len(sources), batch_size):
        chunk = sources[start:start + batch_size]
        ids, _ = tok.encode_batch(chunk + [""] * (batch_size - len(chunk)), max_source_length)
        out = run(params, jnp.asarray(ids))
        best = np.asarray(out.tokens)[:, 0, 1:]
        for row in best[:len(chunk)]:
            hypotheses.append(tok.decode([t for t in row if t != tok.pad_id]))
    bleu = sacrebleu.corpus_bleu(hypotheses, [references])
    result = {"bleu": bleu.score, "signature": str(bleu), "sentences": len(sources),
              "source_lang": source_lang, "target_lang": target_lang, "beam_size": beam_size,
              "length_penalty": length_penalty}
    root = md.resolve(model_dir)
    md.write_text(root / "translations.txt", "\n".join(hypotheses) + "\n")
    md.write_json(root / "bleu.json", result)
    return result


