"""Assertions shared by the test modules (tests/ is on sys.path under pytest's default import mode)."""

import torch


def assert_state_equal(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Every tensor of the two modules' state_dicts (weights and BatchNorm buffers) is bit-identical."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    different = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:5]}"
