"""Errors meant for the user: the CLI prints them as one line, never a traceback."""


class GputopError(Exception):
    """A runtime failure the user can act on (exit code 1). The message says what and what to do."""


class UsageError(GputopError):
    """Bad command-line input (exit code 2)."""
