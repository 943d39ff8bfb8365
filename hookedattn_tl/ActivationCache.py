"""TransformerLens's `ActivationCache`: our cache, plus TL's analysis methods, bound to a model.

`hookedattn.ActivationCache` holds activations and nothing else. TransformerLens's cache
also holds the model that made it and answers questions about it (`decompose_resid`,
`accumulated_resid`, `stack_head_results`, ...). This subclass is that: the same mapping,
the model kept as `cache.model`, and TL's methods with TL's arguments and return
conventions (`(tensor, labels)` with `return_labels=True`, labels such as `"0_attn_out"`,
`pos_slice`, `apply_ln` dividing by the cached scale without the norm's gain and bias).
The sums come from `analysis` (`decompose_resid`, `accumulated_resid`, `head_results`,
`stacked_head_results`, `normalize`); only the labels, slices and stacking order are TL's.

As in TransformerLens, `remove_batch_dim`, `to` and `compute_head_results` change the
cache in place and return it.
"""

import functools
import logging
import re
from collections.abc import Mapping
from typing import Any

import torch
from einops import rearrange
from jaxtyping import Float
from torch import Tensor

import analysis
from analysis.head_results import head_results, stacked_head_results
from analysis.normalization import NormSite, normalize
from hookedattn.core.cache import ActivationCache as _CoreCache
from hookedattn.core.mixer_config import MIXER_KINDS
from hookedattn_tl.utils import Slice, SliceInput, get_act_name

Stack = Float[Tensor, "component ..."]
# A sublayer's term: attention's, an MLP's, or a hybrid's mixer's (`L0_mamba2`).
_MIXERS = "|".join(kind for kind in MIXER_KINDS if kind not in ("attention", "none"))
_SUBLAYER_LABEL = re.compile(rf"^L(\d+)_(attn|mlp|{_MIXERS})$")
_ACCUMULATED_LABEL = re.compile(r"^L(\d+)_resid_(pre|mid)$")
# A copy that shares the original's memory until either is written to (copy-on-write), so
# that a stack returned from the cache's own stack costs no copy unless it is edited.
_lazy_clone = getattr(torch, "_lazy_clone", torch.clone)


class ActivationCache(_CoreCache):
    """Activations by hook name, with the model that recorded them and TL's methods.

    `ActivationCache(cache_dict, model, has_batch_dim=True)` as in TransformerLens;
    `tokens` (set by `hookedattn_tl.HookedTransformer.run_with_cache`) are the input ids,
    which lets `hookedattn_tl.patching` run our batched patching engine from a clean cache.
    """

    # compute_head_results' `[(layer head) ...]` stack, and the cache entries that view it.
    _head_stack: tuple[Tensor, tuple[Tensor, ...]] | None = None

    def __init__(
        self,
        cache_dict: Mapping[str, Tensor],
        model: Any,
        has_batch_dim: bool = True,
        *,
        tokens: Tensor | None = None,
    ) -> None:
        super().__init__(cache_dict, model.cfg.n_layers, has_batch_dim)
        self.model = model
        self.tokens = tokens

    # ------------------------------------------------------------ TL's mapping
    @property
    def cache_dict(self) -> dict[str, Tensor]:
        """The underlying dict from full hook name to tensor."""
        return self._data

    @property
    def has_embed(self) -> bool:
        """Whether `hook_embed` was recorded."""
        return "hook_embed" in self._data

    @property
    def has_pos_embed(self) -> bool:
        """Whether `hook_pos_embed` was recorded."""
        return "hook_pos_embed" in self._data

    def __getitem__(self, key: Any) -> Tensor:
        return super().__getitem__(self._tl_key(key))

    def __contains__(self, key: object) -> bool:
        try:
            return super().__contains__(self._tl_key(key))
        except KeyError:  # a TL 4 name no hook point here sees
            return False

    def _tl_key(self, key: Any) -> Any:
        """TL's reading of a key (`"k6"`, `("z", 0, "attn")`) when it names a cached tensor;
        otherwise the key itself, so that our shorthand and our error messages apply."""
        if isinstance(key, str):
            if key in self._data:
                return key
            ours = self._bridge_name(key)
            if ours in self._data:
                return ours
            full = _tl_name(key, (str,), self.n_layers)
        elif isinstance(key, tuple) and 1 <= len(key) <= 3 and isinstance(key[0], str):
            types = tuple(map(type, key))
            try:
                full = _tl_name(key, types, self.n_layers)
            except TypeError:  # an unhashable part: read it without the memo
                full = _tl_name.__wrapped__(key, types, self.n_layers)
            if full is not None and full not in self._data:
                full = self._bridge_name(full)  # TL 4's ("in", 0): blocks.0.hook_in
        else:
            return key
        return full if full is not None and full in self._data else key

    def _bridge_name(self, name: str) -> str:
        """Our name for TL 4's hook name `name` when the model is a TransformerBridge (which
        raises, saying what to use, for a TL 4 name no hook point here sees); else `name`."""
        resolve = getattr(self.model, "resolve_hook_alias", None)
        if resolve is None:
            return name
        grad = "_grad" if name.endswith("_grad") else ""
        return resolve(name.removesuffix("_grad")) + grad

    def remove_batch_dim(self) -> "ActivationCache":
        """Remove the batch axis (of size one) from every tensor, in place; returns self."""
        if not self.has_batch_dim:
            logging.warning("Tried removing batch dimension after already having removed it.")
            return self
        squeezed = dict(super().remove_batch_dim())
        self.has_batch_dim = False
        self._set_data(squeezed)
        return self

    def to(self, device: str | torch.device) -> "ActivationCache":
        """Move every tensor to `device`, in place; returns self."""
        self._set_data({name: self[name].to(device) for name in self._data})
        return self

    def toggle_autodiff(self, mode: bool = False) -> None:
        """`torch.set_grad_enabled(mode)`: global state, as in TransformerLens."""
        logging.warning("Changed the global state, set autodiff to %s", mode)
        torch.set_grad_enabled(mode)

    def apply_slice_to_batch_dim(self, batch_slice: "SliceInput | Slice") -> "ActivationCache":
        """A new cache holding a slice of the batch (an int slice drops the batch axis)."""
        batch_slice = Slice(batch_slice)
        if not self.has_batch_dim and batch_slice.mode != "identity":
            raise ValueError("this cache has no batch axis to slice (remove_batch_dim was applied)")
        sliced = {name: batch_slice.apply(t, dim=0) for name, t in self._data.items()}
        tokens = None if self.tokens is None else batch_slice.apply(self.tokens, dim=0)
        keeps_batch = batch_slice.mode != "int" and self.has_batch_dim
        return ActivationCache(sliced, self.model, keeps_batch, tokens=tokens)

    # ------------------------------------------------------------ residual stacks
    def accumulated_resid(
        self,
        layer: int | None = None,
        incl_mid: bool = False,
        apply_ln: bool = False,
        pos_slice: "SliceInput | Slice" = None,
        mlp_input: bool = False,
        return_labels: bool = False,
    ) -> Stack | tuple[Stack, list[str]]:
        """The residual stream at each block boundary up to block `layer`'s input.

        Labels `"0_pre"`, `"0_mid"` (with `incl_mid`), ..., `"final_post"`; `layer` None, -1
        or `n_layers` goes to the final stream. With `apply_ln` the final stream's entries
        go through `ln_final` with each entry's own scale (the logit lens), other layers'
        through their `ln1` (`ln2` with `mlp_input`) with the cached scale.
        """
        layer = self._stream_layer(layer, mlp_input)
        stack = analysis.accumulated_resid(
            self.model, self, None if layer == self.n_layers else layer, incl_mid=incl_mid
        )
        components = self._tl_shape(stack.components)
        labels = [_accumulated_label(label) for label in stack.labels]
        if mlp_input and layer < self.n_layers:
            components = torch.cat([components, self["resid_mid", layer][None]])
            labels.append(f"{layer}_mid")
        components = _sliced(Slice(pos_slice), components, dim=-2)
        if apply_ln:
            components = self.apply_ln_to_stack(
                components,
                layer,
                pos_slice=pos_slice,
                mlp_input=mlp_input,
                recompute_ln=layer == self.n_layers,
            )
        return (components, labels) if return_labels else components

    def decompose_resid(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        mode: str = "all",
        apply_ln: bool = False,
        pos_slice: "SliceInput | Slice" = None,
        incl_embeds: bool = True,
        return_labels: bool = False,
    ) -> Stack | tuple[Stack, list[str]]:
        """The stream entering block `layer` as `embed`, `pos_embed`, `"0_attn_out"`, ...

        `mode` is "all", "attn" or "mlp"; `mlp_input` decomposes the MLP's input (adds the
        block's own `attn_out`). The components sum to the cached stream. A hybrid model's
        mixer is labelled by its kind, `"0_mamba2_out"`, and kept by `mode="attn"`.
        """
        if mode not in ("all", "attn", "mlp"):
            raise ValueError(f"mode must be 'all', 'attn' or 'mlp', got {mode!r}")
        layer = self._stream_layer(layer, mlp_input)
        site = "resid_mid" if mlp_input else "resid_pre"
        decomposition = analysis.decompose_resid(
            self.model, self, None if layer == self.n_layers else layer, site
        )
        kept = []
        for i, label in enumerate(decomposition.labels):
            tl_label, kind = _tl_sublayer_label(label)
            if kind is None:
                wanted = incl_embeds and (label != "embed" or self.has_embed)
            else:
                wanted = mode in ("all", kind)
            if wanted:
                kept.append((i, tl_label))
        components = decomposition.components
        if len(kept) < len(decomposition.labels):  # indexing copies: only to drop rows
            components = components[[i for i, _ in kept]]
        components = _sliced(Slice(pos_slice), self._tl_shape(components), dim=-2)
        if apply_ln:
            components = self.apply_ln_to_stack(
                components, layer, pos_slice=pos_slice, mlp_input=mlp_input
            )
        labels = [label for _, label in kept]
        return (components, labels) if return_labels else components

    def apply_ln_to_stack(
        self,
        residual_stack: Stack,
        layer: int | None = None,
        mlp_input: bool = False,
        pos_slice: "SliceInput | Slice" = None,
        batch_slice: "SliceInput | Slice" = None,
        has_batch_dim: bool = True,
        recompute_ln: bool = False,
    ) -> Stack:
        """TL's `apply_ln_to_stack`: centre (LayerNorm) and divide by the cached scale.

        The norm's gain and bias are left out, as in TransformerLens (so the result sums
        to the norm's output only for a model processed with `fold_ln`; see
        `analysis.apply_ln_to_stack` for the version that sums exactly for every model).
        With `recompute_ln` and the final layer, each entry goes through `ln_final`
        whole, with its own scale.
        """
        kind = self.model.cfg.normalization_type
        if kind is None:
            return residual_stack
        layer = self._stream_layer(layer)
        pos_slice, batch_slice = Slice(pos_slice), Slice(batch_slice)
        if has_batch_dim:
            residual_stack = batch_slice.apply(residual_stack, dim=1)
        if recompute_ln and layer == self.n_layers:
            flat = residual_stack.reshape(-1, 1, 1, residual_stack.shape[-1])
            return normalize(self.model, NormSite("ln_final"), flat).reshape(residual_stack.shape)
        if kind in ("LN", "LNPre"):
            residual_stack = residual_stack - residual_stack.mean(dim=-1, keepdim=True)
        return residual_stack / self._cached_scale(layer, mlp_input, pos_slice, batch_slice)

    def _cached_scale(
        self, layer: int, mlp_input: bool, pos_slice: Slice, batch_slice: Slice
    ) -> Tensor:
        key = (
            "ln_final.hook_scale"
            if layer == self.n_layers
            else (f"blocks.{layer}.ln{2 if mlp_input else 1}.hook_scale")
        )
        if key not in self._data:
            raise KeyError(
                f"apply_ln needs the cached scale {key!r}, which is not in this cache; "
                f"run_with_cache without a names_filter that leaves it out"
            )
        scale = pos_slice.apply(self[key], dim=-2)
        return batch_slice.apply(scale, dim=0) if self.has_batch_dim else scale

    def logit_attrs(
        self,
        residual_stack: Stack,
        tokens: Any,
        incorrect_tokens: Any = None,
        pos_slice: "SliceInput | Slice" = None,
        batch_slice: "SliceInput | Slice" = None,
        has_batch_dim: bool = True,
    ) -> Tensor:
        """Each component's dot product, through the final norm's cached scale, with the
        unembedding direction of `tokens` (minus that of `incorrect_tokens`)."""
        directions = self.model.tokens_to_residual_directions(tokens)
        if incorrect_tokens is not None:
            wrong = self.model.tokens_to_residual_directions(incorrect_tokens)
            if wrong.shape != directions.shape:
                raise ValueError(
                    f"tokens and incorrect_tokens must have the same shape, got "
                    f"{tuple(directions.shape[:-1])} and {tuple(wrong.shape[:-1])}"
                )
            directions = directions - wrong
        scaled = self.apply_ln_to_stack(
            residual_stack,
            layer=-1,
            pos_slice=pos_slice,
            batch_slice=batch_slice,
            has_batch_dim=has_batch_dim,
        )
        return (scaled * directions).sum(dim=-1)

    # ------------------------------------------------------------ heads and neurons
    def compute_head_results(self) -> None:
        """Add each layer's per-head results `blocks.{l}.attn.hook_result`, in place.

        With none cached yet, they are computed into one `[(layer head) ...]` stack, and
        each layer's entry is a view of it, so that `stack_head_results` need not copy them.
        """
        blocks = self.model.cfg.attention_layers  # every block, but in a hybrid model
        names = [f"blocks.{layer}.attn.hook_result" for layer in blocks]
        has_z = all(f"blocks.{layer}.attn.hook_z" in self._data for layer in blocks)
        if not blocks or not has_z or any(name in self._data for name in names):
            self._compute_head_results_by_layer()
            return
        stack = stacked_head_results(self.model, self, blocks)
        stack = stack if self.has_batch_dim else stack[:, :, 0]
        views = tuple(
            rearrange(layer, "head ... pos d_model -> ... pos head d_model") for layer in stack
        )
        self._set_data({**self._data, **dict(zip(names, views, strict=True))})
        self._head_stack = (
            rearrange(stack, "layer head ... d_model -> (layer head) ... d_model"),
            views,
        )

    def _compute_head_results_by_layer(self) -> None:
        for layer in self.model.cfg.attention_layers:
            name = f"blocks.{layer}.attn.hook_result"
            if name in self._data:
                logging.warning("Tried to compute head results when they were already cached")
                return
            result = head_results(self.model, self, layer)
            result = result if self.has_batch_dim else result[0]
            self._set_data({**self._data, name: result})

    def stack_head_results(
        self,
        layer: int = -1,
        return_labels: bool = False,
        incl_remainder: bool = False,
        pos_slice: "SliceInput | Slice" = None,
        apply_ln: bool = False,
    ) -> Stack | tuple[Stack, list[str]]:
        """Every head's result in the blocks before `layer`, `[layer*head ...]`, labelled `L0H0`.

        In a hybrid model, the blocks with heads (a mixer in attention's place has none; its
        write is a term of `get_full_resid_decomposition`). As in TL, the per-head results
        are added to the cache (`compute_head_results`) when they are not in it yet, and the
        stack is a tensor of its own: editing it leaves the cache as it is (when the cache's
        entries are the views `compute_head_results` made, it is their stack, copied only
        if either side is written to)."""
        layer = self._stream_layer(layer)
        pos_slice = Slice(pos_slice)
        blocks = [block for block in self.model.cfg.attention_layers if block < layer]
        last = self.model.cfg.attention_layers[-1:]
        if any(f"blocks.{block}.attn.hook_result" not in self._data for block in last):
            self.compute_head_results()  # TL's side effect: the results stay in the cache
        per_layer = [self[f"blocks.{block}.attn.hook_result"] for block in blocks]
        pairs = zip(blocks, per_layer, strict=True)
        labels = [f"L{block}H{h}" for block, result in pairs for h in range(result.shape[-2])]
        stacked = self._head_stack_of(per_layer)
        if stacked is not None:
            components = _lazy_clone(_sliced(pos_slice, stacked, dim=-2))
        elif per_layer:
            heads = torch.cat([pos_slice.apply(r, dim=-3) for r in per_layer], dim=-2)
            components = rearrange(heads, "... component d_model -> component ... d_model")
        else:
            like = pos_slice.apply(self["hook_embed"], dim=-2)
            components = like.new_zeros(0, *like.shape)
        if incl_remainder:
            components, labels = self._with_remainder(components, labels, layer, pos_slice)
        if apply_ln:
            components = self.apply_ln_to_stack(components, layer, pos_slice=pos_slice)
        return (components, labels) if return_labels else components

    def _head_stack_of(self, per_layer: list[Tensor]) -> Tensor | None:
        """The first rows of `compute_head_results`' stack, when `per_layer` are still its
        views (not entries put in the cache since, nor a cache moved or sliced)."""
        if self._head_stack is None or not per_layer:
            return None
        stack, views = self._head_stack
        if any(got is not made for got, made in zip(per_layer, views, strict=False)):
            return None
        return stack[: len(per_layer) * views[0].shape[-2]]

    def get_neuron_results(
        self,
        layer: int,
        neuron_slice: "SliceInput | Slice" = None,
        pos_slice: "SliceInput | Slice" = None,
        project_output_onto: Tensor | None = None,
    ) -> Tensor:
        """Each neuron's write `post_n * W_out[n]` at block `layer`, `[... d_mlp d_model]`
        (the last axis projected onto `project_output_onto` when given)."""
        neuron_slice, pos_slice = Slice(neuron_slice), Slice(pos_slice)
        acts = neuron_slice.apply(pos_slice.apply(self["post", layer], dim=-2), dim=-1)
        W_out = neuron_slice.apply(self.model.blocks[layer].mlp.W_out, dim=0)
        if project_output_onto is None:
            return acts[..., None] * W_out
        projected = W_out @ project_output_onto
        return acts * projected if projected.ndim == 1 else acts[..., None] * projected

    def stack_neuron_results(
        self,
        layer: int,
        pos_slice: "SliceInput | Slice" = None,
        neuron_slice: "SliceInput | Slice" = None,
        return_labels: bool = False,
        incl_remainder: bool = False,
        apply_ln: bool = False,
        project_output_onto: Tensor | None = None,
    ) -> Stack | tuple[Stack, list[str]]:
        """Every neuron's write in the blocks before `layer`, labelled `L0N0`, ..."""
        layer = self._stream_layer(layer)
        pos_slice, neuron_slice = Slice(pos_slice), Slice(neuron_slice)
        neurons = neuron_slice.apply(torch.arange(self.model.cfg.d_mlp), dim=0).reshape(-1)
        blocks = [block for block in range(layer) if self.model.cfg.layer_has_mlp(block)]
        labels = [f"L{block}N{n}" for block in blocks for n in neurons.tolist()]
        # With apply_ln the projection waits until after the norm, which acts on d_model.
        project_now = None if apply_ln else project_output_onto
        per_layer = [
            self.get_neuron_results(block, neuron_slice, pos_slice, _as_2d(project_now))
            for block in blocks
        ]
        if per_layer:
            stacked = torch.cat(per_layer, dim=-2)
            components = rearrange(stacked, "... component d -> component ... d")
        else:
            like = pos_slice.apply(self["hook_embed"], dim=-2)
            like = like if project_now is None else like @ _as_2d(project_now)
            components = like.new_zeros(0, *like.shape)
        if incl_remainder:
            project = None if project_now is None else _as_2d(project_now)
            components, labels = self._with_remainder(components, labels, layer, pos_slice, project)
        if apply_ln:
            components = self.apply_ln_to_stack(components, layer, pos_slice=pos_slice)
            if project_output_onto is not None:
                components = components @ _as_2d(project_output_onto)
        if project_output_onto is not None and project_output_onto.ndim == 1:
            components = components[..., 0]
        return (components, labels) if return_labels else components

    def get_full_resid_decomposition(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        expand_neurons: bool = True,
        apply_ln: bool = False,
        pos_slice: "SliceInput | Slice" = None,
        return_labels: bool = False,
        project_output_onto: Tensor | None = None,
    ) -> Stack | tuple[Stack, list[str]]:
        """The stream entering block `layer` as every head, every neuron (or MLP), `embed`,
        `pos_embed` and the accumulated `bias`, in that order (TL's order). A hybrid
        model's mixers come after the heads, each one term labelled by its kind
        (`L0_mamba2`), its biases inside it."""
        layer = self._stream_layer(layer, mlp_input)
        pos_slice = Slice(pos_slice)
        upto = layer + (1 if mlp_input else 0)
        heads, labels = self.stack_head_results(upto, pos_slice=pos_slice, return_labels=True)
        parts = [heads]
        mixers, mixer_labels = self._mixer_writes(upto)
        if mixers:
            parts.append(torch.stack([pos_slice.apply(write, dim=-2) for write in mixers]))
            labels = labels + mixer_labels
        if self.model.cfg.has_mlp and layer > 0:
            if expand_neurons:
                mlps, mlp_labels = self.stack_neuron_results(
                    layer, pos_slice=pos_slice, return_labels=True
                )
            else:
                mlps, mlp_labels = self.decompose_resid(
                    layer,
                    mlp_input,
                    "mlp",
                    pos_slice=pos_slice,
                    incl_embeds=False,
                    return_labels=True,
                )
            parts.append(mlps)
            labels = labels + mlp_labels
        # A shortformer's positional embedding is cached but never enters the stream (TL
        # lists it all the same, so its decomposition does not sum to the stream).
        in_stream = self.model.cfg.positional_embedding_type == "standard"
        pos_present = self.has_pos_embed and in_stream
        for name, present in (("embed", self.has_embed), ("pos_embed", pos_present)):
            if present:
                parts.append(pos_slice.apply(self[name], dim=-2)[None])
                labels = [*labels, name]
        bias = self.model.accumulated_bias(layer, mlp_input, include_mlp_biases=expand_neurons)
        parts.append(bias.to(heads.dtype).expand(1, *heads.shape[1:]))
        labels = [*labels, "bias"]
        components = torch.cat(parts)
        if apply_ln:
            components = self.apply_ln_to_stack(
                components, layer, pos_slice=pos_slice, mlp_input=mlp_input
            )
        if project_output_onto is not None:
            components = components @ _as_2d(project_output_onto)
            if project_output_onto.ndim == 1:
                components = components[..., 0]
        return (components, labels) if return_labels else components

    def _mixer_writes(self, upto: int) -> tuple[list[Tensor], list[str]]:
        """The writes of a hybrid's mixers in the blocks before `upto`, with their labels: in
        attention's place `hook_attn_out`, beside it (Falcon-H1) `hook_mixer_out`."""
        mixers, writes, labels = self.model.cfg.mixers, [], []
        for block in range(upto if mixers is not None else 0):
            for kind in mixers.layer_mixers(block):
                beside = mixers.layers[block] == "attention"
                writes.append(self[f"blocks.{block}.hook_{'mixer' if beside else 'attn'}_out"])
                labels.append(f"L{block}_{kind}")
        return writes, labels

    def stack_activation(
        self, activation_name: str, layer: int = -1, sublayer_type: str | None = None
    ) -> Float[Tensor, "layer ..."]:
        """One activation of every block before `layer`, stacked: `[layer ...]`."""
        layer = self._stream_layer(layer)
        stacked = [self[(activation_name, block, sublayer_type)] for block in range(layer)]
        return torch.stack(stacked)

    # ------------------------------------------------------------ helpers
    def _set_data(self, data: dict[str, Tensor]) -> None:
        # TL's in-place edits: rebuild the core cache's state (its bookkeeping included).
        _CoreCache.__init__(self, data, self.n_layers, self.has_batch_dim)

    def _stream_layer(self, layer: int | None, mlp_input: bool = False) -> int:
        """A stream position `0..n_layers` (the input of block `layer`; `n_layers` is the
        final stream). None and -1 mean `n_layers`, as in TL; every other negative counts
        from the end the same way (-2 is the last block's input). TL 3.5.1 itself reads only
        -1 so: a -2 there falls into `range(-2)` and gives an empty or failing stack. With
        `mlp_input`, the block must hold an MLP (a hybrid's mixer blocks may not)."""
        position = self._stream_position(layer)
        if mlp_input and position < self.n_layers and not self.model.cfg.layer_has_mlp(position):
            with_mlp = [b for b in range(self.n_layers) if self.model.cfg.layer_has_mlp(b)]
            raise ValueError(
                f"mlp_input=True: block {position} holds no MLP (its sublayer: "
                f"{self.model.cfg.layer_mixer(position)!r}), so there is no MLP input to read; "
                f"the blocks with an MLP are {with_mlp}"
            )
        return position

    def _stream_position(self, layer: int | None) -> int:
        """`_stream_layer` without the MLP check."""
        if layer is None:
            return self.n_layers
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layer must be an int or None, got {layer!r}")
        position = layer + self.n_layers + 1 if layer < 0 else layer
        if not 0 <= position <= self.n_layers:
            raise ValueError(
                f"layer={layer} is out of range for {self.n_layers} blocks: give "
                f"0..{self.n_layers} (the input of that block; {self.n_layers}: the final stream) "
                f"or "
                f"-{self.n_layers + 1}..-1 (from the end; -1 is the final stream)"
            )
        return position

    def _tl_shape(self, stacked: Tensor) -> Tensor:
        # analysis reads a cache without a batch axis as a batch of one; TL keeps it out.
        return stacked if self.has_batch_dim else stacked[:, 0]

    def _with_remainder(
        self,
        components: Tensor,
        labels: list[str],
        layer: int,
        pos_slice: Slice,
        project: Tensor | None = None,
    ) -> tuple[Tensor, list[str]]:
        whole = pos_slice.apply(self["resid_post", layer - 1], dim=-2)
        whole = whole if project is None else whole @ project
        remainder = whole - components.sum(dim=0)
        return torch.cat([components, remainder[None]]), [*labels, "remainder"]


@functools.lru_cache(maxsize=1024)
def _tl_name(key: str | tuple, types: tuple[type, ...], n_layers: int) -> str | None:
    """The full hook name TL's `get_act_name` reads in a key (negative layers counted from
    the end), None where it refuses the key. Memoised: every read of the cache by the
    analysis functions goes through it. `types` keeps `("k", True)` apart from `("k", 1)`."""
    if isinstance(key, str):
        return get_act_name(key)
    name, layer, layer_type = (*key, None, None)[:3]
    if isinstance(layer, int) and not isinstance(layer, bool) and layer < 0:
        layer += n_layers
    try:
        return get_act_name(name, layer, layer_type)
    except (TypeError, ValueError):
        return None


def _as_2d(project: Tensor | None) -> Tensor | None:
    """A `[d_model]` projection as `[d_model 1]`, so every path handles one shape."""
    return project[:, None] if project is not None and project.ndim == 1 else project


def _sliced(pos_slice: Slice, tensor: Tensor, dim: int) -> Tensor:
    """`pos_slice.apply(tensor, dim)`, skipped when it keeps everything (the default)."""
    return tensor if pos_slice.mode == "identity" else pos_slice.apply(tensor, dim=dim)


@functools.lru_cache(maxsize=4096)
def _tl_sublayer_label(label: str) -> tuple[str, str | None]:
    """`L3_attn` -> (`3_attn_out`, "attn"); `embed` -> (`embed`, None): TL's labels. A
    hybrid's mixer, `L0_mamba2` -> (`0_mamba2_out`, "attn"): it mixes positions as
    attention does, and `mode="attn"` keeps it."""
    sublayer = _SUBLAYER_LABEL.match(label)
    if sublayer is None:
        return label, None
    block, kind = sublayer.groups()
    return f"{block}_{kind}_out", "mlp" if kind == "mlp" else "attn"


@functools.lru_cache(maxsize=4096)
def _accumulated_label(label: str) -> str:
    """`L3_resid_pre` -> `3_pre`, `final` -> `final_post`: TL's labels."""
    if label == "final":
        return "final_post"
    match = _ACCUMULATED_LABEL.match(label)
    assert match is not None, label
    return f"{match.group(1)}_{match.group(2)}"
