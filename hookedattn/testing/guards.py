"""What the pytest fixtures do, without pytest: watch for leaked hooks, share models safely
across a session, and build tiny seeded models.

`hookedattn.testing.pytest_plugin` wraps these in fixtures; a suite on another runner can
use them directly.
"""

import dataclasses
import zlib
from collections.abc import Callable
from typing import Any

import torch

from hookedattn.config import HookedTransformerConfig
from hookedattn.hook_points import HookedRootModule, HookPoint, LensHandle
from hookedattn.model import HookedTransformer
from hookedattn.testing.hooks import describe_handles

TINY_CONFIG: dict[str, Any] = dict(
    n_layers=2, d_model=16, n_heads=4, n_ctx=16, d_vocab=32, d_mlp=64, dtype=torch.float64
)


def seed_for(test_id: str) -> int:
    """A seed that is the same for one test on every run and differs between tests."""
    return zlib.crc32(test_id.encode())


def tiny_model(seed: int, **overrides: Any) -> HookedTransformer:
    """A tiny random model (`TINY_CONFIG`, float64) seeded by `seed`; `overrides` are any
    `HookedTransformerConfig` fields, including `seed`."""
    return HookedTransformer(HookedTransformerConfig(**{**TINY_CONFIG, "seed": seed, **overrides}))


class HookRecorder:
    """Records every hook attached anywhere while it is active, on any model.

    `with HookRecorder() as recorder: ...` then `recorder.leaked()`: the hooks attached
    inside the block and still attached. It wraps `HookPoint.add_hook`, the one place
    every hook goes through, so models built inside the block are covered too.
    """

    def __init__(self) -> None:
        self.added: list[LensHandle] = []
        self._original: Callable | None = None

    def start(self) -> "HookRecorder":
        """Begin recording (what `with` does on entry)."""
        original = HookPoint.add_hook
        added = self.added

        def recording_add_hook(point: HookPoint, *args: Any, **kwargs: Any) -> LensHandle:
            handle = original(point, *args, **kwargs)
            added.append(handle)
            return handle

        self._original = original
        HookPoint.add_hook = recording_add_hook
        return self

    def stop(self) -> None:
        """Stop recording; what was recorded stays in `added`."""
        if self._original is not None:
            HookPoint.add_hook = self._original
            self._original = None

    def __enter__(self) -> "HookRecorder":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def leaked(self) -> list[LensHandle]:
        """Hooks attached while recording that are still attached."""
        return [h for h in self.added if h in h.hook_point._fwd or h in h.hook_point._bwd]

    def detach_leaked(self) -> str:
        """Detach the leaked hooks; describe them (empty when none leaked)."""
        leaked = self.leaked()
        for handle in leaked:
            handle.remove()
        return describe_handles(leaked)


@dataclasses.dataclass
class _Shared:
    label: str
    model: HookedRootModule
    pristine: dict[str, torch.Tensor]


class SharedModels:
    """Models loaded once each by `load(name, **kwargs)` and handed to many tests.

    A test that leaves a hook attached to a shared model or edits its weights would change
    every later test's model; `check_and_restore(key)` detects both, undoes them, and
    returns what it found.
    """

    def __init__(self, load: Callable[..., HookedRootModule]) -> None:
        self._load = load
        self._models: dict[tuple, _Shared] = {}

    def get(self, name: str, **kwargs: Any) -> tuple[tuple, HookedRootModule]:
        """The key and the model `load(name, **kwargs)`, loaded on first use."""
        key = (name, *sorted(kwargs.items()))
        if key not in self._models:
            model = self._load(name, **kwargs)
            pristine = {k: v.detach().clone() for k, v in model.state_dict().items()}
            extra = ", ".join(f"{k}={v!r}" for k, v in sorted(kwargs.items()))
            label = f"{name!r}" + (f" ({extra})" if extra else "")
            self._models[key] = _Shared(label, model, pristine)
        return key, self._models[key].model

    def check_and_restore(self, key: tuple) -> list[str]:
        """Problems the last test left on the model at `key` (now undone); empty if none."""
        shared = self._models[key]
        problems = []
        hooks = [h for h in shared.model.attached_hooks() if not h.is_permanent]
        if hooks:
            problems.append(f"hooks left attached to {shared.label}:\n{describe_handles(hooks)}")
            shared.model.reset_hooks()
        state = shared.model.state_dict()
        changed = [k for k, v in shared.pristine.items() if not torch.equal(state[k], v)]
        if changed:
            problems.append(
                f"weights of {shared.label} changed: {', '.join(changed)} "
                f"(edit a copy instead: `model = model.copy()`)"
            )
            with torch.no_grad():
                for name in changed:
                    state[name].copy_(shared.pristine[name])
        return problems
