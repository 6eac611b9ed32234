"""The repository is clean under the ruff rules configured in pyproject.toml ([tool.ruff])."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_is_clean():
    """``ruff check`` (the ``test`` extra installs it) finds nothing in the package, the benchmarks and the tests."""
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_subprocess_tests_have_no_tight_time_limit():
    """A child process's time limit is generous (helpers.SUBPROCESS_TIMEOUT_S, or a literal of 900 s or more): a 120 s
    limit on a child that imports torch failed on a loaded machine (issue 31). Waiting for a killed child to exit
    (``.wait(timeout=...)``) may stay short."""
    import re

    tight = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        for limit in re.findall(r"timeout=(\d+)", line)
        if int(limit) < 900 and ".wait(timeout=" not in line
    ]
    assert not tight, tight
