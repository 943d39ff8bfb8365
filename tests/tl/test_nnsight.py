"""nnsight 0.8 wraps our model as it is, and sees what our cache and hooks see.

nnsight runs in an environment of its own (`.ci/nnsight.sh` builds it and links it at
`~/.cache/hookedattn/nnsight-0.8/`; `HOOKEDATTN_NNSIGHT_PYTHON` names another interpreter),
as a subprocess with this checkout on its PYTHONPATH: `scripts/nnsight_probe.py` there wraps
the models we save with `nnsight.NNsight(model)`, reads hook points' `.output` and `.input`,
caches every hook point (`tracer.cache`), zeroes a head, adds a steering vector, traces
`generate` step by step. Here the same model gives the same values through `run_with_cache`
and `run_with_hooks`, in float32, to 1e-6 (most of them bit for bit: a wrapped model runs
the written-out equations, as `run_with_cache` does).

Without that environment the tests skip, saying how to build it; under CI (`CI` set) they
fail instead, so CI always runs them.
"""

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.tl_reference import require_peer_python

from hookedattn import HookedTransformer
from hookedattn.testing import random_tiny_model, random_tokens, tolerance

# End to end (a subprocess running real nnsight): run in CI with `-m slow`.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
VERSION = "0.8"
TOLERANCE = 1e-6  # float32, absolute: the largest difference allowed anywhere

VARIANTS = {
    "gpt2": dict(act_fn="gelu"),
    "llama": dict(
        normalization_type="RMS",
        positional_embedding_type="rotary",
        gated_mlp=True,
        act_fn="silu",
        n_key_value_heads=2,
        use_attn_result=True,
    ),
    "moe": dict(num_experts=4, experts_per_token=2, gated_mlp=True, act_fn="silu"),
}
TOKENS = random_tokens(32, batch=2, pos=6, seed=2)
HEAD = 1
NEW_TOKENS = 3


def nnsight_python() -> Path:
    """nnsight's interpreter; skips the test without one (fails it under CI)."""
    return require_peer_python(
        f"nnsight {VERSION}", f"nnsight-{VERSION}", "nnsight.sh", "HOOKEDATTN_NNSIGHT_PYTHON"
    )


def run_in_nnsight(arguments: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`python ARGUMENTS` in nnsight's environment, with this checkout's hookedattn (whatever
    the environment running the tests has)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    command = [str(nnsight_python()), *arguments]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """Each variant, every parameter random, saved where the probe loads it from."""
    folder = tmp_path_factory.mktemp("models")
    for name, changes in VARIANTS.items():
        random_tiny_model(dtype=torch.float32, **changes).save(folder / name)
    return folder


@pytest.fixture(scope="module")
def models(saved) -> dict[str, HookedTransformer]:
    return {name: HookedTransformer.load(saved / name) for name in VARIANTS}


@pytest.fixture(scope="module")
def steer(models) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    return {name: torch.randn(m.cfg.d_model, generator=generator) for name, m in models.items()}


@pytest.fixture(scope="module")
def theirs(saved, steer, tmp_path_factory) -> dict[str, Any]:
    """What nnsight saw: `scripts/nnsight_probe.py` in nnsight's environment."""
    folder = tmp_path_factory.mktemp("nnsight")
    given = dict(
        runs={name: str(saved / name) for name in VARIANTS},
        tokens=TOKENS,
        head=HEAD,
        steer=steer,
        max_new_tokens=NEW_TOKENS,
    )
    source, target = folder / "in.pt", folder / "out.pt"
    torch.save(given, source)
    script = ROOT / "scripts" / "nnsight_probe.py"
    done = run_in_nnsight([str(script), str(source), str(target)], folder)
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(target, weights_only=False)


def assert_equal(ours: torch.Tensor, theirs: torch.Tensor, where: str, fused: bool = False):
    """Equal to TOLERANCE (float32), or where ours ran fused kernels that nnsight's wrapped
    model does not (`fused`), to float32's tolerance: the two round differently."""
    assert ours.dtype == theirs.dtype, f"{where}: {ours.dtype} vs {theirs.dtype}"
    assert ours.shape == theirs.shape, f"{where}: {tuple(ours.shape)} vs {tuple(theirs.shape)}"
    close = tolerance(torch.float32).as_kwargs() if fused else dict(rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(ours, theirs, **close, msg=lambda m: f"{where}: {m}")


def zero_head(z: torch.Tensor, hook: Any) -> torch.Tensor:
    z = z.clone()
    z[:, :, HEAD] = 0.0
    return z


# A hook on every point that only listens: our forward then runs what a wrapped one runs
# (the written-out equations), so the two agree bit for bit.
EVERY_POINT = [(lambda name: True, lambda x, hook: None)]


def test_the_probe_ran_nnsight_0_8(theirs):
    assert theirs["nnsight"].startswith(f"{VERSION}.")


@pytest.mark.parametrize("variant", VARIANTS)
def test_hook_point_outputs_and_inputs_are_our_cache(models, theirs, variant):
    logits, cache = models[variant].run_with_cache(TOKENS)
    seen = theirs[variant]
    mlp = "blocks.0.mlp.experts.0" if variant == "moe" else "blocks.0.mlp"  # expert 0's
    expected = {
        "read/pattern": cache["blocks.0.attn.hook_pattern"],
        "read/z_input": cache["blocks.0.attn.hook_z"],  # a hook point is the identity
        "read/z": cache["blocks.0.attn.hook_z"],
        "read/mlp_post": cache[f"{mlp}.hook_post"],
        "read/resid_post": cache["blocks.0.hook_resid_post"],
        "read/block1_input": cache["blocks.1.hook_resid_pre"],
        "read/hook_out": cache["unembed.hook_out"],
        "read/logits": logits,
        "invokes/resid_post": cache["blocks.0.hook_resid_post"],
        "invokes/logits": logits,
    }
    for key, value in expected.items():
        assert_equal(value, seen[key], f"{variant} {key}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_tracer_cache_holds_every_hook_point_as_run_with_cache(models, theirs, variant):
    _, cache = models[variant].run_with_cache(TOKENS)
    seen = {k.removeprefix("cache/"): v for k, v in theirs[variant].items() if k[:6] == "cache/"}
    assert list(seen) == list(cache.keys())
    for name, value in cache.items():
        assert_equal(value, seen[name], f"{variant} {name}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_zeroing_a_head_is_the_same_edit_as_our_hook(models, theirs, variant):
    model, seen = models[variant], theirs[variant]
    edit = [("blocks.0.attn.hook_z", zero_head)]
    with model.hooks(edit):
        logits, cache = model.run_with_cache(TOKENS)
    assert_equal(logits, seen["zeroed/logits"], variant)
    for name, value in cache.items():
        assert_equal(value, seen[f"zeroed/cache/{name}"], f"{variant} zeroed {name}")
    assert (seen["zeroed/cache/blocks.0.attn.hook_z"][:, :, HEAD] == 0).all()
    fused = model.run_with_hooks(TOKENS, fwd_hooks=edit)
    assert_equal(fused, seen["zeroed/logits"], f"{variant} run_with_hooks", fused=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_steering_the_stream_is_the_same_edit_as_our_hook(models, theirs, steer, variant):
    model, seen = models[variant], theirs[variant]
    edit = [("blocks.0.hook_resid_post", lambda x, hook: x + steer[variant])]
    logits = model.run_with_hooks(TOKENS, fwd_hooks=[*EVERY_POINT, *edit])
    assert_equal(logits, seen["steered/logits"], variant)
    fused = model.run_with_hooks(TOKENS, fwd_hooks=edit)
    assert_equal(fused, seen["steered/logits"], f"{variant} run_with_hooks", fused=True)
    assert not torch.allclose(logits, model(TOKENS))


def test_two_invokes_of_their_own_inputs_need_a_batching_model(theirs):
    assert theirs["gpt2"]["batched/error"].startswith("NotImplementedError")


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_traced_generation_steps_as_our_hooks_see_it(models, theirs, variant):
    model, seen = models[variant], theirs[variant]
    options = dict(max_new_tokens=NEW_TOKENS, do_sample=False, stop_at_eos=False)
    steps = []
    with model.hooks([*EVERY_POINT, ("unembed.hook_out", lambda x, hook: steps.append(x))]):
        tokens = model.generate(TOKENS, **options)
    assert torch.equal(tokens, seen["generate/tokens"])
    assert len(steps) == len(seen["generate/steps"]) == NEW_TOKENS
    for i, (ours, theirs_) in enumerate(zip(steps, seen["generate/steps"], strict=True)):
        assert_equal(ours, theirs_, f"{variant} step {i}")

    calls = []

    def zero_head_at_step_1(z: torch.Tensor, hook: Any) -> torch.Tensor | None:
        calls.append(1)
        return zero_head(z, hook) if len(calls) == 2 else None

    steps = []
    edit = [("blocks.0.attn.hook_z", zero_head_at_step_1)]
    record = ("unembed.hook_out", lambda x, hook: steps.append(x))
    with model.hooks([*EVERY_POINT, *edit, record]):
        tokens = model.generate(TOKENS, **options)
    assert torch.equal(tokens, seen["generate/zeroed_tokens"])
    for i, (ours, theirs_) in enumerate(zip(steps, seen["generate/zeroed_steps"], strict=True)):
        assert_equal(ours, theirs_, f"{variant} zeroed step {i}")
    assert not torch.equal(seen["generate/zeroed_steps"][1], seen["generate/steps"][1])


# Each example from a file of its own (nnsight reads a trace's source back from it), in a
# namespace of its own, as a reader runs them one by one; names the failing one.
RUNNER = """
import runpy, sys, traceback
for path in sys.argv[1:]:
    try:
        runpy.run_path(path, run_name="__main__")
    except BaseException:
        print(f"{path} failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def test_the_guides_nnsight_examples_run_in_nnsight(tmp_path):
    # The ```{.python .nnsight} blocks, which the docs test (no nnsight there) leaves out.
    page = (ROOT / "docs" / "guide" / "nnsight.md").read_text()
    blocks = re.findall(r"```\{\.python \.nnsight\}\n(.*?)```", page, flags=re.S)
    assert len(blocks) == 3
    files = [tmp_path / f"example_{i}.py" for i in range(len(blocks))]
    for file, block in zip(files, blocks, strict=True):
        file.write_text(block)
    (tmp_path / "run.py").write_text(RUNNER)
    done = run_in_nnsight([str(tmp_path / "run.py"), *map(str, files)], tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
