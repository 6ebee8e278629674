"""Evaluation metrics of the XTREME-style tasks, pure Python (no jax, no TensorFlow), each a
library function and a CLI printing one JSON object with 0-100 scores:

    python -m xlm_jax.evaluation.metrics {squad,mlqa,seqeval,aer,bucc} --gold FILE --pred FILE
"""
from xlm_jax.evaluation.metrics.alignment import aer_files, aer_scores, parse_links
from xlm_jax.evaluation.metrics.bucc_f1 import bucc_files, bucc_scores, parse_pairs, read_pairs
from xlm_jax.evaluation.metrics.seqeval import (extract_chunks, read_conll, seqeval_files,
                                                seqeval_scores)
from xlm_jax.evaluation.metrics.squad import (MLQA_LANGUAGES, load_json, mlqa_evaluate,
                                              mlqa_evaluate_files, mlqa_normalize_answer,
                                              normalize_answer, squad_evaluate,
                                              squad_evaluate_files)

__all__ = [
    "MLQA_LANGUAGES", "aer_files", "aer_scores", "bucc_files", "bucc_scores", "extract_chunks",
    "load_json", "mlqa_evaluate", "mlqa_evaluate_files", "mlqa_normalize_answer",
    "normalize_answer", "parse_links", "parse_pairs", "read_conll", "read_pairs",
    "seqeval_files", "seqeval_scores", "squad_evaluate", "squad_evaluate_files",
]
