"""`SAEConfig`: the shape and variant of a sparse autoencoder, validated on construction."""

import dataclasses

import torch

ACTIVATIONS = ("relu", "topk", "jumprelu")
PRE_BIASES = ("tied", "untied", "none")
RESHAPES = ("none", "hook_z")
# Far beyond any SAE trained so far (a few million features): a size past it is a typo
# or a hostile file, refused before anything is allocated.
MAX_WIDTH = 1 << 28
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class SAEConfig:
    """A sparse autoencoder from `d_in` to `d_sae` features, read at `hook_name`.

    `activation`: `"relu"` (with an L1 penalty in training), `"topk"` (the `k` largest
    pre-activations, then ReLU) or `"jumprelu"` (a per-feature `threshold`).
    `pre_bias`: what is subtracted from the input before encoding: `"tied"` is the
    decoder bias `b_dec` (Bricken et al. 2023), `"untied"` a parameter of its own
    (`b_pre`), `"none"` nothing. `seed` draws the initial weights. `reshape_activations`:
    `"hook_z"` for an SAE that reads the heads' outputs `[head d_head]` flattened to
    `d_in = head * d_head` (SAELens's field; spliced at a `hook_z` point).
    """

    d_in: int
    d_sae: int
    hook_name: str = ""
    activation: str = "relu"
    k: int | None = None
    pre_bias: str = "tied"
    dtype: str = "float32"
    seed: int | None = 0
    reshape_activations: str = "none"

    def __post_init__(self) -> None:
        for field in ("d_in", "d_sae"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_WIDTH:
                raise ValueError(f"{field} must be an int in 1..{MAX_WIDTH:,}, got {value!r}")
        if self.reshape_activations not in RESHAPES:
            raise ValueError(
                f"reshape_activations must be one of {RESHAPES}, got {self.reshape_activations!r}"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.pre_bias not in PRE_BIASES:
            raise ValueError(f"pre_bias must be one of {PRE_BIASES}, got {self.pre_bias!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        if self.activation == "topk":
            k = self.k
            if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= self.d_sae:
                raise ValueError(
                    f"a topk SAE needs k, an int in 1..d_sae={self.d_sae}, got k={self.k!r}"
                )
        elif self.k is not None:
            raise ValueError(f"k is for activation='topk' only, not {self.activation!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype of the weights, as a `torch.dtype`."""
        return DTYPES[self.dtype]
