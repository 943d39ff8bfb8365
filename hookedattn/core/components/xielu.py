"""xIELU, an activation with learned scalars (Huang and Schlag 2024, "Deriving Activation
Functions Using Integration"; Apertus):

    xielu(x) = a_p x^2 + beta x                             for x > 0
               a_n (expm1(min(x, eps)) - x) + beta x        for x <= 0

with `a_p = softplus(alpha_p)` and `a_n = beta + softplus(alpha_n)` (so that both curvatures
stay positive and the negative side's slope at 0 is continuous), each layer's own. `eps` (a
small negative number) bounds `expm1`'s argument below 0. The four scalars are parameters
of the MLP (`blocks.L.mlp.act_fn.alpha_p`, ...), the checkpoint's `alpha_p`, `alpha_n`,
`beta` and `eps` as stored: the softplus is taken here, in the activation's dtype.
"""

import torch
from jaxtyping import Float
from torch import Tensor, nn


class XIELU(nn.Module):
    """xIELU with its four scalars (module docstring); elementwise, any shape."""

    def __init__(self, dtype: torch.dtype = torch.float32, device: str | None = None) -> None:
        super().__init__()
        at = dict(dtype=dtype, device=device)
        self.alpha_p = nn.Parameter(torch.empty(1, **at))
        self.alpha_n = nn.Parameter(torch.empty(1, **at))
        self.beta = nn.Parameter(torch.empty((), **at))
        self.eps = nn.Parameter(torch.empty((), **at))

    def forward(self, x: Float[Tensor, "..."]) -> Float[Tensor, "..."]:
        a_p = nn.functional.softplus(self.alpha_p)
        a_n = self.beta + nn.functional.softplus(self.alpha_n)
        positive = a_p * x * x + self.beta * x
        negative = (torch.expm1(torch.minimum(x, self.eps)) - x) * a_n + self.beta * x
        return torch.where(x > 0, positive, negative)
