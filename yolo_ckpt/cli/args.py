"""The one ``key=value`` parser of every ``yolo-ckpt`` command and bench script, ``yolo``'s syntax by Ultralytics'
own helpers: a command's words (:func:`parse_train_args`) and one ``key=value`` word (:func:`key_value`)."""

from __future__ import annotations

import logging

from ultralytics.cfg import TASKS, check_cfg, check_dict_alignment, merge_equals_args, parse_key_value_pair
from ultralytics.utils import DEFAULT_CFG_DICT, LOGGER, YAML

from ..config import DEFAULTS
from ..errors import ConfigError
from ..shipped import resolve_yaml
from ..suggest import did_you_mean


def parse_train_args(args: list[str], extra: dict | None = None) -> dict:
    """``["data=x.yaml", "imgsz=1536", "segment", "cfg=my.yaml"]`` -> overrides dict, the way ``yolo`` parses them.

    Args:
        args: the words after the command.
        extra: further valid keys and their defaults (profile and plan take ``objects=``, ...: ``cfg/estimate.yaml``).

    Raises:
        SyntaxError: for an unknown key (with Ultralytics' suggestions of similar keys) or a bare word that is
            neither a task nor a boolean key. FileNotFoundError: for a ``cfg=`` that is neither a file nor a shipped
            policy (``cfg=heavy-blocks``, :func:`yolo_ckpt.shipped.resolve_yaml`), listing the shipped ones.
        ConfigError: for an Ultralytics key's value of the wrong type or range (Ultralytics' ``check_cfg``, whose
            TypeError for ``mosaic=abc`` is a bad value like its ValueError for ``mixup=-1``).
    """
    valid = {**DEFAULT_CFG_DICT, **DEFAULTS, **(extra or {})}
    overrides: dict = {}
    try:
        words = merge_equals_args(args)
    except IndexError:  # Ultralytics' merger pops an empty list on a bare '=' after '[': report it as its own errors
        raise SyntaxError(f"{' '.join(args)!r} has a '=' with no key before it") from None
    for a in words:
        a = a.removeprefix("--").rstrip(",")
        if "=" in a:
            k, v = key_value(a)
            if k == "cfg" and v is not None:  # a YAML of overrides, as in 'yolo train cfg=custom.yaml', or a shipped policy's name
                overrides = {**{k2: v2 for k2, v2 in YAML.load(resolve_yaml(v, "policies", "cfg")).items() if k2 != "cfg"}, **overrides}
            else:
                overrides[k] = v
        elif a in TASKS:
            overrides["task"] = a
        elif isinstance(valid.get(a), bool):
            overrides[a] = True
        else:
            hint = did_you_mean(a, TASKS) if a not in valid else ""
            if hint:  # a misspelt task (Ultralytics would suggest only keys)
                raise SyntaxError(f"'{a}' is neither a task nor a key{hint}; tasks: {', '.join(TASKS)}")
            check_alignment(valid, {a: ""})
            raise SyntaxError(f"'{a}' is missing an '=' sign to set its value, i.e. try '{a}={valid[a]}'")
    check_alignment(valid, overrides)
    try:  # on a copy: check_cfg converts values in place
        check_cfg({k: v for k, v in overrides.items() if k in DEFAULT_CFG_DICT})
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None
    return overrides


def key_value(word: str) -> tuple:
    """``"imgsz=640"`` -> ``("imgsz", 640)`` by Ultralytics' ``parse_key_value_pair``.

    Raises:
        SyntaxError: for a key without a value (Ultralytics asserts it: "missing 'imgsz' value").
    """
    try:
        return parse_key_value_pair(word)
    except AssertionError as e:
        raise SyntaxError(str(e)) from None


def check_alignment(valid: dict, overrides: dict) -> None:
    """Ultralytics' ``check_dict_alignment``: a SyntaxError naming each unknown key and its similar valid keys,
    without the ``yolo`` CLI's 40-line help that it logs first (the error is the one line yolo-ckpt prints)."""
    level = LOGGER.level
    LOGGER.setLevel(logging.WARNING)
    try:
        check_dict_alignment(valid, overrides)
    finally:
        LOGGER.setLevel(level)
