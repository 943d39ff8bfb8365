"""`Transcoder`: a sparse map from an MLP's input to its output, with hook points of its own.

    acts   = act(x @ W_enc + b_enc)                       hook_in -> hook_acts
    recons = acts @ W_dec + b_dec  (+ x @ W_skip.T)       hook_recons
    error  = y - recons                                   hook_error
    out    = recons (+ error, when it replaces the MLP)   hook_out

`x` is what the MLP reads (`blocks.L.ln2.hook_out`), `y` what it writes
(`blocks.L.hook_mlp_out`). `W_enc: [d_in d_sae]`, `W_dec: [d_sae d_out]`, `b_enc: [d_sae]`,
`b_dec: [d_out]`: SAELens's names and layout; a skip transcoder (Paulo et al. 2025,
"Transcoders beat sparse autoencoders") adds the linear term `x @ W_skip.T` with `W_skip:
[d_out d_in]`, SAELens's orientation. The activation (ReLU, TopK, JumpReLU) and the skip
term are modules chosen at construction, so the forward has no branches. Unlike an SAE's,
the encoder reads `x` itself: a decoder bias of the output's width cannot be subtracted
from the input (SAELens refuses `apply_b_dec_to_input` for transcoders too).

The error term is the MLP's output minus the clean reconstruction, detached, as for an SAE
(`hookedattn.sae.autoencoder`): editing a feature then changes the output by that
feature's write. `hookedattn.sae.replacement` puts transcoders in place of a model's MLPs;
`CrossLayerTranscoder` is the variant whose features write to every later MLP output.
"""

from pathlib import Path

import torch
from einops import einsum
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core.hook_points import HookPoint
from hookedattn.sae import _transcoder_io
from hookedattn.sae._coder_module import CoderModule
from hookedattn.sae._coder_parts import make_coder_activation, seeded_generator
from hookedattn.sae.transcoder_config import TranscoderConfig

In = Float[Tensor, "*batch d_in"]
Out = Float[Tensor, "*batch d_out"]
Acts = Float[Tensor, "*batch d_sae"]
TRANSCODER_HOOK_NAMES = ("hook_in", "hook_acts", "hook_recons", "hook_error", "hook_out")


class NoSkip(nn.Module):
    """A plain transcoder: nothing is added to the reconstruction."""

    W_skip = None

    def forward(self, recons: Out, x: In) -> Out:
        """`recons` as it is."""
        return recons


class LinearSkip(nn.Module):
    """The skip transcoder's linear term: `recons + x @ W_skip.T`, `W_skip: [d_out d_in]`."""

    def __init__(self, d_in: int, d_out: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.W_skip = nn.Parameter(torch.zeros(d_out, d_in, dtype=dtype))

    def forward(self, recons: Out, x: In) -> Out:
        """The reconstruction plus the skip term."""
        return recons + einsum(x, self.W_skip, "... d_in, d_out d_in -> ... d_out")


class Transcoder(CoderModule):
    """A per-layer (or skip) transcoder (see the module docstring); build one from a
    `TranscoderConfig`.

    `tc(x)` predicts the MLP's output from its input; `tc.with_error(x, y)` adds back the
    error term against the MLP's actual output `y`.
    """

    def __init__(self, cfg: TranscoderConfig) -> None:
        super().__init__()
        if not isinstance(cfg, TranscoderConfig):
            raise TypeError(f"cfg must be a TranscoderConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        dtype = cfg.torch_dtype
        self.W_enc = nn.Parameter(torch.zeros(cfg.d_in, cfg.d_sae, dtype=dtype))
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, dtype=dtype))
        self.W_dec = nn.Parameter(torch.zeros(cfg.d_sae, cfg.d_out, dtype=dtype))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_out, dtype=dtype))
        self.skip = LinearSkip(cfg.d_in, cfg.d_out, dtype) if cfg.skip else NoSkip()
        self.activation = make_coder_activation(cfg.activation, cfg.k, cfg.d_sae, dtype)
        for name in TRANSCODER_HOOK_NAMES:
            setattr(self, name, HookPoint())
        self.init_weights()
        self.setup()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Random unit decoder rows and unit encoder columns, zero biases and skip.

        Drawn in float32 from a generator seeded by `cfg.seed` (the global RNG when None).
        """
        generator = seeded_generator(self.cfg.seed)
        for param, shape, axis in ((self.W_dec, (self.cfg.d_sae, self.cfg.d_out), -1),
                                   (self.W_enc, (self.cfg.d_in, self.cfg.d_sae), 0)):  # fmt: skip
            W = torch.randn(shape, generator=generator)
            param.copy_((W / W.norm(dim=axis, keepdim=True)).to(param.dtype))

    # ------------------------------------------------------------------ the math
    def pre_activations(self, x: In) -> Acts:
        """`x @ W_enc + b_enc`: what the activation function reads."""
        return einsum(x, self.W_enc, "... d_in, d_in d_sae -> ... d_sae") + self.b_enc

    def encode(self, x: In) -> Acts:
        """Feature activations of `x`, without running any hook point."""
        return self.activation(self.pre_activations(x))

    def decode(self, acts: Acts, x: In) -> Out:
        """The reconstruction from feature activations (and, for a skip transcoder, the
        input), without running any hook point."""
        recons = einsum(acts, self.W_dec, "... d_sae, d_sae d_out -> ... d_out") + self.b_dec
        return self.skip(recons, x)

    def forward(self, x: In) -> Out:
        """The predicted MLP output (SAELens's `transcoder(x)`), through the hook points."""
        x = self.hook_in(x)
        acts = self.hook_acts(self.encode(x))
        return self.hook_out(self.hook_recons(self.decode(acts, x)))

    def with_error(self, x: In, y: Out) -> Out:
        """The reconstruction plus the error term `y - recons`: `y` to rounding, unless a
        hook edits the features (the error is the unedited one)."""
        x = self.hook_in(x)
        clean = self.encode(x)
        # Decoded before a hook sees the features: it may edit them in place and return them.
        clean_recons = self.decode(clean, x)
        acts = self.hook_acts(clean)
        edited = self.hook_acts.has_hooks("fwd")
        recons = self.hook_recons(self.decode(acts, x) if edited else clean_recons)
        error = self.hook_error((y - clean_recons).detach())
        return self.hook_out(recons + error)

    # ------------------------------------------------------------------ conveniences
    @property
    def W_skip(self) -> Tensor | None:
        """The skip term's `[d_out d_in]` weight, None for a plain transcoder."""
        return self.skip.W_skip

    def save(self, path: str | Path) -> Path:
        """Write `cfg.json` and `sae_weights.safetensors` (SAELens's transcoder layout)."""
        return _transcoder_io.save_transcoder(self, path)

    @classmethod
    def load(cls, path: str | Path) -> "Transcoder":
        """A transcoder saved by `save`, by SAELens, or in circuit-tracer's single-file
        layout (a `.safetensors` file); `ValueError` says what is wrong with a file."""
        return _transcoder_io.load_transcoder(cls, path)

    def extra_repr(self) -> str:
        c = self.cfg
        skip = ", skip" if c.skip else ""
        return (
            f"d_in={c.d_in}, d_sae={c.d_sae}, d_out={c.d_out}, {c.activation}{skip}, "
            f"hook_name={c.hook_name!r}, dtype={c.dtype}"
        )
