"""`TranscoderSet`: the transcoders that stand in for a model's MLPs, behind one view.

A set is either per-layer transcoders (plain or skip; one `Transcoder` per layer, for some
or all of the layers) or one `CrossLayerTranscoder`. Whatever it is, layer `L`'s MLP output
is predicted as

    recons_L = Σ_{l in sources(L)} acts_l @ decoder(l, L) + b_dec(L)  (+ x_L @ W_skip(L).T)

with `sources(L) = (L,)` for per-layer transcoders and `(0, ..., L)` for a cross-layer one.
The replacement model (`hookedattn.sae.replacement`), the evaluation and the attribution
graphs (`analysis.attribution_graphs`) read transcoders only through this view.
"""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from einops import einsum
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core.hook_points import HookPoint
from hookedattn.sae.cross_layer import CrossLayerTranscoder
from hookedattn.sae.transcoder import TRANSCODER_HOOK_NAMES, Transcoder

Acts = Float[Tensor, "*batch d_sae"]


class TranscoderSet:
    """Per-layer transcoders (a list, one per layer) or a `CrossLayerTranscoder`, as one
    set; `TranscoderSet(other_set)` is the same set."""

    def __init__(self, transcoders: Any) -> None:
        if isinstance(transcoders, TranscoderSet):
            transcoders = transcoders.source
        self.source = transcoders
        if isinstance(transcoders, CrossLayerTranscoder):
            self.kind = "cross_layer"
            self.layers = tuple(range(transcoders.cfg.n_layers))
            self.modules: tuple[nn.Module, ...] = (transcoders,)
            self._per_layer: dict[int, Transcoder] = {}
            return
        if isinstance(transcoders, Transcoder):
            transcoders = [transcoders]
        if not isinstance(transcoders, Sequence) or isinstance(transcoders, str) or not transcoders:
            raise TypeError(
                f"transcoders must be a CrossLayerTranscoder or a non-empty list of Transcoders "
                f"(one per layer), got {transcoders!r}"
            )
        by_layer: dict[int, Transcoder] = {}
        for tc in transcoders:
            if not isinstance(tc, Transcoder):
                raise TypeError(f"expected a Transcoder, got {type(tc).__name__}")
            layer = tc.cfg.layer
            if layer is None:
                raise ValueError(
                    f"a transcoder needs hook names that name its layer (hook_name="
                    f"'blocks.L.ln2.hook_out', hook_name_out='blocks.L.hook_mlp_out'); "
                    f"got {tc.cfg.hook_name!r}, {tc.cfg.hook_name_out!r}"
                )
            if layer in by_layer:
                raise ValueError(f"two transcoders for layer {layer}: one per layer")
            by_layer[layer] = tc
        self.kind = "per_layer"
        self.layers = tuple(sorted(by_layer))
        self._per_layer = by_layer
        self.modules = tuple(by_layer[layer] for layer in self.layers)

    @classmethod
    def from_pretrained(
        cls,
        name: str,
        *,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | Path | None = None,
        local_files_only: bool = False,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
    ) -> "TranscoderSet":
        """The circuit-tracer transcoder set `name` names: a preset (`"gemma"`, `"llama"`;
        `transcoder_presets()`) or a hub repo id, `org/repo[/folder][@revision]`, fetching
        only the files its `config.yaml` lists (per-layer or cross-layer). The hub
        keywords, `device` and `dtype` as for `SparseAutoencoder.from_pretrained`."""
        from hookedattn.sae.releases import _shared, _transcoders

        options = _shared.options(revision, token, cache_dir, local_files_only)
        return cls(_transcoders.load(name, options, device, dtype))

    # ------------------------------------------------------------------ where it sits
    def input_hook(self, layer: int) -> str:
        """The hook name layer `layer`'s features read (the MLP's input)."""
        if self.kind == "cross_layer":
            return self.source.cfg.hook_name(layer)
        return self._tc(layer).cfg.hook_name

    def output_hook(self, layer: int) -> str:
        """The hook name of the MLP output layer `layer`'s transcoder predicts."""
        if self.kind == "cross_layer":
            return self.source.cfg.hook_name_out(layer)
        return self._tc(layer).cfg.hook_name_out

    def sources(self, layer: int) -> tuple[int, ...]:
        """The layers whose features write to layer `layer`'s MLP output."""
        return tuple(range(layer + 1)) if self.kind == "cross_layer" else (layer,)

    def outputs(self, layer: int) -> tuple[int, ...]:
        """The layers whose MLP outputs layer `layer`'s features write to."""
        return tuple(o for o in self.layers if layer in self.sources(o))

    def d_sae(self, layer: int) -> int:
        """Layer `layer`'s number of features."""
        return self.source.cfg.d_sae if self.kind == "cross_layer" else self._tc(layer).cfg.d_sae

    @property
    def d_in(self) -> int:
        """The width the features read (the model's `d_model`)."""
        return self.modules[0].cfg.d_in

    @property
    def d_out(self) -> int:
        """The width of the outputs they write (the same for every layer)."""
        return self.modules[0].cfg.d_out

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the weights (all the set's transcoders share it)."""
        return self.modules[0].dtype

    # ------------------------------------------------------------------ weights
    def encoder(self, layer: int) -> tuple[Float[Tensor, "d_in d_sae"], Float[Tensor, " d_sae"]]:
        """`(W_enc, b_enc)` of layer `layer`'s features."""
        if self.kind == "cross_layer":
            return self.source.W_enc[layer], self.source.b_enc[layer]
        tc = self._tc(layer)
        return tc.W_enc, tc.b_enc

    def activation(self, layer: int) -> nn.Module:
        """Layer `layer`'s activation function (ReLU, TopK, JumpReLU module)."""
        if self.kind == "cross_layer":
            return self.source.activations[layer]
        return self._tc(layer).activation

    def decoder(self, source: int, layer: int) -> Float[Tensor, "d_sae d_out"]:
        """How layer `source`'s features write to layer `layer`'s MLP output."""
        if self.kind == "cross_layer":
            return self.source.decoder(source, layer)
        if source != layer:
            raise ValueError(f"a per-layer transcoder writes to its own layer only, not {layer}")
        return self._tc(layer).W_dec

    def feature_decoders(self, layer: int) -> Tensor:
        """Every decoder of layer `layer`'s features in one tensor, features first: `W_dec
        [d_sae d_out]` per layer, `W_dec[layer] [d_sae layer_out d_out]` cross-layer."""
        return self.source.W_dec[layer] if self.kind == "cross_layer" else self._tc(layer).W_dec

    def decoder_norms(self, layer: int) -> Float[Tensor, " d_sae"]:
        """Each feature's decoder norm, over all the layers it writes to."""
        return self.feature_decoders(layer).flatten(1).norm(dim=-1)

    def b_dec(self, layer: int) -> Float[Tensor, " d_out"]:
        """The bias of layer `layer`'s reconstruction."""
        return self.source.b_dec[layer] if self.kind == "cross_layer" else self._tc(layer).b_dec

    def W_skip(self, layer: int) -> Float[Tensor, "d_out d_in"] | None:
        """Layer `layer`'s skip weight, None without a skip term."""
        return None if self.kind == "cross_layer" else self._tc(layer).W_skip

    # ------------------------------------------------------------------ the math
    def pre_activations(self, layer: int, x: Float[Tensor, "*batch d_in"]) -> Acts:
        """Layer `layer`'s pre-activations of its input `x`."""
        W_enc, b_enc = self.encoder(layer)
        return einsum(x, W_enc, "... d_in, d_in d_sae -> ... d_sae") + b_enc

    def encode(self, layer: int, x: Float[Tensor, "*batch d_in"]) -> Acts:
        """Layer `layer`'s feature activations of its input `x` (no hook points run)."""
        return self.activation(layer)(self.pre_activations(layer, x))

    def decode(
        self, layer: int, acts: Mapping[int, Acts], x: Float[Tensor, "*batch d_in"]
    ) -> Float[Tensor, "*batch d_out"]:
        """Layer `layer`'s reconstruction from `acts[l]` for each of its source layers, and
        its input `x` (read by a skip term only)."""
        recons = self.b_dec(layer)
        for source in self.sources(layer):
            W = self.decoder(source, layer)
            recons = recons + einsum(acts[source], W, "... d_sae, d_sae d_out -> ... d_out")
        W_skip = self.W_skip(layer)
        if W_skip is not None:
            recons = recons + einsum(x, W_skip, "... d_in, d_out d_in -> ... d_out")
        return recons

    def hook_point(self, layer: int, name: str) -> HookPoint:
        """Layer `layer`'s hook point `name` (one of `TRANSCODER_HOOK_NAMES`)."""
        if name not in TRANSCODER_HOOK_NAMES:
            names = ", ".join(TRANSCODER_HOOK_NAMES)
            raise KeyError(f"a transcoder has no hook point {name!r}; it has {names}")
        if self.kind == "cross_layer":
            return getattr(self.source, name)[layer]
        return getattr(self._tc(layer), name)

    def _tc(self, layer: int) -> Transcoder:
        if layer not in self._per_layer:
            raise KeyError(f"no transcoder for layer {layer}; this set covers layers {self.layers}")
        return self._per_layer[layer]

    def __repr__(self) -> str:
        what = "cross-layer transcoder" if self.kind == "cross_layer" else "per-layer transcoders"
        return (
            f"TranscoderSet({what}, layers {list(self.layers)}, d_sae {self.d_sae(self.layers[0])})"
        )
