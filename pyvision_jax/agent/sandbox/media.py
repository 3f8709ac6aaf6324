"""Preloaded media: the variable names they get, and their copies in the host directory."""

from __future__ import annotations

import keyword
import os
import shutil
from pathlib import Path

from PIL import Image


def check_variable_name(name: str) -> None:
    """ValueError unless `name` can name a variable in the runtime."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"sandbox variable name must be a Python identifier, got {name!r}")


def stage_media(media_dir: Path, name: str, source: Image.Image | str | Path, suffix: str) -> str:
    """Puts `source` (an image, or a file) in `media_dir`, readable by the runtime, and returns
    its file name there; files are linked where they are world-readable, else copied."""
    if isinstance(source, Image.Image):
        filename = f"{name}.png"
        source.save(media_dir / filename, format="PNG", compress_level=1)
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"media file for {name!r} not found: {path}")
        filename = f"{name}{path.suffix or suffix}"
        target = media_dir / filename
        target.unlink(missing_ok=True)
        try:
            if path.stat().st_mode & 0o004 == 0:
                raise OSError("not world-readable: copy it")
            os.link(path, target)
        except OSError:
            shutil.copyfile(path, target)
    (media_dir / filename).chmod(0o644)
    return filename
