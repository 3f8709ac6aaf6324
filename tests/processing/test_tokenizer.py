"""The packaged tiny tokenizer: loading, special ids, round trips, chat template, rebuild."""

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from pyvision_jax.processing.tokenizer import TINY_TOKENIZER_DIR

QWEN_SPECIAL_IDS = {
    "<|endoftext|>": 2000,
    "<|im_start|>": 2001,
    "<|im_end|>": 2002,
    "<|object_ref_start|>": 2003,
    "<|object_ref_end|>": 2004,
    "<|box_start|>": 2005,
    "<|box_end|>": 2006,
    "<|quad_start|>": 2007,
    "<|quad_end|>": 2008,
    "<|vision_start|>": 2009,
    "<|vision_end|>": 2010,
    "<|vision_pad|>": 2011,
    "<|image_pad|>": 2012,
    "<|video_pad|>": 2013,
    "<tool_call>": 2014,
    "</tool_call>": 2015,
    "<|fim_prefix|>": 2016,
    "<|fim_middle|>": 2017,
    "<|fim_suffix|>": 2018,
    "<|fim_pad|>": 2019,
    "<|repo_name|>": 2020,
    "<|file_sep|>": 2021,
}

PROTOCOL_TEXTS = [
    "I need to zoom into the top-left region.\n<code>\n```python\nfrom PIL import Image\n"
    "crop = image_clue_0.crop((10, 20, 310, 220))\nplt.imshow(crop)\nplt.show()\n```\n</code>",
    "<answer>\n\\boxed{B}\n</answer>",
    "<tool_response>\n<interpreter>\nText Result:\n42 17.5\nImage Result:\n<image_clue_1>"
    "<|vision_start|><|image_pad|><|vision_end|></image_clue_1></interpreter>\n\n</tool_response>",
    "frames = video_clue_0.get_batch([0, 30, 60]).asnumpy()\n    print(frames.shape)  \n\n\n",
    "How many red circles are there?\nOptions:\n(A) 3\n(B) 4\n",
    "<|im_start|>user\nWhat colour?<|im_end|>\n<|im_start|>assistant\n",
]


def test_loads_with_auto_tokenizer_and_has_exact_special_ids(tokenizer):
    direct = AutoTokenizer.from_pretrained(str(TINY_TOKENIZER_DIR))
    assert len(tokenizer) == len(direct) == 2022
    for content, token_id in QWEN_SPECIAL_IDS.items():
        assert tokenizer.convert_tokens_to_ids(content) == token_id
        assert tokenizer.encode(content) == [token_id]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2002
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 2000
    assert max(tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False).values()) == 1999


@pytest.mark.parametrize("text", PROTOCOL_TEXTS)
def test_protocol_text_round_trips_and_is_compressed(tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert len(ids) < 0.6 * len(text.encode("utf-8"))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=64))
def test_any_unicode_string_round_trips(tokenizer, text):
    ids = tokenizer.encode(text)
    assert all(0 <= token_id < 2022 for token_id in ids)
    assert tokenizer.decode(ids) == text


def test_skip_special_tokens_drops_qwen_specials_only(tokenizer):
    ids = tokenizer.encode("<|im_start|>a<|image_pad|><tool_call>b<|im_end|>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a<tool_call>b"


def test_chat_template_is_qwen2_5_vl(tokenizer):
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is the star?"}]},
        {"role": "assistant", "content": "<answer>\n\\boxed{red}\n</answer>"},
        {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Count."}]},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What colour is the star?"
        "<|im_end|>\n<|im_start|>assistant\n<answer>\n\\boxed{red}\n</answer><|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>Count.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    with_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(with_system, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )
    ids = tokenizer.apply_chat_template(messages[:1], tokenize=True, add_generation_prompt=True, return_dict=False)
    assert ids[-4:] == [2001] + tokenizer.encode("assistant\n")
    assert ids.count(2012) == 1


def test_rebuilding_gives_identical_files(tmp_path: Path):
    script = Path(__file__).resolve().parents[2] / "scripts" / "build_tiny_tokenizer.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path)], check=True, capture_output=True)
    written = sorted(tmp_path.iterdir())
    assert sorted(path.name for path in written) == sorted(path.name for path in TINY_TOKENIZER_DIR.iterdir())
    for path in written:
        assert path.read_bytes() == (TINY_TOKENIZER_DIR / path.name).read_bytes(), path.name
