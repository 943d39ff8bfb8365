"""A hybrid's gated delta nets, Kimi Delta Attention and Mamba-2 mixers with their heads
split over ranks, and Mamba-1 mixers and short convolutions with their channels split.

Each mixer's equations run on each rank's own heads, as attention's run on its heads: a
gated delta net's key heads and the value heads they serve (`MixerConfig`: each key head
serves a run of consecutive value heads); a Mamba-2 mixer's heads and the groups whose `B`
and `C` they read. What is per head (q, k, v, beta, the decays, dt, `A`, `D`, the state, the
mixing matrix; Kimi Delta Attention's per-channel decays likewise) a rank computes exactly
as one process does; the heads' writes are summed over the ranks (`W_out`'s rows of its
heads; `b_out` once).

The fused convolution's weight stays whole (its channels are q's, then k's, then v's, or
Mamba-2's `xs`, `B`, `C`, so a rank's are three runs, which no one slice of it describes):
each rank reads its channels from it, and from Mamba-2's `W_xBC` likewise. A Mamba-2 mixer
with one group of `B`, `C` (Bamba's, Granite 4's) gives that group to every rank, and its
gated norm over the group's channels takes its mean of squares over every rank's
(`sum_partials(replicated_input(...))`: summed forwards, the gradients summed backwards).
A Mamba-1 mixer's channels are independent but for `B`, `C` and the low-rank step, sums
over every channel: the ranks' partial sums are added, and each rank holds them whole
(`ChannelParallelMamba`). A gated short convolution's (LFM2's) channels are independent
throughout. The other mixers (RG-LRU, lightning attention) have no rule here: they run
whole on every rank, as do the heads of a mixer that do not divide over the ranks.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core.components.gated_delta import GatedDeltaNet
from hookedattn.core.components.kimi_delta import KimiDeltaAttention
from hookedattn.core.components.mamba import MambaMixer
from hookedattn.core.components.mamba2 import Mamba2Mixer
from hookedattn.core.components.short_conv import ShortConv
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.parallel._collectives import replicated_input, sum_partials
from hookedattn.core.parallel._group import TensorParallelGroup
from hookedattn.core.parallel._sharding import (
    narrow_parameters,
    present,
    shard_hook_point,
    swap_class,
)
from hookedattn.core.parallel._shards import LocalSlice
from hookedattn.core.parallel._sublayers import partial_affine
from hookedattn.core.shapes import Resid

# The kinds of mixer split by heads (where they divide); the others run whole on every rank.
SPLIT = {"gated_delta", "mamba2", "kimi_delta", "mamba", "short_conv"}


class SplitMixer:
    """A mixer holding this rank's heads or channels: the stream enters them here, their
    writes are summed over the ranks."""

    tp: TensorParallelGroup

    def enter(self, x: Resid) -> Resid:
        """The stream, entering the split heads or channels (backwards, the ranks'
        gradients summed)."""
        return replicated_input(x, self.tp)

    def write(self, gated: Float[Tensor, "batch pos d_inner"]) -> Resid:
        """`gated @ W_out + b_out` over every rank's heads or channels."""
        return partial_affine(gated, self.W_out, self.b_out, self.tp)


class HeadParallelMixer(SplitMixer):
    """A mixer holding this rank's heads (a gated delta net's, Kimi Delta Attention's, or
    with `HeadParallelMamba2` a Mamba-2 mixer's), whose convolution reads this rank's
    channels of its whole weight."""

    channels: Tensor

    def conv_weights(
        self,
    ) -> tuple[Float[Tensor, "channel d_conv"], Float[Tensor, " channel"]]:
        """This rank's channels of the convolution's weight and bias."""
        return self.W_conv[self.channels], self.b_conv[self.channels]


class HeadParallelMamba2(HeadParallelMixer):
    """A Mamba-2 mixer holding this rank's heads: the stream enters them here, `xBC` and
    its convolution read this rank's channels of their whole weights, the gated norm's mean
    of squares is over every rank's channels where its group spans ranks, the heads' writes
    are summed over the ranks."""

    norm_width: int | None  # a group's channels over all ranks, where it spans ranks

    def xbc_weights(self) -> tuple[Float[Tensor, "d_model channel"], Float[Tensor, " channel"]]:
        """This rank's channels of `xBC`'s weight and bias."""
        return self.W_xBC[:, self.channels], self.b_xBC[self.channels]

    def group_mean_square(self, x: Float[Tensor, "batch pos group channel"]) -> Tensor:
        """The mean of squares over each group's channels: this rank's, or, where the one
        group spans the ranks, every rank's."""
        if self.norm_width is None:
            return super().group_mean_square(x)
        summed = x.pow(2).sum(-1, keepdim=True)
        return sum_partials(replicated_input(summed, self.tp), self.tp) / self.norm_width


class ChannelParallelMamba(SplitMixer):
    """A Mamba-1 mixer holding this rank's channels: the reads that sum over every channel
    (`B`, `C`, the low-rank step) are summed over the ranks, then enter the channels
    again."""

    def channel_reads(
        self, xs: Float[Tensor, "batch pos d_inner"]
    ) -> tuple[Tensor, Tensor, Tensor]:
        """`B`, `C` and the low-rank step, each a sum over every rank's channels (one
        all-reduce for the three), whole on every rank."""
        parts = super().channel_reads(xs)
        widths = [part.shape[-1] for part in parts]
        summed = sum_partials(torch.cat(parts, dim=-1), self.tp)
        return replicated_input(summed, self.tp).split(widths, dim=-1)


def splits_heads(mixer: nn.Module, tp_size: int) -> bool:
    """Whether `mixer` is split over `tp_size` ranks (`_SPLITS`): a gated delta net whose
    key heads divide evenly, Kimi Delta Attention whose heads do, a Mamba-2 mixer whose
    heads do and whose groups do or are one, a Mamba-1 mixer or short convolution whose
    channels do (whole on every rank otherwise)."""
    rule = _rule(mixer)
    return rule is not None and rule[0](getattr(mixer, "settings", None), mixer, tp_size)


def shard_mixer(mixer: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup) -> None:
    """Make a mixer hold this rank's heads or channels, in place, where it splits
    (`splits_heads`)."""
    if splits_heads(mixer, tp.size):
        _rule(mixer)[1](mixer, cfg, tp)


def _split(
    mixer: nn.Module,
    tp: TensorParallelGroup,
    plan: dict[str, LocalSlice],
    style: type,
    hook_points: dict[str, LocalSlice],
) -> None:
    """The steps every split takes: the parameters of `plan` that the mixer has narrowed,
    the class given `style`, the hook points sharded."""
    narrow_parameters(mixer, {name: part for name, part in plan.items() if name in present(mixer)})
    swap_class(mixer, style)
    mixer.tp = tp
    for point, part in hook_points.items():
        shard_hook_point(mixer, point, part, tp)


def shard_gated_delta(
    mixer: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup
) -> None:
    """Make a gated delta net hold this rank's key heads and the value heads they serve,
    in place (module docstring)."""
    m = mixer.settings
    groups, heads = tp.slice_of(m.n_ssm_groups, 0), tp.slice_of(m.n_ssm_heads, 0)
    keys, values = _widened(groups, m.d_state), _widened(heads, m.d_ssm_head)
    plan = {}
    for names, part in ((("q", "k"), keys), (("v", "z"), values), (("b", "a"), heads)):
        for name in names:
            plan[f"W_{name}"] = dataclasses.replace(part, axis=1)
            plan[f"b_{name}"] = part
    plan |= {"dt_bias": heads, "A_log": heads, "W_out": values}
    hook_points = {point: dataclasses.replace(part, axis=axis) for point, part, axis in (
        ("hook_q", groups, 2), ("hook_k", groups, 2), ("hook_v", heads, 2),
        ("hook_o", heads, 2), ("hook_beta", heads, 2), ("hook_decay", heads, 2),
        ("hook_mixing", heads, 1),
    )}  # fmt: skip
    _split(mixer, tp, plan, HeadParallelMixer, hook_points)
    d_key = m.n_ssm_groups * m.d_state
    channels = [torch.arange(keys.start, keys.stop) + offset for offset in (0, d_key)]
    channels.append(torch.arange(values.start, values.stop) + 2 * d_key)
    _register_channels(mixer, channels)
    mixer.settings = dataclasses.replace(m, n_ssm_heads=heads.length, n_ssm_groups=groups.length)
    mixer.d_key = groups.length * m.d_state


def shard_mamba2(mixer: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup) -> None:
    """Make a Mamba-2 mixer hold this rank's heads and the groups they read, in place
    (module docstring)."""
    m = mixer.settings
    heads = tp.slice_of(m.n_ssm_heads, 0)
    shared = m.n_ssm_groups % tp.size != 0  # one group, read by every rank's heads
    groups = LocalSlice(0, 0, 1, 1) if shared else tp.slice_of(m.n_ssm_groups, 0)
    keys, values = _widened(groups, m.d_state), _widened(heads, m.d_ssm_head)
    plan = {"W_z": dataclasses.replace(values, axis=1), "b_z": values, "w_norm": values,
            "W_dt": dataclasses.replace(heads, axis=1), "b_dt": heads, "dt_bias": heads,
            "A_log": heads, "D": heads, "W_out": values}  # fmt: skip
    hook_points = {"hook_mixing": dataclasses.replace(heads, axis=1)}
    _split(mixer, tp, plan, HeadParallelMamba2, hook_points)
    d_key = m.n_ssm_groups * m.d_state
    channels = [torch.arange(values.start, values.stop)]
    channels += [torch.arange(keys.start, keys.stop) + m.d_inner + offset for offset in (0, d_key)]
    _register_channels(mixer, channels)
    mixer.norm_width = m.d_inner if shared and tp.size > 1 else None
    mixer.settings = dataclasses.replace(m, n_ssm_heads=heads.length, n_ssm_groups=groups.length)


def shard_kimi_delta(
    mixer: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup
) -> None:
    """Make Kimi Delta Attention hold this rank's heads, in place: their channels of `W_q`,
    `W_k`, `W_v`, of the gates' (second, where low-rank) maps and `dt_bias`, their `W_b`,
    `A_log` and rows of `W_out`; the gates' low-rank first maps and the norm's gain, which
    every head reads, whole."""
    m = mixer.settings
    heads = tp.slice_of(m.n_ssm_heads, 0)
    values = _widened(heads, m.d_ssm_head)
    columns = dataclasses.replace(values, axis=1)
    plan = {"W_b": dataclasses.replace(heads, axis=1), "b_b": heads, "A_log": heads,
            "dt_bias": values, "W_out": values, "W_f_up": columns, "W_g_up": columns}  # fmt: skip
    for name in ("q", "k", "v", "f", "g"):  # `f`, `g`: full-rank gates (Bailing Hybrid's)
        plan |= {f"W_{name}": columns, f"b_{name}": values}
    per_head = dataclasses.replace(heads, axis=2)
    hook_points = {point: per_head for point in ("hook_decay", "hook_beta", "hook_o")}
    _split(mixer, tp, plan, HeadParallelMixer, hook_points)
    channels = [torch.arange(values.start, values.stop) + offset * m.d_inner for offset in range(3)]
    _register_channels(mixer, channels)
    mixer.settings = dataclasses.replace(m, n_ssm_heads=heads.length)


def shard_mamba(mixer: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup) -> None:
    """Make a Mamba-1 mixer hold this rank's channels, in place: their columns of `W_xs`,
    `W_z` and `W_dt_up`, their rows of the convolution, `W_B`, `W_C`, `W_dt_down`, `A_log`
    and `W_out`, their `D` (`ChannelParallelMamba`)."""
    m = mixer.settings
    rows = tp.slice_of(m.d_inner, 0)
    plan = {name: dataclasses.replace(rows, axis=1) for name in ("W_xs", "W_z", "W_dt_up")}
    plan |= {name: rows for name in ("b_xs", "b_z", "b_dt", "W_conv", "b_conv", "W_B", "W_C",
                                     "W_dt_down", "A_log", "D", "W_out")}  # fmt: skip
    hook_points = {"hook_state": dataclasses.replace(rows, axis=2)}
    _split(mixer, tp, plan, ChannelParallelMamba, hook_points)
    mixer.settings = dataclasses.replace(m, n_ssm_heads=rows.length)


def shard_short_conv(
    mixer: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup
) -> None:
    """Make a gated short convolution (LFM2's) hold this rank's channels, in place: their
    columns of `W_B`, `W_C`, `W_X`, their rows of the convolution and of `W_out`: every
    step between the maps is per channel (`SplitMixer`)."""
    rows = tp.slice_of(cfg.d_model, 0)
    plan = {f"W_{gate}": dataclasses.replace(rows, axis=1) for gate in "BCX"}
    plan |= {name: rows for name in ("b_B", "b_C", "b_X", "W_conv", "b_conv", "W_out")}
    _split(mixer, tp, plan, SplitMixer, {"hook_conv": dataclasses.replace(rows, axis=2)})


# Each mixer class split over ranks: whether it splits over n ranks (from its settings,
# the module, n), and how.
_SPLITS: dict[type, tuple[Callable[[Any, nn.Module, int], bool], Callable]] = {
    GatedDeltaNet: (lambda m, _, n: m.n_ssm_groups % n == 0, shard_gated_delta),
    KimiDeltaAttention: (lambda m, _, n: m.n_ssm_heads % n == 0, shard_kimi_delta),
    MambaMixer: (lambda m, _, n: m.n_ssm_heads % n == 0, shard_mamba),  # its channels
    ShortConv: (lambda _, mixer, n: mixer.W_out.shape[0] % n == 0, shard_short_conv),
    Mamba2Mixer: (lambda m, _, n: m.n_ssm_heads % n == 0
                  and (m.n_ssm_groups % n == 0 or m.n_ssm_groups == 1), shard_mamba2),
}  # fmt: skip


def _rule(mixer: nn.Module) -> tuple[Callable, Callable] | None:
    """`mixer`'s entry of `_SPLITS` (by its class or a base of it), or None."""
    return next((rule for kind, rule in _SPLITS.items() if isinstance(mixer, kind)), None)


def _register_channels(mixer: nn.Module, channels: list[Tensor]) -> None:
    """This rank's channels of the mixer's fused convolution, as the buffer `channels`: not
    saved, so that it follows the module's moves; built on the CPU when the model is built
    on the meta device, and moved with the other buffers once it is read."""
    device = "cpu" if mixer.W_conv.is_meta else mixer.W_conv.device
    mixer.register_buffer("channels", torch.cat(channels).to(device), persistent=False)


def _widened(part: LocalSlice, width: int) -> LocalSlice:
    """The channels of the heads `part` holds, each `width` wide, on axis 0."""
    return LocalSlice(0, part.start * width, part.stop * width, part.size * width)
