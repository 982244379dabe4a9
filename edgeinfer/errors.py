"""The one exception type users see: its message is printed as a single line by the CLI and
mapped to a 4xx JSON error by the server."""


class EdgeInferError(Exception):
    """A user-facing error with a one-line message (bad file, bad flag, unsupported model)."""
