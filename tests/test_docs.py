"""The documentation: the site builds with no warning, its generated pages are current, the README leads with what a user needs."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import SUBPROCESS_TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


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
            assert row.split(" | ")[1] == gen.default_cell(path, key, default), row
    recompute = next(line for line in committed.splitlines() if line.startswith("| `recompute` |"))
    # issue 31: the page showed `backbone` alone, where detect, obb, pose and segment models default to backbone,loss
    assert recompute.split(" | ")[1] == "`backbone,loss` for detect, obb, pose, segment models with a loss region; `backbone` otherwise"


def test_benchmark_results_page_is_current():
    """docs/benchmarks/results.md is what docs/gen_benchmarks.py makes of benchmarks/results/ now: one section per
    result folder, each with its machine and a command to reproduce it."""
    gen = _generator("gen_benchmarks")
    committed = gen.PAGE.read_text()
    assert committed == gen.render(), "docs/benchmarks/results.md is stale: run python docs/gen_benchmarks.py"
    folders = sorted(p.parent.name for p in gen.RESULTS.glob("*/result*.md"))
    sections = [line.split(":")[0].removeprefix("### ") for line in committed.splitlines() if line.startswith("### ")]
    assert sorted(sections) == folders and sections[0].startswith("equal-memory-")  # issue 33: the page leads with them
    reproduce = committed.count("**Reproduce** (into a fresh folder")
    assert committed.count("**Machine:**") == reproduce == committed.count("**Status:**") == len(folders)
    # issue 47: grouped by the question each answers, in the index's order
    groups = [line.removeprefix("## ") for line in committed.splitlines() if line.startswith("## ")]
    assert groups == list(gen.results_index.QUESTIONS.values())
    # the lead results' plots, as the page shows them: copies of the benchmarks' own
    plots = [f for f in gen.folders() if gen.lead_plot(f)]
    assert plots and all((gen.PLOTS / f"{f.name}.png").read_bytes() == gen.lead_plot(f).read_bytes() for f in plots)
    assert committed.count("](plots/") == len(plots)


def test_choosing_page_has_the_current_what_fits_table():
    """docs/guides/choosing-recompute.md's tables of what fits at 1536-4096 px are what docs/gen_benchmarks.py makes of
    its what-fits results folder now (issue 45): every model and card of the study, none / all per imgsz."""
    from benchmarks.high_resolution.what_fits import MODELS

    gen = _generator("gen_benchmarks")
    committed = gen.WHAT_FITS.read_text()
    assert committed == gen.render_what_fits(committed), "the choosing page is stale: run python docs/gen_benchmarks.py"
    block = committed.split(gen.WHAT_FITS_BEGIN)[1].split(gen.WHAT_FITS_END)[0]
    assert all(f"**{card}**" in block for card in ("8 GB", "12 GB", "16 GB", "24 GB", "80 GB"))
    rows = (gen.RESULTS / gen.WHAT_FITS_RESULT / "what_fits.csv").read_text().splitlines()[1:]
    made = {row.split(",")[0].removesuffix(".yaml") for row in rows}
    assert made == {m.removesuffix(".yaml") for m in MODELS}  # YOLO11, YOLO12 and YOLO26 n/s/m, detect and seg
    assert all(f"| {m} |" in block for m in made)


def test_benchmarks_readme_lists_every_study_under_its_question():
    """benchmarks/README.md's table of studies is what docs/gen_benchmarks.py makes of the studies' docstrings now
    (issue 47): every study module under its question's heading, with a command naming a module that imports and the
    results folders the index names for it; the prose about matrices around it kept."""
    gen = _generator("gen_benchmarks")
    committed = gen.README.read_text()
    assert committed == gen.render_readme(committed), "benchmarks/README.md is stale: run python docs/gen_benchmarks.py"
    modules = sorted(p for p in gen.STUDIES.rglob("*.py") if p.name not in {"__init__.py", "results_index.py"})
    assert sorted(p for paths in gen.studies().values() for p in paths) == modules
    for question, paths in gen.studies().items():
        section = committed.split(f"### {gen.results_index.QUESTIONS[question]}\n")[1].split("###")[0]
        for path in paths:
            row = next(line for line in section.splitlines() if line.startswith(f"| [`{path.name}`]"))
            _, commands = gen.study_summary(path)
            assert all(f"`{c}`".replace("|", "\\|") in row and importlib.util.find_spec(c.split()[2]) for c in commands), row
            for folder, entry in gen.results_index.load().items():
                assert (f"[{folder}](results/{folder}/)" in row) == (entry.get("study") == path.relative_to(ROOT).as_posix())
    assert "Matrix files are in `yolo_ckpt/cfg/bench/`" in committed


def test_benchmarks_readme_refuses_a_study_it_cannot_place(tmp_path, monkeypatch):
    """A study outside a question's sub-package, or whose docstring gives no ``python -m`` command, is an error that
    names it, not a row left out."""
    gen = _generator("gen_benchmarks")
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    monkeypatch.setattr(gen, "STUDIES", tmp_path / "benchmarks")
    (tmp_path / "benchmarks" / "mechanism").mkdir(parents=True)
    study = tmp_path / "benchmarks" / "mechanism" / "leak.py"
    study.write_text('"""Does it leak?\n\n    python -m benchmarks.mechanism.leak out=x\n"""\n')
    assert gen.study_summary(study) == ("Does it leak?", ["python -m benchmarks.mechanism.leak out=x"])
    study.write_text('"""Does it leak?"""\n')
    with pytest.raises(ValueError, match="benchmarks/mechanism/leak.py: its docstring gives no 'python -m benchmarks.mechanism.leak"):
        gen.study_summary(study)
    (tmp_path / "benchmarks" / "stray.py").write_text('"""Stray."""\n')
    with pytest.raises(ValueError, match=r"outside a question's sub-package .*benchmarks/stray.py"):
        gen.studies()


def test_api_page_documents_every_public_name():
    """Every name of yolo_ckpt.__all__ has a mkdocstrings entry on the API page."""
    import yolo_ckpt

    page = (DOCS / "reference" / "api.md").read_text()
    missing = [name for name in yolo_ckpt.__all__ if f"::: yolo_ckpt.{name}\n" not in page]
    assert not missing, f"docs/reference/api.md lacks ::: entries for {missing}"


def _wing_names() -> tuple[list[str], list[str]]:
    """The package's wings: its folders with an ``__init__.py``, and its top-level modules."""
    package = ROOT / "yolo_ckpt"
    folders = sorted(p.name for p in package.iterdir() if (p / "__init__.py").is_file())
    return folders, sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")


def test_every_wing_has_a_reference_page():
    """Issue 32: the API reference covers every wing, not only yolo_ckpt.__all__: a page per folder
    (docs/reference/wings/<wing>.md, its modules rendered whole: show_submodules) and one for the top-level modules, each
    in the site's nav."""
    folders, modules = _wing_names()
    pages = DOCS / "reference" / "wings"
    for wing in folders:
        page = (pages / f"{wing}.md").read_text()
        assert f"::: yolo_ckpt.{wing}\n" in page and "show_submodules: true" in page, wing
    top = (pages / "config.md").read_text()
    assert [m for m in modules if f"::: yolo_ckpt.{m}\n" not in top] == []
    nav = (ROOT / "mkdocs.yml").read_text()
    assert [p.name for p in pages.glob("*.md") if f"reference/wings/{p.name}" not in nav] == []


def _unrendered_public_names(site: Path) -> list[str]:
    """``module.name`` for every public name a module of the wings defines (its functions, classes and assigned names,
    docs/griffe_own_names.py) that no page of the built ``site`` has an entry for."""
    sys.path.insert(0, str(DOCS))
    try:
        from griffe_own_names import defined_names
    finally:
        sys.path.remove(str(DOCS))
    anchors = {a for page in site.rglob("*.html") for a in re.findall(r'id="(yolo_ckpt\.[^"]+)"', page.read_text())}
    names = []
    for path in sorted((ROOT / "yolo_ckpt").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if module != "yolo_ckpt" and not path.stem.startswith("__"):
            names += [f"{module}.{n}" for n in sorted(defined_names(path)) if not n.startswith("_")]
    return [n for n in names if n not in anchors]


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


def test_readme_leads_with_what_a_user_needs():
    """Issue 47: the README's sections, in order, lead with install, the one command, what it buys (a table), the decision
    (one paragraph) and the links; every result folder it cites exists and is indexed (benchmarks/results/index.yaml)."""
    text = (ROOT / "README.md").read_text()
    sections = {m[1]: m.start() for m in re.finditer(r"^## (.+)$", text, flags=re.M)}
    lead = ["Install", "The one command", "What it buys", "The decision"]
    assert list(sections)[: len(lead)] == lead, f"README.md's sections: {list(sections)}; they lead with {lead}"
    assert "Documentation" in sections

    def body(name):
        start = sections[name]
        return text[start: min((s for s in sections.values() if s > start), default=len(text))].split("\n", 1)[1].strip()

    assert "pip install" in body("Install") and "yolo-ckpt train" in body("The one command")
    assert re.search(r"^\|.*\|\n\|---", body("What it buys"), flags=re.M), "What it buys holds a table"
    decision = body("The decision")
    assert decision and "\n\n" not in decision, "the decision is one paragraph"
    links = re.findall(r"\]\(([^)#]+)", body("Documentation"))
    assert links and all((ROOT / link).exists() for link in links), links
    index = yaml.safe_load((ROOT / "benchmarks" / "results" / "index.yaml").read_text())["results"]
    cited = set(re.findall(r"benchmarks/results/([a-z0-9-]+)", text))
    assert cited and cited <= set(index), f"cited, not indexed: {cited - set(index)}"


def test_docs_state_no_test_counts_or_suite_durations():
    """Issue 43: the pages said "562 tests, about 7 minutes" long after the suite had grown to 911 tests and 5.5 min: a
    count or a duration of the suite goes stale with every change, so no page states one (the benchmarks' timings, of
    training runs, are data and stay)."""
    stale = re.compile(r"\b\d+ tests\b(?!/)|\bfull suite\b[^.]*\b\d+(\.\d+)? ?(s|min|minutes)\b|\babout \d+ minutes\b")
    pages = [ROOT / "README.md", *(p for p in DOCS.rglob("*.md") if "benchmarks" not in p.parts)]
    said = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in pages for m in stale.finditer(p.read_text())]
    assert said == []


def test_the_built_site_is_ignored_by_git():
    """mkdocs build writes site/ (mkdocs.yml's default site_dir) beside mkdocs.yml: git ignores it."""
    assert "site_dir" not in (ROOT / "mkdocs.yml").read_text()
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    assert subprocess.run(["git", "check-ignore", "-q", "site/index.html"], cwd=ROOT, timeout=SUBPROCESS_TIMEOUT_S).returncode == 0


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
    # issue 32: every public name of every wing has its entry (an error sends users to MemoryModel.plan())
    assert _unrendered_public_names(tmp_path / "site") == []
