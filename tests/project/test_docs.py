# SPDX-License-Identifier: Apache-2.0
"""README.md stays a front door and the docs stay true to the tree.

The README is short, its set-up section holds exactly the two commands, every page under
docs/ is reachable from it, and every link in README.md, docs/*.md and bench/README.md
names a file of this repository (and a heading of it, where it names one). The commands
the pages show name real Makefile targets, vgpu subcommands and options, vgpud flags and
benchmark options.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import io
import re
from pathlib import Path

import pytest
from support.paths import ROOT

README = ROOT / "README.md"
PAGES = sorted([README, ROOT / "bench" / "README.md", *(ROOT / "docs").glob("*.md")])
MAX_README_LINES = 160
SETUP_COMMANDS = ["make demo", "make test"]

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*$", re.MULTILINE)
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def section(text: str, title_prefix: str) -> str:
    """The text under the first `## ` heading starting with title_prefix, to the next one."""
    m = re.search(rf"^## {re.escape(title_prefix)}.*?$(.*?)(?=^## |\Z)", text,
                  re.MULTILINE | re.DOTALL)
    assert m, f"README.md has no '## {title_prefix}' section"
    return m.group(1)


def commands(block: str) -> list[str]:
    """The command lines of a shell block: continuation lines joined, comments dropped."""
    out, pending = [], ""
    for raw in block.splitlines():
        line = raw.strip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = (pending + line).strip(), ""
        if line and not line.startswith("#"):
            out.append(line.split(" #", 1)[0].strip())
    return out


def shell_commands(paths: list[Path]) -> list[tuple[str, str]]:
    """(page, command) for every command in a ```sh block of the pages, and every inline
    `python3 ...` (the benchmark table's commands)."""
    found = []
    for page in paths:
        text, name = page.read_text(), str(page.relative_to(ROOT))
        for m in re.finditer(r"^```sh\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
            found += [(name, c) for c in commands(m.group(1))]
        found += [(name, c) for c in re.findall(r"`(python3 [^`]+)`", without_code(text))]
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def without_code(text: str) -> str:
    return FENCE.sub("", text)


# ---- the front door ---------------------------------------------------------------------

def test_readme_is_short() -> None:
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, (
        f"README.md has {n} lines (at most {MAX_README_LINES}): move reference to docs/")


def test_readme_setup_holds_exactly_the_two_commands() -> None:
    setup = section(README.read_text(), "Set up")
    blocks = FENCE.findall(setup)
    assert len(blocks) == 1, f"the set-up section has {len(blocks)} code blocks, want one"
    assert commands(blocks[0]) == SETUP_COMMANDS
    # They are what they say: Makefile targets, and CI runs the test one.
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    assert {"demo", "test"} <= targets
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    linked = {(README.parent / t.split("#", 1)[0]).resolve()
              for t in LINK.findall(without_code(README.read_text()))}
    missing = [p for p in [*(ROOT / "docs").glob("*.md"), ROOT / "bench" / "README.md"]
               if p.resolve() not in linked]
    assert not missing, f"not linked from README.md: {ids(missing)}"


def demo_line_patterns() -> list[re.Pattern[str]]:
    """What scripts/demo.py can print: each string literal of it, one pattern per line, with
    every {field} of an f-string matching anything."""
    patterns = []
    for node in ast.walk(ast.parse((ROOT / "scripts" / "demo.py").read_text())):
        if isinstance(node, ast.JoinedStr):
            parts = [re.escape(v.value) if isinstance(v, ast.Constant) else "\x00"
                     for v in node.values]
            text = "".join(parts)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = re.escape(node.value)
        else:
            continue
        for line in re.split(r"\\\n", text):      # re.escape writes a newline as backslash-newline
            if line.strip("\x00 \\"):
                patterns.append(re.compile(line.replace("\x00", ".*")))
    return patterns


def test_the_demo_sample_is_what_the_demo_prints() -> None:
    """Every line of the README's demo sample is a line scripts/demo.py prints (the `vgpu
    smi` table aside: the CLI draws it)."""
    sample = FENCE.findall(section(README.read_text(), "What the demo shows"))
    assert sample, "README.md's demo section shows no output"
    patterns = demo_line_patterns()
    lines = [ln for ln in "\n".join(sample).splitlines()
             if ln.strip() and not ln.startswith(("|", "+"))]
    assert len(lines) >= 10
    unknown = [ln for ln in lines if not any(p.fullmatch(ln.rstrip()) for p in patterns)]
    assert not unknown, f"the demo prints no such lines: {unknown}"


# ---- links ------------------------------------------------------------------------------

def link_problems(page: Path, text: str) -> list[str]:
    """One line per link in `text` (the page at `page`) that leaves the repository, names
    no file, or names a heading its page does not have."""
    bad = []
    for target in LINK.findall(without_code(text)):
        path, _, anchor = target.partition("#")
        if re.match(r"^[a-z][a-z0-9+.-]*:", path) or path.startswith(("/", "~")):
            bad.append(f"{target}: points outside the repository (use a relative path)")
            continue
        dest = (page.parent / path).resolve() if path else page.resolve()
        if not dest.is_relative_to(ROOT):
            bad.append(f"{target}: points outside the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md":
            anchors = {slug(h) for h in HEADING.findall(without_code(dest.read_text()))}
            if anchor not in anchors:
                bad.append(f"{target}: {dest.name} has no heading #{anchor}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_links_stay_in_the_repository_and_resolve(page: Path) -> None:
    bad = link_problems(page, page.read_text())
    assert not bad, f"{page.relative_to(ROOT)}:\n" + "\n".join(bad)


def test_the_link_check_catches_what_it_should() -> None:
    """The checker on a synthetic page in docs/: each kind of bad link is found, good ones pass."""
    text = ("[a](../../shared/DESIGN.md) [b](/etc/passwd) [c](https://example.com) "
            "[d](nope.md) [e](vgpud.md#no-such-heading) [ok](vgpud.md#start-it) "
            "[ok](../bench/README.md) ![img](x.png)\n```\n[in code](nope.md)\n```\n")
    bad = link_problems(ROOT / "docs" / "synthetic.md", text)
    assert [b.split(":", 1)[0] for b in bad] == [
        "../../shared/DESIGN.md", "/etc/passwd", "https", "nope.md", "vgpud.md#no-such-heading"]
    assert slug("Start it") == "start-it" and slug("`vgpu` CLI & more") == "vgpu-cli--more"


# ---- commands ---------------------------------------------------------------------------

ALL_COMMANDS = shell_commands(PAGES)


def words_of(command: str) -> list[str]:
    """The words of a command line, optional [brackets] opened, leading VAR=value dropped."""
    words = command.replace("[", " ").replace("]", " ").split()
    while words and re.match(r"^[A-Z_]+=", words[0]):
        words.pop(0)
    return words


def flags_of(command: str) -> list[str]:
    """The --options a command line names."""
    return re.findall(r"(?<![\w-])(--[a-z][\w-]*)", command)


def vgpu_argvs(words: list[str]) -> list[list[str]]:
    """`vgpu ...` as argv lists to parse: <placeholders> filled in, a|b|c alternatives
    expanded into one argv each."""
    argvs: list[list[str]] = [[]]
    for w in words[1:]:
        w = "x" if w.startswith("<") and w.endswith(">") else w
        alternatives = w.split("|") if "|" in w and not w.startswith("-") else [w]
        argvs = [[*a, alt] for a in argvs for alt in alternatives]
    return argvs


def parses(argv: list[str]) -> str | None:
    """None when the vgpu CLI's own parser accepts argv, else what it said."""
    module = "vgpu_cli.args" if (ROOT / "vgpu_cli" / "args.py").is_file() else "arbiter.cli"
    parser = importlib.import_module(module).build_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as e:
        said = err.getvalue().strip().splitlines()
        return None if e.code == 0 else (said[-1] if said else f"exit {e.code}")
    return None


def test_the_pages_show_commands() -> None:
    """The checks below see the commands (a reader that finds none would check nothing)."""
    programs = {words_of(c)[0] for _, c in ALL_COMMANDS}
    assert {"make", "vgpu", "vgpud", "python3"} <= programs


def test_the_vgpu_check_rejects_what_the_cli_rejects() -> None:
    assert parses(["ls", "--json"]) is None
    assert parses(["ls", "--jsn"]) is not None
    assert vgpu_argvs(["vgpu", "install", "docker|podman", "--dry-run"]) == [
        ["install", "docker", "--dry-run"], ["install", "podman", "--dry-run"]]


@pytest.mark.parametrize(("page", "command"), ALL_COMMANDS,
                         ids=[f"{p}: {c[:50]}" for p, c in ALL_COMMANDS])
def test_each_command_is_real(page: str, command: str) -> None:
    words = words_of(command)
    program, where = words[0], f"{page}: `{command}`"
    if program == "make":
        targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
        for target in words[1:]:
            if target == "&&":
                break
            assert target in targets, f"{where}: no Makefile target {target}"
    elif program == "vgpu":
        for argv in vgpu_argvs(words):
            error = parses(argv)
            assert error is None, f"{where}: vgpu {' '.join(argv)}: {error}"
    elif program == "vgpud":
        # vgpud's flags are arbiter.daemon.server's (vgpud/ composes it with the container side).
        daemon = "".join(f.read_text() for f in [ROOT / "arbiter" / "daemon" / "server.py",
                                                 *(ROOT / "vgpud").glob("*.py")])
        for flag in flags_of(command):
            assert f'"{flag}"' in daemon, f"{where}: vgpud has no {flag}"
    elif program in ("python3", "python") and words[1] == "-m":
        module = ROOT / words[2].replace(".", "/")
        assert (module / "__main__.py").is_file() or module.with_suffix(".py").is_file(), \
            f"{where}: no module {words[2]} to run in the checkout"
    elif program in ("python3", "python"):
        script = ROOT / words[1]
        assert script.is_file(), f"{where}: no {words[1]}"
        for flag in flags_of(command):
            assert f'"{flag}"' in script.read_text(), f"{where}: {words[1]} has no {flag}"
    elif "/" in program and not program.startswith("$"):
        assert (ROOT / program).is_file(), f"{where}: no {program}"
