"""The one ``key=value`` parser of every ``yolo-ckpt`` command and benchmark study, with ``yolo``'s syntax.

Two passes. The first (:func:`check_words`) reads the words as ``yolo`` does, its rules mirrored from
``ultralytics/cfg/__init__.py`` (8.4: ``merge_equals_args``, ``parse_key_value_pair``'s empty value,
``check_dict_alignment``'s message and the deprecated keys of ``_handle_deprecation``; ``tests/cli/test_args.py`` holds
each equal to Ultralytics'), and refuses a word with bad syntax or an unknown key in one line, without importing torch or
Ultralytics: ``yolo-ckpt plan imgsx=640`` answers in a fraction of a second. The second converts the values of words that
passed with Ultralytics' own ``parse_key_value_pair`` (``"640"`` -> 640) and, for ``train``, ``profile`` and ``plan``,
checks them with its ``check_cfg``.

- :func:`parse_train_args`: the words of ``train``, ``profile`` and ``plan`` (Ultralytics' keys, yolo-ckpt's, a task,
  a bare boolean key, ``cfg=``);
- :func:`parse_keys`: the ``key=value`` words of a command or study with its own keys (``compare``, ``bench``,
  ``python -m benchmarks.mechanism.soak``).

Importing this module imports neither torch nor Ultralytics.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
from collections.abc import Iterable
from pathlib import Path

import yaml

from ..config import DEFAULT_MODELS, DEFAULTS
from ..errors import ConfigError
from ..suggest import did_you_mean

TASKS = tuple(DEFAULT_MODELS)  # Ultralytics' tasks (ultralytics.cfg.TASKS, in its order), without importing it
# Keys Ultralytics takes though its default.yaml no longer lists them: renamed or dropped with a warning by
# _handle_deprecation (ultralytics/cfg/__init__.py:573), or allowed by check_dict_alignment (:638)
ULTRALYTICS_OLD_KEYS = frozenset({
    "boxes", "hide_labels", "hide_conf", "line_thickness", "end2end", "int8", "half",
    "label_smoothing", "save_hybrid", "crop_fraction", "keras", "augmentations", "save_dir",
})
ALL_KEYS_SEE = "Valid keys: 'yolo cfg' lists yolo train's, 'yolo-ckpt help' yolo-ckpt's."


@functools.cache
def ultralytics_keys() -> dict:
    """Ultralytics' keys and their defaults (``DEFAULT_CFG_DICT``), read from its ``cfg/default.yaml`` without importing
    the package (which imports torch)."""
    spec = importlib.util.find_spec("ultralytics")
    return yaml.safe_load((Path(spec.origin).parent / "cfg" / "default.yaml").read_text(encoding="utf-8"))


def train_keys(extra: dict | None = None) -> dict:
    """The keys ``train`` takes, with their defaults: Ultralytics' and yolo-ckpt's (``cfg/default.yaml``), and
    ``extra`` (profile's and plan's ``objects=``, ...: ``cfg/estimate.yaml``)."""
    return {**ultralytics_keys(), **DEFAULTS, **(extra or {})}


def merge_equals(args: list[str]) -> list[str]:
    """``["imgsz", "=", "640", "imgsz=[3,", "640]"]`` -> ``["imgsz=640", "imgsz=[3,640]"]``: Ultralytics'
    ``merge_equals_args`` (ultralytics/cfg/__init__.py:688): a ``=`` standing alone or at a word's end or start joins
    its neighbours, and a bracket's words join until it closes.

    Raises:
        SyntaxError: for an unmatched ``[`` or ``]`` (Ultralytics' message), or a ``=`` with no key before it.
    """
    merged, current, depth, i = [], [], 0, 0
    while i < len(args):
        arg = args[i]
        try:
            if arg == "=" and 0 < i < len(args) - 1:  # ['arg', '=', 'val']
                arg = f"{merged.pop()}={args[i + 1]}"
                i += 1
            elif arg.endswith("=") and i < len(args) - 1 and "=" not in args[i + 1]:  # ['arg=', 'val']
                arg += args[i + 1]
                i += 1
            elif arg.startswith("=") and i > 0:  # ['arg', '=val']
                arg = merged.pop() + arg
        except IndexError:  # Ultralytics' merger pops an empty list (['[', '=']): its own error here
            raise SyntaxError(f"{' '.join(args)!r} has a '=' with no key before it") from None
        depth += arg.count("[") - arg.count("]")
        current.append(arg)
        if depth == 0:
            merged.append("".join(current))
            current = []
        i += 1
    if current:
        raise SyntaxError(f"'{current[0]}' has an unmatched '[' or ']' bracket.")
    return merged


def takes(command: str, valid) -> str:
    """``"compare takes out"``: the keys a command or study takes, for its errors."""
    return f"{command} takes {', '.join(valid)}"


def refuse_unknown(keys: list[str], valid: dict, command: str | None = None, valid_text: str | None = None) -> None:
    """Raise one SyntaxError naming each unknown key of ``keys`` (none: return) and the valid ones.

    For ``train``, ``profile`` and ``plan`` (``command`` None) as Ultralytics' ``check_dict_alignment`` words it
    (ultralytics/cfg/__init__.py:675: each key's similar valid keys, without the ``yolo`` CLI's help it logs first), and
    where the rest are listed; for a command or study with its own keys, the closest key and all of them, the
    command named (:func:`takes`; ``valid_text`` where they would not fit a line).
    """
    if not keys:
        return
    if command is not None:
        raise SyntaxError(f"unknown key '{keys[0]}'{did_you_mean(keys[0], valid)}; {valid_text or takes(command, valid)}")
    lines = []
    for key in keys:
        close = [f"{k}={valid[k]}" if valid.get(k) is not None else k for k in difflib.get_close_matches(key, frozenset(valid))]
        lines.append(f"'{key}' is not a valid YOLO argument." + (f" Similar arguments are i.e. {close}." if close else ""))
    raise SyntaxError(" ".join([*lines, ALL_KEYS_SEE]))  # Ultralytics' sentences, then where the valid keys are


def check_words(args: list[str], valid: dict, tasks: tuple[str, ...] = (), command: str | None = None,
                valid_text: str | None = None, required: tuple[str, ...] = ()) -> list[str]:
    """The first pass: ``args`` merged (:func:`merge_equals`), each word's ``--`` and trailing comma dropped, and checked
    against ``valid`` (keys to defaults) without importing torch.

    Args:
        args: the words after the command.
        valid: the keys taken, with their defaults (a bare word that is a boolean key sets it True).
        tasks: the bare words taken as a task (``train``'s: :data:`TASKS`); none for a command with its own keys.
        command: a command or study with its own keys (``compare``, ``benchmarks.mechanism.soak``): its errors list ``valid``
            (:func:`takes`) or say ``valid_text``; None for ``train``, ``profile`` and ``plan`` (Ultralytics' wording).
        required: the keys that must be given.

    Returns:
        The words, merged: each a ``key=value`` with a value, a task or a boolean key.

    Raises:
        SyntaxError: one line (:func:`refuse_unknown`), for a key without a value (Ultralytics' "missing 'imgsz'
            value"), a ``=`` with no key before it, an unmatched bracket, an unknown key (naming it and the valid ones),
            a bare word that is not a task nor a boolean key, or a required key missing.
    """
    words, unknown, given = [], [], set()
    for word in merge_equals(args):
        word = word.removeprefix("--").rstrip(",")
        if "=" in word:
            key, value = (part.strip() for part in word.split("=", 1))
            if not value:
                raise SyntaxError(f"missing '{key}' value")
            given.add(key)
            if key not in valid and (command is not None or key not in ULTRALYTICS_OLD_KEYS):
                unknown.append(key)
        elif word in tasks or (command is None and isinstance(valid.get(word), bool)):
            pass
        elif command is not None:
            raise SyntaxError(f"'{word}' is not a key=value word; {valid_text or takes(command, valid)}")
        elif hint := (did_you_mean(word, tasks) if word not in valid else ""):  # a misspelt task (Ultralytics suggests keys)
            raise SyntaxError(f"'{word}' is neither a task nor a key{hint}; tasks: {', '.join(tasks)}")
        elif word not in valid:
            refuse_unknown([word], valid)
        else:
            raise SyntaxError(f"'{word}' is missing an '=' sign to set its value, i.e. try '{word}={valid[word]}'")
        words.append(word)
    refuse_unknown(unknown, valid, command, valid_text)
    if missing := [k for k in required if k not in given]:
        raise SyntaxError(f"{missing[0]}= is required; {valid_text or takes(command, valid)}")
    return words


def key_value(word: str) -> tuple:
    """``"imgsz=640"`` -> ``("imgsz", 640)``, the value converted by Ultralytics' ``parse_key_value_pair`` (which
    imports Ultralytics), for a word :func:`check_words` passed (it has a value: Ultralytics would assert it)."""
    from ultralytics.cfg import parse_key_value_pair

    return parse_key_value_pair(word)


def listed(value) -> list:
    """A ``key=a,b`` value of :func:`parse_keys` as a list (Ultralytics' parser gives a tuple for ``a,b`` and the value
    alone for ``a``)."""
    return list(value) if isinstance(value, (list, tuple)) else str(value).split(",")


def parse_keys(args: list[str], valid: Iterable[str], command: str, valid_text: str | None = None, required: tuple[str, ...] = ()) -> dict:
    """The ``key=value`` words of a command or study with its own keys -> ``{key: value}`` (values as Ultralytics
    converts them: ``out=runs/x`` a str, ``epochs=30`` an int), only the keys given.

    Args:
        args: the words (``sys.argv[1:]`` of a study; a command's ``key=value`` words).
        valid: every key the command or study takes.
        command: its name, in errors (``compare``, ``benchmarks.mechanism.soak``).
        valid_text: what the errors say is valid where listing ``valid`` would not fit a line (``bench``'s settings).
        required: the keys that must be given (a study's ``data=``).

    Raises:
        SyntaxError: one line, before anything is imported or read: for an unknown key (with the
            close valid ones and all of them), a word that is not ``key=value``, a key without a value, a required key
            missing.
    """
    words = check_words(args, dict.fromkeys(valid), command=command, valid_text=valid_text, required=required)
    return dict(key_value(word) for word in words)


def parse_train_args(args: list[str], extra: dict | None = None) -> dict:
    """``["data=x.yaml", "imgsz=1536", "segment", "cfg=my.yaml"]`` -> overrides dict, the way ``yolo`` parses them.

    Args:
        args: the words after the command.
        extra: further valid keys and their defaults (profile and plan take ``objects=``, ...: ``cfg/estimate.yaml``).

    Raises:
        SyntaxError: as :func:`check_words` raises (an unknown key, with Ultralytics' suggestions of similar keys; a bare
            word that is neither a task nor a boolean key), before torch is imported; for an unknown key in a ``cfg=``
            file (Ultralytics' check). FileNotFoundError: for a ``cfg=`` that is neither a file nor a shipped
            policy (``cfg=heavy-blocks``, :func:`yolo_ckpt.shipped.resolve_yaml`), listing the shipped ones.
        ConfigError: for an Ultralytics key's value of the wrong type or range (Ultralytics' ``check_cfg``, whose
            TypeError for ``mosaic=abc`` is a bad value like its ValueError for ``mixup=-1``).
    """
    valid = train_keys(extra)
    words = check_words(args, valid, TASKS)
    from ultralytics.cfg import check_cfg, check_dict_alignment
    from ultralytics.utils import YAML

    from ..shipped import resolve_yaml

    overrides: dict = {}
    for word in words:
        if "=" not in word:
            overrides.update({"task": word} if word in TASKS else {word: True})
            continue
        k, v = key_value(word)
        if k == "cfg" and v is not None:  # a YAML of overrides, as in 'yolo train cfg=custom.yaml', or a shipped policy's name
            given = {k2: v2 for k2, v2 in YAML.load(resolve_yaml(v, "policies", "cfg")).items() if k2 != "cfg"}
            refuse_unknown([k2 for k2 in given if k2 not in valid and k2 not in ULTRALYTICS_OLD_KEYS], valid)
            overrides = {**given, **overrides}
        else:
            overrides[k] = v
    check_dict_alignment(valid, overrides)  # Ultralytics' deprecated keys renamed in place (boxes -> show_boxes)
    try:  # on a copy: check_cfg converts values in place
        check_cfg({k: v for k, v in overrides.items() if k in ultralytics_keys()})
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None
    return overrides
