"""Functions that `torch.compile` reads once, when it traces, instead of at every call.

A hook point asks which thread runs it (hooks attached in one thread are that thread's), and
`threading.get_ident` is something `torch.compile` cannot trace: each hook point would split
the graph. Marked constant, the thread is read once when the graph is traced.

torch's marker, `torch.compiler.assume_constant_result`, imports `torch._dynamo` to set the
mark: 1.5 to 2.5 s of `import hookedattn` on a 2-core machine, for every model, compiled or
not. `constant_when_traced` sets the same mark (the attribute torch's marker sets, read by
its compiler when it traces) without that import; `tests/core/test_traced_constant.py`
checks that torch's marker still sets exactly this, so a torch upgrade that changes it
fails there rather than splitting graphs silently.
"""

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

# What `torch._dynamo.assume_constant_result` sets on the function it marks (torch 2.13).
MARK = "_dynamo_marked_constant"


def constant_when_traced(fn: F) -> F:
    """`fn`, marked as `torch.compiler.assume_constant_result` marks it; in eager mode it
    runs as it is."""
    setattr(fn, MARK, True)
    return fn
