"""The one exception type users see: a one-sentence message naming the problem and the fix."""


class SpecdecError(ValueError):
    """Bad input or an unsupported configuration; the message says what and how to fix it."""
