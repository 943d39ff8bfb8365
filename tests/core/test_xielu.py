"""xIELU (`components/xielu.py`), the activation with four learned scalars per layer, against
its definition written out one value at a time in float64 (Python's `math`), and inside a
model: each layer's MLP keeps its own scalars, and the residual decomposition still sums."""

import math

import torch

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.components.xielu import XIELU


def softplus(v: float) -> float:
    return math.log1p(math.exp(v))


def xielu_by_hand(x: float, alpha_p: float, alpha_n: float, beta: float, eps: float) -> float:
    a_p, a_n = softplus(alpha_p), beta + softplus(alpha_n)
    if x > 0:
        return a_p * x * x + beta * x
    return a_n * (math.expm1(min(x, eps)) - x) + beta * x


def test_xielu_is_its_definition_in_float64():
    act = XIELU(torch.float64)
    scalars = dict(alpha_p=0.3, alpha_n=-0.9, beta=0.5, eps=-1e-6)
    with torch.no_grad():
        for name, value in scalars.items():
            getattr(act, name).fill_(value)
    x = torch.cat([torch.linspace(-8, 8, 161, dtype=torch.float64),
                   torch.tensor([-1e-7, -1e-6, 0.0, 1e-7], dtype=torch.float64)])  # fmt: skip
    expected = torch.tensor([xielu_by_hand(float(v), **scalars) for v in x], dtype=torch.float64)
    with torch.no_grad():
        assert float((act(x) - expected).abs().max()) <= 1e-12


def test_each_layer_keeps_its_own_scalars_and_the_decomposition_sums():
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=16, n_ctx=8, d_head=4, d_vocab=20, d_mlp=32, act_fn="xielu",
        dtype=torch.float64, seed=0,
    )  # fmt: skip
    model = HookedTransformer(cfg)
    with torch.no_grad():
        model.blocks[1].mlp.act_fn.alpha_p.fill_(1.5)
    assert set(model.blocks[0].mlp.act_fn.state_dict()) == {"alpha_p", "alpha_n", "beta", "eps"}
    tokens = torch.tensor([[1, 5, 7, 2]])
    _, cache = model.run_with_cache(tokens)
    mlp = model.blocks[1].mlp
    pre = cache["blocks.1.mlp.hook_pre"]
    assert torch.allclose(cache["blocks.1.mlp.hook_post"], mlp.act_fn(pre))
    assert not torch.allclose(model.blocks[0].mlp.act_fn(pre), mlp.act_fn(pre))
    resid = cache["blocks.1.hook_resid_mid"] + cache["blocks.1.hook_mlp_out"]
    assert torch.allclose(resid, cache["blocks.1.hook_resid_post"], atol=1e-12)
