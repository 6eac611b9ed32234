"""``yolo-ckpt bench``: a benchmark matrix run (:func:`yolo_ckpt.bench.matrix.run_matrix`), bench's own keys from
``cfg/bench.yaml``, the others the matrix's settings."""

from __future__ import annotations

from ..bench.cells import SETTINGS
from ..config import BENCH_DEFAULTS, DEFAULTS, check_bool
from .args import parse_keys, ultralytics_keys

SETTINGS_TEXT = (
    f"bench takes {', '.join(BENCH_DEFAULTS)}, and the matrix's settings: any 'yolo train' key ('yolo cfg'), "
    f"yolo-ckpt's ('yolo-ckpt help'), a step matrix's {', '.join(SETTINGS['step'])}, a train matrix's {', '.join(SETTINGS['train'])}"
)


def bench_keys() -> set[str]:
    """Every key ``bench`` takes: its own (``cfg/bench.yaml``) and any matrix's settings."""
    return {*BENCH_DEFAULTS, *ultralytics_keys(), *DEFAULTS, *SETTINGS["step"], *SETTINGS["train"]}


def bench(args: list[str]):
    """``yolo-ckpt bench matrix=NAME|FILE [out=DIR] [datasets=DIR] [rerun=True] [dry=True] [cells=N,...] [setting=value
    ...]``: run a benchmark matrix, shipped or a file (see :mod:`yolo_ckpt.bench.matrix`); bench's own keys are those
    of ``cfg/bench.yaml``, other ``key=value`` pairs replace the matrix's settings (``epochs=10``). Cells already in
    ``out``'s results.csv with the same settings are skipped (``rerun=True``: measured again); ``datasets=`` is searched
    first for the matrix's datasets; ``cells=`` runs only the cells of these numbers; ``dry=True`` checks the matrix and
    says what would run, writing nothing.

    Returns:
        :func:`~yolo_ckpt.bench.matrix.run_matrix`'s result.

    Examples:
        >>> bench(["matrix=cpu-step", "out=runs/bench/cpu-step"])
        >>> bench(["matrix=equal-memory-bccd", "datasets=/data/sets", "cells=1", "dry=True"])  # what would run

    Raises:
        SyntaxError: for a bare word, without ``matrix=``, or for a key that is neither bench's nor a setting of any
            matrix (before torch is imported). ConfigError: as :func:`yolo_ckpt.bench.matrix.run_matrix` raises (a
            setting the matrix's kind does not take, ...), and for a ``rerun=`` or ``dry=`` that is not a bool.
    """
    if not args or any("=" not in a for a in args):
        raise SyntaxError(
            f"bench takes matrix=NAME or matrix=FILE, optionally out=DIR and settings as key=value; got {' '.join(args) or 'nothing'}"
        )
    options = parse_keys(args, bench_keys(), "bench", SETTINGS_TEXT, required=("matrix",))
    from ..bench.matrix import run_matrix

    own = {k: options.pop(k, default) for k, default in BENCH_DEFAULTS.items()}  # the rest are the matrix's settings
    switches = {k: check_bool(k, own[k]) for k in ("rerun", "dry")}
    return run_matrix(
        str(own["matrix"]), own["out"], command=" ".join(["yolo-ckpt bench", *args]), overrides=options, datasets=own["datasets"],
        cells=own["cells"], **switches,
    )
