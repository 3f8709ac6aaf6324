"""Small training runs with a scripted engine and a fake sandbox pool, shared by the trainer
tests."""

from PIL import Image

from pyvision_jax.data.tasks import Task
from pyvision_jax.rollout.scripted_engine import ScriptedEngine
from pyvision_jax.wiring import build_trainer
from tests.agent.fake_sandbox import FakePool
from tests.tiny_random_cpu import get_config


def colour_tasks(root):
    out = []
    for k, colour in enumerate([(200, 30, 30), (30, 30, 200), (30, 200, 30)]):
        path = root / f"{k}.png"
        Image.new("RGB", (56, 56), colour).save(path)
        out.append(
            Task(
                id=f"task{k}",
                question="What colour is the square?",
                answer="A" if k % 2 == 0 else "B",
                answer_type="multiple_choice",
                data_source="test",
                image_path=str(path),
                options=("red", "blue"),
            )
        )
    return out


def answers_by_rollout(request, turn):
    """Rollouts 0 and 2 answer A, 1 and 3 answer B: every group has reward variance."""
    rollout = int(request.request_id.rsplit("/", 1)[1])
    return f"Looking.\n<answer>\n\\boxed{{{'AB'[rollout % 2]}}}\n</answer>"


def always_wrong(request, turn):
    return "Hmm.\n<answer>\n\\boxed{C}\n</answer>"


def small_config(steps: int):
    c = get_config()
    c.train.steps = steps
    c.train.lr = 1e-3
    c.train.length_buckets = (512,)
    c.train.micro_batch = 2
    c.train.checkpoint_every = 3
    c.train.logprob_chunk = 128
    c.rl.batch_groups = 1
    c.rl.group_size = 2
    c.rl.oversample = 2.0
    return c


def run(config, workdir, tiny_config, tiny_params, tokenizer, tasks, script, log=lambda line: None):
    engine = ScriptedEngine(tokenizer, script)
    trainer = build_trainer(
        config,
        workdir,
        model=(tiny_config, tiny_params),
        engine=engine,
        tokenizer=tokenizer,
        sandboxes=FakePool(),
        tasks=tasks,
        progress=False,
        log=log,
    )
    return trainer.run(), trainer
