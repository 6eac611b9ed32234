"""Assertions and steps shared by the test modules (tests/ is on sys.path under pytest's default import mode)."""

import torch
from torch.utils._pytree import tree_leaves


def assert_state_equal(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Every tensor of the two modules' state_dicts (weights and BatchNorm buffers) is bit-identical."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    different = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:5]}"


def assert_grads_equal(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """The two modules' parameters have bit-identical gradients (None where the other's is None), at least one set."""
    ga, gb = dict(a.named_parameters()), dict(b.named_parameters())
    assert ga.keys() == gb.keys()
    n = 0
    for k in ga:
        if ga[k].grad is None:
            assert gb[k].grad is None, k
            continue
        assert gb[k].grad is not None, k
        assert torch.equal(ga[k].grad, gb[k].grad), k
        n += 1
    assert n > 0


def surrogate_step(model: torch.nn.Module, img: torch.Tensor) -> torch.Tensor:
    """Forward in training mode and backward of a target-free loss over every floating output tensor (any task's
    head); returns the detached loss."""
    out = model(img)
    loss = sum(t.float().square().mean() for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point())
    loss.backward()
    return loss.detach()
