"""The checkpoint's tiny twin run once and watched, for `_anatomy`.

`Watching` is the half of `_anatomy`'s reader that runs the twin: it hooks the first
decoder layer's pieces, the base model's norms and position tables, the embedding and the
unembedding, runs the twin on a few seeded tokens, and reads off what it saw:

    the calls        each piece's input and output, in order (an output changed in place
                     after its call, as Falcon adds the attention's into the MLP's, kept as
                     it was made)
    what enters      the embedding's scale, a norm of the embeddings (before or after
                     learned positions are added), and which table's rows (learned or
                     sinusoidal) were added, from which row
    the logits       what multiplies the final norm's output on its way to them (before a
                     soft cap)
"""

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from hookedattn.core.hf import _sinusoids
from hookedattn.core.hf._config_fields import logit_cap
from hookedattn.core.hf._probes import ratio
from hookedattn.core.hf._roles import is_norm

_TOKENS = (2, 7)


class Watching:
    """A twin's run, watched (`_watch`); `_anatomy._Reader` sets the places it watches
    (`twin`, `config`, `layer`, `layers`, `base`, `base_name`, `head`), and reads the
    embeddings' norm and the fixed positions this finds."""

    twin: nn.Module
    config: Any
    layer: nn.Module
    layers: list[nn.Module]
    base: nn.Module
    base_name: str
    head: dict[str, Any]  # a prediction head's pieces (`_head`), empty without one
    embed_norm: str | None  # found by `_watch`
    embed_norm_is_final: bool
    positions_fixed: str | None  # a sinusoidal table, found by `_positions`
    embed_norm_before_positions: bool  # found by `_entering`

    def _final_norm(self) -> nn.Module | None:
        """The base model's norm beside its layers that is not the embeddings' (None where
        the last layer's post-residual norm is the final one)."""
        norms = [m for n, m in self.base.named_children() if is_norm(m)
                 and (self._in_base(n) != self.embed_norm or self.embed_norm_is_final)]  # fmt: skip
        if not norms:
            return None
        if len(norms) != 1:
            raise ValueError(
                f"the base model holds {len(norms)} norms beside its layers "
                f"({[type(m).__name__ for m in norms]}); one final norm is recognised"
            )
        return norms[0]

    def _in_base(self, name: str) -> str:
        return f"{self.base_name}.{name}".lstrip(".")

    def _embed_norm_module(self) -> nn.Module | None:
        return None if self.embed_norm is None else self.twin.get_submodule(self.embed_norm)

    def _watch(
        self, capped: bool
    ) -> tuple[list[tuple[str, Tensor, Tensor]], float, float, tuple[str | None, int]]:
        """Run the twin; the calls of the first layer's pieces (name, input, output) in
        order, the layer's own call first, the logit scale (of the logits before their soft
        cap, when `capped`), the embedding's scale, and the learned positions' table and
        offset (None, 0 without)."""
        calls: list[tuple[str, Tensor, Tensor]] = []
        seen: dict[str, Tensor] = {}
        # Each output's version and values when it was made: Falcon adds the attention's
        # output into the MLP's in place (`mlp_output += attention_output`) after its call.
        made: list[tuple[int, Tensor]] = []
        embed = self.twin.get_input_embeddings()
        tables = {n: m for n, m in self.base.named_children()
                  if isinstance(m, nn.Embedding) and m is not embed}  # fmt: skip
        base_norms = {n: m for n, m in self.base.named_children() if is_norm(m)}
        base_norms |= _beside_embedding(self.base, self.twin.get_input_embeddings())
        handles = self._hooks(calls, made, seen, tables, base_norms)
        called: set[int] = set()
        handles += [m.register_forward_pre_hook(lambda module, args: called.add(id(module)))
                    for m in self.twin.modules()]  # fmt: skip
        tokens = torch.randint(
            0, self.config.vocab_size, _TOKENS, generator=torch.Generator().manual_seed(1)
        )
        try:
            with torch.no_grad():
                logits = self.twin(tokens).logits
        finally:
            for handle in handles:
                handle.remove()
        self.uncalled = _uncalled(self.twin, called, self.layers_name)
        calls = [(n, x, y if y._version == version else values)
                 for (n, x, y), (version, values) in zip(calls, made, strict=True)]  # fmt: skip
        scale = ratio(seen["embed"], embed.weight.detach()[tokens], "the embedding's output")
        calls, outer = _base_norm_calls(calls)
        # The layer's own call is recorded last (its hook runs after its children's).
        calls = [calls[-1], *calls[:-1]]
        embed_scale, positions = self._entering(outer, seen, tables)
        scale *= embed_scale
        logit_scale = self._logit_scale(logits, capped, seen, outer, base_norms)
        return calls, logit_scale, scale, positions

    def _hooks(
        self,
        calls: list[tuple[str, Tensor, Tensor]],
        made: list[tuple[int, Tensor]],
        seen: dict[str, Tensor],
        tables: dict[str, nn.Embedding],
        base_norms: dict[str, nn.Module],
    ) -> list[RemovableHandle]:
        """The hooks `_watch` runs the twin with, registered: each call of the first layer
        and its pieces and of the base model's norms appended to `calls` (its output's
        version and values to `made`), and the first layer's input, the position `tables`'
        outputs and the embedding's and unembedding's input and output kept in `seen`."""

        def hook(name: str) -> Callable[..., None]:
            def record(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
                y = _first_output(output)
                calls.append((name, _first_tensor(args, kwargs), y))
                made.append((y._version, y.clone()))

            return record

        def keep(name: str) -> Callable[..., None]:
            def record(module: nn.Module, args: tuple, output: Any) -> None:
                seen[name] = _first_output(output)

            return record

        def enter(module: nn.Module, args: tuple, kwargs: dict) -> None:
            seen["first layer"] = _first_tensor(args, kwargs)

        handles = [self.layer.register_forward_hook(hook(""), with_kwargs=True)]
        handles.append(self.layers[0].register_forward_pre_hook(enter, with_kwargs=True))
        handles += [
            m.register_forward_hook(hook(n), with_kwargs=True)
            for n, m in self.layer.named_children()
        ]
        handles += [m.register_forward_hook(keep(n)) for n, m in tables.items()]
        handles += [m.register_forward_hook(hook(f"norm:{n}"), with_kwargs=True)
                    for n, m in base_norms.items()]  # fmt: skip
        handles.append(self.twin.get_input_embeddings().register_forward_hook(keep("embed")))
        unembed = self.twin.get_output_embeddings()
        handles.append(unembed.register_forward_hook(keep("unembed")))
        handles.append(unembed.register_forward_pre_hook(
            lambda module, args: seen.__setitem__("unembed_in", args[0])))  # fmt: skip
        return handles

    def _logit_scale(
        self,
        logits: Tensor,
        capped: bool,
        seen: dict[str, Tensor],
        outer: dict[str, list[tuple[Tensor, Tensor]]],
        base_norms: dict[str, nn.Module],
    ) -> float:
        """What multiplies the final norm's output on its way to the logits (the logits
        before their soft cap, when `capped`)."""
        if capped:  # undone: cap * atanh(logits / cap)
            cap = logit_cap(self.config)
            logits = cap * torch.atanh((logits.double() / cap).clamp(-1 + 1e-12, 1 - 1e-12))
        # What multiplies the final norm's output before the unembedding reads it (MiniCPM's
        # `hidden_size / dim_model_base`) scales the logits as much as what follows it.
        final = self._final_norm()  # None: the last layer's post-residual norm
        name = next((n for n, m in base_norms.items() if m is final), None)
        before = (
            1.0
            if name is None or self.head  # a head transform (`_head`) reads the final norm
            else ratio(seen["unembed_in"], outer[name][-1][1], "the unembedding's input")
        )
        return before * ratio(logits, seen["unembed"], "the logits")

    def _entering(
        self,
        outer: dict[str, list[tuple[Tensor, Tensor]]],
        seen: dict[str, Tensor],
        tables: dict[str, nn.Embedding],
    ) -> tuple[float, tuple[str | None, int]]:
        """What multiplies the embedding's output before the first layer, and the positions
        added to it (None, 0 without); sets the embeddings' norm, if any."""
        entering = seen["first layer"]
        if entering.shape[-1] != seen["embed"].shape[-1]:
            raise ValueError(
                f"the embedding is {seen['embed'].shape[-1]} wide and the stream entering the "
                f"first layer {entering.shape[-1]}: a map between them before the positions "
                f"are added (OPT's `project_in`) is not read"
            )
        # A norm of the embeddings (BART's `layernorm_embedding`): its output enters layer 0.
        # One module may norm the embeddings and, called again, the last stream (nanochat's).
        normed = [n for n, runs in outer.items() if runs[0][1].shape == entering.shape
                  and torch.allclose(runs[0][1], entering)]  # fmt: skip
        self.embed_norm = self._in_base(normed[0]) if normed else None
        self.embed_norm_is_final = bool(normed) and len(outer[normed[0]]) == 2
        before = [] if normed else self._norm_before_positions(outer, seen["embed"])
        if before:  # BlenderbotSmall: the token embedding normed, then positions added
            x, y = outer[before[0]][0]
            self.embed_norm, self.embed_norm_before_positions = self._in_base(before[0]), True
            scale = ratio(x, seen["embed"], "the embedding norm's input")
            # Rounded at the scale of the normed embedding, which the positions are added to.
            magnitude = float(entering.abs().max())
            return scale, self._positions(entering - y, tables, seen, magnitude)
        summed = outer[normed[0]][0][0] if normed else entering
        try:  # the embedding's output, multiplied after the module (Granite's multiplier)
            return ratio(summed, seen["embed"], "the first layer's input"), (None, 0)
        except ValueError:  # or plus learned positions
            return 1.0, self._positions(summed - seen["embed"], tables, seen)

    def _norm_before_positions(
        self, outer: dict[str, list[tuple[Tensor, Tensor]]], embed: Tensor
    ) -> list[str]:
        """The base model's norms that read (a multiple of) the embedding's output."""
        found = []
        for name, runs in outer.items():
            if runs[0][0].shape != embed.shape:
                continue
            try:
                ratio(runs[0][0], embed, "the norm's input")
            except ValueError:
                continue
            found.append(name)
        return found

    def _positions(
        self,
        added: Tensor,
        tables: dict[str, nn.Embedding],
        seen: dict[str, Tensor],
        magnitude: float | None = None,
    ) -> tuple[str | None, int]:
        """Which table's rows (and from which row) were added to the embedding before the
        first layer; a ValueError if anything else was. `magnitude`: what `added` was
        rounded at, where larger than itself."""
        tolerance = 1e-6 * (max(float(added.abs().max()), magnitude or 0.0) + 1e-12)
        if float(added.abs().max()) <= 1e-7:
            return None, 0
        for name, table in tables.items():
            if name in seen and torch.allclose(added, seen[name].expand_as(added), atol=tolerance):
                rows, weight = added[0], table.weight.detach()
                for offset in range(weight.shape[0] - rows.shape[0] + 1):
                    if torch.allclose(weight[offset : offset + len(rows)], rows, atol=tolerance):
                        return f"{self.base_name}.{name}".lstrip("."), offset
        fixed = _sinusoids.found(added[0], self.base, self.base_name)
        if fixed is not None and torch.allclose(added, added[:1].expand_as(added)):
            self.positions_fixed = fixed.kind
            return fixed.name, fixed.offset
        raise ValueError(
            "the stream entering the first layer is not the embedding (plus "
            "learned or sinusoidal positions): an embedding norm or positions we do not read"
        )


def _uncalled(twin: nn.Module, called: set[int], layers: str) -> tuple[str, ...]:
    """The outermost modules outside the layers that hold parameters and that a forward on
    tokens alone never called, nor any module inside them (Phi-4-multimodal's image and
    audio encoders, inside the embedding it calls): pieces for other inputs."""
    found: list[str] = []
    for name, module in twin.named_modules():
        inside = any(name.startswith(f"{outer}.") for outer in (layers, *found))
        if (name and not inside and id(module) not in called
                and not any(id(m) in called for m in module.modules())
                and any(True for _ in module.parameters())):  # fmt: skip
            found.append(name)
    return tuple(found)


def _beside_embedding(base: nn.Module, embed: nn.Module) -> dict[str, nn.Module]:
    """The norms kept beside the token embedding in a child of the base model that holds
    both (ModernBERT's `embeddings.norm`), by their names in the base model."""
    for name, holder in base.named_children():
        if any(m is embed for m in holder.children()):
            return {f"{name}.{n}": m for n, m in holder.named_children() if is_norm(m)}
    return {}


def _base_norm_calls(
    calls: list[tuple[str, Tensor, Tensor]],
) -> tuple[list[tuple[str, Tensor, Tensor]], dict[str, list[tuple[Tensor, Tensor]]]]:
    """The layer's calls, and apart from them the base model's norms' runs (input,
    output) by norm, in order."""
    outer: dict[str, list[tuple[Tensor, Tensor]]] = {}
    for name, x, y in calls:
        if name.startswith("norm:"):
            outer.setdefault(name.removeprefix("norm:"), []).append((x, y))
    return [call for call in calls if not call[0].startswith("norm:")], outer


def _first_tensor(args: tuple, kwargs: dict) -> Tensor:
    for value in (*args, kwargs.get("hidden_states"), *kwargs.values()):
        if isinstance(value, Tensor):
            return value
    raise ValueError("a piece of the layer was called without a tensor")


def _first_output(output: Any) -> Tensor:
    return output[0] if isinstance(output, tuple | list) else output
