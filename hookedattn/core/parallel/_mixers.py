"""A hybrid's gated delta net with its heads split over ranks.

The module's equations run on each rank's own key heads and the value heads they serve
(`MixerConfig`: each key head serves a run of consecutive value heads), as attention's run
on its heads: q, k, v, beta, the decays, the state and the gated norm are per head, so a
rank computes its heads exactly as one process does, and their writes are summed over the
ranks (`W_out`'s rows of its heads; `b_out` once). The convolution's weight stays whole
(its channels are q's, then k's, then v's, so a rank's are three runs, which no one slice
of it describes): each rank reads its channels from it. The other mixers (Mamba-2's, the
short convolution, ...) have no rule here: they run whole on every rank.
"""

import dataclasses

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core.components.gated_delta import GatedDeltaNet
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.parallel._collectives import replicated_input
from hookedattn.core.parallel._group import TensorParallelGroup
from hookedattn.core.parallel._sharding import narrow_parameters, shard_hook_point, swap_class
from hookedattn.core.parallel._shards import LocalSlice
from hookedattn.core.parallel._sublayers import partial_affine
from hookedattn.core.shapes import Resid


class HeadParallelGatedDelta:
    """A gated delta net holding this rank's heads: the stream enters them here, the
    convolution reads this rank's channels of its whole weight, the heads' writes are
    summed over the ranks."""

    tp: TensorParallelGroup
    channels: Tensor

    def enter(self, x: Resid) -> Resid:
        """The stream, entering the split heads (backwards, the ranks' gradients summed)."""
        return replicated_input(x, self.tp)

    def conv_weights(
        self,
    ) -> tuple[Float[Tensor, "channel d_conv"], Float[Tensor, " channel"]]:
        """This rank's channels of the convolution's weight and bias."""
        return self.W_conv[self.channels], self.b_conv[self.channels]

    def write(self, gated: Float[Tensor, "batch pos d_inner"]) -> Resid:
        """`gated @ W_out + b_out` over every rank's heads."""
        return partial_affine(gated, self.W_out, self.b_out, self.tp)


def splits_heads(mixer: nn.Module, tp_size: int) -> bool:
    """Whether `mixer` is split by its heads over `tp_size` ranks: a gated delta net whose
    key heads divide evenly (whole on every rank otherwise)."""
    return isinstance(mixer, GatedDeltaNet) and mixer.settings.n_ssm_groups % tp_size == 0


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
    narrow_parameters(mixer, plan)
    d_key = m.n_ssm_groups * m.d_state
    channels = [torch.arange(keys.start, keys.stop) + offset for offset in (0, d_key)]
    channels.append(torch.arange(values.start, values.stop) + 2 * d_key)
    swap_class(mixer, HeadParallelGatedDelta)
    mixer.tp = tp
    # A buffer (not saved), so that it follows the module's moves; built on the CPU when the
    # model is built on the meta device, and moved with the other buffers once it is read.
    device = "cpu" if mixer.W_conv.is_meta else mixer.W_conv.device
    mixer.register_buffer("channels", torch.cat(channels).to(device), persistent=False)
    mixer.settings = dataclasses.replace(m, n_ssm_heads=heads.length, n_ssm_groups=groups.length)
    mixer.d_key = groups.length * m.d_state
    for point, part, axis in (
        ("hook_q", groups, 2), ("hook_k", groups, 2), ("hook_v", heads, 2),
        ("hook_o", heads, 2), ("hook_beta", heads, 2), ("hook_decay", heads, 2),
        ("hook_mixing", heads, 1),
    ):  # fmt: skip
        shard_hook_point(mixer, point, dataclasses.replace(part, axis=axis), tp)


def _widened(part: LocalSlice, width: int) -> LocalSlice:
    """The channels of the heads `part` holds, each `width` wide, on axis 0."""
    return LocalSlice(0, part.start * width, part.stop * width, part.size * width)
