"""`CrossLayerTranscoder`: features that read one layer's MLP input and write to the MLP
outputs of that layer and every later one (Ameisen et al. 2025, "Circuit Tracing").

    acts_l  = act_l(x_l @ W_enc[l] + b_enc[l])                          hook_in.l -> hook_acts.l
    recon_L = Σ_{l <= L} acts_l @ W_dec[l][:, L - l] + b_dec[L]         hook_recons.L
    error_L = y_L - recon_L                                             hook_error.L
    out_L   = recon_L (+ error_L, when it replaces the MLP)             hook_out.L

`x_l` is what block `l`'s MLP reads, `y_L` what block `L`'s MLP writes. Row-vector
convention: `W_enc: [layer d_in d_sae]`, `b_enc: [layer d_sae]`, `b_dec: [layer d_out]`, and
`W_dec[l]: [d_sae layer_out d_out]` with `layer_out = n_layers - l` (circuit-tracer's decoder
layout; its encoder is stored transposed, `[d_sae d_in]`, which the file code converts).
A feature's "decoder norm" is the norm of all its decoders together, over the layers it
writes to. The error term is detached and computed from the clean features, as for every
coder in this package.
"""

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import torch
from einops import einsum
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core.hook_points import HookPoint
from hookedattn.core.hooked_root import HookedRootModule
from hookedattn.sae import _transcoder_io
from hookedattn.sae._coder_parts import make_coder_activation, seeded_generator
from hookedattn.sae.transcoder import TRANSCODER_HOOK_NAMES
from hookedattn.sae.transcoder_config import CrossLayerTranscoderConfig

In = Float[Tensor, "*batch d_in"]
Out = Float[Tensor, "*batch d_out"]
Acts = Float[Tensor, "*batch d_sae"]


class CrossLayerTranscoder(HookedRootModule):
    """A cross-layer transcoder (module docstring); build one from a
    `CrossLayerTranscoderConfig`. Its hook points are per layer: `hook_acts.1` holds layer
    1's features (`blocks.1.transcoder.hook_acts` once it replaces a model's MLPs)."""

    def __init__(self, cfg: CrossLayerTranscoderConfig) -> None:
        super().__init__()
        if not isinstance(cfg, CrossLayerTranscoderConfig):
            raise TypeError(f"cfg must be a CrossLayerTranscoderConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        n, dtype = cfg.n_layers, cfg.torch_dtype
        self.W_enc = nn.Parameter(torch.zeros(n, cfg.d_in, cfg.d_sae, dtype=dtype))
        self.b_enc = nn.Parameter(torch.zeros(n, cfg.d_sae, dtype=dtype))
        self.W_dec = nn.ParameterList(
            [nn.Parameter(torch.zeros(cfg.d_sae, n - s, cfg.d_out, dtype=dtype)) for s in range(n)]
        )
        self.b_dec = nn.Parameter(torch.zeros(n, cfg.d_out, dtype=dtype))
        self.activations = nn.ModuleList(
            [make_coder_activation(cfg.activation, cfg.k, cfg.d_sae, dtype) for _ in range(n)]
        )
        for name in TRANSCODER_HOOK_NAMES:
            setattr(self, name, nn.ModuleList([HookPoint() for _ in range(n)]))
        self.init_weights()
        self.setup()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Random unit encoder columns, random decoders of unit norm per feature (over all the
        layers each writes to), zero biases; from a generator seeded by `cfg.seed`."""
        generator = seeded_generator(self.cfg.seed)
        for layer in range(self.cfg.n_layers):
            W = torch.randn(self.cfg.d_in, self.cfg.d_sae, generator=generator)
            self.W_enc[layer].copy_((W / W.norm(dim=0, keepdim=True)).to(self.dtype))
            D = torch.randn(self.W_dec[layer].shape, generator=generator)
            self.W_dec[layer].copy_((D / D.flatten(1).norm(dim=-1)[:, None, None]).to(self.dtype))

    # ------------------------------------------------------------------ the math
    def pre_activations(self, layer: int, x: In) -> Acts:
        """`x @ W_enc[layer] + b_enc[layer]`: what layer `layer`'s activation reads."""
        return einsum(x, self.W_enc[layer], "... d_in, d_in d_sae -> ... d_sae") + self.b_enc[layer]

    def encode(self, layer: int, x: In) -> Acts:
        """Layer `layer`'s feature activations of its MLP input `x`, without hook points."""
        return self.activations[layer](self.pre_activations(layer, x))

    def decoder(self, source: int, layer: int) -> Float[Tensor, "d_sae d_out"]:
        """`W_dec[source][:, layer - source]`: how layer `source`'s features write to the MLP
        output of layer `layer` (`layer >= source`)."""
        return self.W_dec[source][:, layer - source]

    def decode(self, layer: int, acts: Sequence[Acts]) -> Out:
        """Layer `layer`'s reconstruction from the activations of layers `0..layer` (`acts[l]`
        is layer l's), without hook points."""
        recons = self.b_dec[layer]
        for source in range(layer + 1):
            W = self.decoder(source, layer)
            recons = recons + einsum(acts[source], W, "... d_sae, d_sae d_out -> ... d_out")
        return recons

    def forward(self, x: Float[Tensor, "layer *batch d_in"]) -> Float[Tensor, "layer *batch d_out"]:
        """Every layer's predicted MLP output from every layer's MLP input, through the hook
        points."""
        acts = []
        for layer in range(self.cfg.n_layers):
            inp = self.hook_in[layer](x[layer])
            acts.append(self.hook_acts[layer](self.encode(layer, inp)))
        outs = [self.decode(layer, acts) for layer in range(self.cfg.n_layers)]
        hooked = [self.hook_out[i](self.hook_recons[i](out)) for i, out in enumerate(outs)]
        return torch.stack(hooked)

    # ------------------------------------------------------------------ conveniences
    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the weights."""
        return self.W_enc.dtype

    def to(self, *args, **kwargs) -> "CrossLayerTranscoder":
        """`nn.Module.to`, keeping `cfg.dtype` true to the weights."""
        super().to(*args, **kwargs)
        name = str(self.W_enc.dtype).removeprefix("torch.")
        if name != self.cfg.dtype:
            self.cfg = dataclasses.replace(self.cfg, dtype=name)
        return self

    def save(self, path: str | Path, model_name: str = "") -> Path:
        """Write circuit-tracer's layout into the folder `path`: `W_enc_{l}.safetensors`
        (`W_enc_{l}: [d_sae d_in]`, `b_enc_{l}`, `b_dec_{l}`, `threshold_{l}` for JumpReLU),
        `W_dec_{l}.safetensors` (`W_dec_{l}: [d_sae layer_out d_out]`) and `config.yaml`
        (naming `model_name` and the hooks)."""
        return _transcoder_io.save_cross_layer(self, path, model_name)

    @classmethod
    def load(cls, path: str | Path) -> "CrossLayerTranscoder":
        """A cross-layer transcoder saved by `save` or by circuit-tracer (its folder of
        `W_enc_*`/`W_dec_*` files); `ValueError` says what is wrong with the files."""
        return _transcoder_io.load_cross_layer(cls, path)

    def extra_repr(self) -> str:
        c = self.cfg
        return (
            f"n_layers={c.n_layers}, d_in={c.d_in}, d_sae={c.d_sae} per layer, d_out={c.d_out}, "
            f"{c.activation}, dtype={c.dtype}"
        )
