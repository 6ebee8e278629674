"""SentencePiece models in the XLM-R / fairseq id layout.

An XLM-R-style SentencePiece model has `<unk>`=0, `<s>`=1, `</s>`=2 and no pad piece. fairseq
(and HF `XLMRobertaTokenizer`) re-number the ids so that

    <s>=0  <pad>=1  </s>=2  <unk>=3  (real piece with spm id i >= 3) -> i + 1  <mask>=spm_size+1

and vocab_size = spm_size + 2 (XLM-R: 250000 pieces -> 250002 ids, `<mask>`=250001).

This module offers:
  * `spm_to_fairseq` / `fairseq_to_spm`: the pure numpy id maps;
  * `XLMRTokenizer`: a TensorFlow-free tokenizer (numpy + sentencepiece), for the encoder API;
  * `get_vocabulary`: a `seqio.SentencePieceVocabulary` subclass with the same layout in its
    python and TF paths (seqio/TF are imported lazily, only when it is called).

Note for seqio users: seqio's own padding (`trim_and_pad_dataset`, feature converters) pads
with 0, which is `<s>` in this layout; converters must write pad id 1 where the mask is 0.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any, Iterable, NamedTuple, Sequence

import numpy as np
import sentencepiece as spm

if TYPE_CHECKING:  # pragma: no cover
    import seqio

__all__ = [
    "SpecialIds",
    "EncodedBatch",
    "spm_to_fairseq",
    "fairseq_to_spm",
    "load_spm",
    "XLMRTokenizer",
    "get_vocabulary",
]

# SentencePiece ids of an XLM-R-style model.
SPM_UNK = 0
SPM_BOS = 1
SPM_EOS = 2
# The SentencePieceTrainer arguments that give that layout (no pad piece).
SPM_TRAINER_IDS = {"unk_id": SPM_UNK, "bos_id": SPM_BOS, "eos_id": SPM_EOS, "pad_id": -1}
# fairseq ids of the four leading specials.
BOS, PAD, EOS, UNK = 0, 1, 2, 3
# fairseq id = spm id + OFFSET for real pieces (spm id >= 3).
OFFSET = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpecialIds:
    """The special token ids of the fairseq/XLM-R layout; `mask` is spm_size + 1 (keyword-only,
    so no positional mix-up is possible)."""

    bos: int = BOS
    pad: int = PAD
    eos: int = EOS
    unk: int = UNK
    mask: int

    def as_set(self) -> frozenset[int]:
        """All special ids, e.g. to skip them when decoding."""
        return frozenset((self.bos, self.pad, self.eos, self.unk, self.mask))


class EncodedBatch(NamedTuple):
    """A padded batch: `input_ids` [B, T] int32 and `attention_mask` [B, T] int32 (1 = token)."""

    input_ids: np.ndarray
    attention_mask: np.ndarray


def _as_int_array(ids: Any, name: str) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.size == 0:
        return arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name}: ids must be integers, got dtype {arr.dtype}")
    return arr


def spm_to_fairseq(ids: np.ndarray) -> np.ndarray:
    """Maps SentencePiece ids (unk=0, bos=1, eos=2, pieces>=3) to fairseq/XLM-R ids.

    unk 0 -> 3, bos 1 -> 0, eos 2 -> 2, piece i >= 3 -> i + 1. Shape and dtype are preserved;
    negative ids raise ValueError.
    """
    arr = _as_int_array(ids, "spm_to_fairseq")
    if arr.size and arr.min() < 0:
        raise ValueError(f"spm_to_fairseq: negative SentencePiece id {int(arr.min())}")
    out = arr + OFFSET
    out = np.where(arr == SPM_UNK, UNK, out)
    out = np.where(arr == SPM_BOS, BOS, out)
    out = np.where(arr == SPM_EOS, EOS, out)
    return out.astype(arr.dtype, copy=False)


# SentencePiece's unk, bos and eos (0, 1, 2) as fairseq ids; every other piece i is i + OFFSET.
_SPM_SPECIALS_AS_FAIRSEQ = (UNK, BOS, EOS)


def spm_list_to_fairseq(ids: Sequence[int]) -> list[int]:
    """`spm_to_fairseq` of one sentence's ids as a list, in plain Python: the tokenizers call
    it per sentence, where numpy's five passes over a few dozen ids cost more than the map."""
    if ids and min(ids) < 0:
        raise ValueError(f"spm_to_fairseq: negative SentencePiece id {min(ids)}")
    specials = _SPM_SPECIALS_AS_FAIRSEQ
    return [i + OFFSET if i > SPM_EOS else specials[i] for i in ids]


def fairseq_to_spm(ids: np.ndarray, *, spm_size: int | None = None) -> np.ndarray:
    """Maps fairseq/XLM-R ids back to SentencePiece ids (inverse of `spm_to_fairseq`).

    `<s>` 0 -> 1, `</s>` 2 -> 2, `<unk>` 3 -> 0, i >= 4 -> i - 1. `<pad>` (1) and `<mask>` have no
    SentencePiece piece and raise ValueError, as do negative ids; pass `spm_size` to also reject
    ids >= spm_size + 1 (the mask and anything beyond the vocabulary).
    """
    arr = _as_int_array(ids, "fairseq_to_spm")
    if arr.size:
        if arr.min() < 0:
            raise ValueError(f"fairseq_to_spm: negative id {int(arr.min())}")
        if np.any(arr == PAD):
            raise ValueError(f"fairseq_to_spm: pad id {PAD} has no SentencePiece piece")
        if spm_size is not None and arr.max() >= spm_size + 1:
            raise ValueError(
                f"fairseq_to_spm: id {int(arr.max())} is the mask or out of range for "
                f"spm_size={spm_size} (real pieces end at {spm_size})"
            )
    out = arr - OFFSET
    out = np.where(arr == BOS, SPM_BOS, out)
    out = np.where(arr == EOS, SPM_EOS, out)
    out = np.where(arr == UNK, SPM_UNK, out)
    return out.astype(arr.dtype, copy=False)


def _check_layout(sp: spm.SentencePieceProcessor, where: str) -> None:
    got = dict(unk=sp.unk_id(), bos=sp.bos_id(), eos=sp.eos_id(), pad=sp.pad_id())
    want = dict(unk=SPM_UNK, bos=SPM_BOS, eos=SPM_EOS, pad=-1)
    if got != want:
        bad = ", ".join(f"{k}={got[k]} (want {want[k]})" for k in got if got[k] != want[k])
        raise ValueError(
            f"{where}: SentencePiece special ids do not fit the XLM-R layout "
            f"(unk=0, bos=1, eos=2, no pad): {bad}"
        )


def load_spm(spm_path: str | os.PathLike[str]) -> spm.SentencePieceProcessor:
    """Loads a SentencePiece model and checks it has the XLM-R special-id layout.

    Raises FileNotFoundError for a missing file and ValueError (naming the file and the
    offending ids) for a model that is unreadable or has other special ids.
    """
    from xlm_jax import model_dir as md  # pylint: disable=g-import-not-at-top

    path = os.fspath(spm_path)
    source = md.resolve(path)  # local or gs:// (a model directory's copy)
    if not source.is_file():
        raise FileNotFoundError(f"SentencePiece model not found: {path}")
    proto = source.read_bytes()
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(proto)
    except (RuntimeError, OSError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{path}: not a SentencePiece model ({first})") from e
    _check_layout(sp, path)
    return sp


class XLMRTokenizer:
    """A TensorFlow-free XLM-R tokenizer: SentencePiece + the fairseq id layout.

    Equal, id for id, to HF `XLMRobertaTokenizer` built from the same `.model` file.
    """

    def __init__(self, spm_path: str | os.PathLike[str]):
        self.spm_path = os.fspath(spm_path)
        self._sp = load_spm(self.spm_path)
        self.spm_size: int = self._sp.get_piece_size()
        self.special = SpecialIds(mask=self.spm_size + 1)
        self._special_set = self.special.as_set()

    @property
    def vocab_size(self) -> int:
        """spm_size + 2: the pieces, plus `<pad>` and `<mask>`."""
        return self.spm_size + 2

    @property
    def pad_id(self) -> int:
        return self.special.pad

    @property
    def eos_id(self) -> int:
        return self.special.eos

    @property
    def bos_id(self) -> int:
        return self.special.bos

    @property
    def unk_id(self) -> int:
        return self.special.unk

    @property
    def mask_id(self) -> int:
        return self.special.mask

    def encode(self, text: str) -> list[int]:
        """Tokenizes `text` to fairseq ids, without `<s>`/`</s>`."""
        if not isinstance(text, str):
            raise TypeError(f"XLMRTokenizer.encode expects str, got {type(text).__name__}")
        return spm_list_to_fairseq(self._sp.encode(text, out_type=int))

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Tokenizes `text` like `encode` and gives each piece's [start, end) CHARACTER span in
        `text`, for extractive QA (mapping predicted tokens back to the original string).

        SentencePiece's per-piece `begin`/`end` are UTF-8 BYTE offsets into the ORIGINAL
        (un-normalised) text; they are turned into character offsets here. A piece's surface
        includes the whitespace its "▁" stands for (all of it: "a  b" gives "▁b" = "  b"), so
        leading and trailing whitespace is cut from every span: spans cover only the word's
        characters, and a lone "▁" piece gets the empty span (k, k) at the start k of the word
        that follows. Pieces that normalisation created from nothing (NFKC "½" -> "1⁄2") may
        also have empty spans; spans never overlap and are non-decreasing.
        """
        if not isinstance(text, str):
            raise TypeError(
                f"XLMRTokenizer.encode_with_offsets expects str, got {type(text).__name__}"
            )
        try:  # sentencepiece 0.2.0-0.2.1: a protobuf-free view of the result
            proto = self._sp.encode(text, out_type="immutable_proto")
        except ValueError:  # newer releases dropped it for 'proto' (parsed with protobuf)
            proto = self._sp.encode(text, out_type="proto")
        pieces = list(proto.pieces)
        ids = spm_list_to_fairseq([p.id for p in pieces])
        # byte offset -> character offset: a character starts at every non-continuation byte.
        raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        byte_to_char = np.append(np.cumsum((raw & 0xC0) != 0x80) - 1, len(text))
        spans = []
        for p in pieces:
            start, end = int(byte_to_char[p.begin]), int(byte_to_char[p.end])
            while start < end and text[start].isspace():
                start += 1
            while end > start and text[end - 1].isspace():
                end -= 1
            spans.append((start, end))
        return ids, spans

    def decode(self, ids: Iterable[int]) -> str:
        """Detokenizes fairseq ids to text, skipping every special id (like HF
        `decode(skip_special_tokens=True)`, which also drops `<unk>`)."""
        arr = np.asarray(list(ids), dtype=np.int64).reshape(-1)
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
            raise ValueError(
                f"XLMRTokenizer.decode: id out of range [0, {self.vocab_size}): "
                f"{int(arr.min()) if arr.min() < 0 else int(arr.max())}"
            )
        keep = arr[~np.isin(arr, list(self._special_set))]
        return self._sp.decode(fairseq_to_spm(keep).tolist())

    def encode_batch(
        self, texts: Sequence[str], max_length: int, add_special: bool = True
    ) -> EncodedBatch:
        """Tokenizes a batch to a static [B, max_length] int32 array and its attention mask.

        With `add_special` each row is `<s> tokens </s>`; long inputs are truncated so that the
        closing `</s>` is kept. Padding uses `<pad>`=1 and mask 0. Unpacks as `(ids, mask)`.
        """
        if isinstance(texts, str):
            raise TypeError("encode_batch expects a sequence of strings, got a single str")
        n_special = 2 if add_special else 0
        if not isinstance(max_length, int) or max_length < n_special + 1:
            raise ValueError(
                f"encode_batch: max_length={max_length!r} must be an int >= {n_special + 1}"
            )
        ids = np.full((len(texts), max_length), self.pad_id, dtype=np.int32)
        mask = np.zeros((len(texts), max_length), dtype=np.int32)
        for row, text in enumerate(texts):
            toks = self.encode(text)[: max_length - n_special]
            if add_special:
                toks = [self.bos_id] + toks + [self.eos_id]
            ids[row, : len(toks)] = toks
            mask[row, : len(toks)] = 1
        return EncodedBatch(ids, mask)


# --------------------------------------------------------------------------------------------
# seqio vocabulary (lazy: seqio imports TensorFlow).

_SEQIO_CLASS: Any = None


class _NoT5PadWarning(logging.Filter):
    """Drops seqio's "T5 library uses PAD_ID=0, which is different from the sentencepiece
    vocabulary, which defines pad_id=-1" warning. XLM-R's SentencePiece model has no pad piece
    by design (`<pad>`=1 is added outside it, see the layout above), so the warning, printed
    at every run, would only mislead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("T5 library uses PAD_ID")


def _seqio_class() -> type:
    """Builds (once) the seqio.SentencePieceVocabulary subclass with the fairseq layout."""
    global _SEQIO_CLASS
    if _SEQIO_CLASS is not None:
        return _SEQIO_CLASS
    import seqio  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    logging.getLogger("absl").addFilter(_NoT5PadWarning())  # seqio logs through absl

    class XLMRSentencePieceVocabulary(seqio.SentencePieceVocabulary):
        """seqio SentencePieceVocabulary with XLM-R/fairseq ids in python and TF paths.

        ids: `<s>`=0 `<pad>`=1 `</s>`=2 `<unk>`=3, pieces shifted by one, `<mask>`=spm_size+1.
        `decode`/`decode_tf` stop at the first `</s>` (seqio convention) and drop specials.
        """

        def __init__(self, sentencepiece_model_file: str):
            path = os.fspath(sentencepiece_model_file)
            if not tf.io.gfile.exists(path):  # gfile: local, gs://, ... like seqio itself
                raise FileNotFoundError(f"SentencePiece model not found: {path}")
            super().__init__(path, extra_ids=0)
            try:
                tokenizer = self.tokenizer
            except Exception as e:  # pylint: disable=broad-except
                first = (str(e).splitlines() or [type(e).__name__])[0]
                raise ValueError(f"{path}: not a SentencePiece model ({first})") from None
            _check_layout(tokenizer, path)  # a clear one-line error for other layouts

        @property
        def spm_size(self) -> int:
            return self.tokenizer.GetPieceSize()

        @property
        def _base_vocab_size(self) -> int:
            return self.spm_size + 2

        @property
        def bos_id(self) -> int:
            return BOS

        @property
        def pad_id(self) -> int:
            return PAD

        @property
        def eos_id(self) -> int:
            return EOS

        @property
        def unk_id(self) -> int:
            return UNK

        @property
        def mask_id(self) -> int:
            return self.spm_size + 1

        @property
        def special(self) -> SpecialIds:
            return SpecialIds(mask=self.mask_id)

        def _encode(self, s: str) -> Sequence[int]:
            return spm_list_to_fairseq(self.tokenizer.EncodeAsIds(s))

        def _decode(self, ids: Iterable[int]) -> str:
            arr = np.asarray([int(i) for i in ids], dtype=np.int64)
            arr = arr[(arr > UNK) & (arr < self.mask_id)]
            return self.tokenizer.DecodeIds(fairseq_to_spm(arr).tolist())

        @property
        def tf_tokenizer(self):
            """The TF SentencePiece tokenizer, built once per vocabulary and outside any graph.

            seqio builds a new one on every access; inside a traced function that puts the
            model proto (an op attribute, ~370 KB for the demo) into the graph, and every
            instantiation of that graph copies the attribute and loads its own processor.
            A many-task mixture instantiates its tokenizing functions once per Task, so they
            now capture this one eagerly created resource instead (same op, same ids).
            """
            tokenizer = self.__dict__.get("_xlm_jax_tf_tokenizer")
            if tokenizer is None:
                with tf.init_scope():  # eager even when first reached while tracing
                    tokenizer = super().tf_tokenizer
                self.__dict__["_xlm_jax_tf_tokenizer"] = tokenizer
            return tokenizer

        def __getstate__(self):
            state = super().__getstate__()
            state.pop("_xlm_jax_tf_tokenizer", None)  # a TF resource: rebuilt lazily
            return state

        def _encode_tf(self, s: "tf.Tensor") -> "tf.Tensor":
            def remap(x):
                return tf.where(
                    tf.equal(x, SPM_UNK),
                    tf.constant(UNK, x.dtype),
                    tf.where(tf.equal(x, SPM_BOS), tf.constant(BOS, x.dtype), x + OFFSET),
                )

            # Plain input text never yields spm bos/eos, but keep the map complete.
            ids = self.tf_tokenizer.tokenize(s)
            if isinstance(ids, tf.RaggedTensor):
                return tf.ragged.map_flat_values(remap, ids)
            return remap(ids)

        def _decode_tf(self, ids: "tf.Tensor") -> "tf.Tensor":
            ids = tf.convert_to_tensor(ids)
            keep = tf.logical_and(tf.greater(ids, UNK), tf.less(ids, self.mask_id))
            ragged = tf.ragged.boolean_mask(ids, keep)
            return self.tf_tokenizer.detokenize(ragged - OFFSET)

        def __str__(self) -> str:
            return f"XLMRSentencePieceVocabulary(file={self.sentencepiece_model_file})"

    XLMRSentencePieceVocabulary.__module__ = __name__
    XLMRSentencePieceVocabulary.__qualname__ = "XLMRSentencePieceVocabulary"
    _SEQIO_CLASS = XLMRSentencePieceVocabulary
    return _SEQIO_CLASS


def __getattr__(name: str) -> Any:
    # Lets pickle (and users) find the lazily built class as `vocab.XLMRSentencePieceVocabulary`
    # without importing seqio/TensorFlow when this module is imported.
    if name == "XLMRSentencePieceVocabulary":
        return _seqio_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_vocabulary(spm_path: str) -> "seqio.Vocabulary":
    """Returns a seqio vocabulary for an XLM-R-layout SentencePiece model.

    vocab_size = spm_size + 2, bos_id=0, pad_id=1, eos_id=2, unk_id=3, `mask_id`=spm_size+1.
    Imports seqio (and so TensorFlow) on first use only.
    """
    return _seqio_class()(os.fspath(spm_path))
