"""benchmarks/engine_roofline.py: its cost arithmetic counted by hand, and one tiny run end to end."""

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.engine_roofline import step_cost
from pyvision_jax.models import ModelConfig
from pyvision_jax.models.qwen2_5_vl import init_params

REPO = Path(__file__).resolve().parents[2]


def test_step_cost_counts_the_decoder_weights_one_embedding_row_per_row_and_the_whole_cache():
    config = ModelConfig.preset("tiny")  # hidden 64, MLP 128, 2 layers, 4 heads, 2 kv heads, vocab 2048
    params = init_params(config)
    h, m, layers, vocab, head_dim = 64, 128, 2, 2048, 16
    per_layer = (h * h + h) + 2 * (h * 32 + 32) + h * h + 3 * h * m + 2 * h  # q, k and v with biases, o, MLP, norms
    decoder = layers * per_layer + h + h * vocab  # final norm and lm_head
    rows, cache = 3, 40
    kv = 2 * layers * rows * 2 * cache * head_dim
    read, flops = step_cost(config, params, rows, cache, cache_itemsize=2)
    assert read == 4 * decoder + rows * 4 * h + 2 * kv
    assert flops == 2 * decoder * rows + 4 * layers * 4 * head_dim * cache * rows


def test_a_tiny_run_prints_its_table_and_writes_every_measurement(tmp_path):
    out = tmp_path / "roofline.json"
    command = [sys.executable, "-m", "benchmarks.engine_roofline", "--models", "small", "--rows", "1,2"]
    command += ["--caches", "64", "--steps", "2", "--repeats", "1", "--bandwidth-mib", "8", "--matmul-size", "128"]
    result = subprocess.run(
        [*command, "--out", str(out)],
        cwd=REPO,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert [(r["rows"], r["cache"]) for r in summary["decode"]] == [(1, 64), (2, 64)]
    for row in summary["decode"]:
        assert row["step_s"] > 0 and row["roofline_s"] > 0
        assert row["ratio"] == row["step_s"] / row["roofline_s"]
        assert row["bound"] in {"memory", "compute", "dispatch"}
        assert row["compiles_timed"] == 0
    assert summary["bandwidth_bytes_s"] > 0 and summary["matmul_flops_s"] > 0 and summary["dispatch_floor_s"] > 0
    assert result.stdout.count("| small |") == 2
