"""Host-side answer checking: boxed-answer extraction, multiple choice, MRA, math, and the
per-trajectory rule shared by the rollout producer and evaluation. Not jitted; the [P, G]
kernels that consume its scores live in `rl`."""

from pyvision_jax.grading.scoring import (
    SCORERS,
    GroundTruthError,
    Score,
    ScorerUnavailableError,
    extract_answer,
    get_scorer,
    math_equivalent,
    mean_relative_accuracy,
    normalize_text,
    parse_choice,
    parse_number,
    register_scorer,
    score_math,
    score_multiple_choice,
    score_numeric,
    score_response,
)

__all__ = [
    "SCORERS",
    "GroundTruthError",
    "Score",
    "ScorerUnavailableError",
    "extract_answer",
    "get_scorer",
    "math_equivalent",
    "mean_relative_accuracy",
    "normalize_text",
    "parse_choice",
    "parse_number",
    "register_scorer",
    "score_math",
    "score_multiple_choice",
    "score_numeric",
    "score_response",
]
