"""Log text shown where a control character would act instead of show.

Names and lines come from the logs and folders under analysis: an escape sequence in a folder
name would retitle the user's terminal or plant a link, and a right-to-left override would
show a checkpoint path other than the one on disk. Each such character is shown as its escape.
"""

from __future__ import annotations

import re

__all__ = ["visible"]

#: C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides and isolates.
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """``text`` with every control character and bidi control written as its escape (``\\x1b``, ``\\u202e``)."""
    return _HIDDEN.sub(_escape, text) if _HIDDEN.search(text) else text


def _escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
