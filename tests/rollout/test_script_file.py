"""Script files of the scripted engine: a request id scripts one rollout, before its task id
and "*"."""

import json
from types import SimpleNamespace

from pyvision_jax.rollout.scripted_engine import script_from_file


def test_request_id_then_task_id_then_star(tmp_path):
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"t0/1": ["one", "two"], "t0": ["task"], "*": ["any"]}))
    respond = script_from_file(path)
    assert respond(SimpleNamespace(request_id="t0/1"), 0) == "one"
    assert respond(SimpleNamespace(request_id="t0/1"), 5) == "two"
    assert respond(SimpleNamespace(request_id="t0/0"), 0) == "task"
    assert respond(SimpleNamespace(request_id="t9/0"), 0) == "any"
