"""``yolo-ckpt plan``: for each policy, the estimated peak of the run the keys describe against ``memory_budget=``,
and the largest imgsz and batch that fit; ``recompute=auto`` and ``batch=-1`` decided as train decides them."""

from __future__ import annotations

import sys

from ..config import CkptConfig
from ..errors import ConfigError
from .args import TASKS, check_words, train_keys
from .console import diagnostics_to_stderr
from .run_setup import estimate_keys, estimate_setup, trained_at


def _plan_budget(config: CkptConfig) -> int:
    """``memory_budget=`` in bytes, which plan needs; checked before the model is built.

    Raises:
        ConfigError: without one, or for a fraction (it needs the CUDA memory of the run's own process).
    """
    if config.memory_budget is None:
        raise ConfigError("plan needs memory_budget= (bytes with a unit, e.g. memory_budget=16GB)")
    return config.memory_budget.bytes(None)


def plan_setup(args: list[str]):
    """The :class:`~yolo_ckpt.memory.memory_model.MemoryModel` ``yolo-ckpt plan`` plans with, for its arguments: the run
    :func:`~yolo_ckpt.cli.run_setup.estimate_setup` makes of them (its headroom on the assumed device, ``loss_chunk=``),
    and the batch train would run with them, by train's function (:func:`yolo_ckpt.memory.planning.decide`).

    Returns:
        ``(memory, budget, opts, spec)``: the memory model, ``memory_budget=`` in bytes, the keys with defaults and
        the :class:`~yolo_ckpt.memory.runspec.RunSpec`; ``opts["images"]`` is the training set's images (None without
        ``data=``), the cap of the largest batch; ``opts["recompute"]`` is ``recompute=`` as train takes it, with the
        task's default (``backbone,loss`` for detect).

    With ``batch=-1``, ``opts["batch"]`` becomes the batch train would pick for ``memory_budget=`` off CUDA, by the same
    function (with the run's policy, ``all`` for ``recompute=auto``, capped by the training set's images); on CUDA train
    measures with AutoBatch instead (and keeps the smaller of the two for segment models), which needs the GPU itself.

    Raises:
        ConfigError: as :func:`~yolo_ckpt.cli.run_setup.estimate_setup` raises (without ``memory_budget=``, for a fraction); PlanError:
            where train refuses: with ``batch=-1`` where not even batch 1 fits.
    """
    from ..memory import decide

    run, opts = estimate_setup(args, "plan", early=_plan_budget)
    budget = _plan_budget(run.config)
    print("yolo-ckpt plan: estimating the model (calibrating its loss formula, one fake pass)", file=sys.stderr)
    memory = run.memory_model()
    opts["recompute"] = run.config.recompute
    opts["images"] = images = run.counts.images if run.counts else None  # the cap of the largest batch, as train's
    if opts["autobatch"]:
        decision = decide(opts["recompute"], -1, memory, budget, opts["imgsz"], images)  # train's, for batch=-1
        opts["batch"] = decision.batch
        cap = f", at most the {images} training images" if images else ""
        how = "; train on CUDA measures its own with AutoBatch" if run.spec.device == "cuda" else ", train's pick"
        print(
            f"yolo-ckpt plan: batch=-1 -> batch={opts['batch']} for recompute={decision.recompute}: the estimate's largest batch that "
            f"fits{cap}{how}",
            file=sys.stderr,
        )
    return memory, budget, opts, run.spec


def plan(args: list[str]) -> list[dict]:
    """``yolo-ckpt plan``: for none, backbone, head, loss (where the head has the loss region), all (layers, head
    branches and loss), auto (as train decides it: its plan at the batch, ``all`` with ``batch=-1``) and the policy train
    runs with these keys (``recompute=``, the task's default: a row of its own where no other is it; the ``train`` column
    marks it), the estimated peak at ``imgsz=`` (the largest size it trains at) and ``batch=``, the headroom kept on top
    of it (CUDA, against a budget in bytes) and the margin left in ``memory_budget=``, the largest imgsz (at ``batch``)
    and batch (at ``imgsz``) that fit, and each policy's recompute cost; for the run the keys describe (see
    :func:`~yolo_ckpt.cli.run_setup.estimate_setup`). Every figure is a fake pass's (the largest imgsz and batch: searched
    by fake passes, ``MemoryModel.largest_imgsz``). For a model with attention layers one line (and the JSON's
    ``attention``) names the attention region's chunking at ``imgsz`` (in ``all``, and ``auto`` may take it; as
    ``profile``'s: :func:`~yolo_ckpt.report.record.attention_text`). The result on stdout, progress and logs on stderr.

    Returns:
        The rows, one per policy, each with the same keys (``format=json`` prints them under ``policies``): ``recompute``,
        ``train`` (the policy train runs), ``estimated_peak_MiB``, ``headroom_MiB``, ``margin_MiB``, ``fits``,
        ``max_imgsz`` (the largest imgsz at the batch planned, the JSON's ``batch``), ``max_batch`` (the largest batch
        at the imgsz planned, its ``imgsz``, at most the training set's images as ``batch=-1``'s),
        ``recompute_GFLOPs``, ``recompute_pct_of_step`` (%). The text table names ``max_imgsz`` and ``max_batch`` with
        their size (``max_imgsz_at_batch_8``).

    Raises:
        PlanError: where train refuses the same keys (:func:`plan_setup`), and where even ``all`` does not fit at
            ``imgsz`` and ``batch``: one line with ``all``'s need and the largest imgsz and batch it fits
            (:meth:`~yolo_ckpt.memory.memory_model.MemoryModel.nothing_fits`).

    Examples:
        >>> rows = plan(["model=yolo11n-seg.yaml", "imgsz=1536", "batch=2", "objects=800", "memory_budget=8GB", "format=json"])
        >>> [row["recompute"] for row in rows]  # none, backbone, head, loss, all, auto's choice; the train column marks train's
    """
    check_words(args, train_keys(estimate_keys("plan")), TASKS)  # argument errors before torch is imported
    import json

    import pandas as pd

    from ..checkpointing.policy import is_auto

    with diagnostics_to_stderr():  # before Ultralytics is imported: its first import on a machine prints a banner
        from ultralytics.utils import TQDM

        from ..memory import IMGSZ_LIMIT, attention_tokens, decide, grid_size, size_text
        from ..report.record import attention_text

        memory, budget, opts, spec = plan_setup(args)
        imgsz, batch, headroom = opts["imgsz"], opts["batch"], memory.headroom
        print(f"yolo-ckpt plan: planning recompute=auto at batch={batch}", file=sys.stderr)
        # train's auto: all under batch=-1, else the plan at the batch (PlanError, exit 2, where even all does not fit)
        auto = decide("auto", -1) if opts["autobatch"] else decide("auto", batch, memory, budget, imgsz, opts["images"])
        names = ["none", "backbone", "head", *(["loss"] if "loss" in memory.candidates else []), "all", "auto"]
        trains = "auto" if is_auto(opts["recompute"]) else opts["recompute"]
        names += [trains] * (trains not in names)  # a row of its own (backbone,loss), where no other row is it
        rows = []
        grid = grid_size(memory.composed.strides)
        # the search's top, never below the size asked: an answer there means that size or more
        top = max(IMGSZ_LIMIT, imgsz) // grid * grid
        for name in TQDM(names, desc="yolo-ckpt plan: checking each policy's peak, largest imgsz and batch"):
            units = memory.units(auto.recompute if name == "auto" else name)
            # each row's peak from its fake pass, the check that decides (the composition is close, not exact)
            cost = auto.plan if name == "auto" and auto.plan else memory.as_plan(
                units, memory.estimate(memory.spec(units), batch, imgsz).peak_bytes, budget, batch, imgsz
            )
            rows.append({
                "recompute": name if name != "auto" else f"auto ({auto.recompute})",  # the plan's units, or all
                "train": name == trains,
                "estimated_peak_MiB": cost.estimated_peak_bytes / 2**20,
                "headroom_MiB": cost.headroom_bytes / 2**20,
                "margin_MiB": cost.margin_bytes / 2**20,
                "fits": cost.fits,
                "max_imgsz": memory.largest_imgsz(units, budget, batch, limit=top),  # at the batch planned (the result's batch)
                "max_batch": memory.largest_batch(units, budget, imgsz, opts["images"]),  # at the result's imgsz
                "recompute_GFLOPs": cost.recompute_flops / 1e9,
                "recompute_pct_of_step": 100 * cost.recompute_cost,
            })
        # the attention region's chunking at this size (None for a model without attention layers)
        attention = attention_tokens(memory.model, imgsz, memory.attn_chunk, memory.attention) if memory.attention else None
    result = {
        "model": opts["model"],
        "memory_budget_bytes": budget,
        "memory_headroom": str(headroom),
        "imgsz": imgsz,
        "imgsz_given": opts["imgsz_given"],
        "batch": batch,
        "recompute": opts["recompute"],
        "recompute_mode": memory.composed.mode,
        "max_imgsz_limit": top,
        "assumed": spec.to_dict(),
        "policies": rows,
        "attention": attention,
    }
    if opts["format"] == "json":
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{opts['model']} at imgsz={imgsz}{trained_at(opts)} batch={batch}, memory_budget={size_text(budget)}, "
            f"memory_headroom={headroom}"
            # selective keeps the convolutions' outputs: each peak is its own pass's, the FLOPs full recomputation's
            + ", recompute_mode=selective (recompute_GFLOPs: full recomputation's, an upper bound)" * (memory.composed.mode == "selective")
        )
        print(spec.describe())
        table = pd.DataFrame(rows).assign(train=lambda t: t["train"].map({True: "yes", False: ""}))
        table["max_imgsz"] = [f"{v}+" if v == top else v for v in table["max_imgsz"]]  # the search's top: that or more
        table = table.rename(columns={"max_imgsz": f"max_imgsz_at_batch_{batch}", "max_batch": f"max_batch_at_imgsz_{imgsz}"})
        print(table.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
        if attention:
            print(attention_text(attention) + " (in all; auto may take it)")
        trains_row = next(r for r in rows if r["train"])
        if not trains_row["fits"]:  # the run these keys start would not fit: say so, not only in the fits column
            fitting = [r["recompute"] for r in rows if r["fits"]]
            print(
                f"train's recompute={trains} does not fit memory_budget={size_text(budget)} at batch={batch} imgsz={imgsz}"
                + (f"; these rows do: {', '.join(fitting)} (give recompute=auto, or recompute= one of them)" if fitting else "")
            )
        if spec.device == "cuda":
            print(
                f"headroom: memory_headroom={headroom} on top of each estimate, for what a CUDA process holds beside its live tensors "
                "(the CUDA context, the allocator's reserve, cuDNN/cuBLAS workspaces); the CUDA and AMP figures are estimates "
                "until a run on a GPU measures them (train's report: the allocator's peak)"
            )
    return rows
