"""`SparseAutoencoder`: a dictionary of features for one hook point, with hook points of its own.

    pre    = (x - pre_bias) @ W_enc + b_enc               hook_in -> hook_acts_pre
    acts   = act(pre)                                     hook_acts
    recons = acts @ W_dec + b_dec                         hook_recons
    error  = x - recons                                   hook_error
    out    = recons (+ error, when spliced exactly)       hook_out

`W_enc: [d_in d_sae]`, `W_dec: [d_sae d_in]` (row `f` is feature `f`'s direction, unit norm
for a freshly built or trained SAE), `b_enc: [d_sae]`, `b_dec: [d_in]`: SAELens's names and
layout. The activation (ReLU, TopK, JumpReLU) and the pre-bias (tied to `b_dec`, untied,
none) are modules chosen at construction (`hookedattn.sae._activations`).

The error term is computed from the clean reconstruction, before any hook edits the
features, and detached from autograd, as in SAELens and Marks et al. 2024 (A.3): ablating a
feature then changes the output by that feature's write, and gradients reach the features,
not a path around them. Without edits, `recons + error` is the input to rounding.
"""

from pathlib import Path

import torch
from einops import einsum
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core.hook_points import HookPoint
from hookedattn.sae import _io
from hookedattn.sae._activations import make_activation, make_pre_bias
from hookedattn.sae._coder_module import CoderModule
from hookedattn.sae.config import SAEConfig

In = Float[Tensor, "*batch d_in"]
Acts = Float[Tensor, "*batch d_sae"]
HOOK_NAMES = ("hook_in", "hook_acts_pre", "hook_acts", "hook_recons", "hook_error", "hook_out")


class SparseAutoencoder(CoderModule):
    """A sparse autoencoder (see the module docstring); build one from an `SAEConfig`.

    `sae(x)` is the reconstruction; `sae.with_error(x)` adds the error term back.
    Spliced into a model (`model.saes([sae])`) its hook points are named after the point
    it sits at: `blocks.1.hook_resid_pre.sae.hook_acts`.
    """

    def __init__(self, cfg: SAEConfig) -> None:
        super().__init__()
        if not isinstance(cfg, SAEConfig):
            raise TypeError(f"cfg must be an SAEConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        dtype = cfg.torch_dtype
        try:
            self.W_enc = nn.Parameter(torch.zeros(cfg.d_in, cfg.d_sae, dtype=dtype))
            self.W_dec = nn.Parameter(torch.zeros(cfg.d_sae, cfg.d_in, dtype=dtype))
        except (RuntimeError, MemoryError) as error:  # the allocator's message names no field
            n_bytes = 2 * cfg.d_in * cfg.d_sae * dtype.itemsize
            raise MemoryError(
                f"an SAE with d_in={cfg.d_in:,} and d_sae={cfg.d_sae:,} in {cfg.dtype} needs "
                f"{n_bytes / 2**30:,.1f} GiB for W_enc and W_dec, which could not be "
                f"allocated: choose a smaller d_sae ({type(error).__name__})"
            ) from None
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, dtype=dtype))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_in, dtype=dtype))
        self.pre_bias = make_pre_bias(cfg)
        self.activation = make_activation(cfg)
        self.hook_in = HookPoint()  # [*batch d_in]
        self.hook_acts_pre = HookPoint()  # [*batch d_sae], before the activation
        self.hook_acts = HookPoint()  # [*batch d_sae]
        self.hook_recons = HookPoint()  # [*batch d_in]
        self.hook_error = HookPoint()  # [*batch d_in]
        self.hook_out = HookPoint()  # [*batch d_in]
        self.init_weights()
        self.setup()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Unit-norm random decoder rows, the encoder their transpose, zero biases.

        Drawn in float32 from a generator seeded by `cfg.seed` (the global RNG when None).
        """
        generator = None if self.cfg.seed is None else torch.Generator().manual_seed(self.cfg.seed)
        W = torch.randn(self.cfg.d_sae, self.cfg.d_in, generator=generator)
        W = W / W.norm(dim=-1, keepdim=True)
        self.W_dec.copy_(W.to(self.W_dec.dtype))
        self.W_enc.copy_(W.T.to(self.W_enc.dtype))

    # ------------------------------------------------------------------ the math
    def encode(self, x: In) -> Acts:
        """Feature activations of `x`, without running any hook point."""
        return self.activation(self.pre_activations(x))

    def pre_activations(self, x: In) -> Acts:
        """`(x - pre_bias) @ W_enc + b_enc`: what the activation function reads."""
        pre = einsum(self.pre_bias(x, self.b_dec), self.W_enc, "... d_in, d_in d_sae -> ... d_sae")
        return pre + self.b_enc

    def decode(self, acts: Acts) -> In:
        """The reconstruction from feature activations, without running any hook point."""
        return einsum(acts, self.W_dec, "... d_sae, d_sae d_in -> ... d_in") + self.b_dec

    def forward(self, x: In) -> In:
        """The reconstruction of `x` (SAELens's `sae(x)`), through the hook points."""
        recons, _ = self._hooked(x)
        return self.hook_out(recons)

    def with_error(self, x: In) -> In:
        """The reconstruction plus the error term: `x` to rounding, unless a hook edits
        the features (the error is the unedited one; module docstring)."""
        recons, error = self._hooked(x)
        return self.hook_out(recons + error)

    def _hooked(self, x: In) -> tuple[In, In]:
        x = self.hook_in(x)
        clean_pre = self.pre_activations(x)
        # The unedited features and reconstruction (the error term's), taken before any hook
        # sees them: a hook may edit its tensor in place and return it.
        clean = self.activation(clean_pre)
        clean_recons = self.decode(clean)
        pre = self.hook_acts_pre(clean_pre)
        # Past a point with hooks, what they returned is computed on; otherwise the clean
        # values are reused.
        edited_pre = self.hook_acts_pre.has_hooks("fwd")
        acts = self.hook_acts(self.activation(pre) if edited_pre else clean)
        edited = edited_pre or self.hook_acts.has_hooks("fwd")
        recons = self.hook_recons(self.decode(acts) if edited else clean_recons)
        error = self.hook_error((x - clean_recons).detach())
        return recons, error

    # ------------------------------------------------------------------ conveniences
    def save(self, path: str | Path) -> Path:
        """Write `cfg.json` and `sae_weights.safetensors` (SAELens's layout) into `path`."""
        return _io.save(self, path)

    @classmethod
    def load(cls, path: str | Path) -> "SparseAutoencoder":
        """Load an SAE saved by `save` or by SAELens (`cfg.json` + `sae_weights.safetensors`)."""
        return _io.load(cls, path)

    @classmethod
    def from_pretrained(
        cls,
        release: str,
        sae_id: str,
        *,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | Path | None = None,
        local_files_only: bool = False,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
    ) -> "SparseAutoencoder":
        """The SAE `sae_id` of SAELens's release `release` (`list_sae_releases()` lists
        them; a hub repo id in SAELens's layout works too, `sae_id` being the folder),
        fetching that SAE's files only: SAELens's `cfg.json` + `sae_weights.safetensors`
        or Gemma Scope's `params.npz` / `params.safetensors`. `revision`, `token`,
        `cache_dir`, `local_files_only` as for `HookedTransformer.from_pretrained`
        (`HF_HUB_OFFLINE=1` reads the cache alone); `device`, `dtype`: where to put it.
        An unknown name is a `KeyError` naming the close ones; the hub's errors are
        `hookedattn.core.hub`'s (`GatedModelError`, `NotCachedError`, ...)."""
        from hookedattn.sae.releases import _sae, _shared

        options = _shared.options(revision, token, cache_dir, local_files_only)
        return _sae.load(cls, release, sae_id, options, device, dtype)

    def extra_repr(self) -> str:
        c = self.cfg
        return f"d_in={c.d_in}, d_sae={c.d_sae}, hook_name={c.hook_name!r}, dtype={c.dtype}"
