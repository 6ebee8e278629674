"""The self-contained HF format: any xlm_jax encoder as a `transformers` model with remote code.

HF's `XLMRobertaModel` computes only XLM-R-shaped models (`hf.is_xlmr_shaped`). Every other
model the library trains (pre-LN, XLM-E's gated relative position bias, language embeddings,
VECO's NLU encoder) is written as a directory that loads offline with
`AutoModel.from_pretrained(dir, trust_remote_code=True)`:

- `config.json`: `model_type` "xlm_jax", `auto_map` (AutoConfig / AutoModel /
  AutoModelForMaskedLM -> the two files below), the sizes under XLM-R's names where they mean
  the same (`num_hidden_layers`, `intermediate_size`, ...), xlm_jax's own switches
  (`ln_style`, `position_type`, `num_languages`, ...), the `languages` of `lang_ids`, and
  `xlm_jax_config`: the whole `ModelConfig`, so that `import-hf` restores it exactly;
- `configuration_xlm_jax.py`, `modeling_xlm_jax.py`: the PyTorch model
  (`xlm_jax.convert.hf_remote`), copied unchanged;
- `model.safetensors`: float32 weights under the torch module names;
- `sentencepiece.bpe.model` and `languages.txt` when the source directory has them.

Names: the path component `layers_{i}` becomes `layers.{i}`, `rel_pos_{i}` becomes
`rel_pos_layers.{i}`, `mlm_head` becomes `lm_head`, a leaf `kernel`/`scale`/`embedding`
becomes `weight`, and with an MLM head (`XlmJaxForMaskedLM`) the encoder's keys start with
`model.`. Kernels become torch Linear weights [out, in] (query/key/value [D, H, Dh] ->
[H*Dh, D], the attention output [H, Dh, D] -> [D, H*Dh]); [H, Dh] biases are flattened; the
rest is stored as is. The word-embedding table keeps its vocabulary-padding rows
(`padded_vocab_size`), so `import-hf` gives back exactly the exported parameters.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xlm_jax import model_dir as md
from xlm_jax.convert import weights
from xlm_jax.convert import hf_remote
from xlm_jax.models import layer_stack
from xlm_jax.models.config import ModelConfig

Params = dict[str, Any]
MODEL_TYPE = "xlm_jax"
WEIGHTS_NAME = "model.safetensors"
HEAD_PREFIX = "model."  # `XlmJaxForMaskedLM.base_model_prefix` + "."
AUTO_MAP = {
    "AutoConfig": "configuration_xlm_jax.XlmJaxConfig",
    "AutoModel": "modeling_xlm_jax.XlmJaxModel",
    "AutoModelForMaskedLM": "modeling_xlm_jax.XlmJaxForMaskedLM",
}
# (ModelConfig field, config.json key): the fields the PyTorch model reads.
HF_FIELDS = (
    ("vocab_size", "vocab_size"), ("hidden_size", "hidden_size"),
    ("num_layers", "num_hidden_layers"), ("num_heads", "num_attention_heads"),
    ("mlp_dim", "intermediate_size"), ("max_positions", "max_position_embeddings"),
    ("pad_id", "pad_token_id"), ("type_vocab_size", "type_vocab_size"),
    ("num_languages", "num_languages"), ("ln_style", "ln_style"),
    ("position_type", "position_type"), ("relative_buckets", "relative_buckets"),
    ("relative_max_distance", "relative_max_distance"),
    ("share_relative_table", "share_relative_table"), ("dropout_rate", "hidden_dropout_prob"),
    ("attention_dropout_rate", "attention_probs_dropout_prob"),
    ("layer_norm_eps", "layer_norm_eps"), ("initializer_range", "initializer_range"),
)
_NUMBERED = re.compile(r"^(layers|rel_pos)_(\d+)$")


def is_remote_config(hf: Mapping[str, Any]) -> bool:
    """True for the `config.json` of a directory this module wrote."""
    return hf.get("model_type") == MODEL_TYPE


# ----------------------------------------------------------------------------- configs

def remote_config(cfg: ModelConfig, with_mlm_head: bool,
                  languages: Sequence[str] | None = None) -> dict[str, Any]:
    """The `config.json` of an exported model (`XlmJaxForMaskedLM` when it has its MLM head,
    else `XlmJaxModel`); `languages`: the codes of `lang_ids` 1, 2, ..."""
    if cfg.cross_attention:
        raise ValueError("cross_attention=True: export the VECO NLU encoder "
                         "(xlm_jax.models.reassemble.nlu_encoder), the remote model has no "
                         "cross-attention")
    out: dict[str, Any] = {
        "architectures": ["XlmJaxForMaskedLM" if with_mlm_head else "XlmJaxModel"],
        "model_type": MODEL_TYPE, "auto_map": dict(AUTO_MAP),
    }
    out.update({theirs: getattr(cfg, ours) for ours, theirs in HF_FIELDS})
    out.update(padded_vocab_size=cfg.padded_vocab_size, hidden_act="gelu", bos_token_id=0,
               eos_token_id=2, tie_word_embeddings=False,
               languages=list(languages) if languages else None,
               xlm_jax_config=cfg.to_dict())
    return out


def config_from_remote(hf: Mapping[str, Any], source: str = "config.json") -> ModelConfig:
    """The `ModelConfig` of an exported `config.json`: `xlm_jax_config` with the fields the
    PyTorch model reads taken from the config's own keys (which a user may have edited);
    errors name the key."""
    saved = dict(hf.get("xlm_jax_config") or {})
    unknown = sorted(set(saved) - set(ModelConfig.__dataclass_fields__))
    if unknown:
        raise ValueError(f"{source}: xlm_jax_config has unknown ModelConfig field(s) {unknown}")
    fields = {}
    for ours, theirs in HF_FIELDS:
        if theirs in hf:
            fields[ours] = hf[theirs]
        elif ours not in saved:
            raise ValueError(f"{source}: missing key {theirs!r}")
    if hf.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"{source}: hidden_act={hf['hidden_act']!r} is not supported (only "
                         "exact 'gelu')")
    try:
        cfg = ModelConfig(**{**saved, **fields})
    except (TypeError, ValueError) as e:
        raise ValueError(f"{source}: {e}") from None
    if cfg.cross_attention:
        raise ValueError(f"{source}: cross_attention=True, but the exported model has no "
                         "cross-attention blocks")
    padded = hf.get("padded_vocab_size", cfg.vocab_size)
    if padded != cfg.padded_vocab_size:
        raise ValueError(f"{source}: padded_vocab_size={padded}, but vocab_size="
                         f"{cfg.vocab_size} with pad_vocab_to_multiple_of="
                         f"{cfg.pad_vocab_to_multiple_of} gives {cfg.padded_vocab_size} rows")
    return cfg


# ----------------------------------------------------------------------------- weights

def torch_key(path: str) -> str:
    """The torch state-dict key of our parameter `path` (without the `model.` prefix)."""
    first, *rest = path.split("/")
    numbered = _NUMBERED.match(first)
    if numbered:
        first = f"{'layers' if numbered[1] == 'layers' else 'rel_pos_layers'}.{numbered[2]}"
    elif first == "mlm_head":
        first = "lm_head"
    if rest and rest[-1] in ("kernel", "scale", "embedding"):
        rest[-1] = "weight"
    return ".".join([first, *rest])


def _contracted(path: str) -> int:
    """How many leading axes of a kernel are its inputs (2 for the attention output's
    [H, Dh, D], else 1)."""
    return 2 if path.endswith("attention/out/kernel") else 1


def torch_shape(path: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape our parameter of `shape` has in the torch state dict."""
    leaf = path.rsplit("/", 1)[-1]
    if leaf == "kernel":
        c = _contracted(path)
        return (int(np.prod(shape[c:])), int(np.prod(shape[:c])))
    if leaf == "bias":
        return (int(np.prod(shape)),)
    return tuple(shape)


def to_torch(path: str, value: np.ndarray) -> np.ndarray:
    """Our parameter -> its torch tensor's layout (contiguous float32)."""
    value = np.asarray(value, np.float32)
    leaf = path.rsplit("/", 1)[-1]
    if leaf == "kernel":
        value = value.reshape(int(np.prod(value.shape[:_contracted(path)])), -1).T
    elif leaf == "bias":
        value = value.reshape(-1)
    return np.ascontiguousarray(value)


def from_torch(path: str, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A torch tensor's values -> our parameter of `shape` (the inverse of `to_torch`)."""
    value = np.asarray(value)
    if path.rsplit("/", 1)[-1] == "kernel":
        value = value.T
    return value.reshape(shape)


def params_to_remote_state(params: Params, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Our encoder parameters (either layer layout) -> the state dict of `XlmJaxForMaskedLM`
    (with `mlm_head`) or `XlmJaxModel`; parameters other than `cfg`'s model has are an error."""
    params = layer_stack.unstack_layers(params)
    with_head = "mlm_head" in params
    flat = weights.flatten(params)
    want = weights.expected_shapes(cfg.replace(scan_layers=False), with_mlm_head=with_head)
    extra = sorted(set(flat) - set(want))
    if extra:
        raise ValueError(f"parameter {extra[0]} is not part of the model the config describes")
    state = {}
    for path, shape in want.items():
        if path not in flat:
            raise ValueError(f"parameter {path} is missing (expected shape {shape})")
        key = torch_key(path)
        if with_head and not key.startswith("lm_head."):
            key = HEAD_PREFIX + key
        state[key] = to_torch(path, flat[path])
    return state


def remote_state_to_params(state: Mapping[str, np.ndarray], cfg: ModelConfig,
                           source: str = "checkpoint") -> Params:
    """A state dict of `XlmJaxModel` or `XlmJaxForMaskedLM` -> our parameters, in
    `cfg.param_dtype` and the layer layout `cfg.scan_layers` names; a missing, unexpected or
    misshapen tensor is a one-line error naming it."""
    state = {k[len(HEAD_PREFIX):] if k.startswith(HEAD_PREFIX) else k: v for k, v in state.items()}
    with_head = "lm_head.bias" in state
    want = weights.expected_shapes(cfg.replace(scan_layers=False), with_mlm_head=with_head)
    by_key = {torch_key(path): path for path in want}
    extra = sorted(set(state) - set(by_key))
    if extra:
        raise ValueError(f"{source}: unexpected parameter {extra[0]!r} with shape "
                         f"{tuple(np.shape(state[extra[0]]))} for this config")
    dtype = np.dtype(cfg.params_dtype)
    params: Params = {}
    for key, path in by_key.items():
        if key not in state:
            raise ValueError(f"{source}: parameter {key!r} is missing (needed for {path})")
        expected = torch_shape(path, want[path])
        if tuple(np.shape(state[key])) != expected:
            raise ValueError(f"{source}: parameter {key!r} has shape "
                             f"{tuple(np.shape(state[key]))} but the config expects {expected} "
                             f"(for {path} of shape {want[path]})")
        weights.set_path(params, path, from_torch(path, state[key], want[path]).astype(dtype))
    return layer_stack.to_layout(params, cfg.scan_layers)


# ----------------------------------------------------------------------------- directories

def save_remote_dir(out_dir: str, cfg: ModelConfig, params: Params, spm_from: str | None = None,
                    languages: Sequence[str] | None = None) -> None:
    """Writes the self-contained directory (this module's docstring lists its files); the
    weights are converted, and so checked against `cfg`, before anything is written."""
    state = params_to_remote_state(params, cfg)
    config = remote_config(cfg, with_mlm_head="lm_head.bias" in state, languages=languages)
    root = md.resolve(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    md.write_json(root / "config.json", config)
    for name in hf_remote.TEMPLATE_FILES:
        md.write_text(root / name, hf_remote.template_text(name))
    weights.write_safetensors(root / WEIGHTS_NAME, state)
    md.copy_spm(md.find_spm(spm_from) if spm_from else None, root, weights.HF_SPM_NAME)
    if languages:
        md.write_languages(root, languages)


def load_remote_dir(hf_dir: str) -> tuple[ModelConfig, Params]:
    """Config + parameters of a directory `save_remote_dir` wrote (or that `save_pretrained`
    of its PyTorch model wrote after fine-tuning)."""
    path = md.resolve(hf_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: not found (an HF model directory needs config.json)")
    cfg = config_from_remote(md.read_json(path), source=os.fspath(path))
    params = remote_state_to_params(weights.read_hf_weights(hf_dir), cfg, source=hf_dir)
    return cfg, params
