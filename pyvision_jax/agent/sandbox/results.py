"""What one call returns, and how a runtime's reply becomes it."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

from PIL import Image

from pyvision_jax.agent.sandbox.channel import ProtocolError
from pyvision_jax.agent.sandbox.config import SandboxConfig

STATE_LOST_NOTICE = (
    "[The Python session was restarted after the previous call failed; "
    "variables and imports defined by earlier code are lost. "
    "Preloaded media are available again.]\n"
)
TRUNCATION_MARKER = "\n[... output truncated: {dropped} more bytes not shown ...]"


@dataclasses.dataclass(frozen=True)
class RunResult:
    """Outcome of one `Sandbox.run` call.

    state_lost: this call ran in a fresh runtime because the previous one was killed or died;
      `stdout` then starts with STATE_LOST_NOTICE.
    """

    stdout: str
    images: list[Image.Image]
    error: str | None
    timed_out: bool
    wall_time_s: float
    state_lost: bool


def reply_stdout(reply: dict[str, Any], config: SandboxConfig) -> str:
    """The printed text of a reply, cut to the config's limit and marked where cut."""
    stdout, dropped = reply.get("stdout"), reply.get("stdout_dropped_bytes")
    if not isinstance(stdout, str) or not isinstance(dropped, int) or dropped < 0:
        raise ProtocolError("reply has a malformed stdout")
    encoded = stdout.encode("utf-8", "replace")
    limit = config.max_stdout_bytes
    if len(encoded) > limit:
        dropped += len(encoded) - limit
        stdout = encoded[:limit].decode("utf-8", "replace")
    if dropped:
        stdout += TRUNCATION_MARKER.format(dropped=dropped)
    return stdout


def reply_error(reply: dict[str, Any]) -> str | None:
    """The error of a reply and its notes (refused images), or None."""
    parts = []
    if isinstance(reply.get("error"), str) and reply["error"]:
        parts.append(reply["error"])
    notes = reply.get("notes")
    if isinstance(notes, list):
        parts += [str(note) for note in notes]
    return "\n".join(parts) or None


def reply_images(reply: dict[str, Any], blob: bytes, config: SandboxConfig) -> list[Image.Image]:
    """The images of a reply, checked again against the config's limits."""
    images, offset = [], 0
    for size in reply["image_sizes"]:
        data = blob[offset : offset + size]
        offset += size
        try:
            with Image.open(io.BytesIO(data)) as image:
                if image.format != "PNG":
                    raise ProtocolError("an image is not a PNG")
                width, height = image.size
                if width * height > config.max_image_pixels or max(width, height) >= config.max_aspect_ratio * min(
                    width, height
                ):
                    raise ProtocolError(f"an image of {width}x{height} passed the limits")
                image.load()
                images.append(image.copy())
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            raise ProtocolError(f"an image could not be decoded ({exc})") from exc
    return images
