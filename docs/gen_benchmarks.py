"""Write docs/benchmarks/results.md from the committed results, grouped by the question each answers
(``benchmarks/results/index.yaml``: :mod:`benchmarks.results_index`): each folder's ``results.md`` (benchmark matrices) or
``result.md`` (single studies) as its run wrote it, with its status, quality, commit, machine and the command that
reproduces it (``record.json``). ``python docs/gen_benchmarks.py`` rewrites the page; tests/test_docs.py checks it is
current."""

from __future__ import annotations

import functools
import json
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from docs/: the repository's benchmarks
from benchmarks import results_index  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = results_index.RESULTS
PAGE = Path(__file__).parent / "benchmarks" / "results.md"
PLOTS = Path(__file__).parent / "benchmarks" / "plots"  # the lead results' mAP-against-memory plots, copied (MkDocs serves docs/ only)
LEAD = "equal-memory-"  # the results the page leads with: accuracy at one memory budget, per arm, on real data
_FOOTER = re.compile(r"^(Machine:|Settings:|Command of the last run:)")  # the run's own footer lines; Settings: is kept


@functools.cache
def _index() -> dict:
    return results_index.load()


def _record(folder: Path) -> dict:
    return json.loads((folder / "record.json").read_text())


def _machine(record: dict) -> str:
    """The record's machine and versions in words."""
    m, v = record.get("machine") or {}, record.get("versions") or {}
    cores = f", {m['cores']} cores" if m.get("cores") else ""
    threads = f", {m['torch_threads']} torch thread{'s' if m['torch_threads'] != 1 else ''}" if m.get("torch_threads") else ""
    versions = ", ".join(f"{k} {val}" for k, val in v.items())
    return f"{m.get('cpu', '?')}{cores}{threads}, GPU: {m.get('gpu') or 'none'}" + (f"; {versions}" if versions else "")


def _code(record: dict) -> str:
    """The commit the record ties the result to, and how it is known."""
    if not record.get("commit"):
        return "not recorded"
    dirty = " (with local changes)" if record.get("dirty") else ""
    inferred = ": inferred from git, the parent of the commit that last changed its figures" if record.get("commit_inferred") else ""
    return f"`{record['commit'][:12]}`{dirty}{inferred}; {str(record.get('date', ''))[:10]}"


def _status(status) -> str:
    """An index status in words."""
    if status == "current":
        return "current"
    (kind, value), = status.items()
    return {
        "stale": f"made before `{value}` changed the code it measures",
        "superseded_by": f"superseded by [{value}](#{value})",
        "holds": f"current: `{value}` shows it still holds",
    }[kind]


def render_result(folder: Path) -> str:
    """One result's section: its Markdown (headings two levels down, under its question's; the run's own machine and
    command lines dropped for the uniform ones below), then from the index its question, status and quality, and from
    its ``record.json`` the commit, the machine and the command."""
    path = folder / "results.md" if (folder / "results.md").is_file() else folder / "result.md"
    lines = [line for line in path.read_text().splitlines() if not _FOOTER.match(line) or line.startswith("Settings:")]
    body = [("##" + line) if line.startswith("#") else line for line in lines]
    if not body or not body[0].startswith("### "):
        body = [f"### {folder.name}", "", *body]
    else:
        body[0] = f"### {folder.name}: {body[0][4:]}" if body[0][4:].strip() != folder.name else f"### {folder.name}"
    body = [line for i, line in enumerate(body) if line.strip() or (i and body[i - 1].strip())]  # one blank line at most
    while body and not body[-1].strip():
        body.pop()
    if lead_plot(folder):
        body += ["", f"![{folder.name}: mAP against peak memory per arm](plots/{folder.name}.png)"]
    record, entry = _record(folder), _index()[folder.name]
    return "\n".join([
        *body, "", f"**Question:** {entry['answers']}", "", f"**Status:** {_status(entry['status'])}. **Quality:** {entry['quality']}.",
        "", f"**Code:** {_code(record)}.", "", f"**Machine:** {_machine(record)}.", "", f"**Reproduce:** `{record['command']}`", "",
    ])


def lead_plot(folder: Path) -> Path | None:
    """A lead result's plot of mAP against peak memory per arm (``map_vs_memory.png``), None for other results."""
    plot = folder / "map_vs_memory.png"
    return plot if folder.name.startswith(LEAD) and plot.is_file() else None


def folders() -> list[Path]:
    """The result folders in the page's order: by question (:data:`results_index.QUESTIONS`, accuracy at equal memory
    first), the lead results on real data first within it (issue 33), then by name."""
    index, order = _index(), list(results_index.QUESTIONS)
    return sorted((RESULTS / n for n in index), key=lambda f: (order.index(index[f.name]["question"]), not f.name.startswith(LEAD), f.name))


def render() -> str:
    """The whole page, as committed in docs/benchmarks/results.md."""
    intro = (
        "# Benchmark results\n\n"
        "<!-- generated by docs/gen_benchmarks.py from benchmarks/results/*/result(s).md: rerun a benchmark, then "
        "`python docs/gen_benchmarks.py` -->\n\n"
        "Every result committed under `benchmarks/results/`, grouped by the question it answers (`benchmarks/results/index.yaml`), "
        "as its run wrote it (a matrix's rows grouped by the machine, versions and date they were measured on), with its "
        "status (current, superseded, or made before a named commit changed the code it measures), the commit of the code "
        "that made it, the machine of its last run and the command that reproduces it (run from the repository root; "
        "`$DATASETS` is a folder holding `<name>/data.yaml` of each dataset named, `$RUNS` a folder of training runs). "
        "Each folder holds `record.json` (commit, date, machine, versions, seeds, command); a matrix folder also "
        "`matrix.yaml` (the file that ran), `results.csv` (each row with its machine, versions and date) and PNG plots. "
        "How to read the tables: [Benchmarks](index.md).\n\n"
        "First, accuracy at one memory budget on real data (`equal-memory-*`): per dataset, (a) stock at the largest imgsz "
        "that fits, (b) `recompute=auto` at full resolution, (c) stock on tiles that fit, (d) stock at full resolution "
        "without the budget, whose weights (b)'s equal; each folder's `map_vs_memory.png` plots mAP against peak memory "
        "per arm. Arms still training are absent from their table.\n"
    )
    sections, question = [], None
    for folder in folders():
        if _index()[folder.name]["question"] != question:
            question = _index()[folder.name]["question"]
            sections.append(f"## {results_index.QUESTIONS[question]}\n")
        sections.append(render_result(folder))
    return "\n".join([intro, *sections])


def main() -> None:
    PAGE.write_text(render())
    PLOTS.mkdir(exist_ok=True)
    for folder in folders():
        if lead_plot(folder):
            shutil.copyfile(lead_plot(folder), PLOTS / f"{folder.name}.png")
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
