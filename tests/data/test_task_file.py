"""Loading a task file through the config: skipped rows are reported, never silent."""

import json
import logging

import pytest
from PIL import Image

from pyvision_jax import wiring
from tests.tiny_random_cpu import get_config


def test_skipped_rows_are_reported_with_count_and_reasons(tmp_path, caplog):
    Image.new("RGB", (32, 32)).save(tmp_path / "a.png")
    rows = [
        {"id": "1", "question": "?", "answer": "A", "image_path": "a.png"},
        {"id": "2", "question": "?", "answer": "A", "image_path": "missing.png"},
    ]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    config = get_config()
    config.data.skip_bad_rows = True
    with caplog.at_level(logging.WARNING):
        tasks = wiring.task_file(config, tmp_path / "t.jsonl")
    assert [t.id for t in tasks] == ["1"]
    assert "skipped 1 bad row(s) of 2" in caplog.text and "missing.png" in caplog.text


def test_a_file_whose_rows_are_all_bad_is_an_error_naming_it(tmp_path):
    (tmp_path / "t.jsonl").write_text(
        json.dumps({"id": "1", "question": "?", "answer": "A", "image_path": "missing.png"}) + "\n"
    )
    config = get_config()
    config.data.skip_bad_rows = True
    with pytest.raises(ValueError, match=r"t.jsonl: no usable tasks \(1 row\(s\) skipped\)"):
        wiring.task_file(config, tmp_path / "t.jsonl")
