"""A float64 `transformers` model called with no step rounded to float32: the reference a
float64 import is held to at 1e-10 (`hookedattn.testing.float64_throughout`)."""

from typing import Any

from hookedattn.testing import float64_throughout


class InFloat64Throughout:
    """`hf` (float64), each call run in `float64_throughout()`, with eager attention so that
    its patterns come back (`output_attentions`)."""

    def __init__(self, hf: Any) -> None:
        hf.set_attn_implementation("eager")
        self.hf = hf

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with float64_throughout():
            return self.hf(*args, **kwargs)
