"""TransformerLens 3.x's `BaseTensorConversion`: a tensor map with an inverse, for hook points.

`HookPoint.enable_reshape(conversion)` shows every hook `conversion.convert(activation)`
and passes what the hook returns through `conversion.revert`. A subclass implements
`handle_conversion` (and `revert`, which by default returns its input).
"""

from collections.abc import Callable
from typing import Any


class BaseTensorConversion:
    """`convert(x) = output_filter(handle_conversion(input_filter(x)))`; `revert` undoes it."""

    def __init__(
        self, input_filter: Callable | None = None, output_filter: Callable | None = None
    ) -> None:
        self.input_filter = input_filter
        self.output_filter = output_filter

    def convert(self, input_value: Any, *full_context: Any) -> Any:
        """The converted value: the filters around `handle_conversion`."""
        if self.input_filter is not None:
            input_value = self.input_filter(input_value)
        output = self.handle_conversion(input_value, *full_context)
        return output if self.output_filter is None else self.output_filter(output)

    def handle_conversion(self, input_value: Any, *full_context: Any) -> Any:
        """The conversion itself; a subclass defines it."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement handle_conversion(input_value, *full_context)"
        )

    def revert(self, input_value: Any, *full_context: Any) -> Any:
        """The inverse conversion; the identity unless a subclass defines it."""
        return input_value


__all__ = ["BaseTensorConversion"]
