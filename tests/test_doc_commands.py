"""Every shell command in README.md and docs/*.md runs here in miniature (CPU sizes, the tiny
model, small local files, a judge and Redis on loopback) or is listed with the one reason it
cannot run on this machine. A command added to the docs fails `test_every_command_has_a_plan`
until it gets an entry below."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis
from PIL import Image

from tests.doc_commands import ROOT, CannotRun, Miniature, doc_commands, miniature_argv
from tests.grading.stub_judge import StubChatServer
from tests.rollout.redis_server import RedisServer

SFT_TOOL = "<tool_response>\n<interpreter>\nText Result:\n{n}\nImage Result:\n</interpreter>\n\n</tool_response>"
ASSETS = ROOT / "pyvision_jax" / "assets"
TINY_MODEL = {"--config.model.preset": "tiny", "--config.model.hf_dir": "", "--config.model.tokenizer": "tiny"}
SHORT = {"--config.episode.max_new_tokens_per_turn": "8", "--config.eval.max_new_tokens_per_turn": "8"}
SMALL_STEP = {"--config.rl.batch_groups": "1", "--config.rl.group_size": "2", "--config.rl.oversample": "1"}
HELDOUT = {"--config.eval.heldout_per_kind": "1", "--config.eval.heldout_k": "1"}
TRAIN = {**TINY_MODEL, **SHORT, **SMALL_STEP, "--config.train.steps": "1", **HELDOUT}
# The 7B configs' machine sizes back to the CPU defaults (configs/base.py); the model and its
# tokenizer are the documented --config.model.hf_dir or --checkpoint, a small checkpoint here.
CPU_7B = {
    "--config.model.attention": "dense",
    "--config.model.remat": "none",
    "--config.model.compute_dtype": "float32",
    "--config.train.mesh_fsdp": "1",
    "--config.train.micro_batch": "1",
    "--config.train.ppo_mini_batch_groups": "0",
    "--config.train.length_buckets": "(512,1024)",
    "--config.rollout.length_buckets": "(512,1024)",
    "--config.episode.max_total_tokens": "1024",
    "--config.eval.max_total_tokens": "1024",
    "--config.episode.max_response_tokens": "512",
    "--config.episode.max_concurrent": "4",
    "--config.episode.image_max_pixels": "50176",
    "--config.sandbox.pool_size": "2",
    "--config.rollout.max_batch": "4",
    **SHORT,
    **SMALL_STEP,
}
EVAL = {"--k": "1", **SHORT}
DYNAMICS = {
    **TINY_MODEL,
    **SHORT,
    "--steps": "1",
    "--eval-every": "1",
    "--seeds": "0",  # a random-init start allows only config.seed
    "--temperatures": "1.0",
    "--config.eval.heldout_per_kind": "1",
    "--config.eval.heldout_k": "1",
    "--config.rl.batch_groups": "1",
    "--config.rl.group_size": "2",
}
PERFORMANCE_REASON = "{}: a benchmark at its documented sizes is a measurement; this runs it at {}"

ROOFLINE_MINIATURE = {"--rows": "1", "--caches": "64", "--steps": "2", "--repeats": "1"} | {
    "--bandwidth-mib": "8",
    "--matmul-size": "128",
}

MAIN_JOB = ".venv/bin/python launch/train.py --config configs/tiny_cpu.py --workdir workdir/tiny_cpu"
HELDOUT_TASKS = "python launch/make_tasks.py --out /tmp/heldout --per-kind 48 --seed 4242 --kinds shapes"
EXPORT = "python launch/convert.py flax2hf --src workdir/tiny_cpu --dst workdir/tiny_cpu_hf --dtype bfloat16"
HF_TO_FLAX = "python launch/convert.py hf2flax --src HF_DIR --dst DIR"

PLANS: dict[str, Miniature | CannotRun] = {
    # README.md
    "bash scripts/install.sh": CannotRun(
        "builds the environment this test runs in: CI's command (scripts/test.sh) runs it first"
    ),
    # the packaged checkpoint it starts from is small; the export below copies its files
    MAIN_JOB: Miniature(set={**SHORT, **SMALL_STEP, "--config.train.steps": "1", **HELDOUT}),
    "bash scripts/test.sh": CannotRun("the test run itself: CI's .ci/run runs exactly this command"),
    "python3 -m venv .venv": CannotRun(
        "the first half of the GPU and TPU installs, which need those machines; scripts/install.sh "
        "creates the CPU environment the same way"
    ),
    '.venv/bin/pip install -c constraints.txt -e ".[cuda12]"': CannotRun(
        "installs jax's CUDA 12 plugin, for a GPU node; scripts/check_install_matrix.py (in CI) resolves "
        "exactly this requirement and lock (trainer-cuda12)"
    ),
    '.venv/bin/pip install -c constraints.txt -e ".[tpu]"': CannotRun(
        "installs libtpu, for a TPU VM; scripts/check_install_matrix.py (in CI) resolves exactly this "
        "requirement and lock (trainer-tpu)"
    ),
    "bash scripts/install_fleet.sh cuda": CannotRun(
        "vLLM's CUDA build, for GPU nodes; scripts/check_install_matrix.py resolves it (fleet-cuda) and "
        "CI runs the same script's cpu case"
    ),
    "python launch/train.py --config configs/pyvision_image_7b.py --config.algorithm=sft "
    "--config.model.hf_dir=/models/Qwen2.5-VL-7B-Instruct --workdir /runs/sft "
    "--config.sft.train_files='(\"/data/PyVision-Image-SFT.jsonl\",)' --config.sft.export_dir=/runs/sft_hf": Miniature(
        set={**CPU_7B, "--config.train.steps": "1", "--config.sft.batch_size": "1"}
    ),
    "vllm serve Qwen/Qwen2.5-72B-Instruct --served-model-name judge": CannotRun(
        "serves a 72B model on GPUs; tests/grading/test_judge_vllm.py runs `vllm serve` of a tiny model "
        "as the judge, and this test uses a stub judge on loopback"
    ),
    "python launch/train.py --config configs/pyvision_image_7b.py --config.model.hf_dir=/models/Qwen2.5-VL-7B-Instruct "
    "--config.grading.judge_url=http://JUDGE_HOST:8000 --config.data.train_files=/data/pyvision_image_rl.jsonl "
    "--workdir /runs/image7b": Miniature(set={**CPU_7B, "--config.train.steps": "1"}, env={"FLEET": "trainer"}),
    "python launch/train.py --config configs/pyvision_image_7b.py --config.model.hf_dir=/models/Qwen2.5-VL-7B-Instruct "
    "--config.grading.judge_url=http://JUDGE_HOST:8000 --config.data.train_files=/data/pyvision_image_rl.jsonl "
    "--config.data.val_files=/data/vstar.jsonl --workdir /runs/image7b": Miniature(
        set={**CPU_7B, "--config.train.steps": "1", "--config.eval.val_max_batch": "2"}, env={"FLEET": "trainer"}
    ),
    "python launch/rollout_worker.py --config configs/pyvision_image_7b.py "
    "--config.model.hf_dir=/models/Qwen2.5-VL-7B-Instruct --config.grading.judge_url=http://JUDGE_HOST:8000 "
    "--config.rollout.redis_url=redis://TRAINER_HOST:6379/0 --worker-index 0 --num-workers 4 "
    "--workdir /shared/rollout": Miniature(
        set={**CPU_7B, "--config.rollout.engine": "jax", "--num-workers": "1"}, env={"FLEET": "worker"}
    ),
    "--config.episode.image_prompt_file=/prompts/vistool_with_img_info_v2.txt "
    "--config.episode.video_prompt_file=/prompts/vis_tool_with_img_info_video_v4.txt "
    '--config.grading.judge_prompt_files=\'(("deepeyes", "/prompts/judge_visual_search.txt"), '
    '("minio3", "/prompts/judge_visual_search.txt"), ("vstar", "/prompts/judge_visual_search.txt"), '
    '("ecd", "/prompts/judge_chart.txt"), ("wemath-*", "/prompts/judge_math.txt"), '
    '("vsi", "/prompts/judge_vsi.txt"), ("longvila", "/prompts/judge_longvila.txt"))\'': CannotRun(
        "flags to add to the commands above, not a command: they name the user's copies of the released "
        "prompts, which are not shipped"
    ),
    HELDOUT_TASKS: Miniature(set={"--per-kind": "2"}),
    "python launch/eval.py --config configs/tiny_cpu.py --data /tmp/heldout/tasks.jsonl --k 4 "
    "--out /tmp/heldout_eval": Miniature(set={**EVAL, **TINY_MODEL}, after=(HELDOUT_TASKS,)),
    "python launch/eval.py --config configs/pyvision_image_7b.py --config.rollout.engine=jax "
    "--config.grading.judge_url=http://JUDGE_HOST:8000 --checkpoint /models/PyVision-Image-7B "
    "--data /data/vstar.jsonl --k 32 --out /runs/eval_vstar": Miniature(set={**CPU_7B, **EVAL}),
    "python launch/eval.py --config configs/tiny_cpu.py --checkpoint workdir/tiny_cpu "
    "--data workdir/tiny_cpu/heldout/tasks/tasks.jsonl --k 4 --out workdir/tiny_cpu_eval": Miniature(
        set=EVAL, after=(MAIN_JOB,)
    ),
    EXPORT: Miniature(after=(MAIN_JOB,)),
    "python launch/eval.py --config configs/tiny_cpu.py --checkpoint workdir/tiny_cpu_hf "
    "--data workdir/tiny_cpu/heldout/tasks/tasks.jsonl --k 4 --out workdir/tiny_cpu_hf_eval": Miniature(
        set=EVAL, after=(EXPORT,)
    ),
    HF_TO_FLAX: Miniature(replace={"HF_DIR": "{scratch}/models/PyVision-Image-7B", "DIR": "{scratch}/flax_params"}),
    "python launch/convert.py flax2hf --src DIR --dst HF_DIR": Miniature(
        replace={"DIR": "{scratch}/flax_params", "HF_DIR": "{scratch}/hf_again"}, after=(HF_TO_FLAX,)
    ),
    # docs/accelerator_suite.md (its install commands are README's); one section at CPU sizes
    ".venv/bin/python -m benchmarks.accelerator_suite --out results.json": Miniature(
        set={"--out": "{scratch}/accelerator/results.json", "--sections": "attention"}
    ),
    # docs/fleet.md (its two fleet commands are README's)
    "export PYVISION_QUEUE_PASSWORD=...": CannotRun(
        "puts the user's queue password in the shell; tests/train/test_secrets_stay_out.py runs a fleet "
        "with a planted password passed this way"
    ),
    "python launch/train.py ... --config.rollout.redis_url=rediss://trainer@TRAINER_HOST:6379/0 "
    "--config.rollout.redis_password_env=PYVISION_QUEUE_PASSWORD --config.rollout.redis_ca_file=/etc/pyvision/ca.crt": (
        CannotRun(
            "a fragment (`...` is README's training command); tests/rollout/test_queue_credentials.py runs the "
            "trainer's role over TLS with these users on loopback"
        )
    ),
    "python launch/rollout_worker.py ... --config.rollout.redis_url=rediss://worker@TRAINER_HOST:6379/0 "
    "--config.rollout.redis_password_env=PYVISION_QUEUE_PASSWORD --config.rollout.redis_ca_file=/etc/pyvision/ca.crt": (
        CannotRun(
            "a fragment (`...` is README's worker command); tests/rollout/test_queue_credentials.py runs the "
            "worker's role over TLS with these users on loopback"
        )
    ),
    # docs/learning.md
    **{
        f"python launch/train.py --config configs/{config}.py --workdir /tmp/{workdir} "
        f"--config.sft.export_dir=pyvision_jax/assets/{name}": Miniature(
            set={
                "--config.sft.export_dir": "{scratch}/" + name,
                "--config.train.steps": "1",
                "--config.sft.synthetic_per_kind": "1",
                "--config.sft.rollouts_per_task": "1",
                "--config.sft.batch_size": "2",
                "--config.train.micro_batch": "2",
            }
        )
        for config, workdir, name in (
            ("sft_shapes", "sft_shapes", "shapes_sft"),
            ("sft_shapes_adaptive", "sft_adaptive", "shapes_adaptive_sft"),
        )
    },
    **{
        command: Miniature(set={**DYNAMICS, "--variants": variants})
        for command, variants in (
            (
                "python -m experiments.reproduce_dynamics --workdir /tmp/learning --steps 12 --eval-every 12 --seeds 0 "
                "--variants full,no_tool_reward,std_norm,arrival_order,turns_2,random_reward,entropy_min "
                "--config.eval.heldout_per_kind=48 --config.eval.heldout_k=4",
                "full,no_tool_reward",
            ),
            (
                "python -m experiments.reproduce_dynamics --workdir /tmp/learning_seed1 --steps 12 --eval-every 12 "
                "--seeds 1 --temperatures 1.0 --variants full,no_tool_reward,std_norm,arrival_order,turns_2,"
                "random_reward,entropy_min --config.eval.heldout_per_kind=48 --config.eval.heldout_k=4",
                "full",
            ),
            (
                "python -m experiments.reproduce_dynamics --workdir /tmp/learning_seed2 --steps 12 --eval-every 12 "
                "--seeds 2 --temperatures 1.0 --variants full,no_tool_reward --config.eval.heldout_per_kind=48 "
                "--config.eval.heldout_k=4",
                "full",
            ),
            (
                "python -m experiments.reproduce_dynamics --config configs/shapes_direct_cpu.py "
                "--workdir /tmp/direct_lr5 --steps 36 --eval-every 12 --seeds 0,1,2,3,4 --temperatures 1.0 "
                "--variants full,no_tool_reward --config.train.lr=5e-4 --config.eval.heldout_per_kind=48 "
                "--config.eval.heldout_k=4",
                "full",
            ),
        )
    },
    **{
        "python -m experiments.reproduce_dynamics --config configs/shapes_adaptive_cpu.py --workdir "
        f"{workdir} --steps 36 --eval-every 12 --seeds 0,1,2 --jobs 3 --temperatures 1.0 --variants full "
        f"{flags} --config.eval.heldout_k=4": Miniature(
            set={**DYNAMICS, "--variants": "full", "--jobs": None, "--validation-per-kind": "1"}
        )
        for workdir, flags in (
            ("/tmp/w48c/test", "--config.rl.tool_reward_coef=0 --config.eval.heldout_per_kind=48"),
            ("/tmp/w48d/test", "--config.eval.heldout_per_kind=48"),
            ("/tmp/w48e/confirm", "--config.eval.heldout_seed=5151 --config.eval.heldout_per_kind=48"),
            (
                "/tmp/w48f/confirm",
                "--validation-per-kind 48 --config.eval.heldout_seed=6161 --config.eval.heldout_per_kind=192",
            ),
        )
    },
    "python launch/train.py --config configs/tiny_cpu.py --workdir /tmp/kl_full_0.1 --config.rl.kl_coef=0.1 "
    "--config.eval.heldout_seed=777 --config.eval.heldout_per_kind=48 --config.eval.heldout_k=4": Miniature(set=TRAIN),
    # docs/performance.md
    ".venv/bin/python -m benchmarks.engine_roofline --models small --out engine_roofline_small.json": Miniature(
        set=ROOFLINE_MINIATURE | {"--out": "{scratch}/roofline.json"}
    ),
    ".venv/bin/python -m benchmarks.engine_roofline --models 7b-slice --rows 1,8 --caches 512 --repeats 2": Miniature(
        set=ROOFLINE_MINIATURE | {"--slice-layers": "1"}
    ),
    ".venv/bin/python -m benchmarks.main_job_time --pairs 2 --out main_job_time.json": Miniature(
        set={"--pairs": "1", "--out": "{scratch}/main_job_time.json"},
        add=("--config.train.steps=1", "--config.eval.heldout_per_kind=1", "--config.rl.batch_groups=2"),
    ),
    ".venv/bin/python -m benchmarks.rl_kernels": Miniature(
        set={"--groups": "64", "--group-size": "4", "--batch": "4", "--length": "64", "--repeats": "2"}
        | {"--loss-repeats": "1"}
    ),
    ".venv/bin/python -m benchmarks.attention": Miniature(
        set={"--rows": "1", "--length": "64", "--heads": "2", "--kv-heads": "1", "--head-dim": "16"}
        | {"--block": "32", "--steps": "1"}
    ),
    **dict.fromkeys(
        (
            "python -m benchmarks.train_step --rows 2 --length 4096 --steps 3",
            "python -m benchmarks.train_step --rows 8 --length 512",
        ),
        Miniature(set={"--rows": "1", "--length": "256", "--steps": "1", "--warmup": "1"}),
    ),
    **dict.fromkeys(
        (
            ".venv/bin/python -m benchmarks.rollout --only decode",
            ".venv/bin/python -m benchmarks.rollout --only stragglers",
            ".venv/bin/python -m benchmarks.rollout --only episodes",
        ),
        Miniature(
            set={"--batch": "2", "--prompt-len": "8", "--new-tokens": "4", "--hidden": "32", "--layers": "1"}
            | {"--repeats": "1", "--episodes": "4"}
        ),
    ),
    ".venv/bin/python -m benchmarks.rollout_throughput --rounds 2 --out results.json": Miniature(
        set={"--rounds": "1", "--tasks": "1", "--out": "{scratch}/throughput.json", "--variants": "baseline,all"}
    ),
    ".venv/bin/python -m benchmarks.sandbox --calls 100 --pool-size 8 --rounds 1 --naive-trajectories 3 "
    "--concurrent 32 --starts 60 --refill-size 16 --refill-rounds 3": Miniature(
        set={"--calls": "5", "--pool-size": "2", "--naive-trajectories": "1", "--concurrent": "2", "--starts": "3"}
        | {"--refill-size": "2", "--refill-rounds": "1"}
    ),
    ".venv/bin/python -m benchmarks.sigterm_latency --after-s 8": Miniature(
        set={"--after-s": "1", "--workdir": "{scratch}/sigterm"}
    ),
    ".venv/bin/python -m benchmarks.eval_output_size": Miniature(
        set={"--tasks": "2", "--k": "2", "--megapixels": "0.05"}
    ),
    ".venv/bin/python -m benchmarks.convert_memory": Miniature(
        set={"--size-gb": "1", "--workdir": "{scratch}/convert"}
    ),
    ".venv/bin/python -m benchmarks.weight_publish": Miniature(
        set={"--layers": "1", "--vision-depth": "1", "--versions": "2"}
    ),
    ".venv-vllm/bin/python -m benchmarks.fleet_throughput --tasks 8 --pool 64 --rounds 2": Miniature(
        set={"--tasks": "1", "--pool": "2", "--rounds": "1", "--group-size": "2", "--in-flight": "2"},
        env={"ENVIRONMENT": "fleet"},
    ),
    ".venv-vllm/bin/python -m benchmarks.engine_vs_vllm --out engine_vs_vllm.json": Miniature(
        set={"--requests": "2", "--max-tokens": "4", "--repeats": "1", "--out": None}, env={"ENVIRONMENT": "fleet"}
    ),
    "python -m benchmarks.memory_7b --devices 8 --tokens 32768": Miniature(set={"--preset": "tiny", "--tokens": "256"}),
    ".venv/bin/python -m benchmarks.model_forward [--repeats 5]": Miniature(set={"--repeats": "1"}),
    # docs/scaling.md
    "python launch/train.py --config configs/pyvision_image_7b.py --workdir /shared/runs/image7b "
    "--config.train.distributed=True --config.train.coordinator_address=HOST0:1234 "
    "--config.train.num_processes=2 --config.train.process_id=0": CannotRun(
        "host 0 of a two-host run waits for the second host; tests/train/test_multihost.py trains with two "
        "jax.distributed processes on loopback"
    ),
}


def all_plans() -> dict[str, Miniature | CannotRun]:
    return PLANS


# ---------------------------------------------------------------------------------------------
# The scratch world the miniatures run in


def tiny_hf_checkpoint(directory: Path) -> Path:
    """The packaged small SFT checkpoint with the tiny tokenizer beside it: an HF directory."""
    directory.mkdir(parents=True, exist_ok=True)
    for source in (ASSETS / "shapes_sft", ASSETS / "tiny_tokenizer"):
        for file in source.iterdir():
            shutil.copy2(file, directory / file.name)
    return directory


def write_sft_file(data: Path) -> Path:
    """Two rows in the released SFT schema: an image, a code turn, its result, the answer."""
    rows = []
    for i in range(2):
        Image.new("RGB", (84, 56), (40 * i, 100, 30)).save(data / f"sft_{i}.png")
        rows.append(
            {
                "conversations": [
                    {"role": "user", "content": "<image_clue_0><image></image_clue_0>\n\nHow many squares?"},
                    {"role": "assistant", "content": "<code>\n```python\nprint(%d)\n```\n</code>" % i},
                    {"role": "user", "content": SFT_TOOL.format(n=i)},
                    {"role": "assistant", "content": "<answer>\n\\boxed{%d}\n</answer>" % i},
                ],
                "images": [f"sft_{i}.png"],
                "source_dataset": "docs",
            }
        )
    path = data / "PyVision-Image-SFT.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def run(argv: list[str], env: dict[str, str], timeout_s: int, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("docs")
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(scratch / "jax_cache"), "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)
    for name in ("Qwen2.5-VL-7B-Instruct", "PyVision-Image-7B"):
        tiny_hf_checkpoint(scratch / "models" / name)
    data = scratch / "data"
    made = run(
        [sys.executable, str(ROOT / "launch" / "make_tasks.py"), "--out", str(data / "shapes"), "--per-kind", "2"]
        + ["--seed", "4242", "--kinds", "shapes"],
        env,
        300,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    rows = [json.loads(line) for line in (data / "shapes" / "tasks.jsonl").read_text().splitlines() if line]
    for name, source in (("vstar.jsonl", "vstar"), ("pyvision_image_rl.jsonl", "deepeyes")):
        with open(data / name, "w", encoding="utf-8") as out:
            for row in rows:
                image = row.get("image_path")
                row = {**row, "data_source": source, "image_path": f"shapes/{image}" if image else image}
                out.write(json.dumps(row) + "\n")
    write_sft_file(data)
    judge = StubChatServer()
    threading.Thread(target=judge.serve_forever, daemon=True).start()
    (scratch / "redis").mkdir()
    redis_server = RedisServer(scratch / "redis")
    hosts = {
        "JUDGE_HOST:8000": judge.url.removeprefix("http://"),
        "TRAINER_HOST:6379": f"127.0.0.1:{redis_server.port}",
    }
    yield {"scratch": scratch, "env": env, "hosts": hosts, "ran": set()}
    judge.shutdown()
    redis_server.stop()


def argv_for(command: str, plan: Miniature, world: dict) -> list[str]:
    scratch = world["scratch"]
    plan = Miniature(
        add=plan.add,
        set={k: None if v is None else v.format(scratch=scratch) for k, v in plan.set.items()},
        replace={k: v.format(scratch=scratch) for k, v in plan.replace.items()},
        env=plan.env,
        timeout_s=plan.timeout_s,
    )
    return miniature_argv(command, plan, scratch, world["hosts"], sys.executable)


# ---------------------------------------------------------------------------------------------
# The tests


def test_every_command_has_a_plan():
    commands = doc_commands()
    assert len(commands) >= 20, "the docs' shell blocks were not found"
    missing = [f"{c.where}: {c.text}" for c in commands if c.text not in all_plans()]
    assert not missing, "commands with neither a miniature nor a reason:\n" + "\n".join(missing)
    documented = {c.text for c in commands}
    stale = [text for text in all_plans() if text not in documented]
    assert not stale, "plans for commands no document has:\n" + "\n".join(stale)
    for text, plan in all_plans().items():
        if isinstance(plan, CannotRun):
            assert len(plan.reason) > 20, f"{text}: give the reason"
        else:
            assert all(isinstance(all_plans().get(e), Miniature) for e in plan.after), f"{text}: after no miniature"


def solo_commands() -> list[str]:
    seen: dict[str, None] = {}
    for command in doc_commands():
        plan = all_plans().get(command.text)
        if isinstance(plan, Miniature) and "FLEET" not in plan.env and "ENVIRONMENT" not in plan.env:
            seen.setdefault(command.text, None)
    return list(seen)


def where(command: str) -> str:
    return next(c.where for c in doc_commands() if c.text == command)


@pytest.mark.slow
@pytest.mark.parametrize("command", solo_commands(), ids=where)
def test_the_documented_command_runs_in_miniature(command, world):
    run_documented(command, world)


def run_documented(command: str, world: dict) -> None:
    """Runs `command`'s miniature, first those of the commands whose outputs it reads (its
    `after`) that this module has not run yet, so that each test also runs alone."""
    plan = all_plans()[command]
    for earlier in plan.after:
        if earlier not in world["ran"]:
            run_documented(earlier, world)
    argv = argv_for(command, plan, world)
    done = run(argv, {**world["env"], **plan.env}, plan.timeout_s)
    assert done.returncode == 0, f"{' '.join(argv)}\nexit {done.returncode}\n{done.stderr[-4000:]}"
    world["ran"].add(command)


@pytest.mark.slow
def test_the_fleet_commands_train_together(world):
    """Each documented trainer (external rollouts from Redis) beside the documented rollout worker."""
    plans = all_plans()
    fleet = {c.text: plans[c.text] for c in doc_commands() if "FLEET" in getattr(plans[c.text], "env", {})}
    trainers = [text for text, plan in fleet.items() if plan.env["FLEET"] == "trainer"]
    workers = [text for text, plan in fleet.items() if plan.env["FLEET"] == "worker"]
    assert len(trainers) >= 2 and workers
    url = f"redis://{world['hosts']['TRAINER_HOST:6379']}/0"
    for trainer in trainers:
        redis.Redis.from_url(url).flushall()
        for stale in ("runs/image7b", "shared/rollout"):
            shutil.rmtree(world["scratch"] / stale, ignore_errors=True)
        trainer_argv = argv_for(trainer, plans[trainer], world) + [f"--config.rollout.redis_url={url}"]
        worker_argv = argv_for(workers[0], plans[workers[0]], world)
        background = subprocess.Popen(
            worker_argv, cwd=ROOT, env=world["env"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        try:
            done = run(trainer_argv, world["env"], 900)
        finally:
            background.send_signal(signal.SIGTERM)
            _, worker_err = background.communicate(timeout=120)
        assert done.returncode == 0, f"{' '.join(trainer_argv)}\n{done.stderr[-4000:]}\nworker:\n{worker_err[-2000:]}"
        assert "training finished at step 1" in done.stdout + done.stderr
