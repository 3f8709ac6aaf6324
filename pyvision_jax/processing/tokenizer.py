"""The tiny tokenizer shipped with the package (for the tiny test model).

Real checkpoints use their own tokenizer (`transformers.AutoTokenizer.from_pretrained(dir)`);
everything else in the project only relies on the Qwen2.5-VL special tokens and chat template,
which the tiny tokenizer shares (at ids 2000..2021 instead of 151643..151664).
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerFast

TINY_TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "assets" / "tiny_tokenizer"


def load_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Loads the packaged tiny byte-level BPE tokenizer (vocab 2,022) with AutoTokenizer."""
    if not (TINY_TOKENIZER_DIR / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"tiny tokenizer files missing in {TINY_TOKENIZER_DIR}; rebuild them with "
            "`python scripts/build_tiny_tokenizer.py`"
        )
    return AutoTokenizer.from_pretrained(str(TINY_TOKENIZER_DIR))
