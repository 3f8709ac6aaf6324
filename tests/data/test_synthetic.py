import decord
import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from pyvision_jax.data.synthetic import (
    COLOURS,
    generate_counting,
    generate_synthetic_suite,
    generate_videos,
    generate_visual_search,
    write_mp4,
)
from pyvision_jax.data.tasks import load_tasks


def files(directory):
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_generators_are_reproducible_from_the_seed(tmp_path):
    first = generate_synthetic_suite(tmp_path / "a", num_per_kind=3, seed=11)
    generate_synthetic_suite(tmp_path / "b", num_per_kind=3, seed=11)
    generate_synthetic_suite(tmp_path / "c", num_per_kind=3, seed=12)
    a, b, c = (files(tmp_path / d) for d in "abc")
    assert len(a) == 3 * 3 + 3 and a == b
    assert a.keys() == c.keys()
    assert all(a[k] != c[k] for k in a)
    for _kind, path in first.items():
        loaded = load_tasks(path)
        assert len(loaded.tasks) == 3 and loaded.num_skipped == 0
        assert len({t.id for t in loaded.tasks}) == 3


def test_visual_search_target_is_small_unique_and_answers_match(tmp_path):
    tasks = load_tasks(generate_visual_search(tmp_path, 6, seed=5)).tasks
    assert {t.ability for t in tasks} == {"visual_search_colour", "visual_search_shape", "visual_search_position"}
    for task in tasks:
        pixels = np.asarray(Image.open(task.image_path)).astype(int)
        assert pixels.shape == (960, 1280, 3)
        mask = np.abs(pixels - [236, 236, 230]).sum(-1) > 60
        labels, count = ndimage.label(mask)
        sizes = ndimage.sum(mask, labels, range(1, count + 1))
        assert count > 20
        order = np.argsort(sizes)
        assert sizes[order[0]] <= 400 < 1000 <= sizes[order[1]]  # one small target
        ys, xs = np.nonzero(labels == order[0] + 1)
        colour = tuple(pixels[int(ys.mean()), int(xs.mean())])
        name = next(n for n, rgb in COLOURS.items() if rgb == colour)
        chosen = task.options["ABCD".index(task.answer)]
        assert task.answer_type == "multiple_choice" and len(task.options) == 4
        if task.ability == "visual_search_colour":
            assert chosen == name
        elif task.ability == "visual_search_position":
            vertical = "top" if ys.mean() < 480 else "bottom"
            horizontal = "left" if xs.mean() < 640 else "right"
            assert chosen == f"{vertical}-{horizontal}" and name in task.question
        else:
            assert f"small {name} object" in task.question


def test_counting_tasks_are_numeric(tmp_path):
    tasks = load_tasks(generate_counting(tmp_path, 4, seed=2)).tasks
    for task in tasks:
        assert task.answer_type == "numeric" and 1 <= int(task.answer) <= 9
        colour = task.question.split()[2]
        pixels = np.asarray(Image.open(task.image_path)).astype(int)
        same_colour = ndimage.label((pixels == COLOURS[colour]).all(-1))[1]
        assert same_colour >= int(task.answer)


def test_videos_are_readable_by_decord_and_answers_match(tmp_path):
    tasks = load_tasks(generate_videos(tmp_path, 2, seed=4)).tasks
    count_task, order_task = tasks
    assert count_task.answer_type == "numeric" and order_task.answer_type == "multiple_choice"
    for task in tasks:
        reader = decord.VideoReader(task.video_path)
        assert len(reader) == 32 and reader.get_avg_fps() == pytest.approx(8.0)
        assert reader[0].shape == (144, 192, 3)
    frames = decord.VideoReader(order_task.video_path).get_batch(list(range(32))).asnumpy()
    first_colours = set()
    for frame in frames.astype(int):
        for name, rgb in COLOURS.items():
            if (np.abs(frame - rgb).sum(-1) < 60).sum() > 50:
                first_colours.add(name)
        if first_colours:
            break
    assert first_colours == {order_task.options["ABCD".index(order_task.answer)]}


def test_write_mp4_rejects_bad_frames(tmp_path):
    with pytest.raises(ValueError, match="multiple of 16"):
        write_mp4(tmp_path / "x.mp4", np.zeros((2, 30, 32, 3), np.uint8), fps=4)
    with pytest.raises(ValueError, match=r"\[T, H, W, 3\]"):
        write_mp4(tmp_path / "x.mp4", np.zeros((2, 32, 32), np.uint8), fps=4)


def test_suite_takes_a_subset_of_kinds(tmp_path):
    paths = generate_synthetic_suite(tmp_path, 1, seed=0, kinds=("counting", "video"))
    assert list(paths) == ["counting", "video"]
    with pytest.raises(ValueError, match="unknown synthetic task kinds \\['maze'\\]"):
        generate_synthetic_suite(tmp_path, 1, seed=0, kinds=("maze",))
    with pytest.raises(TypeError, match="tuple of kind names"):
        generate_synthetic_suite(tmp_path, 1, seed=0, kinds="counting,video")
