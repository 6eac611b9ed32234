"""Tests of yolo_ckpt.checkpointing.engine (and yolo_ckpt.memory.step): patched models train exactly like stock ones, with less memory.

Models are built from YAML (no download); small images (64 px) except for the memory measurement.
"""

import copy
import os
import subprocess
import sys
import textwrap
import weakref
import zipfile

import cloudpickle
import pytest
import torch
from helpers import SUBPROCESS_TIMEOUT_S, assert_grads_equal, assert_state_equal, build_model, surrogate_step
from torch import nn
from torch.utils._pytree import tree_leaves
from ultralytics.nn.tasks import (
    DetectionModel,
)

import yolo_ckpt.checkpointing.engine as engine
from yolo_ckpt import apply_checkpointing, checkpointed_layers, count_recomputations, remove_checkpointing
from yolo_ckpt.checkpointing.engine import checkpointed_modules
from yolo_ckpt.checkpointing.patching import stock_class
from yolo_ckpt.memory.step import probe_training_step
from yolo_ckpt.memory.synthetic_batch import detect_batch
from yolo_ckpt.memory.tracker import LiveTensorTracker

pytestmark = pytest.mark.usefixtures("one_thread")

Y11_ALL = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 16, 17, 19, 20, 22)
Y11_HEAD = tuple(f"23.{b}.{j}" for b in ("cv2", "cv3") for j in range(3))  # Detect's branches (recompute=all)
Y11_PARAM_FREE = {11, 12, 14, 15, 18, 21}


# --------------------------------------------------------------------------------------------- helpers


def cls_batch(b=2, imgsz=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {"img": torch.rand(b, 3, imgsz, imgsz, generator=g), "cls": torch.randint(0, 1000, (b,), generator=g)}


def train_step(model, batch, opt=None):
    """One forward/backward (and optimizer step if given); returns the loss."""
    if opt is not None:
        opt.zero_grad(set_to_none=True)
    loss, _ = model.loss(batch)
    loss.sum().backward()
    if opt is not None:
        opt.step()
    return loss.detach()


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_outputs_equal(x, y):
    lx, ly = tree_leaves(x), tree_leaves(y)
    assert len(lx) == len(ly) and len(lx) > 0
    for a, b in zip(lx, ly):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)


def bn_modules(layer):
    return [m for m in layer.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


@pytest.fixture
def checkpoint_calls(monkeypatch):
    """Counts the calls the engine makes to torch.utils.checkpoint.checkpoint."""
    calls = []
    real = engine.checkpoint

    def spy(*args, **kwargs):
        calls.append(kwargs.get("use_reentrant", "missing"))
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "checkpoint", spy)
    return calls


# --------------------------------------------------------------------------------------------- warnings


def test_checkpoint_without_use_reentrant_is_an_error_here():
    """The module's warning filter really turns checkpoint() without use_reentrant into a failure."""
    x = torch.randn(3, requires_grad=True)
    with pytest.raises((UserWarning, FutureWarning), match="use_reentrant"):
        torch.utils.checkpoint.checkpoint(lambda t: t * 2, x).sum().backward()


def test_engine_passes_use_reentrant_false(checkpoint_calls):
    m = build_model()
    apply_checkpointing(m, "backbone")
    train_step(m, detect_batch(2, 64, 3))
    assert len(checkpoint_calls) == 11
    assert set(checkpoint_calls) == {False}


# --------------------------------------------------------------------------------------------- exactness


def test_all_equals_stock_training():
    """Loss, gradients, parameters and BN buffers bit-identical to stock after 1 and after 3 training steps;
    BN statistics updated once per forward pass (failure mode 1); one recomputation per layer and head branch per pass."""
    stock, patched = build_model(), build_model()
    untouched = snapshot(patched)
    policy = apply_checkpointing(patched, "all")
    assert policy.indices == Y11_ALL
    assert checkpointed_layers(patched) == list(Y11_ALL)
    opt_s = torch.optim.SGD(stock.parameters(), lr=0.01, momentum=0.9)
    opt_p = torch.optim.SGD(patched.parameters(), lr=0.01, momentum=0.9)
    with count_recomputations() as counter:
        for passes in (1, 2, 3):
            batch = detect_batch(2, 64, 3, seed=passes)
            ls = train_step(stock, batch)
            lp = train_step(patched, batch)
            assert torch.equal(ls, lp), passes
            assert_grads_equal(stock, patched)
            assert counter.total == passes * (len(Y11_ALL) + len(Y11_HEAD))
            assert dict(counter.per_layer) == {i: passes for i in Y11_ALL}
            assert dict(counter.per_module) == {n: passes for n in (*map(str, Y11_ALL), *Y11_HEAD)}
            opt_s.step(), opt_p.step()
            opt_s.zero_grad(set_to_none=True), opt_p.zero_grad(set_to_none=True)
            if passes in (1, 3):
                assert_state_equal(stock, patched)  # parameters, running_mean/var, num_batches_tracked
                n_bn = 0
                for i in Y11_ALL:
                    for bn in bn_modules(patched.model[i]):
                        assert int(bn.num_batches_tracked) == passes
                        n_bn += 1
                assert n_bn > 50
    # the parameters and statistics moved: the comparison above is not of untouched models
    assert not torch.equal(patched.model[0].conv.weight, untouched["model.0.conv.weight"])
    assert not torch.equal(patched.model[6].cv1.bn.running_var, untouched["model.6.cv1.bn.running_var"])


def test_all_under_checkpoint_debug_mode_equals_stock():
    """recompute=all under PyTorch's checkpoint debug mode (its tool for a CheckpointError; it refuses a context_fn):
    runs, recomputes every layer and head branch once, and gradients, parameters and BN buffers equal stock's."""
    stock, patched = build_model(), build_model()
    apply_checkpointing(patched, "all")
    batch = detect_batch(2, 64, 3, seed=4)
    with count_recomputations() as counter, torch.utils.checkpoint.set_checkpoint_debug_enabled(True):
        lp = train_step(patched, batch)
    assert torch.equal(train_step(stock, batch), lp)
    assert counter.total == len(Y11_ALL) + len(Y11_HEAD)
    assert_grads_equal(stock, patched)
    assert_state_equal(stock, patched)  # running_mean/var and num_batches_tracked: updated once, as stock


def test_bn_buffers_without_optimizer():
    """Same, gradient accumulation without optimizer steps: BN running stats equal after 2 forward passes."""
    stock, patched = build_model(), build_model()
    apply_checkpointing(patched, "backbone")
    with count_recomputations() as counter:
        for k in range(2):
            train_step(stock, detect_batch(2, 64, 3, seed=10 + k))
            train_step(patched, detect_batch(2, 64, 3, seed=10 + k))
    assert counter.total == 2 * 11
    assert_grads_equal(stock, patched)  # accumulated
    assert_state_equal(stock, patched)
    for bn in bn_modules(patched.model[2]):
        assert int(bn.num_batches_tracked) == 2
    assert not torch.equal(patched.model[2].cv1.bn.running_mean, torch.zeros_like(patched.model[2].cv1.bn.running_mean))


def test_layer0_image_input_gets_gradients():
    """Failure mode 2: layer 0's input (the image) has no grad; its parameters still get the stock gradient."""
    stock, patched = build_model(), build_model()
    apply_checkpointing(patched, "0-1")
    batch = detect_batch(2, 64, 3)
    assert not batch["img"].requires_grad
    train_step(stock, batch)
    with count_recomputations() as counter:
        train_step(patched, batch)
    assert dict(counter.per_layer) == {0: 1, 1: 1}
    for (k, ps), pp in zip(stock.model[0].named_parameters(), patched.model[0].parameters()):
        assert pp.grad is not None, k
        assert pp.grad.abs().sum() > 0, k
        assert torch.equal(ps.grad, pp.grad), k
    assert_grads_equal(stock, patched)


def test_frozen_layers():
    """Frozen layers (requires_grad False) are not recomputed at run time; the first trainable layer after them
    gets its gradient; frozen= drops them from the policy."""
    stock, patched = build_model(), build_model()
    for m in (stock, patched):
        for p in list(m.model[0].parameters()) + list(m.model[1].parameters()):
            p.requires_grad_(False)
    policy = apply_checkpointing(patched, "all")  # frozen not passed: patched, but inert at run time
    assert 0 in policy.indices and 1 in policy.indices
    batch = detect_batch(2, 64, 3)
    train_step(stock, batch)
    with count_recomputations() as counter:
        train_step(patched, batch)
    assert counter.per_layer[0] == 0 and counter.per_layer[1] == 0
    assert counter.per_layer[2] == 1
    assert counter.total == len(Y11_ALL) - 2 + len(Y11_HEAD)
    for p in patched.model[0].parameters():
        assert p.grad is None
    for p in patched.model[2].parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0
    assert_grads_equal(stock, patched)
    assert_state_equal(stock, patched)

    policy = apply_checkpointing(patched, "all", frozen=(0, 1))
    assert policy.indices == Y11_ALL[2:]
    assert checkpointed_layers(patched) == list(Y11_ALL[2:])
    with count_recomputations() as counter:
        train_step(patched, batch)
    assert counter.total == len(Y11_ALL) - 2 + len(Y11_HEAD)
    assert 0 not in counter.per_layer and 1 not in counter.per_layer


# --------------------------------------------------------------------------------------------- inert outside training


def test_inert_in_eval_no_grad_inference_mode(checkpoint_calls):
    """Failure mode 3: eval / no_grad / inference_mode run the stock forward, bit-identical, no recomputation."""
    stock, patched = build_model(), build_model()
    apply_checkpointing(patched, "all")
    img = detect_batch(2, 64, 3)["img"]

    # sanity: the spy sees the engine in training
    train_step(patched, detect_batch(2, 64, 3))
    train_step(stock, detect_batch(2, 64, 3))
    assert len(checkpoint_calls) == len(Y11_ALL) + len(Y11_HEAD)
    checkpoint_calls.clear()

    with count_recomputations() as counter:
        stock.eval(), patched.eval()
        # eval with grad enabled, and a backward through it
        ys, yp = stock(img), patched(img)
        assert_outputs_equal(ys, yp)
        yp[0].sum().backward()
        with torch.no_grad():
            assert_outputs_equal(stock(img), patched(img))
        with torch.inference_mode():
            assert_outputs_equal(stock(img), patched(img))

        # training mode without grad (e.g. AMP check, AutoBatch-like probes)
        stock.train(), patched.train()
        with torch.no_grad():
            assert_outputs_equal(stock(img), patched(img))
        with torch.inference_mode():
            assert_outputs_equal(stock(img), patched(img))
    assert counter.total == 0
    assert checkpoint_calls == []
    assert_state_equal(stock, patched)


def test_selective_mode_equals_stock_training():
    """recompute_mode="selective" (conv/matmul outputs kept, the rest recomputed): same exactness guarantees."""
    stock, patched = build_model(), build_model()
    policy = apply_checkpointing(patched, "all", mode="selective")
    assert policy.indices == Y11_ALL
    assert type(patched.model[2]).__name__ == "SelectiveRecomputedC3k2"
    with count_recomputations() as counter:
        for k in range(2):
            batch = detect_batch(2, 64, 3, seed=20 + k)
            assert torch.equal(train_step(stock, batch), train_step(patched, batch))
            assert_grads_equal(stock, patched)
            stock.zero_grad(set_to_none=True), patched.zero_grad(set_to_none=True)
    assert dict(counter.per_layer) == {i: 2 for i in Y11_ALL}
    assert_state_equal(stock, patched)
    assert int(patched.model[4].cv1.bn.num_batches_tracked) == 2
    # an invalid mode leaves the model as it was
    with pytest.raises(ValueError, match="bogus"):
        apply_checkpointing(patched, "backbone", mode="bogus")
    assert checkpointed_layers(patched) == list(Y11_ALL)
    assert type(patched.model[2]).__name__ == "SelectiveRecomputedC3k2"


# --------------------------------------------------------------------------------------------- structure


def test_layer_attributes_and_state_dict_unchanged():
    """Failure mode 13: .f/.i/.type/.np, model.save and state_dict keys are those of the stock model."""
    stock, patched = build_model(), build_model()
    keys = list(patched.state_dict())
    apply_checkpointing(patched, "all")
    assert list(patched.state_dict()) == keys == list(stock.state_dict())
    assert patched.save == stock.save
    assert len(patched.model) == len(stock.model)
    for ls, lp in zip(stock.model, patched.model):
        for attr in ("f", "i", "type", "np"):
            assert getattr(lp, attr) == getattr(ls, attr), attr
        assert isinstance(lp, type(ls))
    for i in Y11_ALL:
        assert type(patched.model[i]) is not type(stock.model[i])
        assert type(patched.model[i]).__name__ == "Recomputed" + type(stock.model[i]).__name__
    # stock weights load strictly into the patched model and back
    patched.load_state_dict(stock.state_dict(), strict=True)
    stock.load_state_dict(patched.state_dict(), strict=True)


def test_param_free_layers_are_never_regions_and_fold_into_the_recomputed_layer_they_feed():
    m = build_model()
    everything = {11: 13, 12: 13, 14: 16, 15: 16, 18: 19, 21: 22}
    for spec, folded in (("all", everything), ("neck", everything), ("0-22", everything), ("Upsample,Concat,C3k2", everything),
                         ("backbone", {}), ("13", {11: 13, 12: 13}), ("16,17", {14: 16, 15: 16})):
        policy = apply_checkpointing(m, spec)
        assert not set(policy.indices) & Y11_PARAM_FREE
        assert not set(checkpointed_layers(m)) & Y11_PARAM_FREE
        assert engine.folded_layers(m, set(policy.indices)) == folded, spec
        for i in Y11_PARAM_FREE:
            stock = type(m.model[i]).__module__.startswith(("torch", "ultralytics"))
            assert stock == (i not in folded) and stock_class(type(m.model[i])).__module__.startswith(("torch", "ultralytics")), (spec, i)
    assert checkpointed_layers(m) == [16, 17]


@pytest.mark.parametrize("spec", ["all", "backbone"])
def test_folded_layers_outputs_are_not_kept_their_inputs_are(spec):
    """After a training forward, what the graph keeps: with every layer recomputed (``all``), none of the Upsample and
    Concat outputs (the regions keep their inputs instead: layer 10's and 13's outputs, which only Upsample and Concat
    layers take); with ``backbone`` the neck is stock: it keeps the Concat outputs (its convolutions' inputs), not 10's
    or 13's."""
    m = build_model()
    apply_checkpointing(m, spec)
    storages = {}
    hooks = [m.model[i].register_forward_hook(lambda mod, a, out, i=i: storages.__setitem__(i, weakref.ref(out.untyped_storage())))
             for i in (*Y11_PARAM_FREE, 10, 13)]
    preds = m(detect_batch(2, 64, 3)["img"])
    alive = {i for i, ref in storages.items() if ref() is not None}
    if spec == "all":
        assert alive == {10, 13}
    else:
        assert alive == {12, 15, 18, 21}
    for h in hooks:
        h.remove()
    del preds


def test_apply_twice_is_idempotent_and_replaces():
    m = build_model()
    p1 = apply_checkpointing(m, "all")
    cls2 = type(m.model[2])
    p2 = apply_checkpointing(m, "all")
    assert p1 == p2
    assert type(m.model[2]) is cls2
    assert cls2.__bases__ == (engine.RecomputedLayer, type(build_model().model[2]))  # not Recomputed(RecomputedC3k2)
    assert checkpointed_layers(m) == list(Y11_ALL)
    with count_recomputations() as counter:
        train_step(m, detect_batch(2, 64, 3))
    assert counter.total == len(Y11_ALL) + len(Y11_HEAD)  # once per layer and branch, not twice
    assert dict(counter.per_layer) == {i: 1 for i in Y11_ALL}

    apply_checkpointing(m, "backbone")  # replaces, not adds
    assert checkpointed_modules(m) == [str(i) for i in range(11)]
    # an invalid value leaves the model as it was
    with pytest.raises(ValueError, match="C3k3"):
        apply_checkpointing(m, "C3k3")
    with pytest.raises(ValueError, match="assign_chunk=0 is not valid"):
        apply_checkpointing(m, "all,loss", assign_chunk=0)
    assert checkpointed_modules(m) == [str(i) for i in range(11)]
    classify = build_model("yolo11n-cls.yaml")
    with pytest.raises(ValueError, match="no loss region"):
        apply_checkpointing(classify, "all,loss")
    assert checkpointed_modules(classify) == []


def test_remove_checkpointing_restores_stock():
    stock, m = build_model(), build_model()
    stock_types = [type(layer) for layer in m.model]
    apply_checkpointing(m, "all")
    assert checkpointed_modules(m) == [*map(str, Y11_ALL), *Y11_HEAD]
    remove_checkpointing(m)
    assert checkpointed_modules(m) == []
    assert [type(layer) for layer in m.model] == stock_types
    for layer in m.model:
        assert "forward" not in vars(layer)
        assert type(layer).forward is stock_types[layer.i].forward
    with count_recomputations() as counter:
        train_step(m, detect_batch(2, 64, 3))
        train_step(stock, detect_batch(2, 64, 3))
    assert counter.total == 0
    assert_grads_equal(stock, m)
    remove_checkpointing(m)  # no-op on a stock model
    assert [type(layer) for layer in m.model] == stock_types


def test_type_error_for_non_ultralytics_models():
    with pytest.raises(TypeError, match="BaseModel"):
        apply_checkpointing(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()))
    with pytest.raises(TypeError):
        checkpointed_layers(nn.Linear(2, 2))


def test_ddp_like_wrapper():
    """A model wrapped like DDP (.module) is patched in place."""
    m = build_model()

    class Wrapper(nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

    w = Wrapper(m)
    policy = apply_checkpointing(w, "backbone")
    assert policy.indices == tuple(range(11))
    assert checkpointed_layers(w) == checkpointed_layers(m) == list(range(11))
    remove_checkpointing(w)
    assert checkpointed_layers(m) == []


# --------------------------------------------------------------------------------------------- copies and pickles


def test_deepcopy_is_independent_patched_copy():
    """Failure mode 15: a deepcopy (EMA, AutoBatch probe) is patched, and training it leaves the original alone."""
    m = build_model()
    apply_checkpointing(m, "all")
    before = snapshot(m)
    c = copy.deepcopy(m)
    assert checkpointed_layers(c) == checkpointed_layers(m) == list(Y11_ALL)
    assert checkpointed_modules(c) == checkpointed_modules(m) == [*map(str, Y11_ALL), *Y11_HEAD]
    for lm, lc in zip(m.model, c.model):
        assert lc is not lm
        assert type(lc) is type(lm)
        for pm, pc in zip(lm.parameters(), lc.parameters()):
            assert pc is not pm and pc.data_ptr() != pm.data_ptr()
    opt = torch.optim.SGD(c.parameters(), lr=0.01)
    with count_recomputations() as counter:
        train_step(c, detect_batch(2, 64, 3), opt)
        train_step(c, detect_batch(2, 64, 3, seed=2), opt)
    assert counter.total == 2 * (len(Y11_ALL) + len(Y11_HEAD))
    # the original: parameters, BN buffers and grads untouched
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in m.parameters())
    # the copy trained: its parameters and BN stats moved, its BN counted 2 forward passes
    assert not torch.equal(c.model[4].cv1.conv.weight, before["model.4.cv1.conv.weight"])
    assert not torch.equal(c.model[4].cv1.bn.running_mean, before["model.4.cv1.bn.running_mean"])
    assert int(c.model[4].cv1.bn.num_batches_tracked) == 2
    assert int(m.model[4].cv1.bn.num_batches_tracked) == 0


SUBPROCESS = textwrap.dedent(
    """
    import os, sys
    sys.modules["yolo_ckpt"] = None  # yolo_ckpt cannot be imported here
    try:
        import yolo_ckpt  # noqa
    except ImportError:
        pass
    else:
        raise SystemExit("yolo_ckpt importable")
    import cloudpickle, torch
    d = sys.argv[1]
    x, expected = torch.load(os.path.join(d, "io.pt"))
    loaded = {
        "torch.save": torch.load(os.path.join(d, "model.pt"), weights_only=False),
        "cloudpickle": cloudpickle.loads(open(os.path.join(d, "model.cloudpickle"), "rb").read()),
    }
    for how, model in loaded.items():
        assert type(model).__module__ == "ultralytics.nn.tasks", (how, type(model))
        for layer in model.model:
            t = type(layer)
            assert t.__module__.startswith(("ultralytics.", "torch.")), (how, t)
            assert "Recomputed" not in t.__name__, (how, t)
            assert t.__name__ == layer.type.rsplit(".", 1)[-1], (how, t, layer.type)
        for module in model.modules():  # head branches included
            assert "Recomputed" not in type(module).__name__, (how, type(module))
            assert "_recompute_name" not in vars(module), how
        model.eval()
        with torch.no_grad():
            y = model(x)[0]
        assert torch.equal(y, expected), how
    assert not any(k.startswith("yolo_ckpt") and v is not None for k, v in sys.modules.items())
    print("LOADED-STOCK")
    """
)


@pytest.mark.slow
def test_pickles_hold_only_stock_classes(tmp_path):
    """Failure mode 16: torch.save and cloudpickle of a patched model load where yolo_ckpt is absent."""
    m = build_model()
    apply_checkpointing(m, "all")
    train_step(m, detect_batch(2, 64, 3))  # a used model, as saved by a trainer
    m.zero_grad(set_to_none=True)
    torch.save(m, tmp_path / "model.pt")
    blob = cloudpickle.dumps(m)
    (tmp_path / "model.cloudpickle").write_bytes(blob)
    # pickling left the live model patched
    assert checkpointed_modules(m) == [*map(str, Y11_ALL), *Y11_HEAD]

    assert b"yolo_ckpt" not in blob and b"Recomputed" not in blob
    with zipfile.ZipFile(tmp_path / "model.pt") as z:
        pkls = [n for n in z.namelist() if n.endswith(".pkl")]
        assert pkls
        for n in pkls:
            data = z.read(n)
            assert b"yolo_ckpt" not in data and b"Recomputed" not in data, n
            assert b"ultralytics.nn.modules" in data

    # in this process the loaded copies are stock too
    for loaded in (torch.load(tmp_path / "model.pt", weights_only=False), cloudpickle.loads(blob)):
        assert checkpointed_modules(loaded) == []
        assert_state_equal(m, loaded)

    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    m.eval()
    with torch.no_grad():
        expected = m(x)[0]
    torch.save((x, expected), tmp_path / "io.pt")
    env = {**os.environ, "YOLO_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, "-c", SUBPROCESS, str(tmp_path)], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, env=env
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "LOADED-STOCK" in r.stdout


# --------------------------------------------------------------------------------------------- RNG


def test_rng_state_unchanged_by_recomputation():
    stock, patched = build_model(), build_model()
    apply_checkpointing(patched, "all")
    batch = detect_batch(2, 64, 3)
    torch.manual_seed(123)
    train_step(stock, batch)
    rng_stock = torch.get_rng_state()
    torch.manual_seed(123)
    with count_recomputations() as counter:
        train_step(patched, batch)
    assert counter.total == len(Y11_ALL) + len(Y11_HEAD)
    assert torch.equal(torch.get_rng_state(), rng_stock)


def test_rng_inside_recomputed_layer_replayed():
    """A random op inside a recomputed layer (dropout) sees the same random numbers in the recompute; the global
    RNG ends where it ends without checkpointing."""
    stock, patched = build_model(), build_model()
    for m in (stock, patched):
        m.model[2].cv1.act = nn.Sequential(nn.SiLU(), nn.Dropout(0.3))  # no parameters: state_dict unchanged
    apply_checkpointing(patched, "2")
    batch = detect_batch(2, 64, 3)
    torch.manual_seed(7)
    ls = train_step(stock, batch)
    rng_stock = torch.get_rng_state()
    torch.manual_seed(7)
    with count_recomputations() as counter:
        lp = train_step(patched, batch)
    assert dict(counter.per_layer) == {2: 1}
    assert torch.equal(ls, lp)
    assert_grads_equal(stock, patched)
    assert torch.equal(torch.get_rng_state(), rng_stock)


# --------------------------------------------------------------------------------------------- other models


@pytest.mark.parametrize("yaml_name", ["yolov8n.yaml", "yolo12n.yaml", "yolo26n.yaml"])
def test_other_detect_models_equal_gradients(yaml_name):
    stock, patched = build_model(yaml_name), build_model(yaml_name)
    policy = apply_checkpointing(patched, "all")
    assert len(policy.indices) > 10
    batch = detect_batch(2, 64, 3)
    ls = train_step(stock, batch)
    with count_recomputations() as counter:
        lp = train_step(patched, batch)
    assert dict(counter.per_layer) == {i: 1 for i in policy.indices}
    assert dict(counter.per_module) == {n: 1 for n in checkpointed_modules(patched)}  # nested blocks, head branches
    assert torch.equal(ls, lp)
    assert_grads_equal(stock, patched)
    assert_state_equal(stock, patched)


def test_classify_equal_gradients():
    stock, patched = build_model("yolo11n-cls.yaml"), build_model("yolo11n-cls.yaml")
    policy = apply_checkpointing(patched, "all")
    assert policy.indices == tuple(range(10)) and policy.head
    batch = cls_batch()
    ls = train_step(stock, batch)
    with count_recomputations() as counter:
        lp = train_step(patched, batch)
    assert dict(counter.per_module) == {**{str(i): 1 for i in range(10)}, "10.conv": 1}
    assert torch.equal(ls, lp)
    assert_grads_equal(stock, patched)
    assert_state_equal(stock, patched)


@pytest.mark.parametrize("yaml_name", ["yolo11n-seg.yaml", "yolo11n-obb.yaml", "yolo11n-pose.yaml"])
def test_other_tasks_equal_gradients(yaml_name):
    """Segment/OBB/Pose with a target-free surrogate loss over every training output."""
    stock, patched = build_model(yaml_name), build_model(yaml_name)
    policy = apply_checkpointing(patched, "all")
    assert policy.indices == Y11_ALL
    img = detect_batch(2, 64, 3)["img"]
    ls = surrogate_step(stock, img)
    with count_recomputations() as counter:
        lp = surrogate_step(patched, img)
    assert dict(counter.per_layer) == {i: 1 for i in Y11_ALL}
    assert dict(counter.per_module) == {n: 1 for n in checkpointed_modules(patched)} and len(counter.per_module) >= 26
    assert torch.equal(ls, lp)
    assert_grads_equal(stock, patched)
    assert_state_equal(stock, patched)


# --------------------------------------------------------------------------------------------- memory


def test_live_tensor_tracker_counts_storages():
    with LiveTensorTracker() as t:
        a = torch.ones(1000)  # 4000 bytes
        b = a.view(10, 100)  # a view: not counted twice
        assert t.live_bytes == 4000
        c = torch.zeros(500, dtype=torch.float64)  # 4000 bytes
        assert t.live_bytes == 8000
        del a, b
        assert t.live_bytes == 4000
        del c
        assert t.live_bytes == 0
    assert t.peak_bytes == 8000
    x = torch.ones(250)
    with LiveTensorTracker() as t:
        t.track([x], {"k": x})
        assert t.live_bytes == 1000


def test_probe_training_step_leaves_model_untouched():
    m = build_model()
    apply_checkpointing(m, "backbone")
    before = snapshot(m)
    torch.manual_seed(3)
    rng = torch.get_rng_state()
    peak = probe_training_step(m, detect_batch(2, 64, 3))
    assert peak > 10 * 2**20  # at least the parameters + grads + activations
    assert torch.equal(torch.get_rng_state(), rng)
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in m.parameters())
    assert checkpointed_layers(m) == list(range(11))


@pytest.mark.slow
def test_head_lowers_the_layers_only_peak_640():
    """The head's branches are worth recomputing: on YOLO11n at imgsz 640, batch 2, 20 objects per image, with the
    optimizer state (profile_step), recompute=all lowers the peak of backbone,neck (every layer, no head) by at
    least 15% of it (measured 28.5%: 220.0 -> 157.2 MiB)."""
    from yolo_ckpt.memory.step import profile_step

    model, batch = build_model(), detect_batch(2, 640, 20)
    layers_only = profile_step(model, batch, "backbone,neck", flops=False)
    everything = profile_step(model, batch, "all", flops=False)
    assert layers_only.layers[23].recompute is None and everything.layers[23].recompute == "full"
    assert everything.peak_bytes <= 0.85 * layers_only.peak_bytes, (everything.peak_bytes, layers_only.peak_bytes)


def test_shallow_copy_keeps_patch():
    """copy.copy of a patched layer stays patched (only pickling goes stock)."""
    model = DetectionModel("yolo11n.yaml", verbose=False)
    apply_checkpointing(model, "all")
    layer = copy.copy(model.model[2])
    assert type(layer) is type(model.model[2]) and layer.cv1 is model.model[2].cv1


@pytest.mark.parametrize("frozen", ["abc", 5, [1.5], [True], {"0": 1}])
def test_bad_frozen_is_an_error(frozen):
    """frozen= takes layer indices; anything else is named, not silently read as no frozen layer."""
    m = build_model()
    with pytest.raises(ValueError, match=r"frozen=.* is not valid; give layer indices"):
        apply_checkpointing(m, "all", frozen=frozen)
    assert checkpointed_layers(m) == []


@pytest.mark.parametrize("grads", [False, True])
def test_fused_model_refused(grads):
    """model.fuse() sets forward = forward_fuse on its modules, which would bypass the recomputed classes: with
    gradients off (as fuse() leaves them) or turned back on, the policy is refused, saying what to do."""
    m = build_model()
    m.fuse()
    for p in m.parameters():
        p.requires_grad_(grads)
    with pytest.raises(ValueError, match=r"the model is fused .* build or load the model unfused"):
        apply_checkpointing(m, "all")
    assert checkpointed_layers(m) == [] and apply_checkpointing(m, "none").indices == ()
