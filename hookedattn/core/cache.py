"""`ActivationCache`: a read-only mapping from hook name to the activation recorded there.

It holds activations and nothing else: no reference to the model (so keeping a cache never
keeps a model alive) and no analysis (that lives in the `analysis` package, which takes
the model and the cache as explicit arguments).

A cached tensor never changes. Reading an entry hands out the tensor itself (no copy), so
an in-place edit of it (`cache["pattern", 0].mul_(0)`, `cache["resid_post", 0][0] = 0`)
would reach the cache; every tensor carries a version counter, shared by all views of its
storage, and the cache notes each one's when it is recorded. The next read of an entry
whose tensor was edited in place, through it or through any tensor sharing its storage
(`blocks.0.hook_resid_post` is `blocks.1.hook_resid_pre`), raises a `CacheEditedError`
naming the entry. Python runs `cache[k] += 1` as a read, an in-place add and a write, so
that edit happens before the write is refused; the refusal says so, and the entry then
cannot be read.
"""

from collections.abc import Iterator, Mapping

import torch
from jaxtyping import Float
from torch import Tensor

from hookedattn.core import _tl_names
from hookedattn.core import names as _names
from hookedattn.core._stacked_weights import stacked_layers
from hookedattn.core.html import html_table

CacheKey = str | tuple


class CacheEditedError(RuntimeError):
    """A cached tensor was edited in place after it was recorded, so it is no longer what
    the forward produced; it cannot be read."""


class ActivationCache(Mapping[str, Tensor]):
    """Activations by hook name, in the order the forward pass produced them.

    Index with a full name (`cache["blocks.0.attn.hook_pattern"]`) or with shorthand:
    `cache["pattern", 0]`, `cache["resid_pre", -1]`, `cache["scale", 1, "ln2"]`,
    `cache["scale"]` (the final norm). Gradients from `run_with_cache(incl_bwd=True)` are
    stored under `name + "_grad"`. A tensor edited in place after it was recorded cannot
    be read again (`CacheEditedError`, see the module docstring).
    """

    def __init__(
        self,
        activations: Mapping[str, Tensor],
        n_layers: int,
        has_batch_dim: bool = True,
        *,
        _versions: Mapping[str, int] | None = None,
    ) -> None:
        self._data: dict[str, Tensor] = dict(activations)
        self.n_layers = n_layers
        self.has_batch_dim = has_batch_dim
        # The version counter of each tensor when it was recorded (run_with_cache notes it
        # during the forward, so an edit later in the same forward is caught too).
        versions = _versions or {}
        self._versions = {n: versions.get(n, t._version) for n, t in self._data.items()}

    def __getstate__(self) -> dict:
        # A copied or unpickled tensor starts a new version counter: keep which entries
        # were edited, not the counts.
        state = dict(self.__dict__)
        state["_versions"] = {n: n in self._edited_names() for n in self._data}
        return state

    def __setstate__(self, state: dict) -> None:
        edited = state.pop("_versions")
        self.__dict__.update(state)
        self._versions = {n: -1 if edited[n] else t._version for n, t in self._data.items()}

    # ------------------------------------------------------------ mapping protocol
    def __getitem__(self, key: CacheKey) -> Tensor:
        name = self._full_name(key)
        try:
            t = self._data[name]
        except KeyError:
            raise KeyError(self._missing_message(key, name)) from None
        if t._version != self._versions[name]:
            raise CacheEditedError(self._edited_message(name))
        return t

    def __contains__(self, key: object) -> bool:
        try:
            return self._full_name(key) in self._data
        except (KeyError, ValueError):
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __setitem__(self, key: object, value: object) -> None:
        message = "an ActivationCache is read-only; build a new one to change it"
        edited = self._edited_names()
        if edited:  # `cache[k] += x` has already edited the tensor in place by now
            message += (
                f". The tensor was edited in place before this assignment (as `cache[k] += "
                f"x` does), so {', '.join(edited)} can no longer be read; write "
                f"`cache[k] + x` for a new tensor"
            )
        raise TypeError(message)

    def __delitem__(self, key: object) -> None:
        raise TypeError("an ActivationCache is read-only; build a new one to change it")

    def __getattr__(self, name: str) -> object:
        # Reached only when the ordinary lookup fails: TransformerLens's method names
        # (`decompose_resid`, ...) get the name of what to write here instead.
        raise AttributeError(_tl_names.missing_attribute("ActivationCache", name))

    # ---------------------------------------------------------------- conversions
    def to(self, device: str | torch.device) -> "ActivationCache":
        """A new cache with every tensor moved to `device`."""
        moved = {name: self[name].to(device) for name in self._data}
        return ActivationCache(moved, self.n_layers, self.has_batch_dim)

    def remove_batch_dim(self) -> "ActivationCache":
        """A new cache with the batch axis (of size 1) removed from every tensor (an
        expert's rows, which have none, stay as they are)."""
        if not self.has_batch_dim:
            raise ValueError("this cache has no batch axis left to remove")
        batched = [name for name in self._data if not _names.is_rows(name)]
        sizes = {self._data[name].shape[0] for name in batched}
        if sizes - {1}:
            raise ValueError(f"remove_batch_dim needs a batch of 1, got batch sizes {sizes}")
        squeezed = {
            name: self[name] if _names.is_rows(name) else self[name][0] for name in self._data
        }
        return ActivationCache(squeezed, self.n_layers, has_batch_dim=False)

    def stack(self, name: str, layer_type: str | None = None) -> Float[Tensor, "layer ..."]:
        """One activation stacked across layers: `stack("pattern")` is `[layer batch ...]`.

        `name` is a short name (`"pattern"`, `"resid_pre"`, ...); the per-block norms also
        need which one: `stack("scale", "ln2")`.
        """
        if self.n_layers == 0:
            raise ValueError(f"a model with 0 layers has no per-layer {name!r} to stack")
        keys = [
            (name, layer) if layer_type is None else (name, layer, layer_type)
            for layer in range(self.n_layers)
        ]
        return stacked_layers([self[key] for key in keys], f"cache.stack({name!r})",
                              f"cache[({name!r}, {{layer}})]")  # fmt: skip

    def nbytes(self) -> int:
        """Bytes held by the cache, counting each underlying storage once."""
        storages = {}
        for t in self._data.values():
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())

    # ----------------------------------------------------------------------- repr
    def __repr__(self) -> str:
        if not self._data:
            return "ActivationCache(empty)"
        width = max(len(n) for n in self._data)
        dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in self._data.values()})
        devices = sorted({str(t.device) for t in self._data.values()})
        lines = [
            f"ActivationCache: {len(self._data)} activations, "
            f"{self.nbytes() / 2**20:.2f} MB, {'/'.join(dtypes)} on {'/'.join(devices)}"
            + ("" if self.has_batch_dim else ", batch axis removed")
        ]
        for name, t in self._data.items():
            size = t.numel() * t.element_size() / 2**20
            lines.append(f"  {name:<{width}}  {tuple(t.shape)!s:<22} {size:8.3f} MB")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        # A notebook shows the repr's table as HTML: its first line above, one row a name.
        rows = [
            (name, str(tuple(t.shape)), str(t.dtype).removeprefix("torch."), t.nbytes / 2**20)
            for name, t in self._data.items()
        ]
        caption = repr(self).split("\n")[0]
        table = html_table(("name", "shape", "dtype", "MB"), rows, caption)
        return f'<div style="max-height:28em;overflow:auto">{table}</div>'

    # -------------------------------------------------------------------- helpers
    def _full_name(self, key: object) -> str:
        if isinstance(key, str) and key in self._data:
            return key
        if isinstance(key, str) and key.endswith("_grad"):
            return self._full_name(key.removesuffix("_grad")) + "_grad"
        if not isinstance(key, str | tuple):
            raise KeyError(f"cache keys are hook names or (name, layer) tuples, got {key!r}")
        return _names.expand_key(key, self.n_layers)

    def _edited_names(self) -> list[str]:
        return [n for n, t in self._data.items() if t._version != self._versions[n]]

    def _edited_message(self, name: str) -> str:
        storage = self._data[name].untyped_storage().data_ptr()
        sharing = [
            n
            for n, t in self._data.items()
            if n != name and t.numel() and t.untyped_storage().data_ptr() == storage
        ]
        shared = f" (it shares its storage with {', '.join(sharing)})" if sharing else ""
        return (
            f"cache entry {name!r}{shared} was edited in place after it was recorded, so it "
            f"no longer holds what the forward produced. Edit a copy instead: "
            f"`cache[name].clone()`, or out-of-place operations (`x * 0`, not `x.mul_(0)`)"
        )

    def _missing_message(self, key: CacheKey, name: str) -> str:
        where = "" if key == name else f" (from {key!r})"
        return f"{name!r}{where} is not in this cache. " + _names.unknown_name_message(
            name, self._data
        ).replace("in this model", "in this cache")
