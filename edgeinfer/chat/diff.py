"""Comparing two renderings of a template: llama.cpp's common/chat-auto-parser-helpers.cpp.

Template analysis renders the same template twice with one input changed (a reasoning
field added, enable_thinking flipped, ...) and reads the markers around what changed. Text
is split into segments first: a "marker" is anything in `<...>` or `[...]`, the rest is
text; the diff consumes whole equal segments from both ends, then equal characters of the
remaining text segments.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeinfer.chat.peg import SPACE_CHARS
from edgeinfer.kv.prefix import common_prefix

TEXT, MARKER = "text", "marker"


@dataclass(frozen=True)
class Segment:
    kind: str  # TEXT or MARKER
    value: str


@dataclass
class DiffSplit:
    """left = prefix + self.left + suffix, right = prefix + self.right + suffix."""

    prefix: str = ""
    suffix: str = ""
    left: str = ""
    right: str = ""


_CLOSERS = {"<": ">", "[": "]"}


def trim(text: str) -> str:
    """trim_whitespace: C isspace on both ends."""
    return text.strip(SPACE_CHARS)


def segmentize(text: str) -> list[Segment]:
    """segmentize_markers: `<...>` and `[...]` runs are markers, everything between is text
    (an unclosed opener runs to the end as text)."""
    segments, start, closer = [], 0, ""
    for pos, char in enumerate(text):
        if not closer and char in _CLOSERS:
            if start < pos:
                segments.append(Segment(TEXT, text[start:pos]))
            start, closer = pos, _CLOSERS[char]
        elif closer and char == closer:
            segments.append(Segment(MARKER, text[start:pos + 1]))
            start, closer = pos + 1, ""
    if start < len(text):
        segments.append(Segment(TEXT, text[start:]))
    return segments


def prune_whitespace(segments: list[Segment]) -> list[Segment]:
    return [s for s in segments if trim(s.value)]


def _common_suffix_len(a: str, b: str) -> int:
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return n


class _Sides:
    """The two segment lists with llama.cpp's start/end cursors (inclusive ends)."""

    def __init__(self, left: list[Segment], right: list[Segment]):
        self.L, self.R = left, right
        self.ls, self.le, self.rs, self.re = 0, len(left) - 1, 0, len(right) - 1
        self.left_done = self.right_done = False
        self.prefix = self.suffix = ""

    def trim_ends(self) -> None:
        """Consume equal segments from the front and the back while both sides have more
        than one segment left."""
        L, R = self.L, self.R
        while self.ls != self.le and self.rs != self.re:
            advanced = False
            if L[self.ls] == R[self.rs]:
                self.prefix += L[self.ls].value
                self.ls, self.rs, advanced = self.ls + 1, self.rs + 1, True
            if L[self.le] == R[self.re]:
                self.suffix = L[self.le].value + self.suffix
                if self.ls != self.le:
                    self.le -= 1
                else:
                    self.left_done = True
                if self.rs != self.re:
                    self.re -= 1
                else:
                    self.right_done = True
                advanced = True
            if not advanced:
                break

    def trim_last(self) -> None:
        """One side is down to one segment: match it against the other side's ends."""
        L, R = self.L, self.R
        if self.ls == self.le and self.rs != self.re:
            if L[self.ls] == R[self.re]:
                self.suffix = R[self.re].value + self.suffix
                self.re, self.left_done = self.re - 1, True
            elif L[self.ls] == R[self.rs]:
                self.prefix += R[self.rs].value
                self.rs, self.left_done = self.rs + 1, True
        elif self.rs == self.re and self.ls != self.le:
            if L[self.le] == R[self.rs]:
                self.suffix = L[self.le].value + self.suffix
                self.le, self.right_done = self.le - 1, True
            elif L[self.ls] == R[self.rs]:
                self.prefix += L[self.ls].value
                self.ls, self.right_done = self.ls + 1, True
        elif (self.ls == self.le and self.rs == self.re and L[self.ls] == R[self.rs]
              and L[self.ls].kind == MARKER):
            self.prefix += R[self.rs].value
            self.left_done = self.right_done = True

    def remainders(self) -> tuple[str, str]:
        left_stop = self.le if self.left_done else self.le + 1
        right_stop = self.re if self.right_done else self.re + 1
        return ("".join(s.value for s in self.L[self.ls:left_stop]),
                "".join(s.value for s in self.R[self.rs:right_stop]))


def diff_split(left: str, right: str) -> DiffSplit:
    """calculate_diff_split."""
    left_segs, right_segs = segmentize(left), segmentize(right)
    if not left_segs:
        return DiffSplit(right=right)
    if not right_segs:
        return DiffSplit(left=left)
    sides = _Sides(left_segs, right_segs)
    sides.trim_ends()
    sides.trim_last()
    L, R = sides.L, sides.R
    text_suffix = L[sides.le].kind == TEXT and R[sides.re].kind == TEXT
    text_prefix = R[sides.rs].kind == TEXT and L[sides.ls].kind == TEXT
    rest_left, rest_right = sides.remainders()
    suffix_len = _common_suffix_len(rest_left, rest_right) if text_suffix else 0
    prefix_len = common_prefix(rest_left[:len(rest_left) - suffix_len],
                                    rest_right[:len(rest_right) - suffix_len]) \
        if text_prefix else 0
    result = DiffSplit(
        prefix=sides.prefix + rest_left[:prefix_len],
        suffix=rest_left[len(rest_left) - suffix_len:] + sides.suffix,
        left=rest_left[prefix_len:len(rest_left) - suffix_len],
        right=rest_right[prefix_len:len(rest_right) - suffix_len],
    )
    if not result.left and not result.right:  # no difference at all
        return DiffSplit(prefix=left)
    if not result.left and result.right and right.startswith(left):
        return DiffSplit(prefix=left, right=right[len(left):])
    return result
