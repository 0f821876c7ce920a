"""User-facing errors.

Anything raised as `FrspecError` is a problem with the user's input or environment: the CLI prints its message on
one line and exits non-zero, without a traceback. Bugs stay ordinary exceptions so they keep their tracebacks.
"""


class FrspecError(Exception):
    """An error caused by bad input (files, arguments, models) with a message meant for the user."""
