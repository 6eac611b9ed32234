"""The ``yolo-ckpt`` script: :func:`main` answers ``help`` and a command it does not know, then hands the words to the
command's function, in the module named after it (:mod:`.train`, :mod:`.profile`, :mod:`.plan`, :mod:`.compare`,
:mod:`.bench`), imported only then. Each parses its words first with the one parser (:mod:`.args`), so ``help`` and
every argument error are answered without importing torch or Ultralytics; bad input is one line and exit 2.

``train`` takes every ``yolo train`` argument with the same syntax and defaults, plus yolo-ckpt's keys
(``yolo_ckpt/cfg/default.yaml``). Two offline-safe exceptions to ``yolo train``'s defaults: with no ``data=`` it trains
on the built-in synthetic dataset of the task, and with no ``model=`` it builds ``yolo11n.yaml`` (``yolo11n-seg.yaml``,
...; ``yolo26n-sem.yaml`` and ``yolo26n-depth.yaml`` for semantic and depth) instead of downloading weights.

``profile`` and ``plan`` read the same keys as ``train`` (:mod:`yolo_ckpt.memory.runspec` decides the device, AMP,
optimizer and objects per image they stand for), plus their own (``objects=``, ``format=``, profile's ``plot=``:
``yolo_ckpt/cfg/estimate.yaml``), and say what they assumed; their result is all that goes to stdout. Every command
checks yolo-ckpt's keys once, through :mod:`yolo_ckpt.config`, before it builds or writes anything.
"""

from __future__ import annotations

import sys

from ..config import BENCH_DEFAULTS_PATH, DEFAULTS, DEFAULTS_PATH, ESTIMATE_DEFAULTS_PATH, shown_default
from ..errors import ConfigError, NoRoomError, Terminated, one_line
from ..shipped import shipped
from ..suggest import did_you_mean

COMMANDS = {
    "train": "train a model with activation checkpointing",
    "profile": "per-layer memory and FLOPs table and estimated peak of a training step: none against recompute=",
    "plan": "largest imgsz and batch that fit memory_budget= for none, backbone, head, loss, all and auto, and the attention chunking",
    "compare": "delta table of runs against the first: RUN_DIR_A RUN_DIR_B ... [out=DIR]",
    "bench": (
        "run a benchmark matrix: matrix=NAME|FILE [out=DIR] [datasets=DIR] [rerun=True] [dry=True] [setting=value] "
        "(out: runs/bench/NAME)"
    ),
    "help": "show this help",
}


def help_text() -> str:
    """The text of ``yolo-ckpt help``: commands, examples, and yolo-ckpt's keys with their defaults and comments, as
    ``cfg/default.yaml`` (train's), ``cfg/estimate.yaml`` (profile's and plan's) and ``cfg/bench.yaml`` (bench's)
    write them."""
    commands = "\n".join(f"  {name:<8}{text}" for name, text in COMMANDS.items())
    keys, estimate_keys, bench_keys = (
        "\n".join(f"  {_task_defaults_shown(line)}" for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))
        for path in (DEFAULTS_PATH, ESTIMATE_DEFAULTS_PATH, BENCH_DEFAULTS_PATH)
    )
    return (
        "usage: yolo-ckpt COMMAND [TASK] key=value ...\n\n"
        f"commands:\n{commands}\n\n"
        "examples:\n  yolo-ckpt train data=path/to/data.yaml model=yolo11s.yaml imgsz=1536 recompute=backbone\n"
        "  yolo-ckpt profile model=yolo11s.yaml imgsz=1536 batch=8 recompute=all\n"
        "  yolo-ckpt plan model=yolo11s.yaml memory_budget=16GB imgsz=1536 batch=8 format=json\n"
        "  yolo-ckpt bench matrix=cpu-step dry=True   # what would run, and where; without dry=True it measures\n"
        "  yolo-ckpt train cfg=heavy-blocks data=path/to/data.yaml\n\n"
        f"shipped matrices (bench matrix=NAME): {', '.join(shipped('bench'))}\n"
        f"shipped policies (train cfg=NAME): {', '.join(shipped('policies'))}\n\n"
        "train takes every 'yolo train' argument (see 'yolo cfg'), with the same syntax and defaults, except:\n"
        "  data   default: the built-in synthetic dataset of the task (1600 px aerial-like scenes)\n"
        "  model  default: yolo11n.yaml (yolo11n-seg.yaml, ...; yolo26n-sem.yaml, yolo26n-depth.yaml) built from\n"
        "         scratch, nothing is downloaded; RT-DETR YAMLs (rtdetr-l.yaml, ...) train with RTDETRTrainer\n\n"
        f"yolo-ckpt's keys (defaults from {DEFAULTS_PATH.name}):\n{keys}\n\n"
        f"profile's and plan's keys (defaults from {ESTIMATE_DEFAULTS_PATH.name}):\n{estimate_keys}\n\n"
        f"bench's keys (defaults from {BENCH_DEFAULTS_PATH.name}; other key=value pairs are the matrix's settings):\n{bench_keys}\n\n"
        "profile and plan read train's keys as train does: data= (classes, objects, images for optimizer=auto), device=\n"
        "(default: the device train would use, CUDA where torch sees one, else the CPU; device=0 plans for a GPU from any\n"
        "machine; cpu estimates fp32), amp=, optimizer=, epochs=, nbs=; the output states what it assumed.\n"
    )


def _task_defaults_shown(line: str) -> str:
    """A key file's ``key: value # comment`` line, a train key's default a task sets otherwise shown per task
    (:func:`yolo_ckpt.config.shown_default`: ``recompute: backbone`` alone read as every model's default)."""
    key, _, rest = line.partition(":")
    if key not in DEFAULTS or shown_default(key, DEFAULTS[key]) == str(DEFAULTS[key]):
        return line
    return f"{key}: {shown_default(key, DEFAULTS[key])} #{rest.partition('#')[2]}"


def command_function(name: str):
    """The function of the command ``name`` (one of :data:`COMMANDS` but ``help``), its module imported now: it takes
    the words after the command and returns what the command made (a run's report, a table, ...)."""
    if name == "train":
        from .train import train as run
    elif name == "profile":
        from .profile import profile as run
    elif name == "plan":
        from .plan import plan as run
    elif name == "compare":
        from .compare import compare as run
    else:
        from .bench import bench as run
    return run


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``yolo-ckpt`` console script (``argv``: the words after ``yolo-ckpt``, default
    ``sys.argv[1:]``); returns the exit status, as :func:`run_command` returns it.

    Examples:
        >>> main(["plan", "model=yolo11n.yaml", "imgsz=1536", "memory_budget=4GB"])
        0
        >>> main(["plan", "imgsx=640"])  # one line on stderr naming the valid keys
        2
    """
    args = sys.argv[1:] if argv is None else list(argv)
    command = args[0].lstrip("-") if args else "help"
    if command in {"help", "h"} or {"help", "-h", "--help"} & set(args[1:]):
        print(help_text())
        return 0
    if command not in COMMANDS:
        print(f"yolo-ckpt: unknown command '{args[0]}'{did_you_mean(command, COMMANDS)}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return run_command(command_function(command), args[1:])


def run_command(function, args: list[str], prog: str = "yolo-ckpt") -> int:
    """``function(args)`` (a command's, or a study's ``main`` in ``benchmarks/``) and its exit status: 0; 2 for bad
    input (a ConfigError, PlanError included, or a SyntaxError: one line on stderr, ``prog: error: ...``); 1 for a disk
    without room for a save; 130 for Ctrl-C, 143 for a SIGTERM a trainer turned into :class:`~yolo_ckpt.errors.Terminated`.
    Anything else raised is a bug and keeps its traceback."""
    try:
        function(args)
    except (ConfigError, SyntaxError) as e:  # the input's fault (PlanError too); anything else is a bug: traceback
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except NoRoomError as e:  # a full disk or the file-size limit: the line says how much the save needs
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM: a trainer's says what it left (yolo_ckpt.train.resume.stop_on_interrupt)
        print(f"{prog}: {one_line(e) if str(e) else 'interrupted'}", file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130  # 128 + the signal, as a shell reports a process it ended
    return 0
