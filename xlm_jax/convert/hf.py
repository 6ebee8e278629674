"""HF XLM-R <-> xlm_jax parameter conversion, and the xlm_jax on-disk model format.

An XLM-R-shaped model (`is_xlmr_shaped`: post-LN, absolute positions, no language table, no
cross-attention) exports as XLM-R; every other one in the self-contained format of
`xlm_jax.convert.remote` (PyTorch remote code shipped beside the weights), which
`load_hf_dir` reads too.

HF layout (`XLMRobertaForMaskedLM` / `XLMRobertaModel`): `[roberta.]embeddings.*`,
`[roberta.]encoder.layer.{i}.attention.self.{query,key,value}`, `...attention.output.dense`,
`...attention.output.LayerNorm`, `...intermediate.dense`, `...output.dense`,
`...output.LayerNorm`, `lm_head.{dense,layer_norm,bias}` with the decoder tied to the word
embeddings. torch Linear weights are [out, in]; ours are [in, (heads, head_dim)] kernels.

The xlm_jax format is a model directory (`xlm_jax.model_dir` owns its layout and its paths,
local or gs://): a config and either `params/` (an orbax checkpoint of the encoder's
parameters) or trainer checkpoints. HF directories are read and written through the same paths.
Reading never imports TensorFlow; torch is imported only to read a `pytorch_model.bin` (with
`weights_only=True`).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from xlm_jax import model_dir as md
from xlm_jax.convert.weights import HF_SPM_NAME, HF_WEIGHT_NAMES, expected_shapes
from xlm_jax.convert.weights import read_hf_weights
from xlm_jax.convert.weights import get_path as _get
from xlm_jax.convert.weights import set_path as _set
from xlm_jax.convert.weights import write_safetensors
from xlm_jax.models.config import VOCAB_PARAMS, ModelConfig

Params = dict[str, Any]


# ----------------------------------------------------------------------------- configs

def hf_config_to_model_config(hf: Mapping[str, Any], source: str = "config.json") -> ModelConfig:
    """Reads an XLM-R `config.json` dict into a `ModelConfig` (errors name the key/value)."""
    act = hf.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(f"{source}: hidden_act={act!r} is not supported (only exact 'gelu')")
    ptype = hf.get("position_embedding_type", "absolute")
    if ptype != "absolute":
        raise ValueError(f"{source}: position_embedding_type={ptype!r} is not supported "
                         "(only 'absolute')")
    try:
        return ModelConfig(
            vocab_size=int(hf["vocab_size"]), hidden_size=int(hf["hidden_size"]),
            num_layers=int(hf["num_hidden_layers"]), num_heads=int(hf["num_attention_heads"]),
            mlp_dim=int(hf["intermediate_size"]),
            max_positions=int(hf["max_position_embeddings"]),
            pad_id=int(hf.get("pad_token_id", 1)),
            type_vocab_size=int(hf.get("type_vocab_size", 1)),
            dropout_rate=float(hf.get("hidden_dropout_prob", 0.1)),
            attention_dropout_rate=float(hf.get("attention_probs_dropout_prob", 0.1)),
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
            initializer_range=float(hf.get("initializer_range", 0.02)))
    except KeyError as e:
        raise ValueError(f"{source}: missing key {e.args[0]!r}") from None


def xlmr_incompatibilities(cfg: ModelConfig) -> list[str]:
    """What keeps `cfg` from being XLM-R-shaped, one phrase per feature naming the field and
    what it is (empty: `XLMRobertaModel` computes this model exactly)."""
    out = []
    if cfg.ln_style != "post":
        out.append(f"ln_style={cfg.ln_style!r} (pre-LN layers and a final LayerNorm; XLM-R is "
                   "post-LN)")
    if cfg.position_type != "absolute":
        out.append(f"position_type={cfg.position_type!r} (the XLM-E gated relative position "
                   "bias, which XLM-R has no weights for)")
    if cfg.num_languages:
        out.append(f"num_languages={cfg.num_languages} (a language-embedding table, which "
                   "XLM-R lacks)")
    if cfg.cross_attention:
        out.append("cross_attention=True (VECO's cross-attention blocks; export the NLU "
                   "encoder, `models.reassemble.nlu_encoder`)")
    return out


def is_xlmr_shaped(cfg: ModelConfig) -> bool:
    """True when HF's `XLMRobertaModel` computes `cfg`'s model exactly."""
    return not xlmr_incompatibilities(cfg)


def model_config_to_hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """An XLM-R-compatible `config.json` for `XLMRobertaForMaskedLM`; a ValueError naming
    every feature XLM-R lacks for any other model (`xlm_jax.convert.remote` exports those)."""
    incompatible = xlmr_incompatibilities(cfg)
    if incompatible:
        raise ValueError(f"cannot export as XLM-R: {'; '.join(incompatible)}; the "
                         "self-contained format (export-hf --format xlm_jax, or the default "
                         "auto) exports it")
    return {
        "architectures": ["XLMRobertaForMaskedLM"], "model_type": "xlm-roberta",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim, "max_position_embeddings": cfg.max_positions,
        "type_vocab_size": cfg.type_vocab_size, "layer_norm_eps": cfg.layer_norm_eps,
        "hidden_act": "gelu", "hidden_dropout_prob": cfg.dropout_rate,
        "attention_probs_dropout_prob": cfg.attention_dropout_rate,
        "initializer_range": cfg.initializer_range, "pad_token_id": cfg.pad_id,
        "bos_token_id": 0, "eos_token_id": 2, "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }


# ----------------------------------------------------------------------------- mapping

def _layer_map(cfg: ModelConfig, i: int) -> list[tuple[str, str, Callable, Callable]]:
    """(ours, theirs, to_ours, to_theirs) for one layer."""
    d, h, dh = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    ours, hf = f"layers_{i}", f"encoder.layer.{i}"
    qkv_k = (lambda w: w.T.reshape(d, h, dh), lambda k: k.reshape(d, h * dh).T)
    qkv_b = (lambda b: b.reshape(h, dh), lambda b: b.reshape(h * dh))
    out_k = (lambda w: w.T.reshape(h, dh, d), lambda k: k.reshape(h * dh, d).T)
    lin = (lambda w: w.T, lambda k: k.T)
    ident = (lambda x: x, lambda x: x)
    rows = []
    for name in ("query", "key", "value"):
        rows.append((f"{ours}/attention/{name}/kernel", f"{hf}.attention.self.{name}.weight", *qkv_k))
        rows.append((f"{ours}/attention/{name}/bias", f"{hf}.attention.self.{name}.bias", *qkv_b))
    rows += [
        (f"{ours}/attention/out/kernel", f"{hf}.attention.output.dense.weight", *out_k),
        (f"{ours}/attention/out/bias", f"{hf}.attention.output.dense.bias", *ident),
        (f"{ours}/attention_norm/scale", f"{hf}.attention.output.LayerNorm.weight", *ident),
        (f"{ours}/attention_norm/bias", f"{hf}.attention.output.LayerNorm.bias", *ident),
        (f"{ours}/mlp/intermediate/kernel", f"{hf}.intermediate.dense.weight", *lin),
        (f"{ours}/mlp/intermediate/bias", f"{hf}.intermediate.dense.bias", *ident),
        (f"{ours}/mlp/output/kernel", f"{hf}.output.dense.weight", *lin),
        (f"{ours}/mlp/output/bias", f"{hf}.output.dense.bias", *ident),
        (f"{ours}/mlp_norm/scale", f"{hf}.output.LayerNorm.weight", *ident),
        (f"{ours}/mlp_norm/bias", f"{hf}.output.LayerNorm.bias", *ident),
    ]
    return rows


def parameter_map(cfg: ModelConfig, with_mlm_head: bool = True
                  ) -> list[tuple[str, str, Callable, Callable]]:
    """Every (our path, HF key without the `roberta.` prefix, to_ours, to_theirs)."""
    ident = (lambda x: x, lambda x: x)
    lin = (lambda w: w.T, lambda k: k.T)
    rows = [
        ("embeddings/word_embeddings/embedding", "embeddings.word_embeddings.weight", *ident),
        ("embeddings/position_embeddings/embedding", "embeddings.position_embeddings.weight", *ident),
        ("embeddings/token_type_embeddings/embedding", "embeddings.token_type_embeddings.weight", *ident),
        ("embeddings/LayerNorm/scale", "embeddings.LayerNorm.weight", *ident),
        ("embeddings/LayerNorm/bias", "embeddings.LayerNorm.bias", *ident),
    ]
    for i in range(cfg.num_layers):
        rows += _layer_map(cfg, i)
    if with_mlm_head:
        rows += [
            ("mlm_head/dense/kernel", "lm_head.dense.weight", *lin),
            ("mlm_head/dense/bias", "lm_head.dense.bias", *ident),
            ("mlm_head/LayerNorm/scale", "lm_head.layer_norm.weight", *ident),
            ("mlm_head/LayerNorm/bias", "lm_head.layer_norm.bias", *ident),
            ("mlm_head/bias", "lm_head.bias", *ident),
        ]
    return rows


def pad_vocab(path: str, value: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Zero rows appended to a vocabulary table of exactly `cfg.vocab_size` rows, up to
    `cfg.padded_vocab_size`; any other parameter (or size) is returned unchanged."""
    extra = cfg.padded_vocab_size - cfg.vocab_size
    if path not in VOCAB_PARAMS or extra == 0 or value.shape[0] != cfg.vocab_size:
        return value
    return np.concatenate([value, np.zeros((extra,) + value.shape[1:], value.dtype)])


def hf_state_to_params(state: Mapping[str, np.ndarray], cfg: ModelConfig,
                       source: str = "checkpoint") -> Params:
    """HF state dict (numpy) -> our nested parameter dict; shape mismatches name both shapes.
    Vocabulary tables are zero-padded when `cfg` pads the vocabulary; the layers are stacked
    when `cfg.scan_layers` (`xlm_jax.models.layer_stack`)."""
    from xlm_jax.models import layer_stack

    prefix = "roberta." if any(k.startswith("roberta.") for k in state) else ""
    has_head = "lm_head.bias" in state
    shapes = expected_shapes(cfg.replace(scan_layers=False), with_mlm_head=has_head)
    params: Params = {}
    for ours, theirs, to_ours, _ in parameter_map(cfg, with_mlm_head=has_head):
        key = theirs if theirs.startswith("lm_head.") else prefix + theirs
        if key not in state:
            raise ValueError(f"{source}: parameter {key!r} is missing (needed for {ours})")
        value = pad_vocab(ours, np.asarray(to_ours(np.asarray(state[key], np.float32))), cfg)
        if value.shape != shapes[ours]:
            raise ValueError(f"{source}: parameter {key!r} has shape {tuple(state[key].shape)} "
                             f"-> {value.shape} but the model expects {shapes[ours]} for {ours}")
        _set(params, ours, value)
    return layer_stack.to_layout(params, cfg.scan_layers)


def params_to_hf_state(params: Params, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Our parameter dict (either layer layout, `xlm_jax.models.layer_stack`) -> an
    `XLMRobertaForMaskedLM` state dict (numpy, contiguous); vocabulary padding rows are dropped
    (HF tables have exactly `vocab_size` rows)."""
    from xlm_jax.models import layer_stack

    params = layer_stack.unstack_layers(params)
    has_head = "mlm_head" in params
    state = {}
    for ours, theirs, _, to_theirs in parameter_map(cfg, with_mlm_head=has_head):
        key = theirs if theirs.startswith("lm_head.") else "roberta." + theirs
        value = np.asarray(_get(params, ours), np.float32)
        if ours in VOCAB_PARAMS:
            value = value[:cfg.vocab_size]
        state[key] = np.ascontiguousarray(to_theirs(value))
    if has_head:
        state["lm_head.decoder.bias"] = state["lm_head.bias"].copy()
    return state


# ----------------------------------------------------------------------------- files

def load_hf_dir(hf_dir: str) -> tuple[ModelConfig, Params]:
    """Config + params of an HF directory: XLM-R, or what `export-hf` wrote for any other
    model (`model_type` "xlm_jax", read by `xlm_jax.convert.remote`)."""
    path = md.resolve(hf_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: not found (an HF model directory needs config.json)")
    hf = md.read_json(path)
    from xlm_jax.convert import remote

    if remote.is_remote_config(hf):
        return remote.load_remote_dir(hf_dir)
    cfg = hf_config_to_model_config(hf, source=os.fspath(path))
    return cfg, hf_state_to_params(read_hf_weights(hf_dir), cfg, source=hf_dir)


def save_hf_dir(out_dir: str, cfg: ModelConfig, params: Params,
                spm_from: str | None = None) -> None:
    """Writes `config.json` + `model.safetensors` (+ `sentencepiece.bpe.model` when known)."""
    root = md.resolve(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    md.write_json(root / "config.json", model_config_to_hf_config(cfg))
    write_safetensors(root / "model.safetensors", params_to_hf_state(params, cfg))
    md.copy_spm(md.find_spm(spm_from) if spm_from else None, root, HF_SPM_NAME)


def save_xlm_jax(out_dir: str, cfg: ModelConfig, params: Params,
                 spm_from: str | None = None) -> None:
    """Writes the xlm_jax format: `xlm_jax_config.json` + orbax `params/`."""
    import orbax.checkpoint as ocp

    root = md.resolve(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    md.write_config(root, cfg)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(md.params_dir(root), params, force=True)
    md.copy_spm(md.find_spm(spm_from) if spm_from else None, root)


def load_xlm_jax(model_dir: str, step: int | None = None) -> tuple[ModelConfig, Params]:
    """Reads an xlm_jax model directory, or a trainer model_dir's checkpoint (`step`, default
    the latest). Only the encoder's arrays are read (`model_dir.restore_subtree`)."""
    model_dir = os.fspath(md.resolve(model_dir))
    if not md.is_model_dir(model_dir):
        raise FileNotFoundError(f"{model_dir}: not an xlm_jax model directory (no "
                                f"{md.CONFIG_NAME})")
    cfg = md.read_config(model_dir)
    params_dir = md.params_dir(model_dir)
    if step is not None and md.has_params_dir(model_dir) and not md.checkpoint_steps(model_dir):
        raise FileNotFoundError(f"{model_dir}: step {step} asked for, but this directory holds "
                                f"one set of parameters ({md.PARAMS_DIR}/) and no trainer "
                                "checkpoints: leave the step out")
    if step is not None or not md.has_params_dir(model_dir):
        params_dir = md.trainer_state_dir(model_dir, step)
    # Only the encoder's arrays are read: not the optimiser's moments, the objectives' modules
    # or their state (which a trainer checkpoint holds beside them).
    tree = md.saved_tree(params_dir)
    params = md.restore_subtree(params_dir, encoder_keys(tree), tree)
    from xlm_jax.models import layer_stack

    # In the layout the config names, whichever layout the saved parameters have.
    params = layer_stack.to_layout(params, cfg.scan_layers)
    check_params(params, cfg, source=model_dir)
    return cfg, params


def encoder_keys(tree: Mapping[str, Any]) -> tuple[str, ...]:
    """Where a saved tree keeps the encoder's parameters: ("params", "encoder") in a train
    state, ("params",) in one from before objective-owned modules (`params` held the encoder
    alone; it still loads), ("encoder",) in a `{encoder, objectives}` tree, () for encoder
    parameters themselves (an exported `params/`)."""
    keys: tuple[str, ...] = ()
    if "params" in tree and "embeddings" not in tree:
        keys, tree = ("params",), tree["params"]
    if "encoder" in tree and "embeddings" not in tree:
        keys = keys + ("encoder",)
    return keys


def check_params(params: Params, cfg: ModelConfig, source: str) -> None:
    """Raises a one-line error naming the first parameter whose shape differs from `cfg`'s."""
    want = expected_shapes(cfg, with_mlm_head="mlm_head" in params)
    import jax

    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    got = {"/".join(str(getattr(k, "key", k)) for k in path): tuple(np.shape(v)) for path, v in flat}
    for name, shape in want.items():
        if name not in got:
            raise ValueError(f"{source}: parameter {name} is missing (expected shape {shape})")
        if got[name] != shape:
            raise ValueError(f"{source}: parameter {name} has shape {got[name]} but the config "
                             f"expects {shape}")
    extra = sorted(set(got) - set(want))
    if extra:
        raise ValueError(f"{source}: unexpected parameter {extra[0]} with shape {got[extra[0]]}")


def is_hf_dir(path: str) -> bool:
    root = md.resolve(path)
    return (root / "config.json").exists() and any((root / n).exists() for n in HF_WEIGHT_NAMES)




