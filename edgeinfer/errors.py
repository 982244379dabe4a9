"""The one exception type users see: its message is printed as a single line by the CLI and
mapped to a 4xx JSON error by the server (a `ModelFault`, the model's own, to a 500)."""

from __future__ import annotations


class EdgeInferError(Exception):
    """A user-facing error with a one-line message (bad file, bad flag, unsupported model)."""


class ModelFault(EdgeInferError):
    """The model computed unusable numbers (NaN or infinite logits): a corrupt or
    incompatible file rather than a bad request."""


def printable(text: object, limit: int = 80) -> str:
    """A string from a file as one line of plain text: unprintable characters (newlines,
    escape sequences, undecodable bytes) written as Python escapes, cut to `limit`
    characters with an ellipsis. For error messages and terminal output, never markup."""
    text = text if isinstance(text, str) else str(text)
    cut = len(text) > limit
    text = text[:limit]
    if not text.isprintable():
        text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
        cut = cut or len(text) > limit
        text = text[:limit]
    return text + "…" if cut else text
