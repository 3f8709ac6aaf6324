"""The released SFT schema: loading, writing, and errors naming the row and the field."""

import json

import pytest
from PIL import Image

from pyvision_jax.data.sft_rows import SftFormatError, load_sft_rows, write_sft_rows

FIRST = "<image_clue_0><image></image_clue_0>\n\nHow many dots?"
TOOL = (
    "<tool_response>\n<interpreter>\nText Result:\n3\nImage Result:\n<image_clue_1><image></image_clue_1></interpreter>"
    "\n\n</tool_response>"
)


def _row(images=("a.png", "b.png"), roles=("user", "assistant", "user", "assistant")):
    contents = (FIRST, "<code>\n```python\nprint(3)\n```\n</code>", TOOL, "<answer>\n\\boxed{3}\n</answer>")
    return {
        "conversations": [{"role": r, "content": c} for r, c in zip(roles, contents)],
        "images": list(images),
        "source_dataset": "hand_made",
    }


@pytest.fixture
def folder(tmp_path):
    for name in ("a.png", "b.png"):
        Image.new("RGB", (64, 48), (200, 10, 10)).save(tmp_path / name)
    return tmp_path


def _write(folder, rows, name="sft.jsonl"):
    path = folder / name
    if name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        path.write_text(json.dumps(rows))
    return path


@pytest.mark.parametrize("name", ["sft.jsonl", "sft.json"])
def test_loads_rows_with_images_relative_to_the_file(folder, name):
    rows = load_sft_rows(_write(folder, [_row(), _row(images=("b.png", "a.png"))], name))
    assert len(rows) == 2
    assert [m.role for m in rows[0].messages] == ["user", "assistant", "user", "assistant"]
    assert rows[0].messages[2].content == TOOL
    assert rows[1].image_paths == (str(folder / "b.png"), str(folder / "a.png"))
    assert rows[0].source_dataset == "hand_made"


def test_write_then_load_is_the_same_rows(folder):
    rows = load_sft_rows(_write(folder, [_row()]))
    out = folder / "copy.jsonl"
    write_sft_rows(out, rows)
    assert json.loads(out.read_text()) == _row()
    assert load_sft_rows(out)[0].messages == rows[0].messages


@pytest.mark.parametrize(
    "row, message",
    [
        (_row(images=("a.png",)), r"line 2: field images: 1 images for 2 <image> placeholders"),
        (_row(images=("a.png", "missing.png")), r"line 2: field images\[1\]: image file 'missing.png' not found"),
        (
            _row(roles=("user", "assistant", "tool", "assistant")),
            r"line 2: field conversations\[2\].role: unknown role 'tool'",
        ),
        ({"images": []}, r"line 2: field conversations: expected a non-empty list"),
    ],
)
def test_malformed_rows_name_the_row_and_field(folder, row, message):
    path = _write(folder, [_row(), row])
    with pytest.raises(SftFormatError, match=message) as caught:
        load_sft_rows(path)
    assert str(path) in str(caught.value)
