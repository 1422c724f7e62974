"""The one exception users see: a single line saying what, where and how to fix."""


class SpecopsError(Exception):
    """A user-facing failure. str(e) is one line: what went wrong, where, how to fix it."""

    def __init__(self, message: str, *, detail: str = ""):
        super().__init__(message)
        #: Optional extra lines (a log tail, failing rows) shown under the message.
        self.detail = detail


class NoRetry(SpecopsError):
    """A connection failure that retrying cannot mend (a changed or unknown host key, refused
    authentication): whoever retries on a lost connection stops at once with this line."""
