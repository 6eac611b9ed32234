"""The documentation: the site builds with no warning, its generated pages are current, the README stays short."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import SUBPROCESS_TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 150  # issue 23: the README answers what, install, the command, what it buys, guarantees, links, tests


def _generator(name: str):
    """The page generator ``docs/<name>.py`` as a module (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_keys_page_is_current_and_names_every_key():
    """docs/reference/keys.md is what docs/gen_keys.py makes of yolo_ckpt/cfg/*.yaml now, and names each key with
    its default."""
    gen = _generator("gen_keys")
    committed = gen.PAGE.read_text()
    assert committed == gen.render(), "docs/reference/keys.md is stale: run python docs/gen_keys.py"
    files = gen.key_files()
    assert {p.name for p in files} >= {"default.yaml", "estimate.yaml"}
    for path in files:
        for key, default in yaml.safe_load(path.read_text()).items():
            row = next((line for line in committed.splitlines() if line.startswith(f"| `{key}` |")), None)
            assert row is not None, f"{path.name}: key {key!r} missing from the keys page"
            assert row.split(" | ")[1] == gen.shown_default(path, key, default), row
    recompute = next(line for line in committed.splitlines() if line.startswith("| `recompute` |"))
    # issue 31: the page showed `backbone` alone, where detect, obb, pose and segment models default to backbone,loss
    assert recompute.split(" | ")[1] == "`backbone,loss` for detect, obb, pose, segment models with a loss region; `backbone` otherwise"


def test_benchmark_results_page_is_current():
    """docs/benchmarks/results.md is what docs/gen_benchmarks.py makes of benchmarks/results/ now: one section per
    result folder, each with its machine and a command to reproduce it."""
    gen = _generator("gen_benchmarks")
    committed = gen.PAGE.read_text()
    assert committed == gen.render(), "docs/benchmarks/results.md is stale: run python docs/gen_benchmarks.py"
    folders = sorted({p.parent.name for p in gen.RESULTS.glob("*/result*.md")})
    sections = [line.split(":")[0].removeprefix("## ") for line in committed.splitlines() if line.startswith("## ")]
    assert sections == folders
    assert committed.count("**Machine:**") == committed.count("**Reproduce:** `") == len(folders)


def test_api_page_documents_every_public_name():
    """Every name of yolo_ckpt.__all__ has a mkdocstrings entry on the API page."""
    import yolo_ckpt

    page = (DOCS / "reference" / "api.md").read_text()
    missing = [name for name in yolo_ckpt.__all__ if f"::: yolo_ckpt.{name}\n" not in page]
    assert not missing, f"docs/reference/api.md lacks ::: entries for {missing}"


def test_docs_name_only_names_that_exist():
    """Issue 32: every dotted name the README and docs/ write in backticks (`yolo_ckpt.report.record.RunReport`)
    imports: its longest module prefix, then its attributes (the docs named yolo_ckpt.report.RunReport, which is not)."""
    import importlib
    import re

    named = {
        (page.relative_to(ROOT).as_posix(), m.group(1))
        for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
        for m in re.finditer(r"`(yolo_ckpt(?:\.[A-Za-z_]\w*)+)", page.read_text())
    }
    missing = []
    for page, name in sorted(named):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ModuleNotFoundError:
                continue
        try:
            for part in parts[i:]:
                obj = getattr(obj, part)
        except AttributeError:
            missing.append(f"{page}: {name}")
    assert len(named) > 10 and not missing, f"names in the docs that do not exist: {missing}"


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; at most {README_MAX_LINES}: move the rest into docs/"


@pytest.mark.docs
@pytest.mark.slow
def test_site_builds_strict(tmp_path):
    """mkdocs build --strict: every page in the nav, every link and anchor resolves, every API entry renders (the
    docstrings are imported: yolo_ckpt's public names are lazy), with no network."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install '.[docs]'")
    pytest.importorskip("material", reason="the docs extra is not installed: pip install '.[docs]'")
    pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra is not installed: pip install '.[docs]'")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "YOLO_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "api" / "index.html").read_text().count('class="doc doc-heading"') >= 15
    assert "yolo-ckpt" not in result.stdout + result.stderr  # issue 31: importing the CLI ran it ("unknown command 'build'")
    # issue 31: key names wrapped mid-word, code blocks clipped: the site's own stylesheet keeps them whole and wrapped
    assert 'href="../../stylesheets/extra.css"' in (tmp_path / "site" / "reference" / "keys" / "index.html").read_text()
    css = (tmp_path / "site" / "stylesheets" / "extra.css").read_text()
    assert "td:first-child code {\n  white-space: nowrap;" in css and "pre > code {\n  white-space: pre-wrap;" in css
