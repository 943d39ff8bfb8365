"""Discovery on the shipped `bytes-attn-only-2l`, found unaided: on repeated random bytes
against the same sequences with their first copy re-drawn (which breaks the repeat the
induction head's keys look for), the top edge into the induction head's keys is the
previous-token head, by exact edge patching and by EAP-IG; ACDC keeps it."""

import pytest
import torch

from analysis import acdc, edge_attribution, edge_patching, faithfulness
from analysis.induction import PERIOD, repeated_tokens
from hookedattn import HookedTransformer

N_SEQ = 4  # the circuit is the same on every sequence: a few keep the test quick
# The report's heads (tests/shipped/test_induction_findings.py).
PREVIOUS, INDUCTION = "L0H5", "L1H2"


@pytest.fixture(scope="module")
def prompts():
    model = HookedTransformer.from_pretrained("bytes-attn-only-2l")
    clean = repeated_tokens(n_seq=N_SEQ)
    corrupted = clean.clone()
    generator = torch.Generator().manual_seed(1)
    corrupted[:, 1 : PERIOD + 1] = torch.randint(0, 256, (N_SEQ, PERIOD), generator=generator)
    # Position p predicts token p + 1: the second copy's predictions after its first token.
    positions = torch.arange(PERIOD + 1, 2 * PERIOD)
    targets = clean[:, positions + 1]

    def second_copy_loss(logits: torch.Tensor) -> torch.Tensor:
        logprobs = logits[:, positions].log_softmax(-1)
        return -logprobs.gather(-1, targets[..., None])[..., 0].mean(-1)

    return model, dict(clean_tokens=clean, corrupted_tokens=corrupted, metric=second_copy_loss)


def top_edge_into_the_keys(scores) -> str:
    return scores.top(1, receiver=f"{INDUCTION}.k").rows[0][0]


def test_exact_edge_patching_finds_the_previous_token_head(prompts):
    model, kwargs = prompts
    exact = edge_patching(model, **kwargs)
    assert top_edge_into_the_keys(exact) == f"{PREVIOUS} -> {INDUCTION}.k"
    assert exact.clean_baseline < 0.5 < 5 < exact.corrupted_baseline  # the repeat is learnt


def test_eap_ig_finds_it_too(prompts):
    model, kwargs = prompts
    scores = edge_attribution(model, **kwargs, method="eap-ig", ig_steps=5)
    assert top_edge_into_the_keys(scores) == f"{PREVIOUS} -> {INDUCTION}.k"


def test_acdc_keeps_it_in_a_faithful_circuit(prompts):
    model, kwargs = prompts
    circuit = acdc(model, **kwargs, threshold=0.1)
    assert f"{PREVIOUS} -> {INDUCTION}.k" in circuit
    assert f"{INDUCTION} -> logits" in circuit
    assert len(circuit) < 30  # of 257
    assert faithfulness(model, circuit, **kwargs).value > 0.8
