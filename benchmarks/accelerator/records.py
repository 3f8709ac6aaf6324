"""Results of one section, written to its JSON file after every measurement, so that a
section stopped at its time limit still leaves what it had measured."""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any


def _plain(value: Any) -> Any:
    """JSON-ready copy: numpy and JAX scalars as Python numbers, tuples as lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    return value


class SectionLog:
    """The records of one section: (case, metrics, one-line summary) each."""

    def __init__(self, section: str, path: Path):
        self.section, self.path = section, Path(path)
        self.records: list[dict[str, Any]] = []
        self.status, self.error = "running", None
        self._write()

    def record(self, case: str, metrics: dict[str, Any], summary: str) -> None:
        self.records.append({"case": case, "summary": summary, "metrics": _plain(metrics)})
        print(f"[{self.section}] {case}: {summary}", flush=True)
        self._write()

    def finish(self) -> None:
        self.status = "done"
        self._write()

    def fail(self, error: BaseException) -> None:
        self.status = "error"
        self.error = "".join(traceback.format_exception_only(type(error), error)).strip()
        traceback.print_exc()
        self._write()

    def _write(self) -> None:
        data = {"section": self.section, "status": self.status, "error": self.error, "records": self.records}
        staging = self.path.with_suffix(".tmp")
        staging.write_text(json.dumps(data, indent=1))
        os.replace(staging, self.path)


def read_section(path: Path, section: str) -> dict[str, Any]:
    """A section's file as written so far; an empty record when it wrote none."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {"section": section, "status": "no output", "error": None, "records": []}
