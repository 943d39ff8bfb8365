"""What the pytest fixtures do, without pytest: watch for leaked hooks, share models safely
across a session, and build tiny seeded models.

The pytest plugin (`pytest_hookedattn`) wraps these in fixtures; a suite on another runner
can use them directly.
"""

import dataclasses
import threading
import zlib
from collections.abc import Callable
from typing import Any

import torch

from hookedattn.core.hook_points import HookPoint, LensHandle
from hookedattn.core.hooked_root import HookedRootModule
from hookedattn.testing.hooks import describe_handles
from hookedattn.testing.models import TINY_CONFIG as TINY_CONFIG
from hookedattn.testing.models import tiny_model as tiny_model


def seed_for(test_id: str) -> int:
    """A seed that is the same for one test on every run and differs between tests."""
    return zlib.crc32(test_id.encode())


class HookRecorder:
    """Records every hook attached anywhere while it is active, on any model.

    `with HookRecorder() as recorder: ...` then `recorder.leaked()`: the hooks attached
    inside the block and still attached. It wraps `HookPoint.add_hook`, the one place
    every hook goes through, so models built inside the block are covered too. Recorders
    may overlap and stop in any order: `add_hook` is wrapped once, while any is recording,
    and each hook goes to every recorder recording at the time.
    """

    def __init__(self) -> None:
        self.added: list[LensHandle] = []

    def start(self) -> "HookRecorder":
        """Begin recording (what `with` does on entry)."""
        with _RECORDING.lock:
            if self not in _RECORDING.recorders:
                if not _RECORDING.recorders:
                    _RECORDING.original = HookPoint.add_hook
                    HookPoint.add_hook = _recording_add_hook
                _RECORDING.recorders.append(self)
        return self

    def stop(self) -> None:
        """Stop recording; what was recorded stays in `added`."""
        with _RECORDING.lock:
            if self in _RECORDING.recorders:
                _RECORDING.recorders.remove(self)
                if not _RECORDING.recorders:
                    HookPoint.add_hook = _RECORDING.original
                    _RECORDING.original = None

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


@dataclasses.dataclass(eq=False)
class _Recording:
    """The recorders now recording, and the `HookPoint.add_hook` they wrap."""

    recorders: list[HookRecorder] = dataclasses.field(default_factory=list)
    original: Callable | None = None
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


_RECORDING = _Recording()


def _recording_add_hook(point: HookPoint, *args: Any, **kwargs: Any) -> LensHandle:
    handle = _RECORDING.original(point, *args, **kwargs)
    for recorder in tuple(_RECORDING.recorders):
        recorder.added.append(handle)
    return handle


@dataclasses.dataclass(frozen=True)
class _Snapshot:
    """What a test must leave as it found it on a shared model, besides hooks and weights."""

    cfg: Any
    tokenizer: Any
    tensors: dict[str, tuple[torch.dtype, torch.device, bool]]  # dtype, device, requires_grad
    training: dict[str, bool]

    @classmethod
    def of(cls, model: HookedRootModule) -> "_Snapshot":
        """The model's config and tokenizer objects, its tensors' kinds, its modes."""
        tensors = {
            name: (t.dtype, t.device, t.requires_grad)
            for name, t in [*model.named_parameters(), *model.named_buffers()]
        }
        training = {name: m.training for name, m in model.named_modules()}
        cfg, tokenizer = getattr(model, "cfg", None), getattr(model, "tokenizer", None)
        return cls(cfg, tokenizer, tensors, training)


@dataclasses.dataclass
class _Shared:
    label: str
    model: HookedRootModule
    pristine: dict[str, torch.Tensor]
    snapshot: _Snapshot


class SharedModels:
    """Models loaded once each by `load(name, **kwargs)` and handed to many tests.

    A test that changes a shared model would change every later test's model.
    `check_and_restore(key)` detects what a test left behind: hooks (permanent ones too),
    edited weights, a changed dtype or device (`.to(torch.float64)`), training mode,
    changed `requires_grad`, a replaced `cfg` or `tokenizer`, a non-empty `hook.ctx`, a
    parameter's `.grad`; it returns what it found and undoes it, reloading the model when
    it cannot be undone in place (a changed dtype, device or config).
    """

    def __init__(self, load: Callable[..., HookedRootModule]) -> None:
        self._load = load
        self._models: dict[tuple, _Shared] = {}

    def get(self, name: str, **kwargs: Any) -> tuple[tuple, HookedRootModule]:
        """The key and the model `load(name, **kwargs)`, loaded on first use."""
        key = (name, *sorted(kwargs.items()))
        if key not in self._models:
            extra = ", ".join(f"{k}={v!r}" for k, v in sorted(kwargs.items()))
            label = f"{name!r}" + (f" ({extra})" if extra else "")
            self._models[key] = self._fresh(label, name, kwargs)
        return key, self._models[key].model

    def _fresh(self, label: str, name: str, kwargs: dict[str, Any]) -> _Shared:
        model = self._load(name, **kwargs)
        pristine = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return _Shared(label, model, pristine, _Snapshot.of(model))

    def check_and_restore(self, key: tuple) -> list[str]:
        """Problems the last test left on the model at `key` (now undone); empty if none."""
        shared = self._models[key]
        model, label, before = shared.model, shared.label, shared.snapshot
        problems = _hook_problems(model, label)
        now = _Snapshot.of(model)
        reload = [
            *([f"the config of {label} was replaced"] if now.cfg != before.cfg else []),
            *_kind_problems(before, now, label),
        ]
        if reload:
            name, *kwargs = key
            self._models[key] = self._fresh(label, name, dict(kwargs))
            return [*problems, *reload, f"(a fresh {label} was loaded for the next tests)"]
        problems += _undo_in_place(model, label, shared.pristine, before, now)
        return problems


def _hook_problems(model: HookedRootModule, label: str) -> list[str]:
    """Hooks (permanent ones too) and hook contexts left on `model`; both are cleared."""
    problems = []
    hooks = model.attached_hooks()
    if hooks:
        problems.append(f"hooks left attached to {label}:\n{describe_handles(hooks)}")
        model.reset_hooks(including_permanent=True)
    contexts = [name for name, point in model.hook_dict.items() if point.ctx]
    if contexts:
        problems.append(f"hook.ctx left non-empty on {label} at {', '.join(contexts)}")
        model.clear_contexts()
    return problems


def _kind_problems(before: _Snapshot, now: _Snapshot, label: str) -> list[str]:
    """Tensors of `label` whose dtype or device changed, or that appeared or went."""
    if set(before.tensors) != set(now.tensors):
        return [f"the parameters and buffers of {label} are not the ones it was loaded with"]
    changed = [
        f"{name} {before.tensors[name][0]} on {before.tensors[name][1]} -> "
        f"{now.tensors[name][0]} on {now.tensors[name][1]}"
        for name in before.tensors
        if before.tensors[name][:2] != now.tensors[name][:2]
    ]
    if not changed:
        return []
    return [f"dtype or device of {label} changed (use a copy): {', '.join(changed[:4])}"]


def _undo_in_place(
    model: HookedRootModule,
    label: str,
    pristine: dict[str, torch.Tensor],
    before: _Snapshot,
    now: _Snapshot,
) -> list[str]:
    """Find and undo the changes that can be undone on the model itself."""
    problems = []
    state = model.state_dict()
    changed = [k for k, v in pristine.items() if not torch.equal(state[k], v)]
    if changed:
        problems.append(
            f"weights of {label} changed: {', '.join(changed)} "
            f"(edit a copy instead: `model = model.copy()`)"
        )
        with torch.no_grad():
            for name in changed:
                state[name].copy_(pristine[name])
    parameters = dict(model.named_parameters())
    with_grad = [name for name, p in parameters.items() if p.grad is not None]
    if with_grad:
        problems.append(f".grad left on {label}: {', '.join(with_grad[:4])}")
        for name in with_grad:
            parameters[name].grad = None
    flipped = [n for n, p in parameters.items() if p.requires_grad != before.tensors[n][2]]
    if flipped:
        problems.append(f"requires_grad of {label} changed: {', '.join(flipped[:4])}")
        for name in flipped:
            parameters[name].requires_grad_(before.tensors[name][2])
    if now.training != before.training:
        problems.append(f"{label} was left in {'training' if model.training else 'eval'} mode")
        for name, module in model.named_modules():
            module.training = before.training[name]
    if now.tokenizer is not before.tokenizer:
        problems.append(f"the tokenizer of {label} was replaced")
        model.tokenizer = before.tokenizer
    return problems
