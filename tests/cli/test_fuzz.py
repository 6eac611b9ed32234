"""Fuzzing the parsers of user input with Hypothesis (in-process, bounded): key=value words, the recompute= grammar
and memory_budget=. No input may raise anything but the documented error, and that error names the key."""

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from yolo_ckpt.checkpointing.policy import ModelLayout, check_spec, resolve
from yolo_ckpt.cli.args import parse_train_args
from yolo_ckpt.config import Budget

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# yolo11n's layout, without building the model: 23 layers, 11 in the backbone, parameter-free Upsample/Concat.
TYPES = ("Conv", "Conv", "C3k2", "Conv", "C3k2", "Conv", "C3k2", "Conv", "C3k2", "SPPF", "C2PSA", "Upsample", "Concat",
         "C3k2", "Upsample", "Concat", "C3k2", "Conv", "Concat", "C3k2", "Conv", "Concat", "C3k2", "Detect")
LAYOUT = ModelLayout(TYPES, 11, frozenset(i for i, t in enumerate(TYPES) if t in {"Upsample", "Concat"}))
# Words made of the grammar's own pieces, so that the fuzzer reaches deep into the parser, plus arbitrary text.
PIECES = st.sampled_from(["none", "all", "backbone", "neck", "head", "loss", "auto", "C3k2", "SPPF", "Detect", "-",
                          ",", " ", "0", "3", "22", "23", "99", "²", "٣", "1e3", "-1", "0x1"])
SPECS = st.one_of(st.text(max_size=20), st.lists(PIECES, max_size=8).map("".join), st.integers(-5, 100),
                  st.lists(st.one_of(st.integers(-5, 100), st.text(max_size=5)), max_size=4).map(tuple),
                  st.none(), st.booleans(), st.floats(allow_nan=True))


@pytest.mark.slow
@FUZZ
@given(SPECS)
def test_recompute_grammar_raises_only_value_errors_naming_the_key(spec):
    """check_spec and resolve either accept a value (a policy within the model's layers) or raise ValueError that
    names recompute=."""
    try:
        check_spec(spec)
        policy = resolve(spec, LAYOUT)
    except ValueError as e:
        assert "recompute=" in str(e)
    else:
        assert set(policy.indices) <= set(range(LAYOUT.head)) - LAYOUT.param_free


@FUZZ
@given(st.one_of(st.text(max_size=16), st.lists(st.sampled_from(["0", "1", ".", "5", "e", "GB", "GiB", "mb", " ", "-",
                                                                   "B", "TiB", "inf", "nan", "²"]), max_size=6).map("".join),
                 st.floats(allow_nan=True), st.integers(-10, 10**13), st.booleans(), st.none()),
       st.sampled_from([None, 16 * 2**30]))
def test_memory_budget_raises_only_value_errors_naming_the_key(value, cuda_available):
    """Budget.parse and its bytes() return a positive byte count or raise ValueError that names memory_budget=."""
    try:
        budget = Budget.parse(value).bytes(cuda_available)
    except ValueError as e:
        assert "memory_budget=" in str(e)
    else:
        assert isinstance(budget, int) and budget > 0


WORDS = st.lists(st.one_of(st.text(max_size=12),
                           st.tuples(st.sampled_from(["imgsz", "recompute", "batch", "memory_budget", "epochs", "bogus",
                                                      "cfg_", "", "amp", "data"]),
                                     st.sampled_from(["=", "==", "", " = "]),
                                     st.text(max_size=8)).map("".join)), max_size=5)


@FUZZ
@given(WORDS)
def test_key_value_words_raise_only_syntax_errors(words):
    """The yolo-style word parser returns a dict of keys it knows or raises Ultralytics' own errors: SyntaxError for
    an unknown key or a missing '=', AssertionError for a key without a value, ValueError for a value of the wrong
    type or range, naming the key (check_cfg's; the CLI prints each, exit 2)."""
    from ultralytics.utils import DEFAULT_CFG_DICT

    from yolo_ckpt.config import DEFAULTS

    try:
        overrides = parse_train_args(words)
    except (SyntaxError, AssertionError):
        return
    except ValueError as e:
        assert any(f"'{k}" in str(e) for k in DEFAULT_CFG_DICT), e
        return
    assert set(overrides) <= set(DEFAULT_CFG_DICT) | set(DEFAULTS) | {"task"}


def test_bare_equals_after_bracket_is_a_syntax_error():
    """Found by the fuzzer: Ultralytics' merge_equals_args raises IndexError on ['[', '=']."""
    with pytest.raises(SyntaxError, match="has a '=' with no key before it"):
        parse_train_args(["[", "="])


@pytest.mark.parametrize("spec", ["²", "0-²", "٣x"])
def test_unicode_digits_name_the_key(spec):
    """str.isdigit accepts digits int() rejects: the error still names recompute= and the valid choices."""
    with pytest.raises(ValueError, match=r"recompute=.*valid choices"):
        resolve(spec, LAYOUT)
