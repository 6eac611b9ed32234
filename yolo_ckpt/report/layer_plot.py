"""The per-layer picture of one training step (matplotlib): the memory each layer saves for backward, kept or
recomputed, and where the step's peak is: per phase (forward, loss, backward, optimizer step) above what is alive all
step long (parameters, buffers, optimizer state, the batch), the loss's own share, the head's layer marked.

Drawn from :class:`yolo_ckpt.memory.step.StepProfile` s: by ``yolo-ckpt profile ... plot=True`` from the estimates of
``recompute=none`` and of the named policy, at the end of a run from its set-up estimate of the same two (both
side by side, in MiB), and, where the run skipped its estimate, from its CPU memory probe alone (the figures of its
``ckpt_report.json``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PHASES = ("forward", "loss", "backward", "optimizer")


def is_recomputed(policy, index: int, layers: int) -> bool:
    """Whether ``policy`` recomputes layer ``index`` of a model of ``layers`` layers: one of its layer indices, or
    the final head when it recomputes the head's branches (``policy.head``)."""
    return index in policy.indices or (policy.head and index == layers - 1)


@dataclass
class LayerPlot:
    """The data behind the picture, in bytes.

    Attributes:
        layers: one row per layer of ``model.model``: ``index``, ``type``, ``saved_bytes`` (saved for backward in
            the profiled step), ``recomputed`` (by the policy), ``head`` (the final head's layer).
        static_bytes: alive all step long: parameters, buffers, optimizer state and the batch.
        phase_peak_bytes: the peak inside each of :data:`PHASES`; peak_bytes: the step's peak; peak_phase: its phase.
        loss_bytes: the loss's own share of its phase's peak. title: what was profiled.
        phases_of: whose phases the right panel draws (``recompute=all``).
        none_phase_peak_bytes: ``recompute=none``'s peak inside each phase, drawn beside the policy's; None where
            only the policy's step is known (a run without its set-up estimate).
    """

    layers: list[dict]
    static_bytes: int
    phase_peak_bytes: dict
    peak_bytes: int
    peak_phase: str
    loss_bytes: int
    title: str
    phases_of: str
    none_phase_peak_bytes: dict | None = None


def layer_plot(profile, policy, title: str, phases=None) -> LayerPlot:
    """The :class:`LayerPlot` of a step ``profile`` (its layers as they are), each layer marked as ``policy`` (a
    :class:`~yolo_ckpt.checkpointing.policy.RecomputePolicy`) recomputes it; the peaks, static and loss bytes are those of the
    step under ``policy``: ``phases`` (the policy's estimate, with ``profile`` the ``recompute=none`` estimate of the
    same step, whose phases are drawn beside), else ``profile``'s own (a run's probe, which trained with ``policy``)."""
    n = len(profile.layers)
    rows = [
        {
            "index": r.index,
            "type": r.type,
            "saved_bytes": r.saved_bytes,
            "recomputed": is_recomputed(policy, r.index, n),
            "head": r.index == n - 1,
        }
        for r in profile.layers
    ]
    step = phases or profile
    peaks = {p: step.phase_peak_bytes[p] for p in PHASES}
    none = {p: profile.phase_peak_bytes[p] for p in PHASES} if phases else None
    return LayerPlot(
        rows, step.static_bytes, peaks, step.peak_bytes, max(peaks, key=peaks.get), step.loss_bytes, title, f"recompute={policy.spec}", none
    )


def write_layer_plot(data: LayerPlot, path) -> Path:
    """Draw ``data`` into the PNG ``path`` (MiB): bars of saved memory per layer, kept or recomputed, the head's
    hatched; beside them the peak of each phase above the static bytes, the step's peak marked, the loss's share, and
    ``recompute=none``'s peak of each phase beside the policy's where ``data`` has it."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    mib = 2**20
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    for row in data.layers:
        ax.bar(
            row["index"],
            row["saved_bytes"] / mib,
            color="tab:orange" if row["recomputed"] else "tab:blue",
            hatch="//" if row["head"] else None,
            edgecolor="black",
            linewidth=0.3,
        )
    ax.set_xticks([r["index"] for r in data.layers], [f"{r['index']} {r['type']}" for r in data.layers], rotation=90, fontsize=6)
    ax.set(ylabel="saved for backward (MiB)")
    ax.set_title(data.title, fontsize=9)
    ax.legend(handles=[Patch(color="tab:blue", label="kept"), Patch(color="tab:orange", label="recomputed"),
                       Patch(facecolor="white", hatch="//", edgecolor="black", label="the head's layer")], fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    static = data.static_bytes / mib
    side = data.none_phase_peak_bytes is not None  # none's bar beside the policy's in each phase, the same MiB axis
    width, shift = (0.4, 0.2) if side else (0.8, 0.0)
    for i, (phase, peak) in enumerate(data.phase_peak_bytes.items()):
        bx.bar(i - shift, static, width, color="tab:gray")
        bx.bar(i - shift, peak / mib - static, width, bottom=static, color="tab:red" if phase == data.peak_phase else "tab:green")
        if side:
            bx.bar(i + shift, static, width, color="tab:gray")
            bx.bar(i + shift, data.none_phase_peak_bytes[phase] / mib - static, width, bottom=static, color="white", hatch="..",
                   edgecolor="tab:green")
    bx.set_xticks(range(len(data.phase_peak_bytes)), list(data.phase_peak_bytes), fontsize=7)
    bx.set(ylabel="peak inside the phase (MiB)", xlabel=f"the loss's own share: {data.loss_bytes / mib:.1f} MiB")
    bx.set_title(f"where the peak is, {data.phases_of}" + ("\n(solid) and recompute=none (dotted)" if side else ""), fontsize=9)
    handles = [
        Patch(color="tab:gray", label="parameters, buffers,\noptimizer state, batch"),
        Patch(color="tab:green", label="the rest of the phase"),
        Patch(color="tab:red", label=f"the step's peak:\n{data.peak_bytes / mib:.1f} MiB"),
    ]
    if side:
        none_peak = max(data.none_phase_peak_bytes.values()) / mib
        handles.append(Patch(facecolor="white", hatch="..", edgecolor="tab:green", label=f"recompute=none:\n{none_peak:.1f} MiB peak"))
    bx.legend(handles=handles, fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=1)
    bx.grid(axis="y", alpha=0.3)
    path = Path(path)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
