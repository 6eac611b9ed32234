"""Assertions shared by the test modules (tests/ is on sys.path under pytest's default import mode)."""

import torch
from torch.utils._pytree import tree_leaves


def assert_state_equal(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Every tensor of the two modules' state_dicts (weights and BatchNorm buffers) is bit-identical."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    different = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:5]}"


def surrogate_step(model: torch.nn.Module, img: torch.Tensor) -> torch.Tensor:
    """Forward in training mode and backward of a target-free loss over every floating-point output tensor (reaches
    every head branch of every task); returns the loss."""
    out = model(img)
    loss = sum(t.float().square().mean() for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point())
    loss.backward()
    return loss.detach()


def assert_grads_equal(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """The two modules' parameters have bit-identical gradients (None where the other's is None), at least one."""
    ga = {k: p.grad for k, p in a.named_parameters()}
    gb = {k: p.grad for k, p in b.named_parameters()}
    assert ga.keys() == gb.keys()
    assert all((ga[k] is None) == (gb[k] is None) for k in ga), [k for k in ga if (ga[k] is None) != (gb[k] is None)][:5]
    different = [k for k in ga if ga[k] is not None and not torch.equal(ga[k], gb[k])]
    assert not different, f"{len(different)} gradients differ, e.g. {different[:5]}"
    assert any(g is not None for g in ga.values())
