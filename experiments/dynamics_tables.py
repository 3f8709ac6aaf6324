"""results.md of the ablation runs (records of `experiments.dynamics_stats.run_records`): the best
fixed-temperature baseline, the input-independent baselines, one table row per variant and seed
(the recipe and its ablations, then the controls), plan shares and accuracy by task ability and
by family, and the checks of the learning claims."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from experiments.ablations import CONTROL

HEADER = (
    "| variant | seed | held-out start | early-stopped (step) | last | gain vs best T [95 % CI] | "
    "last - start [95 % CI] | tool calls start -> end | end calls / full | careful share start -> end | "
    "wall s | expected |"
)
RULE = "| " + " | ".join(["---"] * (HEADER.count("|") - 1)) + " |"


def _accuracy(entry: Mapping[str, Any]) -> str:
    low, high = entry["ci95"]
    return f"{entry['accuracy']:.3f} [{low:.3f}, {high:.3f}]"


def _difference(entry: Mapping[str, Any]) -> str:
    low, high = entry["ci95"]
    return f"{entry['estimate']:+.3f} [{low:+.3f}, {high:+.3f}]"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table_row(record: Mapping[str, Any]) -> str:
    s = record["statistics"]
    stopped, calls, plans = s["heldout_early_stopped"], s["tool_calls"], s["plans"]
    return (
        f"| {record['name']} | {record['seed']} | {_accuracy(s['heldout_start'])} | "
        f"{_accuracy(stopped)} ({stopped['step']}) | {_accuracy(s['heldout_last'])} | "
        f"{_difference(s['early_stopped_minus_baseline'])} | {_difference(s['last_minus_start'])} | "
        f"{calls['heldout_start']:.2f} -> {calls['heldout_last']:.2f} | "
        f"{_ratio(s['tool_calls_ratio_to_full']['heldout_last'])} | "
        f"{plans['start']['careful']:.2f} -> {plans['last']['careful']:.2f} | "
        f"{record['wall_time_s']:.0f} | {record['paper']} |"
    )


def results_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: the recipe and its ablations, then the controls, one row per variant and seed."""
    lines = []
    for heading, chosen in (
        ("Recipe and ablations", [r for r in records if r["kind"] != CONTROL]),
        ("Controls", [r for r in records if r["kind"] == CONTROL]),
    ):
        if chosen:
            lines += ["", f"### {heading}", "", HEADER, RULE, *(table_row(r) for r in chosen)]
    return "\n".join(lines[1:])


def _shares(shares: Mapping[str, float] | None) -> str:
    if not shares:
        return "-"
    return " / ".join(f"{shares.get(plan, 0.0):.2f}" for plan in ("quick", "careful", "guess"))


def _family_accuracy(value: float | None) -> str:
    return "" if value is None else f" ({value:.2f})"


def ability_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: each run's held-out plan shares (quick / careful / guess) and accuracy by task
    ability, at the start and the end; empty when no evaluation recorded abilities."""
    abilities = sorted({a for r in records for a in r["statistics"].get("plans_by_ability", {}).get("last", {})})
    if not abilities:
        return ""
    header = "| variant | seed | " + " | ".join(f"{a}: start -> end (accuracy)" for a in abilities) + " |"
    lines = [header, "| " + " | ".join(["---"] * (len(abilities) + 2)) + " |"]
    for r in records:
        by = r["statistics"].get("plans_by_ability", {})
        start, last = by.get("start", {}), by.get("last", {})
        right = r["statistics"].get("accuracy_by_ability", {})
        right_start, right_last = right.get("start", {}), right.get("last", {})
        cells = [
            f"{_shares(start.get(a))}{_family_accuracy(right_start.get(a))} -> {_shares(last.get(a))}"
            f"{_family_accuracy(right_last.get(a))}"
            for a in abilities
        ]
        lines.append(f"| {r['name']} | {r['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def baseline_line(baselines: Mapping[str, Any], validation_seed: int, heldout_seed: int) -> str:
    """The best fixed-temperature baseline (`experiments.baselines.TemperatureBaselines.as_dict`)."""
    low, high = baselines["best_heldout_accuracy_ci95"]
    swept = ", ".join(
        f"T {v['temperature']:g}: {v['accuracy']:.3f} / {h['accuracy']:.3f}"
        for v, h in zip(baselines["validation"], baselines["heldout"])
    )
    return (
        f"Best fixed temperature T {baselines['best_temperature']:g} (chosen on validation seed {validation_seed}): "
        f"held-out (seed {heldout_seed}) accuracy {baselines['best_heldout_accuracy']:.3f} [{low:.3f}, {high:.3f}]. "
        f"Validation / held-out accuracy per temperature: {swept}."
    )


def input_independent_table(report: Mapping[str, Any]) -> str:
    """Markdown: each input-independent baseline (`experiments.fixed_policies.FixedPolicies.as_dict`)
    with its validation and held-out accuracy, by family too, the best on validation named."""
    best = report["best_input_independent"]["name"]
    policies = [*report["constants"], *report["forced_plans"], *report["temperatures"]]
    families = sorted({f for p in policies for f in p["heldout_accuracy_by_family"]})
    lines = [
        "| baseline | validation | held-out [95 % CI] | " + " | ".join(families) + " |",
        "| " + " | ".join(["---"] * (len(families) + 3)) + " |",
    ]
    for p in policies:
        low, high = p["heldout_accuracy_ci95"]
        by = p["heldout_accuracy_by_family"]
        name = f"**{p['name']}** (best)" if p["name"] == best else p["name"]
        cells = " | ".join(f"{by[f]:.3f}" if f in by else "-" for f in families)
        held = f"{p['heldout_accuracy']:.3f} [{low:.3f}, {high:.3f}]"
        lines.append(f"| {name} | {p['validation_accuracy']:.3f} | {held} | {cells} |")
    return "\n".join(lines)


def family_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: each run's held-out plan shares (quick / careful / guess) and accuracy by task
    family at the start, the early-stopped step and the end, and its gain over the best
    input-independent policy; empty when no evaluation recorded families."""
    families = sorted({f for r in records for f in r["statistics"].get("plans_by_family", {}).get("last", {})})
    if not families:
        return ""
    header = "| variant | seed | gain vs best input-independent [95 % CI] | " + " | ".join(
        f"{f}: start -> early-stopped -> end (accuracy)" for f in families
    )
    lines = [header + " |", "| " + " | ".join(["---"] * (len(families) + 3)) + " |"]
    points = ("start", "early_stopped", "last")
    for r in records:
        s = r["statistics"]
        plans, right = s["plans_by_family"], s["accuracy_by_family"]
        gain = s.get("early_stopped_minus_input_independent")
        cells = [
            " -> ".join(f"{_shares(plans[p].get(f))}{_family_accuracy(right[p].get(f))}" for p in points)
            for f in families
        ]
        gain_cell = _difference(gain) if gain else "-"
        lines.append(f"| {r['name']} | {r['seed']} | {gain_cell} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _figure(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_figure(v)}" for key, v in value.items()) + "}"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_figure(v) for v in value) + "]"
    return str(value)


def claim_lines(claims: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One markdown bullet per seed and check of `experiments.dynamics_stats.claim_checks`."""
    lines = []
    for seed, checks in claims.items():
        for name, check in checks.items():
            if name == "passed":
                continue
            figures = ", ".join(f"{key} {_figure(value)}" for key, value in check.items() if key != "passed")
            lines.append(f"- {seed} {name}: {'pass' if check['passed'] else 'FAIL'} ({figures})")
    return lines


def results_markdown(
    records: Sequence[Mapping[str, Any]],
    baselines: Mapping[str, Any],
    claims: Mapping[str, Mapping[str, Any]],
    validation_seed: int,
    heldout_seed: int,
    input_independent: Mapping[str, Any] | None = None,
) -> str:
    """results.md: the baselines, the tables and the claim checks."""
    checks = claim_lines(claims)
    by_ability = ability_table(records)
    by_family = family_table(records)
    return "\n".join(
        [
            baseline_line(baselines, validation_seed, heldout_seed),
            *(
                [
                    "",
                    f"### Input-independent baselines (best chosen on validation seed {validation_seed})",
                    "",
                    input_independent_table(input_independent),
                ]
                if input_independent
                else []
            ),
            "",
            results_table(records),
            *(
                ["", "### Held-out plan shares (quick / careful / guess) by task family", "", by_family]
                if by_family
                else []
            ),
            *(
                ["", "### Held-out plan shares (quick / careful / guess) by task ability", "", by_ability]
                if by_ability
                else []
            ),
            *(["", "### Claims checked", "", *checks] if checks else []),
        ]
    )
