"""Errors where TransformerLens raises `AssertionError` or `RuntimeError`.

Each is also the `ValueError` (or `TypeError`) our core raises for the same mistake, so
code written for either catches it: TL code (and TL's tests) that expect `AssertionError`,
and ours that expects `ValueError`.
"""


class TLAssertionError(ValueError, AssertionError):
    """A bad value, where TL asserts."""


class TLTypeAssertionError(TypeError, AssertionError):
    """A bad type, where TL asserts."""


class TLRuntimeError(ValueError, RuntimeError):
    """Shapes that do not broadcast, where TL lets torch raise `RuntimeError`."""
