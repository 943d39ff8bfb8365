"""One edge patched by hand: a forward with a sender's change added to one receiver's input,
the definition the edge scores of `analysis.discovery` are checked against."""

import torch


def patched_logits(model, tokens, receiver, delta, stream=None) -> torch.Tensor:
    """The logits of one forward of `tokens` (or of `stream`, the stream entering block 0)
    with `delta` added to `receiver`'s input where it passes its hook point: its head's
    copy (a query, key or value receiver) or the whole input (an MLP's, a mixer's, the
    logits'). `model` has those hook points (`use_split_qkv_input`, ...)."""

    def add(x, hook):
        x = x.clone()
        if receiver.head is None:
            x += delta
        else:
            x[:, :, receiver.head] += delta
        return x

    with torch.no_grad(), model.hooks(fwd_hooks=[(receiver.hook, add)]):
        return model(tokens) if stream is None else model(stream, start_at_layer=0)
