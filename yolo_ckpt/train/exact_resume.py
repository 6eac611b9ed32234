"""Exact resume: a resumed run trains on as if it had never stopped, bit for bit on the CPU.

Ultralytics' ``last.pt`` resumes a run only approximately (``BaseTrainer.save_model``, ``resume_training`` and
``_do_train``, engine/trainer.py, 8.4.190):

- the training model restarts from the EMA, stored in half precision (``"model": None  # resume and final
  checkpoints derive from EMA``), and the optimizer's state is stored in half precision
  (``convert_optimizer_state_dict_to_fp16``);
- the random states restart from the seed: Python's and NumPy's (the augmentation), torch's, and the train loader's
  shuffling generator (``build_dataloader``), and the mosaic's buffer of recent images (``BaseDataset.buffer``)
  starts empty;
- the gradients accumulated since the last optimizer step (``batch`` < ``nbs``) are dropped and the step cadence
  restarts (``_do_train``'s local ``last_opt_step``).

So beside each ``last.pt`` a Checkpoint*Trainer writes ``resume_state.pt`` (:data:`STATE_NAME`, atomically) with
what it lacks, and a resumed trainer puts it back where Ultralytics' resume leaves off: the model, EMA and optimizer
in full precision once ``resume_training`` has loaded ``last.pt``, the mosaic buffer then too (its images read again),
and at the first resumed epoch's start the gradients, the random states, the loader's shuffling (its index chain
replayed, :func:`_restore_loader`) and the cadence (:func:`accumulate`). Everything is exact in one
process with ``workers=0`` (Ultralytics' setting on the CPU); with ``workers > 0`` the workers' random states live in
their processes and are not kept, nor is the shuffling replayed (the batches then differ from an uninterrupted run's;
the model, EMA, optimizer and step cadence are exact);
DDP runs resume as stock does. A ``resume_state.pt`` that is not ``last.pt``'s epoch (a kill between the two saves)
is not used, nor one of another run, nor one saved under other batches than the resume trains (a changed
``batch=``, ``imgsz=``, ..., or other training images: :func:`mismatch`), nor one that cannot be read (a folder, a
truncated file, a pickle of other objects, which ``weights_only`` refuses to run: :func:`load_state`): the run resumes
as stock does, and says so in one line. The file is removed when
the run ends (its final validation). Its size is four times the model's fp32 weights (model, EMA, the optimizer's
two moments), five with pending gradients.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import torch
from ultralytics.utils import LOGGER, RANK
from ultralytics.utils.torch_utils import unwrap_model

from ..errors import NoRoomError
from .atomic import atomic_write
from .log import PREFIX

STATE_NAME = "resume_state.pt"
# the arguments a resume may change (BaseTrainer.check_resume's `allowed`, engine/trainer.py) that change what trains
# next: the batches, their shuffling and augmentation, the step cadence, the epochs (time=), what trains (freeze=)
TRAJECTORY_KEYS = ("imgsz", "batch", "close_mosaic", "augmentations", "workers", "cache", "time", "freeze", "distill_model")


def state_path(weights) -> Path:
    """``resume_state.pt`` in a run's ``weights`` folder (a trainer's ``wdir``)."""
    return Path(weights) / STATE_NAME


def saves_state(trainer) -> bool:
    """Whether ``trainer`` keeps an exact resume state: one process (not DDP)."""
    return RANK == -1


def random_states() -> dict:
    """Python's, NumPy's, torch's and (where there is CUDA) every CUDA device's random state, as tensors and tuples
    that ``torch.load(weights_only=True)`` reads."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_random_states(states: dict) -> None:
    """Put back :func:`random_states`' states (CUDA's where the saving process and this one both have CUDA)."""
    random.setstate(states["python"])
    name, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_state(trainer) -> None:
    """Write ``trainer``'s exact resume state beside its ``last.pt`` (just saved for ``trainer.epoch``), atomically
    (:func:`~yolo_ckpt.train.atomic.atomic_write`). Where the disk has no room for it, the old one is removed with a
    one-line warning and training goes on (its resume is then stock's); where a folder has its name, nothing is
    written, said once. Nothing for DDP (:func:`saves_state`)."""
    if not saves_state(trainer):
        return
    path = state_path(trainer.wdir)
    if path.is_dir():  # not ours to remove: said at the leg's first save, and the run goes on
        if trainer.epoch == trainer.start_epoch:
            LOGGER.warning(f"{PREFIX}{path} is a folder: no exact resume state written; a resume of this run is Ultralytics'")
        return
    loader = trainer.train_loader
    buffer = getattr(loader.dataset, "buffer", None)
    params = list(trainer.model.parameters())
    state = {
        "epoch": trainer.epoch,
        "updates": trainer.ema.updates,
        "model": unwrap_model(trainer.model).state_dict(),
        "ema": trainer.ema.ema.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "grads": [p.grad for p in params] if any(p.grad is not None for p in params) else None,
        "last_step": trainer.ckpt_state.last_step,
        "random": random_states(),
        "loader": {"state": loader.generator.get_state(), "chain_start": trainer.ckpt_state.chain_start,
                   "chain_batches": trainer.ckpt_state.chain_batches} if trainer.ckpt_state.chain_start is not None else None,
        "buffer": list(buffer) if isinstance(buffer, list) else None,
        "args": {k: getattr(trainer.args, k, None) for k in TRAJECTORY_KEYS},
        "data": training_images(loader.dataset),
        "step_s": list(trainer.ckpt_state.step_s),  # the report's median step time is the whole run's, not the last leg's
        "val_s": list(trainer.ckpt_state.val_s),  # and so are its validation seconds
        "best_epoch": trainer.ckpt_state.best_epoch,
    }
    try:
        atomic_write(path, lambda f: torch.save(state, f))
    except NoRoomError as e:
        path.unlink(missing_ok=True)
        LOGGER.warning(
            f"{PREFIX}no room for {path.name} ({e}): a resume of this run is Ultralytics' (the model from the checkpoint's "
            "half-precision EMA)"
        )


def remove_state(weights) -> None:
    """Remove ``resume_state.pt`` from a run's ``weights`` folder: at the run's end nothing is left to resume (a folder
    of that name is not a state: left)."""
    if state_path(weights).is_file():
        state_path(weights).unlink(missing_ok=True)


def restore(trainer, ckpt: dict) -> None:
    """After Ultralytics' ``resume_training`` loaded ``ckpt`` (``last.pt``): load ``resume_state.pt``'s model, EMA and
    optimizer in full precision, refill the mosaic buffer and take back the step and validation times so far and the
    epoch of ``best.pt``; keep the rest for the first epoch (:func:`on_train_epoch_start`). Where the state cannot be
    read (:func:`load_state`) or is not this checkpoint's (:func:`mismatch`), the resume stays stock's, said in one line."""
    path = state_path(trainer.wdir)
    state, why = load_state(path) if saves_state(trainer) else (None, "")
    why = why or mismatch(trainer, ckpt, state)
    if why:
        LOGGER.warning(
            f"{PREFIX}resume as Ultralytics resumes ({why}): the model from the checkpoint's half-precision EMA, the random "
            f"states from the seed"
        )
        return
    unwrap_model(trainer.model).load_state_dict(state["model"])
    trainer.ema.ema.load_state_dict(state["ema"])
    for saved, group in zip(state["optimizer"]["param_groups"], trainer.optimizer.param_groups):
        saved["fused"] = group.get("fused")  # as _load_checkpoint_state: the runtime device picks the kernel
    trainer.optimizer.load_state_dict(state["optimizer"])
    dataset = trainer.train_loader.dataset
    if state["buffer"] is not None and isinstance(getattr(dataset, "buffer", None), list):
        dataset.buffer.clear()
        for i in state["buffer"]:  # load_image appends each to the buffer, in the saved order
            dataset.load_image(i)
    trainer.ckpt_state.resumed = state
    trainer.ckpt_state.step_s = list(state.get("step_s", []))  # none in a state saved before they were (issue 33's arms)
    trainer.ckpt_state.val_s = list(state.get("val_s", []))  # none before issue 46
    trainer.ckpt_state.best_epoch = state.get("best_epoch")
    workers = trainer.train_loader.num_workers
    LOGGER.info(
        f"{PREFIX}resume: exact from {path.name} (model, EMA and optimizer in full precision, random states, mosaic buffer, "
        f"{'the gradients accumulated since the last step' if state['grads'] is not None else 'no pending gradients'})"
        + (f"; workers={workers}: the workers' random states are not kept, the shuffling and augmentation differ" if workers else "")
    )


def mismatch(trainer, ckpt: dict, state: dict | None) -> str:
    """Why ``state`` (``resume_state.pt``, None where there is none) cannot make the resume of ``ckpt`` exact, or ""
    where it can: DDP; no state; a state of another epoch or optimizer step count (a kill between the two saves); of
    another run (its EMA, cast to half precision, is not the checkpoint's); one saved under other values of the
    :data:`TRAJECTORY_KEYS` than the resumed run's (Ultralytics' resume lets them change: the saved shuffling and step
    cadence are of the old ones); or of other training images (:func:`training_images`: fewer images would make the
    mosaic buffer's indices fail, the same number of others would train on other data)."""
    if not saves_state(trainer):
        return "DDP"
    epoch = ckpt.get("epoch", -1) + 1
    if state is None or (state["epoch"], state["updates"]) != (ckpt.get("epoch"), ckpt.get("updates")):
        return f"no {STATE_NAME} of epoch {epoch}"
    ema = ckpt["ema"].state_dict() if ckpt.get("ema") is not None else {}
    if set(state["ema"]) != set(ema):
        return f"{STATE_NAME} is not this checkpoint's: its EMA has other tensors"
    for k, v in state["ema"].items():
        if not torch.equal(v.half() if v.is_floating_point() else v, ema[k].cpu()):
            return f"{STATE_NAME} is not this checkpoint's: its EMA differs at {k}"
    saved = state.get("args", {})  # none in a state saved before these keys were (the arms of issue 33)
    changed = [f"{k}={getattr(trainer.args, k, None)} (was {v})" for k, v in saved.items() if getattr(trainer.args, k, None) != v]
    if changed:
        return f"{', '.join(changed)} at the resume"
    data, now = state.get("data"), training_images(trainer.train_loader.dataset)  # none in a state saved before issue 44
    if data is not None and data != now:
        count = f"{now['images']} training images, were {data['images']}" if now["images"] != data["images"] else "another list of them"
        return f"the training images changed since {STATE_NAME} was saved ({count})"
    return ""


# what restore() reads of a state, each key's type: a file missing one, or of another type, is not a state of this format
STATE_KEYS = {"epoch": int, "updates": int, "model": dict, "ema": dict, "optimizer": dict, "last_step": int, "random": dict}


def load_state(path: Path) -> tuple[dict | None, str]:
    """``(state, "")`` of the ``resume_state.pt`` at ``path``; ``(None, why)`` where there is none (``why`` empty:
    :func:`mismatch` says so) or it cannot be used: a folder, a file ``torch.load(weights_only=True)`` cannot read (a
    truncated file, a pickle of other objects: refused, never run), or not a dict of :data:`STATE_KEYS`."""
    if path.is_dir():
        return None, f"{STATE_NAME} is a folder"
    if not path.is_file():
        return None, ""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # whatever a damaged file raises (RuntimeError, EOFError, UnpicklingError, ...): never run, never fatal
        reason = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        return None, f"{STATE_NAME} is not readable: {reason.split('. ')[0][:200]}"
    if not (isinstance(state, dict) and all(isinstance(state.get(k), t) for k, t in STATE_KEYS.items())):
        return None, f"{STATE_NAME} is not an exact resume state"
    return state, ""


def training_images(dataset) -> dict | None:
    """What a state depends on of the training set: ``{"images": count, "hash": Ultralytics' get_hash of the image and
    label paths and their total size}`` (the label cache's check, ``ultralytics/data/utils.py``): the mosaic buffer
    holds image indices, the shuffling draws them. None for a dataset without ``im_files`` (classify's)."""
    from ultralytics.data.utils import get_hash

    files = list(getattr(dataset, "im_files", None) or [])
    if not files:
        return None
    return {"images": len(files), "hash": get_hash(files + list(getattr(dataset, "label_files", None) or []))}


def on_train_epoch_start(trainer) -> None:
    """Count the epoch's batches from here (:func:`on_train_batch_start`) and follow the train loader's shuffling
    (:func:`_track_loader`); at the first resumed epoch put back the gradients, random states, shuffling and step
    cadence that :func:`restore` kept."""
    state = trainer.ckpt_state
    state.batch_index = -1
    _track_loader(trainer)
    resumed, state.resumed = state.resumed, None
    if resumed is None:
        return
    if resumed["grads"] is not None:  # after _do_train's zero_grad
        for p, g in zip(trainer.model.parameters(), resumed["grads"]):
            p.grad = None if g is None else g.to(p.device)
    set_random_states(resumed["random"])
    if resumed["loader"] is not None and _tracks(trainer.train_loader):
        _restore_loader(trainer, resumed["loader"])
    state.last_step = state.pending_step = resumed["last_step"]


def _tracks(loader) -> bool:
    """Whether the shuffling of ``loader`` can be followed and replayed: drawn in this process (``workers=0``) from
    the loader's own generator (Ultralytics' ``build_dataloader`` gives it one)."""
    return loader.num_workers == 0 and loader.generator is not None


def _track_loader(trainer) -> None:
    """Wrap the train loader's ``_get_iterator`` (once per loader) to note, whenever it makes an iterator, the
    generator's state the iterator's index chain (sampler inside batch sampler inside Ultralytics' ``_RepeatSampler``)
    starts from; :func:`on_train_batch_start` counts the batches drawn from it since. A resumed run's first iterator
    instead replays the uninterrupted run's chain (:func:`_restore_loader`): from that state, its batches' indices
    drawn without loading them (the chain's own draws, such as the empty permutation ``RandomSampler`` draws when an
    epoch ends, happen as they did)."""
    loader, state = trainer.train_loader, trainer.ckpt_state
    if not _tracks(loader) or "_get_iterator" in vars(loader):
        return
    make = loader._get_iterator

    def tracked():
        iterator = make()
        replay, state.replay = state.replay, None
        if replay is None:
            state.chain_start, state.chain_batches = loader.generator.get_state(), 0
            return iterator
        state.chain_start, state.chain_batches = replay
        loader.generator.set_state(state.chain_start)
        for _ in range(state.chain_batches):
            iterator._next_index()  # torch's single-process iterator: the next batch's indices, nothing loaded
        return iterator

    loader._get_iterator = tracked


def _restore_loader(trainer, saved: dict) -> None:
    """Make the resumed loader shuffle as the uninterrupted run's did. Where mosaic closed at this epoch, that run
    reset its loader (``train_loader.reset()``: a new iterator and index chain from the generator's state): so does
    the resumed run, from the saved state. Otherwise that run drew on from its chain, and the resumed loader's first
    iterator (stock makes it at the first batch, or at the reset it does when the run resumes past the closing)
    replays it (:func:`_track_loader`)."""
    loader, close = trainer.train_loader, trainer.args.close_mosaic
    if close and trainer.epoch == trainer.epochs - close:
        loader.generator.set_state(saved["state"])
        return
    trainer.ckpt_state.replay = (saved["chain_start"], saved["chain_batches"])
    if loader.iterator is not None:  # made already: make it again, replaying
        loader.reset()


def on_train_start(trainer) -> None:
    """Note ``_do_train``'s ``nb``: the train loader's length as its loop begins (:func:`step_index`)."""
    trainer.ckpt_state.batches = len(trainer.train_loader)


def on_train_batch_start(trainer) -> None:
    """Count the batch: its index in the run is ``batch_index + nb * epoch`` (``_do_train``'s ``ni``)."""
    state = trainer.ckpt_state
    state.batch_index += 1
    state.chain_batches += 1


def step_index(trainer) -> int:
    """``_do_train``'s ``ni`` of the current batch: counted with the loader length its loop began with (``nb``,
    :func:`on_train_start`), which a loader put in place later by a callback (:mod:`yolo_ckpt.bench.hybrid`) does
    not change; the current loader's length before the loop began."""
    state = trainer.ckpt_state
    return state.batch_index + (state.batches if state.batches is not None else len(trainer.train_loader)) * trainer.epoch


def on_optimizer_step(trainer) -> None:
    """Remember the batch of the optimizer step just taken (the saved cadence), and end the resumed cadence's hold."""
    state = trainer.ckpt_state
    state.last_step, state.pending_step = step_index(trainer), None


def accumulate(trainer, nominal: int) -> float:
    """What ``_do_train``'s ``if ni - last_opt_step >= self.accumulate`` should read: ``nominal`` (the value
    Ultralytics set), except in a resumed run before its first optimizer step, where stock's ``last_opt_step`` is -1
    and the uninterrupted run's was the saved step: there 0 where that run stepped at this batch, else infinity."""
    pending = trainer.ckpt_state.pending_step
    if pending is None:
        return nominal
    return 0 if step_index(trainer) - pending >= nominal else math.inf


class ExactResume:
    """The trainer's hooks of exact resume (a base of :class:`~yolo_ckpt.train.trainer.CheckpointTrainerMixin`)."""

    def save_model(self):
        """Ultralytics' ``save_model``, then the exact resume state beside ``last.pt`` (:func:`save_state`), as one
        pair: a Ctrl-C or SIGTERM meanwhile stops the run after both (``ckpt_state.saving``), never between them."""
        self.ckpt_state.saving = True
        try:
            saved = super().save_model()
            save_state(self)
        finally:
            self.ckpt_state.saving = False
        return saved

    def final_eval(self):
        """The run is over, nothing is left to resume: its state removed (:func:`remove_state`), then Ultralytics'
        final validation."""
        remove_state(self.wdir)
        super().final_eval()

    def resume_training(self, ckpt):
        """Ultralytics' resume from ``last.pt``, then made exact from ``resume_state.pt`` (:func:`restore`)."""
        super().resume_training(ckpt)
        if ckpt is not None and self.resume:
            restore(self, ckpt)

    @property
    def accumulate(self):
        """Batches per optimizer step, as Ultralytics sets it, held in a resumed run until the step the uninterrupted
        run took (:func:`accumulate`). Kept where stock keeps it, in the trainer's ``__dict__``."""
        return accumulate(self, self.__dict__["accumulate"])

    @accumulate.setter
    def accumulate(self, value):
        self.__dict__["accumulate"] = value

    def optimizer_step(self):
        """Ultralytics' optimizer step, its batch remembered (:func:`on_optimizer_step`)."""
        super().optimizer_step()
        on_optimizer_step(self)


# added by the trainer (run_stats.add_callbacks)
CALLBACKS = {"on_train_start": on_train_start, "on_train_epoch_start": on_train_epoch_start, "on_train_batch_start": on_train_batch_start}

