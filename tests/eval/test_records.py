"""The evaluation directory's files: images stored once each in media/ (large ones as a
preview), and trajectories.jsonl read task by task."""

import io
import json

import numpy as np
from PIL import Image

from pyvision_jax.eval.records import (
    MEDIA_DIR,
    PREVIEW_SIDE,
    MediaFiles,
    finished_tasks,
    iter_finished,
    rewrite_jsonl,
)


def png(width, height, seed=0):
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_each_distinct_image_is_one_file_and_a_large_one_a_preview(tmp_path):
    media = MediaFiles(tmp_path)
    small, other, large = png(64, 48), png(64, 48, seed=1), png(1200, 900)
    paths = [media.store(small), media.store(other), media.store(small), media.store(large), media.store(large)]
    assert paths[0] == paths[2] and paths[3] == paths[4] and len(set(paths)) == 3
    assert sorted(p.name for p in (tmp_path / MEDIA_DIR).iterdir()) == sorted({p.split("/")[1] for p in paths})
    assert (tmp_path / paths[0]).read_bytes() == small  # the PNG the model saw, byte for byte
    with Image.open(tmp_path / paths[3]) as preview:
        assert preview.format == "JPEG" and preview.size == (PREVIEW_SIDE, PREVIEW_SIDE * 3 // 4)
    # another evaluation writer on the same directory reuses the files
    assert MediaFiles(tmp_path).store(large) == paths[3]


def record(task_id, index):
    return {"task_id": task_id, "rollout_index": index, "correct": index == 0}


def test_finished_tasks_are_streamed_and_the_rest_rewritten_away(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    lines = [record("a", 0), record("a", 1), record("b", 1), record("c", 1), record("c", 0), record("b", 5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"task_id": "d", "rollo')
    assert finished_tasks(path, 2) == (["a", "c"], True)
    tasks = iter_finished(path, 2)
    assert next(tasks) == [record("a", 0), record("a", 1)]
    assert next(tasks) == [record("c", 0), record("c", 1)]
    assert list(tasks) == []
    rewrite_jsonl(path, (r for records in iter_finished(path, 2) for r in records))
    assert finished_tasks(path, 2) == (["a", "c"], False)
    assert [json.loads(line)["task_id"] for line in path.read_text().splitlines()] == ["a", "a", "c", "c"]
    assert finished_tasks(tmp_path / "absent.jsonl", 2) == ([], False)
