"""Errors of the data layer."""


class DataUnavailable(RuntimeError):
    """Data a run needs is not installed or not readable; the message names the fix."""
