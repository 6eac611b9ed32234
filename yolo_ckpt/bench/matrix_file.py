"""A benchmark matrix file: its format, read and checked whole (:func:`load_matrix`, :class:`Matrix`) before any cell
runs or any file is written, and the cells a run picks of it (:func:`select_cells`). :mod:`.matrix` runs it.

A matrix is named by a shipped name (``cpu-step``: ``yolo_ckpt/cfg/bench/cpu-step.yaml`` in the repository, installed as
package data of yolo-ckpt) or a path to a matrix file (a path that exists wins).

A matrix file (YAML) has:

- ``kind``: ``step`` (one measured training step per cell, :mod:`.step_cell`) or ``train`` (a training run per
  cell through the Checkpoint*Trainers, :mod:`.train_cell`).
- ``grid``: a list of blocks; each maps cell keys (:data:`.cells.CELL_KEYS`) to a value or a list of values, and
  the cells are the union of the blocks' products, at most :data:`MAX_CELLS`. ``settings``: what every cell shares
  (:data:`.cells.SETTINGS`, and for
  ``train`` any ``yolo train`` argument, epochs, fraction, seed, ..., and yolo-ckpt's train keys that are not cell
  keys, checked as train checks them: ``estimate=False`` skips each run's set-up estimate).
- ``baseline_keys`` (optional): the keys whose values a cell shares with its baseline, the ``recompute=none``
  (``recompute_mode=full``) cell of its group; default: every key but ``recompute`` and ``recompute_mode``.
- ``datasets_dir`` (optional, relative to the matrix file): where ``dataset: <name>`` finds
  ``<name>/data.yaml``, unless the bench's ``datasets=DIR`` has it; where neither has it (an installed matrix's
  ``datasets_dir`` points into site-packages), Ultralytics' ``SETTINGS['datasets_dir']`` (:func:`dataset_roots`).
  ``dataset: synthetic`` is the built-in synthetic dataset of the task, ``dataset: small-objects`` /
  ``small-objects-640`` the built-in small-object set at 320 / 640 px (:func:`yolo_ckpt.data.small_objects.small_object_dataset`).
- ``tiles: {size, overlap}`` (train cells, detection or segmentation data): train on tiles of the dataset (:mod:`yolo_ckpt.data.tiles`,
  cut from its images resized to the cell's ``imgsz``) at ``imgsz = size`` (``fit``: the largest that fits
  ``memory_budget`` with the cell's policy), then validate on the full val images at the cell's ``imgsz``.
- ``hybrid: true`` (a ``tiles`` cell with a ``memory_budget``): the tiles train all but the last ``close_mosaic`` epochs,
  the full images at the cell's ``imgsz`` with its ``recompute`` those, in one run (one optimizer, schedule and EMA),
  validated on the full images throughout (:mod:`.hybrid`); ``size: fit`` is the tiles arm's (the largest that fits with
  ``recompute=none``), and each phase is planned to fit the budget before the cell writes anything.

The matrix is checked whole (keys, values, models, recompute values, datasets) before any cell runs or any file is
written.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from ultralytics.cfg import check_dict_alignment
from ultralytics.utils import DEFAULT_CFG_DICT, SETTINGS as ULTRALYTICS_SETTINGS, YAML

from yolo_ckpt.checkpointing.model_file import layout_of
from yolo_ckpt.checkpointing.policy import is_auto, resolve
from yolo_ckpt.config import DEFAULTS, CkptConfig
from yolo_ckpt.data.tiles import TILE_TASKS
from yolo_ckpt.errors import ConfigError, MissingFileError, one_line
from yolo_ckpt.memory import TASKS
from yolo_ckpt.shipped import resolve_yaml

from .cells import BUILT_IN_DATASETS, CELL_KEYS, SETTINGS, RelativeBudget, cell_budget, cell_id, is_none
from .hybrid import check_settings

KINDS = ("step", "train")
# the most cells a grid may have: each cell trains or measures a step (seconds to hours), so a larger grid is a mistake
# in a list (a 200,000-cell grid was checked for minutes, printing nothing); checked before the product is built
MAX_CELLS = 10_000


@dataclass
class Matrix:
    """A checked matrix file. ``cells``: dicts of every :data:`CELL_KEYS` key, in file order."""

    name: str
    kind: str
    path: Path
    settings: dict
    cells: list[dict]
    baseline_keys: list[str]
    datasets_dir: Path | None = None  # the matrix file's own
    description: str = ""
    datasets: Path | None = None  # the bench's datasets= setting
    data: dict = field(default_factory=dict)  # dataset value -> data.yaml path

    def baseline_of(self, cell: dict) -> dict | None:
        """The cell's baseline: the ``recompute=none``, ``recompute_mode=full`` cell sharing its baseline keys; of
        several, the plainest (no tiles, no memory budget, an imgsz given: the unconstrained run the others are
        measured against, as an equal-memory matrix's full-resolution arm), the first of equals."""
        candidates = [o for o in self.cells if is_none(o) and all(o[k] == cell[k] for k in self.baseline_keys)]
        plain = lambda o: (o.get("tiles") is not None, o.get("memory_budget") is not None, o.get("imgsz") == "fit")  # noqa: E731
        return min(candidates, key=plain, default=None)


def _positive_int(value) -> bool:
    """An int >= 1, or its digits ("3" from a YAML string)."""
    return not isinstance(value, bool) and (isinstance(value, int) or (isinstance(value, str) and value.isdigit())) and int(value) >= 1


def load_matrix(path, overrides: dict | None = None, datasets=None) -> Matrix:
    """Read and check a matrix file, before anything runs; ``overrides`` replace some of its ``settings``
    (``yolo-ckpt bench ... epochs=10``). ``path``: a file, or the name of a shipped matrix (``cpu-step``,
    :func:`yolo_ckpt.shipped.resolve_yaml`; a file wins). ``datasets``: the folder searched first for a ``dataset:
    <name>`` (:func:`dataset_roots`).

    Raises:
        FileNotFoundError: for a matrix that is neither a file nor a shipped name (listing the shipped names), a
            missing model YAML or dataset.
        ValueError / SyntaxError: for an unknown kind or key, a bad recompute, recompute_mode, imgsz, batch or
            memory_budget value, a step cell of a non-detection model, or a cell without a baseline; each names the
            bad value and the valid choices. ConfigError: for a file that is not a YAML mapping (a syntax error, a
            ``!!python`` tag, which is refused, never built), or a grid of more than :data:`MAX_CELLS` cells.
    """
    path = resolve_yaml(path, "bench", "matrix")
    try:
        spec = YAML.load(path) or {}
    except (yaml.YAMLError, ValueError) as e:  # a syntax error, or a tag safe_load refuses to build (!!python/object...)
        cause = e if isinstance(e, yaml.YAMLError) else (e.__cause__ or e.__context__ or e)  # Ultralytics wraps it in a ValueError
        mark = getattr(cause, "problem_mark", None)
        what = getattr(cause, "problem", None) or one_line(cause).split(" Verify YAML")[0]  # Ultralytics' own: not a mapping
        raise ConfigError(f"{path}: not a readable matrix YAML: {what}" + (f" (line {mark.line + 1})" if mark else "")) from None
    top = {"name", "kind", "description", "settings", "grid", "baseline_keys", "datasets_dir"}
    if set(spec) - top:
        raise ConfigError(f"{path}: unknown top-level keys {sorted(set(spec) - top)}; valid: {sorted(top)}")
    kind = spec.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{path}: kind={kind!r} is not valid; valid kinds: {', '.join(KINDS)}")
    settings = {**SETTINGS[kind], **(spec.get("settings") or {}), **(overrides or {})}
    if kind == "train":  # any 'yolo train' argument or yolo-ckpt train key, with Ultralytics' suggestions for a misspelt one
        check_dict_alignment({**DEFAULT_CFG_DICT, **DEFAULTS, **SETTINGS[kind]}, settings)
        owned = sorted(set(settings) & (set(CELL_KEYS) | {"data", "project", "name", "trainer"}))
        if owned:
            raise ConfigError(
                f"{path}: settings {owned} are set per cell by the runner; give them as cell keys in grid: (valid: {sorted(CELL_KEYS)})"
            )
        CkptConfig.from_args({k: settings[k] for k in DEFAULTS if k in settings})  # estimate=, loss_chunk=, ... as train checks them
    elif bad := next((k for k in ("pairs", "objects") if not _positive_int(settings[k])), None):
        raise ConfigError(f"{path}: {bad}={settings[bad]!r} is not valid; valid: an int >= 1")
    elif set(settings) - set(SETTINGS[kind]):
        raise ConfigError(
            f"{path}: unknown settings {sorted(set(settings) - set(SETTINGS[kind]))} for kind={kind}; valid: {sorted(SETTINGS[kind])}"
        )
    blocks = spec.get("grid") or []
    if not isinstance(blocks, list) or not blocks:
        raise ConfigError(f"{path}: grid must be a non-empty list of blocks (key: value or list of values)")
    products = []
    for block in blocks:
        if not isinstance(block, dict):
            raise ConfigError(f"{path}: grid block {block!r} is not a mapping of cell keys to values; valid keys: {sorted(CELL_KEYS)}")
        bad = set(block) - set(CELL_KEYS)
        if bad:
            raise ConfigError(f"{path}: unknown cell keys {sorted(bad)}; valid: {sorted(CELL_KEYS)}")
        values = {k: block.get(k, default) for k, default in CELL_KEYS.items()}
        products.append({k: v if isinstance(v, list) else [v] for k, v in values.items()})
    count = sum(math.prod(len(v) for v in values.values()) for values in products)
    if count > MAX_CELLS:
        raise ConfigError(
            f"{path}: the grid has {count} cells (its blocks' products); at most {MAX_CELLS}: split it into matrices, or list fewer values"
        )
    cells, seen = [], set()
    for values in products:
        for combo in itertools.product(*values.values()):
            cell = dict(zip(values, combo))
            if repr(combo) not in seen:  # a cell two blocks share runs once
                seen.add(repr(combo))
                cells.append(cell)
    datasets_dir = (path.parent / spec["datasets_dir"]).resolve() if spec.get("datasets_dir") else None
    baseline_keys = spec.get("baseline_keys") or [k for k in CELL_KEYS if k not in {"recompute", "recompute_mode"}]
    if set(baseline_keys) - set(CELL_KEYS):
        raise ConfigError(
            f"{path}: baseline_keys {sorted(set(baseline_keys) - set(CELL_KEYS))} are not cell keys; valid: {sorted(CELL_KEYS)}"
        )
    if kind == "step" and not {"model", "amp"} <= set(baseline_keys):
        raise ConfigError(
            f"{path}: baseline_keys={baseline_keys}: step cells are measured beside their baseline in one process, so model and "
            "amp must be among them"
        )
    matrix = Matrix(
        spec.get("name") or path.stem,
        kind,
        path,
        settings,
        cells,
        list(baseline_keys),
        datasets_dir,
        spec.get("description", ""),
        Path(datasets) if datasets else None,
    )
    layouts: dict[str, object] = {}  # per model: a checkpoint is unpickled once, whatever its cells
    for cell in cells:
        _check_cell(matrix, cell, layouts)
    return matrix


def _check_cell(matrix: Matrix, cell: dict, layouts: dict) -> None:
    """Check one cell's values against its model and the matrix kind (see :func:`load_matrix`); ``layouts``: the
    models' layouts read so far, by model."""
    where = f"{matrix.path}: cell {cell_id(cell)}"
    if cell["model"] not in layouts:
        layouts[cell["model"]] = layout_of(cell["model"])  # MissingFileError for a missing model
    layout = layouts[cell["model"]]
    task = cell["task"] or _model_task(cell["model"])
    cell["task"] = task
    config = CkptConfig.from_args({k: cell[k] for k in ("recompute", "recompute_mode")})  # as train checks them
    if not is_auto(config.recompute):
        resolve(config.recompute, layout)
    if matrix.kind == "step" and task not in TASKS:
        raise ConfigError(
            f"{where}: step cells measure the tasks {', '.join(TASKS)} (yolo_ckpt.memory.synthetic_batch.training_batch); task={task} "
            "needs kind: train"
        )
    try:
        budget = cell_budget(cell["memory_budget"])  # the form; a fraction's device is checked by run_matrix
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    relative = isinstance(budget, RelativeBudget)
    if relative and matrix.kind != "step":
        raise ConfigError(
            f"{where}: memory_budget={cell['memory_budget']} (relative to recompute=none) is for step cells; give bytes with a "
            "unit, e.g. 2GB"
        )
    if cell["imgsz"] != "fit" and not (isinstance(cell["imgsz"], int) and cell["imgsz"] > 0):
        raise ConfigError(f"{where}: imgsz={cell['imgsz']!r} is not valid; valid: a positive int or 'fit'")
    if cell["amp"] not in {True, False}:
        raise ConfigError(f"{where}: amp={cell['amp']!r} is not valid; valid: true, false")
    if (
        isinstance(cell["imgsz"], bool)
        or isinstance(cell["batch"], bool)
        or not (isinstance(cell["batch"], int) and (cell["batch"] > 0 or cell["batch"] == -1))
    ):
        raise ConfigError(f"{where}: batch={cell['batch']!r} is not valid; valid: a positive int or -1")
    planned = [
        k
        for k, v in (
            ("recompute=auto", is_auto(cell["recompute"])),
            ("batch=-1", cell["batch"] == -1),
            ("imgsz=fit", cell["imgsz"] == "fit"),
        )
        if v
    ]
    if cell["imgsz"] == "fit" and (is_auto(cell["recompute"]) or cell["batch"] == -1):
        raise ConfigError(f"{where}: imgsz=fit needs a named policy and a batch (it is the largest imgsz for them)")
    if relative and (cell["imgsz"] == "fit" or cell["batch"] == -1):
        raise ConfigError(
            f"{where}: memory_budget={cell['memory_budget']} is relative to recompute=none at the cell's imgsz and batch: give both"
        )
    if planned and budget is None:
        raise ConfigError(f"{where}: {' and '.join(planned)} need memory_budget= (bytes with a unit, e.g. 4GB)")
    if planned and task not in TASKS:
        raise ConfigError(
            f"{where}: {' and '.join(planned)} plan memory for the tasks {', '.join(TASKS)}; task={task} needs a named "
            "policy, imgsz and batch"
        )
    if cell["hybrid"] not in {True, False}:
        raise ConfigError(f"{where}: hybrid={cell['hybrid']!r} is not valid; valid: true, false")
    if cell["hybrid"] and (cell["tiles"] is None or budget is None):
        raise ConfigError(f"{where}: hybrid: true needs tiles= (the tiles that train first) and memory_budget= (both phases fit it)")
    if cell["tiles"] is not None:
        _check_tiles(where, matrix, cell, task)
    if cell["hybrid"]:
        try:
            check_settings(matrix.settings)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
    if matrix.kind == "train":
        matrix.data[cell["dataset"]] = _data_yaml(matrix, cell["dataset"])
    if matrix.baseline_of(cell) is None:
        keys = ", ".join(f"{k}={cell[k]}" for k in matrix.baseline_keys)
        raise ConfigError(
            f"{where}: no baseline cell (recompute=none, recompute_mode=full) with {keys}; add one to the grid or change baseline_keys"
        )


def _check_tiles(where: str, matrix: Matrix, cell: dict, task: str) -> None:
    """Check a cell's ``tiles: {size, overlap}`` (see the module docstring)."""
    tiles = cell["tiles"]
    if matrix.kind != "train" or task not in TILE_TASKS:
        raise ConfigError(f"{where}: tiles= is for train cells of {' and '.join(TILE_TASKS)} models (kind={matrix.kind}, task={task})")
    if not isinstance(tiles, dict) or set(tiles) != {"size", "overlap"}:
        raise ConfigError(f"{where}: tiles={tiles!r} is not valid; valid: {{size: px or fit, overlap: px}}")
    if not isinstance(cell["imgsz"], int):
        raise ConfigError(f"{where}: tiles need an int imgsz (the resolution the images are tiled and validated at), got {cell['imgsz']!r}")
    size = tiles["size"]
    if size == "fit" and (cell["memory_budget"] is None or (is_auto(cell["recompute"]) and not cell["hybrid"])):
        raise ConfigError(f"{where}: tiles size=fit needs memory_budget= and a named policy (or hybrid: true)")
    if size != "fit" and (isinstance(size, bool) or not isinstance(size, int) or not 32 <= size <= cell["imgsz"]):
        raise ConfigError(f"{where}: tiles size={size!r} is not valid; valid: fit or an int in [32, imgsz={cell['imgsz']}]")


def _model_task(model: str) -> str:
    """The task of a model YAML (its head) or checkpoint."""
    from ultralytics.nn.tasks import guess_model_task, yaml_model_load

    return guess_model_task(yaml_model_load(model) if str(model).endswith((".yaml", ".yml")) else model)


def dataset_roots(matrix: Matrix) -> dict[str, Path | None]:
    """Where a ``dataset: <name>`` is looked for, in order (the first holding ``<name>/data.yaml`` wins): the bench's
    ``datasets=`` setting, the matrix file's ``datasets_dir``, Ultralytics' ``SETTINGS['datasets_dir']`` (read,
    never written). A place not given is None."""
    return {
        "datasets=": matrix.datasets,
        "the matrix's datasets_dir": matrix.datasets_dir,
        "Ultralytics' SETTINGS['datasets_dir']": Path(ULTRALYTICS_SETTINGS["datasets_dir"]),
    }


def _data_yaml(matrix: Matrix, dataset: str) -> str:
    """The data.yaml a ``dataset`` value names: ``synthetic`` (and the other built-in sets), a data.yaml path, or a
    name in one of :func:`dataset_roots`.

    Raises:
        FileNotFoundError: one line naming each place it looked and the valid forms.
    """
    if dataset in BUILT_IN_DATASETS:
        return dataset  # generated when the cell runs (it writes files)
    if str(dataset).endswith((".yaml", ".yml")):
        if Path(dataset).is_file():
            return str(Path(dataset).resolve())
        raise MissingFileError(
            f"{matrix.path}: dataset={dataset!r}: no such file; valid: {', '.join(BUILT_IN_DATASETS)}, a data.yaml path, or a dataset name"
        )
    roots = dataset_roots(matrix)
    for root in roots.values():
        if root is not None and (root / dataset / "data.yaml").is_file():
            return str((root / dataset / "data.yaml").resolve())
    looked = "; ".join(
        f"{where} {root if root is not None else '(not given)'}{'' if root is None or root.is_dir() else ' (absent)'}"
        for where, root in roots.items()
    )
    raise MissingFileError(
        f"{matrix.path}: dataset={dataset!r} not found: no {dataset}/data.yaml in {looked}; "
        f"give datasets=DIR (a folder holding {dataset}/data.yaml), or use {', '.join(BUILT_IN_DATASETS)} or a data.yaml path"
    )


def select_cells(matrix: Matrix, cells) -> list[dict]:
    """The cells ``cells=`` names, in file order: every cell for None, else those at these numbers of
    ``matrix.cells`` (file order, from 0): an int, a list or tuple of them, or ``"4,7"``.

    Raises:
        ConfigError: for a value that is not numbers of the matrix's cells, naming the valid range.
    """
    if cells is None:
        return matrix.cells
    words = cells if isinstance(cells, (list, tuple)) else str(cells).split(",")
    numbers = {int(text) if (text := str(w).strip()).isdigit() else -1 for w in words}  # -1: not a cell's number
    if not words or not numbers <= set(range(len(matrix.cells))):
        raise ConfigError(
            f"cells={cells!r} is not valid for matrix {matrix.name}: give numbers of its {len(matrix.cells)} cells, 0 to "
            f"{len(matrix.cells) - 1} (cells=0 or cells=0,2; dry=True lists them)"
        )
    return [c for i, c in enumerate(matrix.cells) if i in numbers]
