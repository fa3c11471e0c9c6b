"""Every folder under experiments/results/ says where it came from: a README.md whose Provenance block
names the command that made it (whose scripts and tools exist today), the commit, the machine, and the
README / docs pages that quote it (each of which exists and names the folder)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
FOLDERS = sorted(p for p in RESULTS.iterdir() if p.is_dir())
COMMAND = re.compile(r"^- Command: `((?:[A-Z_]+=\S+ )*(?:python|bash|make|torchrun) [^`]*)`", re.M)
COMMIT = re.compile(r"^- Commit: .*\b[0-9a-f]{7,40}\b", re.M)
MACHINE = re.compile(r"^- Machine: \S", re.M)
QUOTED = re.compile(r"^- Quoted by: (.+)$", re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SCRIPT = re.compile(r"\b((?:tools|experiments)/[\w./-]+\.(?:py|sh))\b")


def provenance(folder: Path) -> str:
    readme = folder / "README.md"
    assert readme.is_file(), f"{folder.relative_to(ROOT)} has no README.md saying which command made it"
    return readme.read_text()


@pytest.mark.parametrize("folder", FOLDERS, ids=[p.name for p in FOLDERS])
def test_results_folder_names_its_command_commit_machine_and_quotes(folder):
    text = provenance(folder)
    command = COMMAND.search(text)
    assert command, f"{folder.name}/README.md: no '- Command: `python|bash|make ...`' line"
    for script in SCRIPT.findall(text):
        assert (ROOT / script).is_file(), f"{folder.name}/README.md names {script}, which does not exist"
    assert COMMIT.search(text), f"{folder.name}/README.md: no '- Commit:' line with a commit hash"
    assert MACHINE.search(text), f"{folder.name}/README.md: no '- Machine:' line ('not recorded' where it is not)"
    quoted = QUOTED.search(text)
    assert quoted, f"{folder.name}/README.md: no '- Quoted by:' line"
    targets = LINK.findall(quoted.group(1))
    assert targets, f"{folder.name}/README.md: '- Quoted by:' links no page"
    for target in targets:
        page = (folder / target).resolve()
        assert page.is_file(), f"{folder.name}/README.md: {target} does not exist"
        assert folder.name in page.read_text(), f"{folder.name}/README.md: {target} does not mention {folder.name}"


def run_commits(folder: Path) -> set[str]:
    """The commits the code ran at, as the folder's runs recorded them (meta.json, meta_resume.json,
    bench_rl_meta.json: `git_commit`), shortened to 7 hex digits."""
    commits = set()
    for meta in folder.rglob("*meta*.json"):
        try:
            commit = json.loads(meta.read_text()).get("git_commit")
        except (ValueError, AttributeError):
            continue
        if commit:
            commits.add(str(commit)[:7])
    return commits


@pytest.mark.parametrize("folder", FOLDERS, ids=[p.name for p in FOLDERS])
def test_results_folder_names_the_code_its_runs_ran_at(folder):
    """A result is tied to the code that made it, not to the commit that added the files: every commit
    a run recorded is named in the README, and a folder whose runs recorded their machine says which."""
    text = provenance(folder)
    commits = run_commits(folder)
    missing = sorted(c for c in commits if c not in text)
    assert not missing, f"{folder.name}/README.md does not name the commits its runs ran at: {', '.join(missing)}"
    if commits:
        assert not re.search(r"^- Machine: not recorded", text, re.M), (
            f"{folder.name}/README.md: its runs recorded their CPU in meta.json; say which machine it was"
        )


def test_the_headline_result_carries_its_machine_and_commit():
    """README's first result (the default run) comes from runs that recorded their commit, CPU and a
    calibration of the machine's speed (rapid.profiling.calibrate) in meta.json."""
    seeds = sorted((RESULTS / "default_run").glob("seed*"))
    assert seeds, "experiments/results/default_run has no seed folders"
    for seed in seeds:
        meta = seed / "meta.json"
        assert meta.is_file(), f"{meta.relative_to(ROOT)} is missing: rerun `make default-results`"
        fields = json.loads(meta.read_text())
        for key in ("git_commit", "cpu", "calibration"):
            assert fields.get(key), f"{meta.relative_to(ROOT)} has no {key}"
