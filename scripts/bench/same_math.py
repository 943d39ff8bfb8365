"""The second reference of `scripts/bench`: the same math as hookedattn, without hook points.

What do hook points cost over "a hook-free forward of the same weights"? The bare reference
(`reference.BareTransformer`) answers a different question: it uses
`scaled_dot_product_attention` and a fused LayerNorm, other algorithms than ours, so its
ratio mixes the cost of the hooks with the cost of materialising the attention pattern.
This one is the suite's independent reference forward (`hookedattn.testing.reference`):
the explicit `q k^T / scale`, masked softmax, the norms written out, each projection one
matmul over all heads, with no hook points, checks or KV cache, and the weights laid out
before the clock starts. Where a hook reads the attention scores or a norm, hookedattn
runs this algorithm; where none is attached it runs fused kernels instead (equal to it to
float rounding).
"""

import torch.nn.functional as F

from hookedattn.testing.reference import ReferenceTransformer


class SameMathTransformer(ReferenceTransformer):
    """The independent reference forward, with gelu_new in torch's one kernel (as hookedattn
    evaluates it) rather than the formula written out, so the MLP costs what ours does."""

    activations = ReferenceTransformer.activations | {
        "gelu_new": lambda x: F.gelu(x, approximate="tanh")
    }
