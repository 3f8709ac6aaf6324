"""`python -m benchmarks.accelerator_suite` at its CPU sizes, end to end, and the arithmetic it reports."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.accelerator import flops, packed_rows, profile_summary, report, sizes, train_width
from benchmarks.accelerator_suite import run_section
from pyvision_jax.models import ModelConfig

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    """(results, stdout) of one whole run at CPU sizes."""
    out = tmp_path_factory.mktemp("accelerator") / "results.json"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.accelerator_suite", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return json.loads(out.read_text()), result.stdout


def records(results, section):
    return {r["case"]: r["metrics"] for r in results["sections"][section]["records"]}


def test_every_section_finishes_at_cpu_sizes_and_prints_one_table(suite_run):
    results, stdout = suite_run
    assert results["suite"]["sizes"] == "cpu"
    assert {name: s["status"] for name, s in results["sections"].items()} == dict.fromkeys(sizes.SECTIONS, "done")
    table = stdout[stdout.index("section  ") :]
    for name in sizes.SECTIONS:
        assert f"\n{name} " in table


def test_parity_compares_bf16_with_fp32_and_fp32_with_transformers(suite_run):
    parity = records(suite_run[0], "parity")
    assert parity["bf16 vs fp32"]["ok"] and 0 < parity["bf16 vs fp32"]["relative_error"] < 5e-2
    assert parity["fp32 vs transformers"]["ok"] and parity["fp32 vs transformers"]["torch_device"] == "cpu"


def test_step_reports_time_memory_prediction_and_the_full_depth_extrapolation(suite_run):
    step = records(suite_run[0], "step")
    cpu = sizes.sizes_for("cpu").step
    for depth in cpu.depths:
        run = step[f"L={depth} T={cpu.lengths[0]}"]
        assert run["updated"] and math.isfinite(run["loss"])
        assert run["step_s"] > 0 and run["compile_s"] > 0 and run["tokens_per_s"] > 0
        assert run["predicted"]["total"] > run["state_bytes"] > 0
        assert run["mfu"] is None and run["peak_bytes"] is None  # CPU: no datasheet peak, no allocator stats
        assert run["fraction_of_matmul_rate"] > 0
    deepest = step[f"L={cpu.depths[-1]} T={cpu.lengths[-1]}"]
    assert deepest["profile"]["ops"] > 0 and abs(sum(deepest["profile"]["category_share"].values()) - 1) < 1e-6
    full = step[f"L={ModelConfig.preset(cpu.preset).num_hidden_layers} T={cpu.lengths[0]} (extrapolated)"]
    assert full["predicted_bytes"] > 0 and full["step_s"] > 0


def test_attention_kernels_agree_with_blockwise(suite_run):
    attention = records(suite_run[0], "attention")
    cpu = sizes.sizes_for("cpu").attention
    assert set(attention) == {f"{impl} T={t}" for impl in cpu.implementations for t in cpu.lengths}
    for case in attention.values():
        assert case["matches_reference"] and case["time_s"] > 0 and case["temp_bytes"] > 0


def test_decode_reports_tokens_per_second_of_both_models(suite_run):
    decode = records(suite_run[0], "decode")
    assert len(decode) == 2
    for case in decode.values():
        assert case["tokens_per_s"] > 0 and case["decode_tokens_per_s"] > 0
        assert case["compiles"]["prefill"] >= 1 and case["compiles"]["decode"] >= 1
        roofline = case["roofline"]
        assert roofline["bandwidth_bytes_s"] > 0 and roofline["matmul_flops_s"] > 0
        [point] = roofline["points"]  # the CPU size: one rows x cache point
        assert (point["rows"], point["cache"]) == (4, 64) and point["bytes"] > 0
        assert point["ratio"] == pytest.approx(point["step_s"] / point["roofline_s"])


def test_a_section_past_its_time_limit_is_stopped_and_named(tmp_path):
    result = run_section("step", "cpu", timeout_s=2.0, workdir=tmp_path)
    assert result["status"] == "timed out" and result["wall_s"] < 60


def test_the_h200_budgets_fit_in_eight_minutes():
    gpu = sizes.sizes_for("gpu")
    assert sizes.ENVIRONMENT_S + sum(seconds for _, seconds in gpu.budgets_s) <= 8 * 60
    assert {name for name, _ in gpu.budgets_s} == set(sizes.SECTIONS[1:])


def test_train_step_flops_follow_the_six_n_rule_plus_causal_attention():
    config = ModelConfig.preset("tiny")
    lengths = [10, 6]
    layer = 64 * 16 * (2 * 4 + 2 * 2) + 3 * 64 * 128  # q, k, v, o projections and the MLP
    pairs = 10 * 11 // 2 + 6 * 7 // 2
    expected = 6 * 16 * (2 * layer + 64 * 2048) + 2 * 12 * 4 * 16 * pairs
    assert flops.layer_matmul_params(config) == layer
    assert flops.train_step_flops(config, 2, lengths) == expected
    assert flops.peak_flops("NVIDIA H200") == 989.4e12 and flops.peak_flops("cpu") is None


def test_extrapolation_is_linear_in_depth():
    low = {"layers": 2, "step_s": 1.0, "peak_bytes": 10, "predicted_bytes": 12, "state_bytes": 4}
    high = {"layers": 4, "step_s": 1.5, "peak_bytes": 16, "predicted_bytes": None, "state_bytes": 6}
    full = train_width.extrapolate(low, high, 28)
    assert full["step_s"] == pytest.approx(7.5) and full["step_s_per_layer"] == pytest.approx(0.25)
    assert full["peak_bytes"] == pytest.approx(88) and full["predicted_bytes"] is None


def test_packed_rows_are_segments_with_their_own_positions_and_generated_tails():
    config = ModelConfig.preset("tiny")
    batch = packed_rows.packed_text_batch(config, rows=2, length=200)
    segments = batch.segment_ids[0, 0]
    lengths = packed_rows.segment_lengths(200)
    assert [int(np.sum(segments == k + 1)) for k in range(len(lengths))] == lengths and np.sum(segments == 0) > 0
    starts = np.flatnonzero(np.diff(np.r_[0, segments]) != 0)
    assert np.all(batch.positions[0, :, 0, starts[segments[starts] > 0]] == 0)
    assert not np.any(batch.loss_mask & ~batch.attention_mask)
    assert np.all(batch.input_ids[0][batch.attention_mask[0]] < config.vision_start_token_id)


def test_profile_ops_are_put_in_categories():
    events = [
        ("dot.1", "dot.1 gemm", 3.0),
        ("fusion.2", "fusion.2 loop_fusion", 1.0),
        ("custom-call.3", "custom-call.3 __cudnn$fmhaSoftmax", 4.0),
        ("copy.4", "copy.4", 2.0),
    ]
    summary = profile_summary.summarize(events, top=2)
    assert summary["category_share"] == {"attention": 0.4, "matmul": 0.3, "copy": 0.2, "other": 0.1}
    assert summary["top_ops"] == [("custom-call.3", 4.0), ("dot.1", 3.0)]


def test_the_table_names_a_section_that_did_not_finish():
    sections = {
        "step": {
            "status": "timed out",
            "error": None,
            "wall_s": 255.0,
            "timeout_s": 255.0,
            "records": [{"case": "L=2 T=8192", "summary": "step 210 ms"}],
        }
    }
    lines = report.table(sections).splitlines()
    assert lines[2].split() == ["step", "L=2", "T=8192", "step", "210", "ms"]
    assert "(timed out)" in lines[3] and "after 255 s of 255 s" in lines[3]
