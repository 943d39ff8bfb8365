"""`SAEConfig`: the shape and variant of a sparse autoencoder, validated on construction."""

import dataclasses

import torch

ACTIVATIONS = ("relu", "topk", "jumprelu")
PRE_BIASES = ("tied", "untied", "none")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class SAEConfig:
    """A sparse autoencoder from `d_in` to `d_sae` features, read at `hook_name`.

    `activation`: `"relu"` (with an L1 penalty in training), `"topk"` (the `k` largest
    pre-activations, then ReLU) or `"jumprelu"` (a per-feature `threshold`).
    `pre_bias`: what is subtracted from the input before encoding: `"tied"` is the
    decoder bias `b_dec` (Bricken et al. 2023), `"untied"` a parameter of its own
    (`b_pre`), `"none"` nothing. `seed` draws the initial weights.
    """

    d_in: int
    d_sae: int
    hook_name: str = ""
    activation: str = "relu"
    k: int | None = None
    pre_bias: str = "tied"
    dtype: str = "float32"
    seed: int | None = 0

    def __post_init__(self) -> None:
        for field in ("d_in", "d_sae"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field} must be a positive int, got {value!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.pre_bias not in PRE_BIASES:
            raise ValueError(f"pre_bias must be one of {PRE_BIASES}, got {self.pre_bias!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        if self.activation == "topk":
            if not isinstance(self.k, int) or not 1 <= self.k <= self.d_sae:
                raise ValueError(
                    f"a topk SAE needs k, an int in 1..d_sae={self.d_sae}, got k={self.k!r}"
                )
        elif self.k is not None:
            raise ValueError(f"k is for activation='topk' only, not {self.activation!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype of the weights, as a `torch.dtype`."""
        return DTYPES[self.dtype]
