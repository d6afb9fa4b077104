"""README.md is a front door and docs/ holds the rest: every link resolves (to the file and the heading it names), every
`python <script>.py` names a file that exists, and the README stays short."""

import re

import pytest

from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces as '-'."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_reaches_a_file_and_its_heading(page):
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path) if path else page
        assert resolved.exists(), f"{page.name}: {target} does not exist"
        if anchor and resolved.suffix == ".md":
            assert anchor in anchors(resolved), f"{page.name}: no heading #{anchor} in {resolved.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_script_a_page_tells_you_to_run_exists(page):
    text = page.read_text()
    commands = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S) + re.findall(r"`([^`\n]+)`", text))
    made = set(re.findall(r"\bcp [\w./-]+\.py ([\w./-]+\.py)", commands))  # a fork the page has you make
    for script in re.findall(r"python3? ((?:[\w./-]+/)?[\w-]+\.py)", commands):
        assert (ROOT / script).is_file() or script in made, f"{page.name}: `python {script}` names no file"


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    for heading in ("## Quick start", "## Make your own recipe", "## gsm8k_grpo.py", "## tool_use_grpo.py",
                    "## search_agent_grpo.py", "## Troubleshooting"):
        assert heading in readme
    assert readme.index("## Quick start") < readme.index("## gsm8k_grpo.py")  # the newcomer's path first


def test_the_link_checker_sees_a_broken_link_and_a_missing_heading(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title here\n[a](missing.md) [b](#title-here) [c](#nowhere)\n")
    assert anchors(page) == {"title-here"}
    with pytest.raises(AssertionError, match="missing.md does not exist"):
        test_every_relative_link_reaches_a_file_and_its_heading(page)
