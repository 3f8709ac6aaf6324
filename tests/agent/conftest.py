import pytest
from PIL import Image

from pyvision_jax.data.tasks import Task


@pytest.fixture
def image_task(tmp_path):
    path = tmp_path / "task.png"
    Image.new("RGB", (56, 56), (200, 30, 30)).save(path)
    return Task(
        id="img",
        question="What colour is the square?",
        answer="A",
        answer_type="multiple_choice",
        data_source="test",
        image_path=str(path),
        options=("red", "blue"),
    )
