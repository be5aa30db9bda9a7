"""Writing a document's content to standard output, as ``semq inbox show``
does: bytes as they came to a pipe or a file, but to a terminal only
text.

A document comes from another organization. Its bytes written to a
terminal are read by the terminal: an escape sequence can retitle the
window, redefine keys, hide what follows or, on some terminals, answer
back into the shell's input. Like ``git show`` and ``less``, the command
therefore writes to a terminal only content that is UTF-8 text without
control characters (newline, carriage return and tab are text); anything
else is refused with one line naming the document, its size and how to
get it (``--raw``, or ``semq inbox save``). Not on a terminal, nothing
changes: the bytes go out as they came.

A large document is checked block by block as it is written (it is never
whole in memory), so text that turns binary half-way stops there.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable
from typing import BinaryIO, Final

__all__ = ["TextCheck", "write_content"]

# C0 controls but \t \n \r, DEL, and the C1 controls (U+0080..U+009F: a
# terminal may take U+009B as CSI, like ESC [).
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


class TextCheck:
    """Incremental: ``feed(block)`` is False once the bytes so far are not
    UTF-8 text or hold a control character; ``end()`` also refuses a
    character cut off at the end. A UTF-8 character split across blocks is
    text."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")

    def feed(self, block: bytes) -> bool:
        try:
            text = self._decoder.decode(block, final=False)
        except UnicodeDecodeError:
            return False
        return _CONTROL.search(text) is None

    def end(self) -> bool:
        try:
            self._decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return False
        return True


def write_content(blocks: Iterable[bytes], out: BinaryIO, *, text_only: bool) -> bool:
    """Write ``blocks`` to ``out``; with ``text_only``, each block is
    checked before it is written and writing stops at the first that is not
    text (False: the caller says why). True when everything was written."""
    check = TextCheck() if text_only else None
    for block in blocks:
        if check is not None and not check.feed(block):
            return False
        out.write(block)
    return check is None or check.end()
