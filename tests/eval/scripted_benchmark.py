"""A small synthetic benchmark (image, numeric and video tasks), its scripted answers, and an
evaluation of it with the scripted engine and the fake sandbox pool."""

from pathlib import Path

import numpy as np
from PIL import Image

from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.data.synthetic import write_mp4
from pyvision_jax.data.tasks import Task
from pyvision_jax.eval.evaluate import EvalSettings, Evaluator
from pyvision_jax.rollout.scripted_engine import ScriptedEngine
from tests.agent.fake_sandbox import FakePool
from tests.agent.turns import answer_turn, code_turn

K = 2
HOSTILE = (
    "<script>document.body.setAttribute('data-pwned','1')</script>"
    "<img src=x onerror=\"document.body.setAttribute('data-pwned','2')\">"
)

# Two rollouts per task. Expected per task (correct fraction, mean score):
#   mc-1:  correct A; wrong B (hostile text)         -> 0.5, 0.5
#   num-1: 10 after a tool call; 8 (MRA 0.6, correct) -> 1.0, 0.8
#   vid-1: 3 after a tool call with 2 images; no code nor answer (malformed) -> 0.5, 0.5
#   mc-2:  wrong Z; unterminated answer (malformed)   -> 0.0, 0.0
SCRIPT = {
    "mc-1/0": [answer_turn("A")],
    "mc-1/1": ["Hmm " + HOSTILE + "\n<answer>\n\\boxed{B}\n</answer>"],
    "num-1/0": [code_turn("print there are 10", "images 1 64x48"), answer_turn("10")],
    "num-1/1": [answer_turn("8")],
    "vid-1/0": [code_turn("print frames", "images 2 64x48"), answer_turn("3")],
    "vid-1/1": ["I think there are three objects."],
    "mc-2/0": [answer_turn("Z")],
    "mc-2/1": ["<answer>\n\\boxed{B}"],
}


def write_benchmark(root: Path) -> list[Task]:
    """Writes the benchmark's image and video under ``root``; returns its four tasks."""
    image = root / "square.png"
    Image.new("RGB", (56, 56), (200, 30, 30)).save(image)
    video = root / "clip.mp4"
    frames = np.zeros((8, 32, 32, 3), np.uint8)
    frames[:, 8:24, 8:24] = (30, 70, 220)
    write_mp4(video, frames, fps=4.0)
    return [
        Task(
            id="mc-1",
            question="What colour is the square?",
            answer="A",
            answer_type="multiple_choice",
            data_source="src_a",
            image_path=str(image),
            options=("red", "blue"),
        ),
        Task(
            id="num-1",
            question="How many squares?",
            answer="10",
            answer_type="numeric",
            data_source="src_b",
            image_path=str(image),
        ),
        Task(
            id="vid-1",
            question="How many objects appear?",
            answer="3",
            answer_type="numeric",
            data_source="src_video",
            video_path=str(video),
        ),
        Task(
            id="mc-2",
            question="What shape is it?",
            answer="A",
            answer_type="multiple_choice",
            data_source="src_a",
            image_path=str(image),
            options=("square", "circle"),
        ),
    ]


def run_scripted_evaluation(tokenizer, tasks, out_dir, engine=None, **settings):
    """Evaluates ``tasks`` into ``out_dir`` with ``engine`` (default: one replaying SCRIPT),
    k=K, seed 7 and no progress bar unless ``settings`` say otherwise; returns the results
    and the engine."""
    engine = engine or ScriptedEngine(tokenizer, SCRIPT)
    eval_settings = EvalSettings(**{"k": K, "seed": 7, "progress": False, **settings})
    evaluator = Evaluator(engine, tokenizer, FakePool(), EpisodeConfig.evaluation(), eval_settings)
    return evaluator.run(tasks, out_dir), engine
