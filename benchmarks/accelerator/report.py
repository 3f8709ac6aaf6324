"""The suite's one table: a line per measurement, and a line per section that did not finish."""

from __future__ import annotations

from typing import Any


def table(sections: dict[str, dict[str, Any]]) -> str:
    rows = [("section", "case", "result")]
    for name, section in sections.items():
        for record in section["records"]:
            rows.append((name, record["case"], record["summary"]))
        if section["status"] != "done":
            why = section.get("error") or ""
            rows.append(
                (
                    name,
                    f"({section['status']})",
                    f"after {section.get('wall_s', 0):.0f} s of {section.get('timeout_s', 0):.0f} s {why}".strip(),
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    lines = [f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]}" for row in rows]
    lines.insert(1, f"{'-' * widths[0]}  {'-' * widths[1]}  {'-' * 6}")
    return "\n".join(lines)
