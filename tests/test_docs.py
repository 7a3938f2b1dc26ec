"""The front-page README and the docs: every relative link points to a file of the tree, and
the README's test command is exactly the line that CI (.ci/run) runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "tests" / "gpu-logs" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _links(path: Path) -> list[str]:
    return [t for t in LINK.findall(path.read_text()) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_exist(doc):
    missing = [t for t in _links(doc) if not (doc.parent / t).exists()]
    assert not missing, f"{doc.relative_to(ROOT)}: links to missing files {missing}"


def test_link_check_can_fail(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("see [here](nowhere.md) and [site](https://example.org)\n")
    assert _links(doc) == ["nowhere.md"] and not (tmp_path / "nowhere.md").exists()


def _bash_blocks(text: str) -> list[str]:
    return [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()]


def test_readme_test_command_is_what_ci_runs():
    commands = [c for c in _bash_blocks((ROOT / "README.md").read_text()) if "pytest" in c]
    assert len(commands) == 1, commands
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert commands[0] in ci, (commands[0], ci)
    # a CPU machine must not pull a CUDA torch through .[test]: the CPU build comes first
    cmd = commands[0]
    assert "download.pytorch.org/whl/cpu" in cmd and cmd.index("whl/cpu") < cmd.index('".[test]"'), cmd
