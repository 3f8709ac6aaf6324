import json

import numpy as np
import pytest
from PIL import Image

from pyvision_jax.data.synthetic import write_mp4
from pyvision_jax.data.tasks import TaskFormatError, load_tasks, write_tasks_jsonl


@pytest.fixture
def media(tmp_path):
    Image.new("RGB", (32, 32), (1, 2, 3)).save(tmp_path / "a.png")
    write_mp4(tmp_path / "v.mp4", np.zeros((4, 32, 48, 3), np.uint8), fps=2)
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really a png")
    (tmp_path / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 junk" * 10)
    return tmp_path


def write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_official_simple_schema_loads_with_inferred_answer_types(media):
    path = write_jsonl(
        media / "tasks.jsonl",
        [
            {
                "id": 1,
                "question": "Which?",
                "answer": "B",
                "ability": "search",
                "data_source": "vstar",
                "image_path": "a.png",
                "options": ["x", "y"],
            },
            {
                "id": "2",
                "question": "How many?",
                "answer": "3",
                "ability": "count",
                "data_source": "s",
                "image_path": str(media / "a.png"),
            },
            {"id": "3", "question": "Who?", "answer": "the cat", "data_source": "s", "video_path": "v.mp4"},
        ],
    )
    loaded = load_tasks(path)
    a, b, c = loaded.tasks
    assert loaded.num_skipped == 0
    assert (a.id, a.answer_type, a.options, a.ability) == ("1", "multiple_choice", ("x", "y"), "search")
    assert a.image_path == str(media / "a.png") and not a.is_video
    assert b.answer_type == "numeric" and c.answer_type == "text" and c.is_video
    assert c.video_path == str(media / "v.mp4")


def test_json_list_files_load_and_round_trip_through_jsonl(media):
    rows = [
        {"id": "q", "question": "Q?", "answer": "4", "data_source": "s", "image_path": "a.png", "answer_type": "text"}
    ]
    (media / "tasks.json").write_text(json.dumps(rows))
    (task,) = load_tasks(media / "tasks.json").tasks
    assert task.answer_type == "text"
    write_tasks_jsonl(media / "copy.jsonl", [task])
    assert json.loads((media / "copy.jsonl").read_text())["image_path"] == "a.png"
    assert load_tasks(media / "copy.jsonl").tasks == (task,)


BAD_ROWS = [
    ({"question": "Q?", "answer": "1", "image_path": "a.png"}, "field 'id': missing"),
    ({"id": "x", "answer": "1", "image_path": "a.png"}, "field 'question': missing"),
    ({"id": "x", "question": "  ", "answer": "1", "image_path": "a.png"}, "field 'question': empty"),
    (
        {"id": "x", "question": "Q", "answer": None, "image_path": "a.png"},
        "field 'answer': expected a string, got NoneType",
    ),
    ({"id": "x", "question": "Q", "answer": "1"}, "field 'image_path': exactly one of"),
    (
        {"id": "x", "question": "Q", "answer": "1", "image_path": "a.png", "video_path": "v.mp4"},
        "field 'image_path': exactly one of",
    ),
    (
        {"id": "x", "question": "Q", "answer": "1", "image_path": "a.png", "options": "AB"},
        "field 'options': expected a list of strings",
    ),
    (
        {"id": "x", "question": "Q", "answer": "1", "image_path": "a.png", "answer_type": "free"},
        "field 'answer_type': 'free' is not one of",
    ),
    ({"id": "x", "question": "Q", "answer": "1", "image_path": "missing.png"}, "field 'image_path': file not found"),
    (
        {"id": "x", "question": "Q", "answer": "1", "image_path": "broken.png"},
        "field 'image_path': cannot decode image",
    ),
    (
        {"id": "x", "question": "Q", "answer": "1", "video_path": "broken.mp4"},
        "field 'video_path': cannot decode video",
    ),
    ({"id": "x", "question": "Q", "answer": "1", "video_path": "nope.mp4"}, "field 'video_path': file not found"),
    ("{not json", "field '<row>': not valid JSON"),
    ("[1, 2]", "field '<row>': expected an object, got list"),
]


@pytest.mark.parametrize("row, message", BAD_ROWS)
def test_bad_rows_name_file_row_and_field(media, row, message):
    good = {"id": "ok", "question": "Q", "answer": "1", "image_path": "a.png"}
    path = write_jsonl(media / "tasks.jsonl", [good, row])
    with pytest.raises(TaskFormatError) as err:
        load_tasks(path)
    assert str(err.value).startswith(f"{path}: row 2: ")
    assert message in str(err.value)


def test_skip_bad_rows_counts_what_it_skipped(media):
    good = {"id": "ok", "question": "Q", "answer": "1", "image_path": "a.png"}
    path = write_jsonl(media / "tasks.jsonl", [good] + [row for row, _ in BAD_ROWS] + [good | {"id": "ok2"}, good])
    loaded = load_tasks(path, skip_bad_rows=True)
    assert [t.id for t in loaded.tasks] == ["ok", "ok2"]
    assert loaded.num_skipped == len(BAD_ROWS) + 1  # the last row repeats id "ok"
    assert [s.row for s in loaded.skipped] == list(range(2, len(BAD_ROWS) + 2)) + [len(BAD_ROWS) + 3]
    assert "field 'id': duplicate id 'ok'" in loaded.skipped[-1].reason


def test_check_media_can_be_disabled(media):
    path = write_jsonl(
        media / "tasks.jsonl", [{"id": "x", "question": "Q", "answer": "1", "image_path": "missing.png"}]
    )
    assert load_tasks(path, check_media=False).tasks[0].image_path == str(media / "missing.png")


def test_whole_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="task file not found"):
        load_tasks(tmp_path / "none.jsonl")
    (tmp_path / "t.csv").write_text("id,question\n")
    with pytest.raises(TaskFormatError, match="unknown task file type '.csv'"):
        load_tasks(tmp_path / "t.csv")
    (tmp_path / "t.json").write_text('{"id": 1}')
    with pytest.raises(TaskFormatError, match="expected a JSON list of rows, got dict"):
        load_tasks(tmp_path / "t.json")
    (tmp_path / "u.json").write_text('[{"id": 1,')
    with pytest.raises(TaskFormatError, match="u.json: not valid JSON"):
        load_tasks(tmp_path / "u.json")


def corrupt_middle_of_video(path):
    """Flips bytes a third of the way into the file: the header and frame 0 stay readable."""
    data = bytearray(path.read_bytes())
    start = len(data) // 3
    for offset in range(start, min(start + 4000, len(data))):
        data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_video_with_corrupt_packets_in_the_middle_fails_validation(tmp_path):
    frames = np.random.default_rng(0).integers(0, 255, (60, 64, 64, 3), dtype=np.uint8)
    write_mp4(tmp_path / "v.mp4", frames, fps=10)
    corrupt_middle_of_video(tmp_path / "v.mp4")
    path = write_jsonl(tmp_path / "t.jsonl", [{"id": "v", "question": "?", "answer": "1", "video_path": "v.mp4"}])
    with pytest.raises(TaskFormatError, match="row 1: field 'video_path': cannot decode video"):
        load_tasks(path)


def test_unknown_fields_are_errors_with_a_suggestion_unless_listed(media):
    row = {"id": "1", "question": "?", "answer": "A", "image_path": "a.png", "optoins": ["x", "y"]}
    path = write_jsonl(media / "t.jsonl", [row])
    with pytest.raises(TaskFormatError, match=r"row 1: field 'optoins': unknown field \(did you mean 'options'\?\)"):
        load_tasks(path)
    row = {"id": "1", "question": "?", "answer": "A", "image_path": "a.png", "split": "train"}
    path = write_jsonl(media / "t.jsonl", [row])
    with pytest.raises(TaskFormatError, match="field 'split': unknown field .*data.extra_fields"):
        load_tasks(path)
    assert [t.id for t in load_tasks(path, extra_fields=("split",)).tasks] == ["1"]


def test_a_file_without_rows_is_named_in_the_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(TaskFormatError, match=r"empty.jsonl: the task file has no rows"):
        load_tasks(tmp_path / "empty.jsonl")
