"""``yolo-ckpt profile``: the estimated training step of the run the keys describe, layer by layer, for ``none``
against ``recompute=``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .args import TASKS, check_words, train_keys
from .console import diagnostics_to_stderr
from .run_setup import estimate_keys, estimate_setup, trained_at

if TYPE_CHECKING:  # annotations only: pandas is imported where a table is built
    import pandas


def profile_table(profile, policy) -> pandas.DataFrame:
    """Per-layer rows of a ``recompute=none`` :class:`~yolo_ckpt.memory.step.StepProfile` (MiB, GFLOPs), the layers of
    ``policy`` marked (the final head's row when ``policy.head``: its branches), and a total row: the saved-for-backward
    column adds up to the total."""
    import pandas as pd

    from ..report.layer_plot import is_recomputed

    rows = [
        {
            "layer": r.index,
            "type": r.type,
            "output_MiB": r.output_bytes / 2**20,
            "saved_MiB": r.saved_bytes / 2**20,
            "freed_if_recomputed_MiB": r.freeable_bytes / 2**20,
            "forward_GFLOPs": r.forward_flops / 1e9,
            "recompute": policy.mode if is_recomputed(policy, r.index, len(profile.layers)) else "",
        }
        for r in profile.layers
    ]
    table = pd.DataFrame(rows)
    total = table.drop(columns=["layer", "type", "recompute"]).sum()
    return pd.concat([table, pd.DataFrame([{"layer": "total", "type": "", **total, "recompute": ""}])], ignore_index=True)


def profile(args: list[str]) -> dict:
    """``yolo-ckpt profile``: estimate one training step for none and for ``recompute=`` (default: backbone), for the
    run the keys describe (see :func:`yolo_ckpt.cli.run_setup.estimate_setup`); the result on stdout, progress and logs on stderr. With
    ``plot=True`` the per-layer picture of the ``none`` estimate, ``recompute=``'s layers marked, beside the phases of
    the ``recompute=`` estimate (:mod:`yolo_ckpt.report.layer_plot`), goes to ``layers.png`` in a new folder named as
    ``yolo`` names runs (``project=``,
    ``name=``; default ``<runs_dir>/profile/profile<N>``); its path is the result's ``plot``. Where ``recompute=`` runs
    the attention region, one line (and the result's ``attention``) names its ``attn_chunk`` and each attention
    module's layer and tokens N at ``imgsz``, chunked or stock (:func:`yolo_ckpt.memory.attention_shapes.attention_tokens`).

    Examples:
        >>> profile(["model=yolo11n.yaml", "imgsz=1024", "batch=2", "recompute=all", "plot=True"])["plot"]
    """
    check_words(args, train_keys(estimate_keys("profile")), TASKS)  # argument errors before torch is imported
    import json

    from ..report.record import attention_text

    with diagnostics_to_stderr():  # before Ultralytics is imported: its first import on a machine prints a banner
        from ultralytics.utils import TQDM

        from ..checkpointing.policy import ModelLayout, resolve
        from ..memory import attention_tokens, estimate_step, loss_models

        run, opts = estimate_setup(args, "profile")
        model, config, spec = run.model, run.config, run.spec
        recompute, mode = config.recompute, config.recompute_mode
        policy = resolve(recompute, ModelLayout.from_model(model), mode=mode)
        steps = TQDM(total=3, desc="yolo-ckpt profile: calibrating the loss, estimating none, estimating the policy")
        formulas = loss_models(model, spec.amp, config.loss_chunk, config.assign_chunk)  # the stock loss's, the region's
        steps.update()
        results = {}
        for name, spec_name, loss in (("none", "none", False), ("policy", recompute, policy.loss)):
            results[name] = estimate_step(
                model, opts["imgsz"], opts["batch"], spec.objects, spec_name, mode, spec.optimizer, spec.amp, formulas[loss],
                sizes=run.sizes, attn_chunk=config.attn_chunk,
            )
            steps.update()
        steps.close()
        # the attention region's chunking at this size, where the policy runs it (None elsewhere)
        attention = attention_tokens(model, opts["imgsz"], config.attn_chunk) if policy.attention else None
    table = profile_table(results["none"], policy)
    summary = {
        "model": opts["model"],
        "imgsz": opts["imgsz"],
        "imgsz_given": opts["imgsz_given"],
        "batch": opts["batch"],
        "objects": spec.objects,
        "amp": spec.amp,
        "assumed": spec.to_dict(),
        "recompute": policy.spec,
        "recompute_mode": mode,
        "recomputed_layers": policy.layers(),
        "recomputed_regions": policy.regions(),
        "estimated_peak_bytes": {"none": results["none"].peak_bytes, "policy": results["policy"].peak_bytes},
        "phase_peak_bytes": {k: r.phase_peak_bytes for k, r in results.items()},
        "loss_bytes": results["none"].loss_bytes,
        "attention": attention,
        "static_bytes": results["none"].static_bytes,
        "layers": table.to_dict("records"),
    }
    if opts["plot"]:
        from types import SimpleNamespace

        from ultralytics.cfg import get_save_dir

        from ..report.layer_plot import layer_plot, write_layer_plot

        title = (
            f"{Path(str(opts['model'])).stem} at imgsz={opts['imgsz']} batch={opts['batch']}, "
            f"recompute=none's layers (estimate); orange: recompute={policy.spec}"
        )
        # the folder as 'yolo' names a run's: project=, name= (default profile, profile2, ...), exist_ok=
        folder = get_save_dir(
            SimpleNamespace(project=opts["project"], name=opts["name"], exist_ok=opts["exist_ok"], task="profile", mode="profile")
        )
        folder.mkdir(parents=True, exist_ok=True)
        summary["plot"] = str(write_layer_plot(layer_plot(results["none"], policy, title, phases=results["policy"]), folder / "layers.png"))
        print(f"per-layer picture written to {summary['plot']}", file=sys.stderr)
    if opts["format"] == "json":
        print(json.dumps(summary, indent=2))
    else:
        print(f"{opts['model']} at imgsz={opts['imgsz']}{trained_at(opts)} batch={opts['batch']}; {spec.describe()}")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        none, pol = results["none"], results["policy"]
        print(f"\nparameters, buffers, optimizer state and the batch: {none.static_bytes / 2**20:.1f} MiB")
        print(f"loss/assigner ({spec.objects} objects per image): {none.loss_bytes / 2**20:.1f} MiB at its peak")
        if attention:
            print(attention_text(attention))
        print(f"estimated peak, recompute=none: {none.peak_bytes / 2**20:.1f} MiB")
        print(f"estimated peak, {policy}: {pol.peak_bytes / 2**20:.1f} MiB ({pol.peak_bytes / none.peak_bytes:.2f}x)")
    return summary
