"""HF XLM-R <-> xlm_jax parameter conversion, and the xlm_jax on-disk model format.

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
from xlm_jax.models.config import VOCAB_PARAMS, ModelConfig

HF_WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin")
HF_SPM_NAME = "sentencepiece.bpe.model"

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


def model_config_to_hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """An XLM-R-compatible `config.json` for `XLMRobertaForMaskedLM`."""
    incompatible = {k: v for k, v in (("ln_style", "post"), ("position_type", "absolute"),
                                      ("num_languages", 0), ("cross_attention", False))
                    if getattr(cfg, k) != v}
    if incompatible:
        bad = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in incompatible)
        why = (" (HF XLM-R has no gated relative position bias: an XLM-E discriminator loads "
               "with xlm_jax.load_encoder only)" if "position_type" in incompatible else "")
        raise ValueError(f"cannot export to XLM-R: {bad} has no XLM-R equivalent{why}")
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


def _set(tree: Params, path: str, value: Any) -> None:
    *parents, leaf = path.split("/")
    for p in parents:
        tree = tree.setdefault(p, {})
    tree[leaf] = value


def _get(tree: Mapping[str, Any], path: str) -> Any:
    for p in path.split("/"):
        tree = tree[p]
    return tree


def expected_shapes(cfg: ModelConfig, with_mlm_head: bool = True) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of our model for `cfg`, by path (computed without allocating)."""
    import jax
    import flax.linen as nn

    from xlm_jax.models.transformer import Transformer

    model = Transformer(cfg, with_mlm_head=with_mlm_head)
    ids = jax.ShapeDtypeStruct((1, 4), np.int32)
    # A model with language embeddings needs lang_ids to create its table.
    lang = (lambda i: {"lang_ids": i}) if cfg.num_languages else (lambda i: {})
    shapes = jax.eval_shape(
        lambda i: nn.meta.unbox(model.init(jax.random.PRNGKey(0), i, **lang(i))), ids)["params"]
    flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
    return {"/".join(k.key for k in path): tuple(v.shape) for path, v in flat}


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

def read_hf_weights(hf_dir: str) -> dict[str, np.ndarray]:
    """Reads `model.safetensors` or `pytorch_model.bin` (torch, `weights_only=True`); local
    files are memory-mapped, gs:// ones read whole."""
    root = md.resolve(hf_dir)
    st = root / "model.safetensors"
    if st.exists():
        from safetensors.numpy import load, load_file

        return load(st.read_bytes()) if md.is_remote(st) else load_file(os.fspath(st))
    binf = root / "pytorch_model.bin"
    if binf.exists():
        import torch

        with binf.open("rb") as f:
            sd = torch.load(f, map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in sd.items()}
    raise FileNotFoundError(f"{hf_dir}: no weights found (looked for {', '.join(HF_WEIGHT_NAMES)})")


def load_hf_dir(hf_dir: str) -> tuple[ModelConfig, Params]:
    """Config + params of an HF XLM-R directory."""
    path = md.resolve(hf_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: not found (an HF model directory needs config.json)")
    cfg = hf_config_to_model_config(md.read_json(path), source=os.fspath(path))
    return cfg, hf_state_to_params(read_hf_weights(hf_dir), cfg, source=hf_dir)


def save_hf_dir(out_dir: str, cfg: ModelConfig, params: Params,
                spm_from: str | None = None) -> None:
    """Writes `config.json` + `model.safetensors` (+ `sentencepiece.bpe.model` when known)."""
    from safetensors.numpy import save, save_file

    root = md.resolve(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    md.write_json(root / "config.json", model_config_to_hf_config(cfg))
    state, meta = params_to_hf_state(params, cfg), {"format": "pt"}
    weights = root / "model.safetensors"
    if md.is_remote(weights):
        weights.write_bytes(save(state, metadata=meta))
    else:
        save_file(state, os.fspath(weights), metadata=meta)
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
    the latest)."""
    import orbax.checkpoint as ocp

    model_dir = os.fspath(md.resolve(model_dir))
    cfg = md.read_config(model_dir)
    params_dir = md.params_dir(model_dir)
    if step is not None or not md.has_params_dir(model_dir):
        params_dir = md.trainer_state_dir(model_dir, step)
    with ocp.StandardCheckpointer() as ckptr:
        params = ckptr.restore(params_dir)
    from xlm_jax.models import layer_stack

    # In the layout the config names, whichever layout the saved parameters have.
    params = layer_stack.to_layout(encoder_subtree(params), cfg.scan_layers)
    check_params(params, cfg, source=model_dir)
    return cfg, params


def encoder_subtree(tree: Mapping[str, Any]) -> Params:
    """The encoder's parameters of a saved tree: a train state (`params/encoder/...`; before
    objective-owned modules, `params/...` held the encoder alone and still loads), a
    `{encoder, objectives}` params tree, or encoder parameters themselves."""
    if "params" in tree and "embeddings" not in tree:
        tree = tree["params"]
    if "encoder" in tree and "embeddings" not in tree:
        tree = tree["encoder"]
    return tree


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




