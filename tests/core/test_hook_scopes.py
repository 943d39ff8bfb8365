"""Whose hooks run where: a `hooks()` scope belongs to its thread (another thread's forward
refuses to run beside it; threads work on copies), while hooks attached with `add_hook`, or
kept after their block, belong to the model; recorders of hooks stopped out of order."""

import threading
from functools import partial

import pytest
import torch

from hookedattn import HookedTransformer
from hookedattn.testing import tiny_model
from hookedattn.testing._guards import HookRecorder

TOKENS = torch.tensor([[1, 2, 3, 4, 5]])


make_model = partial(tiny_model, n_ctx=8, d_mlp=32)


# ------------------------------------------------------------------------ threads
def run_beside_a_scope(model: HookedTransformer, in_main_thread) -> list:
    """Hold a `hooks()` scope open in another thread while `in_main_thread()` runs."""
    attached, done, errors = threading.Event(), threading.Event(), []

    def other_thread() -> None:
        try:
            with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: z * 0)]):
                attached.set()
                done.wait(timeout=30)
        except Exception as error:  # reported to the test below
            errors.append(error)

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        assert attached.wait(timeout=30)
        return [in_main_thread(), errors]
    finally:
        done.set()
        thread.join()


def test_a_forward_in_another_thread_refuses_to_run_a_scoped_hook():
    model = make_model()
    expected = model(TOKENS)

    def forward():
        with pytest.raises(RuntimeError, match="attached for a scope.*by thread") as error:
            model(TOKENS)
        return str(error.value)

    message, errors = run_beside_a_scope(model, forward)
    assert "blocks.0.attn.hook_z" in message and "model.copy()" in message
    assert errors == []
    torch.testing.assert_close(model(TOKENS), expected)  # the scope is gone: runs again


def test_run_with_cache_in_another_thread_refuses_too():
    model = make_model()

    def cached_run():
        with pytest.raises(RuntimeError, match="attached for a scope"):
            model.run_with_cache(TOKENS)
        return model.attached_hooks()

    still_attached, errors = run_beside_a_scope(model, cached_run)
    assert [h.hook_point.name for h in still_attached] == ["blocks.0.attn.hook_z"]
    assert errors == [] and model.attached_hooks() == []


def test_each_thread_sees_only_its_own_hooks_on_its_own_copy():
    model = make_model()
    copies = [model.copy(), model.copy()]
    results = [None, None]

    def run(i: int) -> None:
        scale = lambda x, hook: x * (i + 1)
        results[i] = copies[i].run_with_hooks(TOKENS, fwd_hooks=[("hook_embed", scale)])

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in (0, 1):
        expected = model.run_with_hooks(
            TOKENS, fwd_hooks=[("hook_embed", lambda x, hook, s=i + 1: x * s)]
        )
        torch.testing.assert_close(results[i], expected)


def test_a_hook_attached_with_add_hook_runs_in_every_thread():
    model = make_model()
    calls = []
    model.add_hook("hook_embed", lambda x, hook: calls.append(threading.get_ident()))
    thread = threading.Thread(target=lambda: model(TOKENS))
    thread.start()
    thread.join()
    model(TOKENS)
    assert len(set(calls)) == 2
    model.reset_hooks()


def test_hooks_kept_after_their_block_belong_to_the_model():
    model = make_model()
    calls = []
    kept = [("hook_embed", lambda x, hook: calls.append(1))]
    with model.hooks(fwd_hooks=kept, reset_hooks_end=False):
        pass
    thread = threading.Thread(target=lambda: model(TOKENS))
    thread.start()
    thread.join()
    assert calls == [1]
    model.reset_hooks()


# ------------------------------------------------------------ hooks in odd places
def test_a_hook_added_with_add_hook_inside_hooks_stays_after_the_block():
    model = make_model()
    with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: None)]):
        kept = model.add_hook("blocks.0.hook_resid_pre", lambda x, hook: None)
    assert model.attached_hooks() == kept  # the block removed only what it attached
    model.reset_hooks()
    assert model.attached_hooks() == []


def test_hook_recorders_stopped_out_of_order_record_and_restore_correctly():
    from hookedattn.core.hook_points import HookPoint

    original = HookPoint.add_hook
    outer, inner = HookRecorder().start(), HookRecorder().start()
    model = make_model()
    outer.stop()  # out of order: the inner one is still recording
    model.add_hook("hook_embed", lambda x, hook: None)
    assert len(inner.added) == 1 and outer.added == []
    inner.stop()
    assert HookPoint.add_hook is original  # nothing left wrapped
    model.add_hook("hook_embed", lambda x, hook: None)
    assert len(inner.added) == 1
    model.reset_hooks()
