"""The MLP sublayer: `act(x @ W_in + b_in) @ W_out + b_out`, each neuron a column of W_in.

The gated form (SwiGLU in Llama, GeGLU in Gemma; Shazeer 2020) multiplies each neuron's
activation by a second, linear read of the input: `act(x @ W_gate) * (x @ W_in + b_in)`.

SoLU-LN (`act_fn="solu_ln"`, Elhage et al. 2022, "Softmax Linear Units"; TransformerLens's
SoLU toy models) is an activation that is not elementwise: `SoLU(x) = x * softmax(x)` over
the neurons, then a LayerNorm over the neurons, so `post = ln(solu(pre))`. A neuron's write
is still `post[n] * W_out[n]`.
"""

from collections.abc import Callable

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core.components.embed import _param, affine
from hookedattn.core.components.norm import LayerNorm, LayerNormPre, make_norm
from hookedattn.core.components.xielu import XIELU
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint


def gelu_new(x: Tensor) -> Tensor:
    """GPT-2's tanh approximation of GELU: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.

    torch evaluates this formula in one kernel (`approximate="tanh"`); written out in torch
    ops it takes eight passes over `[batch pos d_mlp]`.
    """
    return nn.functional.gelu(x, approximate="tanh")


def relu2(x: Tensor) -> Tensor:
    """Squared ReLU, `relu(x)^2` (So et al. 2021, "Primer"; Nemotron, Persimmon)."""
    return torch.relu(x).square()


def solu(x: Float[Tensor, "... d_mlp"]) -> Float[Tensor, "... d_mlp"]:
    """SoLU, `x * softmax(x)` over the neurons (the last axis)."""
    return x * x.softmax(dim=-1)


def glu(act_fn: Callable[[Tensor], Tensor], pre: Tensor, pre_linear: Tensor) -> Tensor:
    """A gated linear unit's neurons: `act(pre) * pre_linear` (Shazeer 2020)."""
    return act_fn(pre) * pre_linear


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": torch.relu,
    "gelu": nn.functional.gelu,
    "gelu_new": gelu_new,
    "silu": nn.functional.silu,
    "relu2": relu2,
    "solu_ln": solu,  # the LayerNorm after it belongs to the MLP (`NeuronNormMLP`)
}


def _add_linear_maps(mlp: nn.Module, cfg: HookedTransformerConfig, d_mlp: int) -> None:
    """The weights both MLPs share (`W_in`, `b_in`, `W_out`, `b_out`) and the activation
    (xIELU's with its own learned scalars, `components.xielu`)."""
    mlp.W_in = _param(cfg.d_model, d_mlp, cfg=cfg)
    mlp.b_in = _param(d_mlp, cfg=cfg)
    mlp.W_out = _param(d_mlp, cfg.d_model, cfg=cfg)
    mlp.b_out = _param(cfg.d_model, cfg=cfg)
    mlp.act_fn = XIELU(cfg.dtype, cfg.device) if cfg.act_fn == "xielu" else ACTIVATIONS[cfg.act_fn]


class _Neurons(nn.Module):
    """What both MLPs share: where the stream enters the neurons and how their write back
    sums over them, the steps a split of the neurons over processes replaces
    (`hookedattn.core.parallel`)."""

    def enter(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """The stream the neurons read: itself."""
        return x

    def activate(self, pre: Float[Tensor, "batch pos d_mlp"]) -> Float[Tensor, "batch pos d_mlp"]:
        """The activation function on the neurons' input (TransformerLens's `*_ln`
        activations add a norm after it: `hookedattn_tl`)."""
        return self.act_fn(pre)

    def write(self, post: Float[Tensor, "batch pos d_mlp"]) -> Float[Tensor, "batch pos d_model"]:
        """The neurons' write to the stream: `post @ W_out + b_out`, a sum over neurons."""
        return affine(post, self.W_out, self.b_out)


class MLP(_Neurons):
    """Two linear maps with a nonlinearity between; `hook_pre`, `hook_post`: `[batch pos d_mlp]`.
    `d_mlp` overrides the config's width (a mixture of experts' shared expert, its dense
    blocks)."""

    def __init__(self, cfg: HookedTransformerConfig, d_mlp: int | None = None) -> None:
        super().__init__()
        _add_linear_maps(self, cfg, cfg.d_mlp if d_mlp is None else d_mlp)
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        x = self.enter(x)
        pre = self.hook_pre(affine(x, self.W_in, self.b_in))
        post = self.hook_post(self.activate(pre))
        return self.write(post)


class NeuronNormMLP(MLP):
    """An MLP whose activation is followed by a norm over the neurons (`act_fn="solu_ln"`):

        pre  = x @ W_in + b_in               (hook_pre)
        mid  = solu(pre)                     (hook_mid)
        post = ln(mid)                       (ln.hook_scale, ln.hook_normalized, hook_post)
        out  = post @ W_out + b_out

    `ln` is a LayerNorm over `d_mlp` with its own gain and bias (`mlp.ln.w`, `mlp.ln.b`)
    when `normalization_type` is "LN", and a weightless one otherwise (TransformerLens's
    rule: after `fold_layer_norm` its gain and bias live in `W_out`, `b_out`).
    """

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        _Neurons.__init__(self)
        _add_linear_maps(self, cfg, cfg.d_mlp)
        # Registered in the order the forward reaches them (hook_dict lists them so).
        self.hook_pre = HookPoint()
        self.hook_mid = HookPoint()
        norm = LayerNorm if cfg.normalization_type == "LN" else LayerNormPre
        self.ln = norm(cfg, (cfg.d_mlp,))
        self.hook_post = HookPoint()

    def activate(self, pre: Float[Tensor, "batch pos d_mlp"]) -> Float[Tensor, "batch pos d_mlp"]:
        """SoLU on the neurons' input, then the norm over the neurons."""
        return self.ln(self.hook_mid(self.act_fn(pre)))


class GatedMLP(_Neurons):
    """`(act(x @ W_gate + b_gate) * (x @ W_in + b_in)) @ W_out + b_out`, `b_gate` only where
    `cfg.mlp_gate_bias` (RecurrentGemma's; None, no bias, elsewhere).

    `hook_pre` is the gate's input `x @ W_gate (+ b_gate)`, `hook_pre_linear` the linear read
    `x @ W_in + b_in`, `hook_post` their product after the activation: all `[batch pos
    d_mlp]`, as in TransformerLens. A neuron's write to the stream is `hook_post[..., n] *
    W_out[n]`.
    `d_mlp` overrides the config's width (a mixture of experts' shared expert).
    """

    def __init__(self, cfg: HookedTransformerConfig, d_mlp: int | None = None) -> None:
        super().__init__()
        d_mlp = cfg.d_mlp if d_mlp is None else d_mlp
        self.W_gate = _param(cfg.d_model, d_mlp, cfg=cfg)
        self.b_gate = _param(d_mlp, cfg=cfg) if cfg.mlp_gate_bias else None
        _add_linear_maps(self, cfg, d_mlp)
        self.hook_pre = HookPoint()
        self.hook_pre_linear = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        x = self.enter(x)
        pre = self.hook_pre(affine(x, self.W_gate, self.b_gate))
        pre_linear = self.hook_pre_linear(affine(x, self.W_in, self.b_in))
        post = self.hook_post(glu(self.activate, pre, pre_linear))
        return self.write(post)


class SubNormGatedMLP(GatedMLP):
    """A gated MLP whose neurons are normed together before `W_out` reads them (BitNet's
    `ffn_sub_norm`, `mlp_sub_norm`):

        mid  = act(x @ W_gate) * (x @ W_in + b_in)    (hook_pre, hook_pre_linear, hook_mid)
        post = ln(mid)                                (ln.hook_scale, ln.hook_normalized,
                                                       hook_post)
        out  = post @ W_out + b_out

    `ln` is the config's norm over `d_mlp` (`mlp.ln.w`); a neuron's write to the stream is
    still `hook_post[..., n] * W_out[n]`, with one scale per position shared by the neurons.
    """

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        _Neurons.__init__(self)
        self.W_gate = _param(cfg.d_model, cfg.d_mlp, cfg=cfg)
        _add_linear_maps(self, cfg, cfg.d_mlp)
        # Registered in the order the forward reaches them (hook_dict lists them so).
        self.hook_pre = HookPoint()
        self.hook_pre_linear = HookPoint()
        self.hook_mid = HookPoint()
        self.ln = make_norm(cfg, (cfg.d_mlp,))
        self.hook_post = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        x = self.enter(x)
        pre = self.hook_pre(x @ self.W_gate)
        pre_linear = self.hook_pre_linear(affine(x, self.W_in, self.b_in))
        mid = self.hook_mid(glu(self.activate, pre, pre_linear))
        return self.write(self.hook_post(self.ln(mid)))


def make_mlp(cfg: HookedTransformerConfig, d_mlp: int | None = None) -> nn.Module:
    """The MLP the config asks for, `d_mlp` wide (None: the config's): plain, with a norm
    over the neurons (`solu_ln`, never in a mixture of experts: the config refuses it), or
    gated, with a norm over the neurons too (`mlp_sub_norm`)."""
    if cfg.mlp_sub_norm:  # never in a mixture of experts: the config refuses it
        return SubNormGatedMLP(cfg)
    if cfg.gated_mlp:
        return GatedMLP(cfg, d_mlp=d_mlp)
    return NeuronNormMLP(cfg) if cfg.act_fn == "solu_ln" else MLP(cfg, d_mlp=d_mlp)
