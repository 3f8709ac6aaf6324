"""The scheduling list in tests/conftest.py names files that exist, and they are collected first."""

from pathlib import Path

from tests.conftest import LONGEST_FILES

ROOT = Path(__file__).resolve().parents[1]


def test_the_longest_files_exist():
    assert [path for path in LONGEST_FILES if not (ROOT / path).is_file()] == []


def test_the_longest_files_are_collected_first(request):
    files = list(dict.fromkeys(item.nodeid.split("::")[0] for item in request.session.items))
    present = [path for path in LONGEST_FILES if path in files]
    assert files[: len(present)] == present
