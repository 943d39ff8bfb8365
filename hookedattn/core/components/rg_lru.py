"""Griffin's recurrent block (De et al. 2024, "Griffin", section 2.4), a sublayer that mixes
positions by a real-gated linear recurrent unit (RG-LRU) in place of attention
(RecurrentGemma).

From the normed stream `x`, per position:

    y   = gelu_tanh(x @ W_y + b_y)                           the output gate   [d_inner]
    u   = causal_conv(x @ W_x + b_x)                         the LRU's input   [d_inner]
    r   = sigmoid(u @ W_a + b_a),  i = sigmoid(u @ W_i + b_i)     the recurrence and input gates

(`W_a`, `W_i` block-diagonal: channel head `h`'s gates read only its own `d_ssm_head`
channels of `u`, `n_ssm_heads` blocks); then per channel, with a learnt `Lambda`,

    a_t = exp(-8 r_t softplus(Lambda))                       the decay, in (0, 1)
    h_t = a_t h_{t-1} + sqrt(1 - a_t^2) (i_t u_t),           h_{-1} = 0
    out = (h * y) @ W_out + b_out

except at a sequence's first position, which keeps its whole input (`h_0 = i_0 u_0`, no
`sqrt(1 - a_0^2)`: the unit's reset). Unrolled, each channel is a causal mix of the
positions, `h_t = sum_{s<=t} (prod_{r=s+1..t} a_r) x_s` with `x_s` the scaled input; as for
the Mamba-1 mixer (`mamba`) the mix is one matrix per channel, so this module keeps no
`hook_mixing`: `hook_decay` holds every `a_t`, `hook_state` every `h_t`, and the tests check
the scan against a loop over channels and positions.

In a padded batch `u` is zero at padding (as the convolution's input is, `real_positions`),
so a padding position adds nothing to the state, and the first real position of each row is
the one reset: a left-padded prompt gives what it gives alone. With a cache
(`kv_cache.MixerCacheEntry`) the recurrence starts from the state the last forward carried
on, the reset reads whether its last position was real, and the convolution reads the
inputs it carried (`causal_conv_continued`).
"""

import torch
from einops import einsum, rearrange
from jaxtyping import Bool, Float
from torch import Tensor, nn
from torch.nn.functional import gelu, sigmoid, softplus

from hookedattn.core.components.causal_conv import causal_conv_continued, real_positions
from hookedattn.core.components.embed import _param, affine, affine_params
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import NO_PAST, MixerCacheEntry
from hookedattn.core.shapes import Resid

Channels = Float[Tensor, "batch pos d_inner"]
# Griffin's constant `c` in the decay's exponent (the paper fixes it at 8).
DECAY_SCALE = 8.0


def linear_recurrence(
    decay: Channels, drive: Channels, start: Float[Tensor, "batch d_inner"] | None = None
) -> Channels:
    """Every state `h_t = decay_t * h_{t-1} + drive_t`, from `h_{-1} = start` (zero by
    default)."""
    state = torch.zeros_like(drive[:, 0]) if start is None else start
    states = []
    for t in range(drive.shape[1]):  # a recurrence: each state needs the one before
        state = decay[:, t] * state + drive[:, t]
        states.append(state)
    return torch.stack(states, dim=1)


def _first_real(
    real: Bool[Tensor, "#batch pos 1"], last: Bool[Tensor, "#batch 1 1"] | None
) -> Bool[Tensor, "#batch pos 1"]:
    """True at each row's first real position (where the unit resets): a real one after
    padding, or after `last`, whether the position before these was real (none: not)."""
    before = nn.functional.pad(real[:, :-1], (0, 0, 1, 0), value=False)
    if last is not None:
        batch = max(before.shape[0], last.shape[0])
        before = torch.cat([last.expand(batch, 1, 1), before[:, 1:].expand(batch, -1, 1)], dim=1)
    return real & ~before


class RGLRUMixer(nn.Module):
    """Griffin's recurrent block (module docstring). Hook points: `hook_in` (the normed
    stream it reads), `hook_decay` (every `a_t`), `hook_state` (every `h_t`), `hook_out`
    (what it writes, before any post-norm)."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        m = cfg.mixers
        self.n_heads, d_head = m.n_ssm_heads, m.d_ssm_head
        self.hook_in = HookPoint()
        self.W_x, self.b_x = affine_params(cfg.d_model, m.d_inner, cfg)
        self.W_y, self.b_y = affine_params(cfg.d_model, m.d_inner, cfg)
        self.W_conv, self.b_conv = _param(m.d_inner, m.d_conv, cfg=cfg), _param(m.d_inner, cfg=cfg)
        # The gates: one [d_ssm_head d_ssm_head] block per channel head.
        for gate in ("a", "i"):
            setattr(self, f"W_{gate}", _param(self.n_heads, d_head, d_head, cfg=cfg))
            setattr(self, f"b_{gate}", _param(m.d_inner, cfg=cfg))
        self.Lambda = _param(m.d_inner, cfg=cfg)
        self.hook_decay = HookPoint()
        self.hook_state = HookPoint()
        self.W_out, self.b_out = affine_params(m.d_inner, cfg.d_model, cfg)
        self.hook_out = HookPoint()

    def _gate(self, u: Channels, W: Tensor, b: Tensor) -> Channels:
        """`sigmoid(u @ W + b)` with `W` block-diagonal, one block per channel head."""
        heads = rearrange(u, "batch pos (head d_in) -> batch pos head d_in", head=self.n_heads)
        out = einsum(heads, W, "batch pos head d_in, head d_in d_out -> batch pos head d_out")
        return sigmoid(rearrange(out, "batch pos head d_out -> batch pos (head d_out)") + b)

    def forward(
        self, x: Resid, context: AttentionContext, past: MixerCacheEntry = NO_PAST
    ) -> Resid:
        x = self.hook_in(x)
        real = real_positions(context, x.shape[1])  # no real token reads padding
        y = gelu(affine(x, self.W_y, self.b_y), approximate="tanh")
        u = affine(x, self.W_x, self.b_x) * real
        u = causal_conv_continued(u, self.W_conv, self.b_conv, past) * real
        log_a = -DECAY_SCALE * self._gate(u, self.W_a, self.b_a) * softplus(self.Lambda)
        a = self.hook_decay(log_a.exp())
        # The reset: the first position keeps its whole input and reads no earlier state.
        reset = _first_real(real, past.carried("real"))
        past.carry("real", real[:, -1:])
        scale = torch.where(reset, 1.0, torch.sqrt(1 - (2 * log_a).exp()))
        drive = self._gate(u, self.W_i, self.b_i) * u * scale
        h = linear_recurrence(a.masked_fill(reset, 0.0), drive, past.carried("state"))
        past.carry("state", h[:, -1])  # as the recurrence left it, before any hook's edit
        h = self.hook_state(h)
        return self.hook_out(affine(h * y, self.W_out, self.b_out))
