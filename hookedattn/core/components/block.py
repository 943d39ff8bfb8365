"""Transformer blocks: the residual-stream equations, one sublayer at a time.

Each sublayer reads the residual stream (through a norm) and adds what it writes back:

    resid_mid  = resid_pre + attn(ln1(resid_pre))
    resid_post = resid_mid + mlp(ln2(resid_mid))

In a parallel block (GPT-NeoX, GPT-J) both sublayers read `resid_pre` and there is no
`resid_mid`: `resid_post = resid_pre + attn(ln1(resid_pre)) + mlp(ln2(resid_pre))`. An
attention-only block has no MLP and no `resid_mid`.

In a post-residual-norm block (the original Transformer's, GPT-1's, BERT's:
`normalization_placement="post_residual"`) the sublayers read the stream as it is and a
norm follows each add, so `resid_mid` and `resid_post` are normed streams:

    resid_mid  = ln_resid_mid(resid_pre + attn(resid_pre))
    resid_post = ln_resid_post(resid_mid + mlp(resid_mid))

In a normed-skip block (MiniMax's: `normed_skip`) each sublayer's skip carries its normed
input, scaled, in place of the stream:

    resid_mid  = attn_skip_scale * ln1(resid_pre) + attn(ln1(resid_pre))
    resid_post = mlp_skip_scale * ln2(resid_mid) + mlp(ln2(resid_mid))

the skips behind their own hook points (`hook_attn_skip`, `hook_mlp_skip`), so that each
stream is the sum of its two hooked terms.

The parts are chosen when the block is built, so the forwards stay these equations:
the norms before a sublayer (`ln1`, `ln2`) and after it (`ln1_post`, `ln2_post`: part of
what the sublayer writes, so `hook_attn_out` holds the normed output that is added), each a
real norm or the identity as `cfg.layer_placement` says; how the stream enters the
attention (`AttnInputs`: one shared input, or per-head copies behind their own hook points);
the MLP, plain or gated or a mixture of experts (`MoE`); the attention, full or grouped,
global or windowed, or in a hybrid model's non-attention blocks a mixer in its place
(`ShortConv`, `MambaMixer`, `Mamba2Mixer`, `GatedDeltaNet`, `RGLRUMixer`,
`KimiDeltaAttention`, `LightningAttention`: `make_mixer`), whose write `hook_attn_out`
holds; or, in Falcon-H1, a mixer beside the attention, both reading `ln1(resid_pre)`
(`ParallelMixerBlock`: `resid_mid = resid_pre + attn(...) + mixer(...)`, the mixer's write
behind its own `hook_mixer_out`); or, in Nemotron-H, one sublayer per block: a block of
its mixing sublayer alone (`AttnOnlyBlock`) or of its MLP alone (`MLPOnlyBlock`:
`resid_post = resid_pre + mlp(ln2(resid_pre))`). The MLP sublayer may hold a dense MLP
and a mixture of experts side by side (Gemma 4's: `moe_beside_mlp`). A sequential block
may scale the stream
it leaves (`ResidScale`, Gemma 4's: `resid_post = w * (resid_mid + mlp_out)`), and add a
third sublayer's write reading an input of its own (`PerLayerInputBlock`, Gemma 4's small
sizes). In a shortformer model the queries and keys read the positions too:

    q_in = k_in = ln1(resid_pre) + W_pos[positions],   v_in = ln1(resid_pre)

(TransformerLens's toy models: the positional embedding enters no residual stream.)
"""

from torch import nn

from hookedattn.core.components.attention import (
    Attention,
    GroupedQueryAttention,
)
from hookedattn.core.components.attn_inputs import AttnInputs
from hookedattn.core.components.differential_attention import make_differential_attention
from hookedattn.core.components.gated_delta import GatedDeltaNet
from hookedattn.core.components.kimi_delta import KimiDeltaAttention
from hookedattn.core.components.latent_attention import LatentAttention
from hookedattn.core.components.lightning import LightningAttention
from hookedattn.core.components.mamba import MambaMixer
from hookedattn.core.components.mamba2 import Mamba2Mixer
from hookedattn.core.components.mlp import make_mlp
from hookedattn.core.components.moe import MoE
from hookedattn.core.components.norm import make_ln1, make_ln2_post, make_norm, make_placed_norm
from hookedattn.core.components.per_layer_input import PerLayerInput
from hookedattn.core.components.resid_scale import ResidScale
from hookedattn.core.components.rg_lru import RGLRUMixer
from hookedattn.core.components.shared_kv_attention import SharedKVAttention
from hookedattn.core.components.short_conv import ShortConv
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import NO_PAST, KeyValueCacheEntry, MixerCacheEntry
from hookedattn.core.shapes import Resid

# This layer's cache of earlier positions: its attention's keys and values, or its mixer's.
PastKV = KeyValueCacheEntry | MixerCacheEntry | None


def _same(resid: Resid) -> Resid:
    return resid


class AttnOnlyBlock(nn.Module):
    """`resid_post = resid_pre + attn(ln1(resid_pre))`."""

    def __init__(self, cfg: HookedTransformerConfig, layer: int = 0) -> None:
        super().__init__()
        # Modules are registered in the order the forward reaches them, so that
        # `hook_dict` lists hook points in that order too.
        self.hook_resid_pre = HookPoint()
        self._add_attention(cfg, layer)
        self.hook_resid_post = HookPoint()

    def _add_attention(self, cfg: HookedTransformerConfig, layer: int) -> None:
        if cfg.layer_mixer(layer) != "attention":
            self._add_mixer(cfg, layer)
            return
        if cfg.use_split_qkv_input:
            self.hook_q_input = HookPoint()  # [batch pos head d_model]
            self.hook_k_input = HookPoint()  # [batch pos kv_head d_model]
            self.hook_v_input = HookPoint()
        elif cfg.use_attn_in:
            self.hook_attn_in = HookPoint()  # [batch pos head d_model]
        self.ln1 = make_ln1(cfg, layer)
        self.attn_inputs = AttnInputs(cfg.attention_config(layer))
        self.attn = make_attention(cfg, layer)
        self.ln1_post = make_placed_norm(cfg, "post", layer)
        self.hook_attn_out = HookPoint()

    def _add_mixer(self, cfg: HookedTransformerConfig, layer: int) -> None:
        """A hybrid model's block `layer` mixes positions by another sublayer in attention's
        place (`mixer_config`): read through `ln1`, written through `ln1_post` and
        `hook_attn_out`, as attention's is. With `use_hook_mixer_in`, what it reads passes
        `hook_mixer_in` first, a copy, as the MLP's input passes `hook_mlp_in`."""
        self.mixer_input = self._mixer_input
        if cfg.use_hook_mixer_in:
            self.hook_mixer_in = HookPoint()  # [batch pos d_model]
            self.mixer_input = self._hooked_mixer_input
        self.ln1 = make_placed_norm(cfg, "pre", layer)
        self.mixer = make_mixer(cfg, layer)
        self.ln1_post = make_placed_norm(cfg, "post", layer)
        self.hook_attn_out = HookPoint()
        self.attend = self._mix

    def _mix(self, resid: Resid, context: AttentionContext, past_kv: PastKV) -> Resid:
        """What the mixer writes: `ln1_post(mixer(ln1(resid)))`, reading the mixer's cache
        (`kv_cache.MixerCacheEntry`) where there is one."""
        past = NO_PAST if past_kv is None else past_kv
        mixed = self.mixer(self.mixer_input(resid), context, past)
        return self.hook_attn_out(self.ln1_post(mixed))

    def _mixer_input(self, resid: Resid) -> Resid:
        return self.ln1(resid)

    def _hooked_mixer_input(self, resid: Resid) -> Resid:
        # A copy: an in-place edit of the mixer's input must not reach the stream's skip path.
        return self.ln1(self.hook_mixer_in(resid.clone()))

    def _add_mlp(self, cfg: HookedTransformerConfig, layer: int) -> None:
        if cfg.use_hook_mlp_in:
            self.hook_mlp_in = HookPoint()
            self.mlp_input = self._hooked_mlp_input
        else:
            self.mlp_input = self._mlp_input
        self.ln2 = make_placed_norm(cfg, "pre", layer)
        self.mlp = _make_feed_forward(cfg, layer)
        if cfg.moe_beside_mlp:
            self._add_dense_beside_experts(cfg)
        self.ln2_post = make_ln2_post(cfg, layer)
        self.hook_mlp_out = HookPoint()

    def _add_dense_beside_experts(self, cfg: HookedTransformerConfig) -> None:
        """Gemma 4's MLP sublayer (`moe_beside_mlp`): a dense MLP `d_mlp_dense` wide beside
        the mixture `mlp` (where the experts' hook points and analysis look for it), each
        behind norms of its own, the router reading the stream through `ln_router`:

            dense   = ln2_dense_post(mlp_dense(ln2(resid)))                  (hook_dense_out)
            experts = ln2_moe_post(mlp(ln2_moe(resid), ln_router(resid)))   (hook_moe_out)
            mlp_out = ln2_post(dense + experts)                              (hook_mlp_out)
        """
        self.mlp_dense = make_mlp(cfg, d_mlp=cfg.d_mlp_dense)
        self.ln2_dense_post = make_norm(cfg)
        self.hook_dense_out = HookPoint()
        self.ln2_moe, self.ln_router, self.ln2_moe_post = (make_norm(cfg) for _ in range(3))
        self.hook_moe_out = HookPoint()
        self.feed_forward = self._dense_and_experts

    def _dense_and_experts(self, resid: Resid) -> Resid:
        """What the MLP sublayer writes with the mixture beside a dense MLP:
        `ln2_post(dense + experts)` (`_add_dense_beside_experts`)."""
        dense = self.hook_dense_out(self.ln2_dense_post(self.mlp_dense(self.mlp_input(resid))))
        routed = self.mlp(self.ln2_moe(resid), self.ln_router(resid))
        experts = self.hook_moe_out(self.ln2_moe_post(routed))
        return self.hook_mlp_out(self.ln2_post(dense + experts))

    def forward(self, resid_pre: Resid, context: AttentionContext, past_kv: PastKV = None) -> Resid:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.attend(resid_pre, context, past_kv)
        return self.hook_resid_post(resid_pre + attn_out)

    def attend(self, resid: Resid, context: AttentionContext, past_kv: PastKV) -> Resid:
        """What the attention sublayer writes: `ln1_post(attn(ln1(resid)))`."""
        attn_out = self.attn(*self.attn_inputs(self, resid, context), context, past_kv)
        return self.hook_attn_out(self.ln1_post(attn_out))

    def feed_forward(self, resid: Resid) -> Resid:
        """What the MLP sublayer writes: `ln2_post(mlp(ln2(resid)))`."""
        return self.hook_mlp_out(self.ln2_post(self.mlp(self.mlp_input(resid))))

    def _mlp_input(self, resid: Resid) -> Resid:
        return self.ln2(resid)

    def _hooked_mlp_input(self, resid: Resid) -> Resid:
        # A copy: an in-place edit of the MLP's input must not reach the stream's skip path.
        return self.ln2(self.hook_mlp_in(resid.clone()))


class Block(AttnOnlyBlock):
    """`resid_mid = resid_pre + attn(ln1(resid_pre))`, `resid_post = resid_mid + mlp(ln2(...))`."""

    def __init__(self, cfg: HookedTransformerConfig, layer: int = 0) -> None:
        nn.Module.__init__(self)
        self.hook_resid_pre = HookPoint()
        self._add_attention(cfg, layer)
        self.hook_resid_mid = HookPoint()
        self._add_mlp(cfg, layer)
        self._add_resid_scale(cfg)
        self.hook_resid_post = HookPoint()

    def _add_resid_scale(self, cfg: HookedTransformerConfig) -> None:
        """Gemma 4's `layer_scalar`: the stream the block leaves scaled (its own call,
        bound, so that the module stays registered once, as `resid_scale`), or as it is."""
        self.scaled = _same
        if cfg.resid_post_scale:
            self.resid_scale = ResidScale(cfg)
            self.scaled = self.resid_scale.__call__

    def forward(self, resid_pre: Resid, context: AttentionContext, past_kv: PastKV = None) -> Resid:
        resid_pre = self.hook_resid_pre(resid_pre)
        resid_mid = self.hook_resid_mid(resid_pre + self.attend(resid_pre, context, past_kv))
        return self.hook_resid_post(self.scaled(resid_mid + self.feed_forward(resid_mid)))


class PerLayerInputBlock(Block):
    """`Block`, then a third sublayer reading the block's per-layer input (Gemma 4's
    small sizes: `components.per_layer_input`): `resid_post = resid_mid + mlp_out +
    per_layer_out`, where `per_layer_out = per_layer_input(resid_mid + mlp_out, p[L])`."""

    def __init__(self, cfg: HookedTransformerConfig, layer: int = 0) -> None:
        nn.Module.__init__(self)
        self.layer = layer
        self.hook_resid_pre = HookPoint()
        self._add_attention(cfg, layer)
        self.hook_resid_mid = HookPoint()
        self._add_mlp(cfg, layer)
        self.per_layer_input = PerLayerInput(cfg)
        self.hook_per_layer_out = HookPoint()
        self._add_resid_scale(cfg)
        self.hook_resid_post = HookPoint()

    def forward(self, resid_pre: Resid, context: AttentionContext, past_kv: PastKV = None) -> Resid:
        resid_pre = self.hook_resid_pre(resid_pre)
        resid_mid = self.hook_resid_mid(resid_pre + self.attend(resid_pre, context, past_kv))
        resid_fed = resid_mid + self.feed_forward(resid_mid)
        own = context.per_layer_inputs[:, :, self.layer]
        per_layer_out = self.hook_per_layer_out(self.per_layer_input(resid_fed, own))
        return self.hook_resid_post(self.scaled(resid_fed + per_layer_out))


class ParallelBlock(AttnOnlyBlock):
    """`resid_post = resid_pre + attn(ln1(resid_pre)) + mlp(ln2(resid_pre))` (no resid_mid)."""

    def __init__(self, cfg: HookedTransformerConfig, layer: int = 0) -> None:
        nn.Module.__init__(self)
        self.hook_resid_pre = HookPoint()
        self._add_attention(cfg, layer)
        self._add_mlp(cfg, layer)
        self.hook_resid_post = HookPoint()

    def forward(self, resid_pre: Resid, context: AttentionContext, past_kv: PastKV = None) -> Resid:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.attend(resid_pre, context, past_kv)
        mlp_out = self.feed_forward(resid_pre)
        return self.hook_resid_post(resid_pre + attn_out + mlp_out)


class PostResidualBlock(AttnOnlyBlock):
    """`resid_mid = ln_resid_mid(resid_pre + attn(resid_pre))`, `resid_post =
    ln_resid_post(resid_mid + mlp(resid_mid))`: the norms rescale the stream itself.

    `ln1`, `ln2` (and the sublayers' post-norms) are the identity here, as the placement
    makes them; `hook_attn_out` and `hook_mlp_out` are what each sublayer adds, and
    `hook_resid_mid`, `hook_resid_post` the normed sums, the streams the next sublayer reads.
    """

    def __init__(self, cfg: HookedTransformerConfig, layer: int = 0) -> None:
        nn.Module.__init__(self)
        self.hook_resid_pre = HookPoint()
        self._add_attention(cfg, layer)
        self.ln_resid_mid = make_norm(cfg)
        self.hook_resid_mid = HookPoint()
        self._add_mlp(cfg, layer)
        self.ln_resid_post = make_norm(cfg)
        self.hook_resid_post = HookPoint()

    def forward(self, resid_pre: Resid, context: AttentionContext, past_kv: PastKV = None) -> Resid:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.attend(resid_pre, context, past_kv)
        resid_mid = self.hook_resid_mid(self.ln_resid_mid(resid_pre + attn_out))
        return self.hook_resid_post(self.ln_resid_post(resid_mid + self.feed_forward(resid_mid)))


class NormedSkipBlock(AttnOnlyBlock):
    """`resid_mid = attn_skip_scale * ln1(resid_pre) + attn(ln1(resid_pre))`, `resid_post =
    mlp_skip_scale * ln2(resid_mid) + mlp(ln2(resid_mid))` (MiniMax: `normed_skip`).

    `hook_attn_skip` and `hook_mlp_skip` hold what passes each sublayer by its skip, so
    `resid_mid = hook_attn_skip + hook_attn_out` and `resid_post = hook_mlp_skip +
    hook_mlp_out`. Each reader calls its norm itself (its hook points fire twice with the
    same values), so that every way the attention's inputs are built stays as it is.
    """

    def __init__(self, cfg: HookedTransformerConfig, layer: int = 0) -> None:
        nn.Module.__init__(self)
        self.attn_skip_scale, self.mlp_skip_scale = cfg.attn_skip_scale, cfg.mlp_skip_scale
        self.hook_resid_pre = HookPoint()
        self._add_attention(cfg, layer)
        self.hook_attn_skip = HookPoint()
        self.hook_resid_mid = HookPoint()
        self._add_mlp(cfg, layer)
        self.hook_mlp_skip = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, resid_pre: Resid, context: AttentionContext, past_kv: PastKV = None) -> Resid:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_skip = self.hook_attn_skip(self.attn_skip_scale * self.ln1(resid_pre))
        resid_mid = self.hook_resid_mid(attn_skip + self.attend(resid_pre, context, past_kv))
        mlp_skip = self.hook_mlp_skip(self.mlp_skip_scale * self.ln2(resid_mid))
        return self.hook_resid_post(mlp_skip + self.feed_forward(resid_mid))


class ParallelMixerBlock(Block):
    """`resid_mid = resid_pre + attn(ln1(resid_pre)) + mixer(ln1(resid_pre))`, `resid_post =
    resid_mid + mlp(ln2(resid_mid))` (Falcon-H1: `MixerConfig.beside_attention`).

    The two writes pass their own hook points, `hook_attn_out` and `hook_mixer_out`, so the
    heads keep their per-head analysis and the decomposition sums term by term. Each reader
    calls `ln1` itself (its hook points fire twice with the same values), so that every
    way the attention's inputs are built (`AttnInputs`) stays as it is.
    """

    def __init__(self, cfg: HookedTransformerConfig, layer: int = 0) -> None:
        nn.Module.__init__(self)
        self.hook_resid_pre = HookPoint()
        self._add_attention(cfg, layer)
        self.mixer = make_mixer(cfg, layer, cfg.mixers.beside_attention)
        self.hook_mixer_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self._add_mlp(cfg, layer)
        self.hook_resid_post = HookPoint()

    def forward(self, resid_pre: Resid, context: AttentionContext, past_kv: PastKV = None) -> Resid:
        resid_pre = self.hook_resid_pre(resid_pre)
        mixer_past = NO_PAST if past_kv is None else past_kv.beside()  # the mixer's cache
        attn_out = self.attend(resid_pre, context, past_kv)
        mixer_out = self.hook_mixer_out(self.mixer(self.ln1(resid_pre), context, mixer_past))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out + mixer_out)
        return self.hook_resid_post(resid_mid + self.feed_forward(resid_mid))


class MLPOnlyBlock(AttnOnlyBlock):
    """`resid_post = resid_pre + mlp(ln2(resid_pre))`: a block that mixes no positions
    (Nemotron-H's MLP layers: `MixerConfig.layers` "none"). It has no `ln1`,
    `hook_attn_out` or `hook_resid_mid`; its MLP keeps its usual names (`ln2`, `mlp`,
    `hook_mlp_out`), so block `L` is the checkpoint's layer `L`."""

    def __init__(self, cfg: HookedTransformerConfig, layer: int = 0) -> None:
        nn.Module.__init__(self)
        self.hook_resid_pre = HookPoint()
        self._add_mlp(cfg, layer)
        self.hook_resid_post = HookPoint()

    def forward(self, resid_pre: Resid, context: AttentionContext, past_kv: PastKV = None) -> Resid:
        resid_pre = self.hook_resid_pre(resid_pre)
        return self.hook_resid_post(resid_pre + self.feed_forward(resid_pre))


def make_attention(cfg: HookedTransformerConfig, layer: int) -> Attention:
    """The attention of block `layer`: one key/value head per query head, grouped, or
    latent (`kv_lora_rank`), or differential (`differential_attention`), or reading an
    earlier block's keys and values (`n_kv_shared_layers`); shaped as the
    block's own config says (`cfg.attention_config`: heads and widths per block)."""
    cfg = cfg.attention_config(layer)
    if cfg.kv_source_layer(layer) is not None:
        return SharedKVAttention(cfg, layer)
    if cfg.differential_attention:
        return make_differential_attention(cfg, layer)
    if cfg.is_latent_attention:
        return LatentAttention(cfg, layer)
    return (GroupedQueryAttention if cfg.n_kv_heads != cfg.n_heads else Attention)(cfg, layer)


def make_mixer(cfg: HookedTransformerConfig, layer: int, kind: str | None = None) -> nn.Module:
    """The sublayer in attention's place in block `layer` of a hybrid model (or, `kind`
    given, the mixer of that kind: Falcon-H1's beside the attention)."""
    kind = kind or cfg.layer_mixer(layer)
    return _MIXERS[kind](cfg)


_MIXERS = {"short_conv": ShortConv, "mamba2": Mamba2Mixer, "mamba": MambaMixer,
           "gated_delta": GatedDeltaNet, "rg_lru": RGLRUMixer,
           "kimi_delta": KimiDeltaAttention, "lightning": LightningAttention}  # fmt: skip


def _make_feed_forward(cfg: HookedTransformerConfig, layer: int) -> nn.Module:
    """The MLP of block `layer`: a mixture of experts, or dense (in every block, or in the
    blocks a mixture-of-experts model keeps dense, `d_mlp_dense` wide: `cfg.layer_is_moe`;
    in the blocks sharing keys and values, `d_mlp_kv_shared` wide where set)."""
    if cfg.layer_is_moe(layer):
        return MoE(cfg)
    if cfg.d_mlp_kv_shared is not None and cfg.kv_source_layer(layer) is not None:
        return make_mlp(cfg, d_mlp=cfg.d_mlp_kv_shared)  # Gemma 4's `use_double_wide_mlp`
    return make_mlp(cfg, d_mlp=cfg.d_mlp_dense if cfg.is_moe else None)


def make_block(cfg: HookedTransformerConfig, layer: int) -> AttnOnlyBlock:
    """The block the config asks for: attention-only, sequential, parallel, sequential
    with post-residual norms or with skips of the normed stream, sequential with a mixer
    beside the attention, or one of a
    hybrid's blocks of one sublayer (its mixing one, or its MLP)."""
    kind = cfg.layer_mixer(layer)
    if kind == "attention" and cfg.mixers is not None and cfg.mixers.layer_mixers(layer):
        return ParallelMixerBlock(cfg, layer)
    if kind == "none":
        return MLPOnlyBlock(cfg, layer)
    if cfg.normalization_placement == "post_residual":
        return PostResidualBlock(cfg, layer)
    if cfg.normed_skip:
        return NormedSkipBlock(cfg, layer)
    if cfg.attn_only or not cfg.layer_has_mlp(layer):
        return AttnOnlyBlock(cfg, layer)
    if cfg.d_per_layer_input is not None:
        return PerLayerInputBlock(cfg, layer)
    return (ParallelBlock if cfg.parallel_attn_mlp else Block)(cfg, layer)
