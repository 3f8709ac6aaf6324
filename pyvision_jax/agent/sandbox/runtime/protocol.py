"""The frame format of the channel between the host and the runtime, shared by both sides.

A frame is `MAGIC | u32 json length | u64 blob length | json | blob`; the runtime's first frame
is a `READY_OP` message, and each later one a `REPLY_OP` message answering one request. A
template (started with TEMPLATE_FLAG) sends a `READY_OP` message on its control socket once it
serves fork requests.
"""

import struct

MAGIC = b"PVSB"
HEADER = struct.Struct("<4sIQ")
MAX_REQUEST_JSON_BYTES = 64 * 1024 * 1024
READY_OP = "ready"
REPLY_OP = "reply"
TEMPLATE_FLAG = "--template"
