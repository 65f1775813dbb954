# SPDX-License-Identifier: Apache-2.0
"""Every repository path the docs, scripts, comments and docstrings name exists.

A path is named when a token starts with one of the repository's top-level folders
(`arbiter/`, `tests/`, `.ci/`, ...) or is a top-level file we ship (`README.md`,
`Makefile`, ...), or when a markdown link points at it. What is read:

- whole files: every *.md, Makefile, .ci/run, scripts/*, bench/*.py, tools/*,
  configs/**, the shell scripts under tests/, setup.py, pyproject.toml, MANIFEST.in,
  Containerfile;
- only comments and docstrings: every other first-party *.py (generated *_pb2*.py
  aside) and every *.c, *.h and *.proto.

A token with glob characters (`*`, `?`, `{a,b}`, a `<placeholder>`) is a pattern that
must match something. `file.py:12` and `file.py::test_x` name `file.py`. A markdown
link, and a `./` or `../` path in a markdown page, resolve against the page's folder;
a `../` path elsewhere against the file's folder. "Exists" means tracked by git (or new
and not ignored): a named path that git ignores (build outputs) is not checked, and
neither are the paths only an installed wheel holds (BUILT_ONLY).

Files are only read (the list of them comes from `git ls-files`); a failure lists every
miss as `file:line: path`.
"""
from __future__ import annotations

import bisect
import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

import pytest
from support.paths import ROOT

#: The top-level folders a named path can start with. A fixed list, not the tree's, so a
#: folder that is gone still has its stale references caught; a new one must be added
#: here (test_every_top_level_folder_is_known says so).
TOP_DIRS = ("arbiter", "libvgpu", "shim", "oci_hook", "vgpud", "vgpu_cli", "vgpu_k8s",
            "tests", "bench", "docs", "scripts", "tools", "configs", ".ci")
#: Top-level files we ship, named bare.
TOP_FILES = ("README.md", "LICENSE", "Makefile", "Containerfile", "setup.py",
             "pyproject.toml", "MANIFEST.in")
#: Paths that exist only once built: setup.py's build_py copies the built library, the
#: compiled programs and configs/ into the installed package; and `shim/runc` is the
#: name of a compiled program (build/bin/shim/runc, arbiter.native.PROGRAMS), not a
#: source path.
BUILT_ONLY = ("arbiter/native/libvgpu.so", "arbiter/native/libvgpu-fileops.so",
              "arbiter/native/bin", "arbiter/configs",
              "shim/runc")

_TOP = "|".join(re.escape(d) for d in TOP_DIRS)
_FILES = "|".join(re.escape(f) for f in TOP_FILES)
#: A path character, a `{a,b}` brace group or a `<placeholder>`. `:` ends a path, so
#: `x.py:12` and `x.py::test` name x.py; a comma only counts inside braces.
_PART = r"(?:[\w.*?@+-]|/|\{[\w.*/,-]*\}|<[\w-]+>)"
PATH = re.compile(
    # Not the tail of a longer path (the tests/ inside libvgpu/ is not the top-level
    # one), of a URL or of $VAR/..., nor a regex anchored with ^ (pyproject's excludes).
    r"(?<![\w./~$@^-])"
    rf"(?P<path>(?:\.\.?/)*(?:(?:{_TOP})/{_PART}*|(?:{_FILES})(?![\w.-])))")
LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
URL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


@dataclass(frozen=True)
class Named:
    """A path named at `line` of a file; `relative` when it resolves against the
    file's folder rather than the repository root."""

    line: int
    path: str
    relative: bool = False


def named_paths(text: str, first_line: int = 1, markdown: bool = False) -> list[Named]:
    """The repository paths `text` names, in order (links of a markdown page too).

    Pure: the text in, the tokens out, trailing sentence punctuation dropped.
    """
    starts = [m.end() for m in re.finditer("\n", text)]

    def named(offset: int, path: str, relative: bool) -> tuple[int, Named]:
        return offset, Named(first_line + bisect.bisect_right(starts, offset), path, relative)

    found, links = [], []
    for m in LINK.finditer(text) if markdown else ():
        target = m.group(1).split("#", 1)[0]
        if target and not URL.match(target) and not target.startswith("/"):
            found.append(named(m.start(1), target, True))
            links.append(m.start(1))
    for m in PATH.finditer(text):
        path = m.group("path").rstrip(".")
        if m.start() not in links:      # a link's target, read above
            relative = path.startswith("../") or (markdown and path.startswith("./"))
            found.append(named(m.start(), path, relative))
    return [n for _, n in sorted(found, key=lambda f: f[0])]


# ---- which text of which file ------------------------------------------------------------

WHOLE = re.compile(r"^(.*\.md|Makefile|\.ci/run|scripts/.*|bench/[^/]+\.py|tools/.*|configs/.*"
                   r"|tests/.*\.sh|setup\.py|pyproject\.toml|MANIFEST\.in|Containerfile)$")
PY_SOURCE = re.compile(r"^(arbiter|oci_hook|shim|vgpud|vgpu_cli|vgpu_k8s|tests|bench|scripts"
                       r"|tools)/.*\.py$")
#: C and protobuf share their comment syntax.
C_SOURCE = re.compile(r"^(libvgpu|shim|tests|arbiter|vgpu_k8s)/.*\.(c|h|proto)$")
GENERATED = re.compile(r"_pb2(_grpc)?\.py$")
C_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'",
                       re.DOTALL)


def python_prose(source: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of each comment and each statement that is only a string
    (a docstring) of a Python source."""
    skip = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT}
    before = tokenize.NEWLINE      # the last significant token's type
    pending: list[tokenize.TokenInfo] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
        if tok.type == tokenize.STRING and (pending or before in (
                tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)):
            pending.append(tok)
            continue
        if tok.type in skip:
            if tok.type in (tokenize.INDENT, tokenize.DEDENT):
                before = tok.type
            continue
        if pending and tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            yield from ((s.start[0], s.string) for s in pending)
        pending = []
        before = tok.type


def c_comments(source: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of each comment of a C or .proto source (strings skipped)."""
    for m in C_COMMENT.finditer(source):
        if m.group().startswith("/"):
            yield source.count("\n", 0, m.start()) + 1, m.group()


def tracked() -> list[str]:
    """The repository's files: tracked, or new and not ignored, and present."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], capture_output=True, text=True, check=True)
    return sorted({f for f in out.stdout.split("\0") if f and (ROOT / f).is_file()})


def references(files: list[str]) -> Iterator[tuple[str, Named]]:
    """(file, named path) for every path the files in scope name."""
    for name in files:
        whole = WHOLE.match(name)
        python = PY_SOURCE.match(name) and not GENERATED.search(name)
        if not (whole or python or C_SOURCE.match(name)):
            continue
        text = (ROOT / name).read_text(errors="replace")
        markdown = name.endswith(".md")
        if not markdown and not PATH.search(text):
            continue            # names nothing anywhere: no need to tokenize it (speed)
        chunks: Iterator[tuple[int, str]]
        if whole:
            chunks = iter([(1, text)])
        elif python:
            chunks = python_prose(text)
        else:
            chunks = c_comments(text)
        for first, chunk in chunks:
            for n in named_paths(chunk, first, markdown):
                yield name, n


# ---- does it exist -----------------------------------------------------------------------

def pattern(path: str) -> re.Pattern[str]:
    """A normalised path with glob characters as a regex over repository paths."""
    out, i = [], 0
    while i < len(path):
        c = path[i]
        if path.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "<":
            end = path.index(">", i)
            out.append("[^/]+")
            i = end
        elif c == "{":
            end = path.index("}", i)
            out.append("(?:" + "|".join(re.escape(a) for a in path[i + 1:end].split(",")) + ")")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out))


#: `tests/support/engines.CriContainerd`: a module's file, then one of its names.
MODULE_ATTR = re.compile(r"^(.*/\w+)\.[A-Z]\w*$")


def normalise(file: str, named: Named) -> str | None:
    """The repository-relative path `named` stands for in `file`, or None when it
    leaves the repository."""
    path = MODULE_ATTR.sub(r"\1.py", named.path)
    base = PurePosixPath(file).parent if named.relative else PurePosixPath()
    parts: list[str] = list(base.parts)
    for part in PurePosixPath(path).parts:
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part != ".":
            parts.append(part)
    return "/".join(parts) if parts else "."


class Tree:
    """The repository's files and folders, to look named paths up in."""

    def __init__(self, files: list[str]) -> None:
        self.files = set(files)
        self.dirs = {"."} | {str(p) for f in files for p in PurePosixPath(f).parents
                             if str(p) != "."}
        self.all = sorted(self.files | self.dirs)

    def has(self, path: str) -> bool:
        if re.search(r"[*?{<]", path):
            rx = pattern(path.rstrip("/"))
            return any(rx.fullmatch(p) for p in self.all)
        return path.rstrip("/") in self.files or path.rstrip("/") in self.dirs


def ignored(paths: list[str]) -> set[str]:
    """Which of the paths git ignores (build outputs and the like)."""
    if not paths:
        return set()
    out = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "--stdin", "-z"],
                         input="\0".join(paths) + "\0", capture_output=True, text=True)
    return {p for p in out.stdout.split("\0") if p}


def built_only(path: str) -> bool:
    return any(path == b or path.startswith(b + "/") for b in BUILT_ONLY)


def misses(files: list[str]) -> list[str]:
    """`file:line: path` for every named path that does not exist."""
    tree = Tree(files)
    candidates = []
    for file, named in references(files):
        path = normalise(file, named)
        if path is None:
            candidates.append((file, named, named.path))
        elif not built_only(path) and not tree.has(path):
            candidates.append((file, named, path))
    skip = ignored([p for _, _, p in candidates if not re.search(r"[*?{<]", p)])
    return [f"{file}:{named.line}: {named.path}" for file, named, path in candidates
            if path not in skip]


# ---- the tests ---------------------------------------------------------------------------

def test_every_named_path_exists() -> None:
    missing = misses(tracked())
    assert not missing, (f"{len(missing)} named paths do not exist:\n" + "\n".join(missing))


def test_every_top_level_folder_is_known() -> None:
    tops = {f.split("/", 1)[0] for f in tracked() if "/" in f}
    assert tops <= set(TOP_DIRS), f"add to TOP_DIRS: {sorted(tops - set(TOP_DIRS))}"


@pytest.mark.parametrize(("text", "want"), [
    ("see tests/support/prereq.py.", ["tests/support/prereq.py"]),
    ("`libvgpu/src/sched.c:120` and tests/x.py::test_y,", ["libvgpu/src/sched.c", "tests/x.py"]),
    ("libvgpu/tests/scribble.c", ["libvgpu/tests/scribble.c"]),
    ("tests/*.py, docs/<page>.md and shim/{a,b}.c",
     ["tests/*.py", "docs/<page>.md", "shim/{a,b}.c"]),
    ("(from .ci/run) README.md; Makefile:", [".ci/run", "README.md", "Makefile"]),
    ("https://x.io/docs/a.md $ROOT/tests/x /opt/tools/y", []),
    ("arbiter.sched, build/libvgpu.so, READMEs, setup.pyc, '^arbiter/x(_y)?$'", []),
    ("'configs/vgpu.yaml'", ["configs/vgpu.yaml"]),
], ids=["sentence-end", "line-and-test-id", "whole-path", "globs", "top-files", "not-ours",
        "modules-and-build", "quoted"])
def test_named_paths_finds_the_tokens(text: str, want: list[str]) -> None:
    assert [n.path for n in named_paths(text)] == want


def test_named_paths_reads_markdown_links_against_the_page() -> None:
    text = "[a](compute.md#x) [b](../README.md) [c](https://x.io) ![d](img.png)\nsee `tests/`"
    assert named_paths(text, markdown=True) == [
        Named(1, "compute.md", True), Named(1, "../README.md", True), Named(1, "img.png", True),
        Named(2, "tests/")]


def test_the_prose_readers_skip_code() -> None:
    py = ('"""docs/a.md"""\nx = "tests/b.py"  # tests/c.py\ndef f():\n    """tests/d.py"""\n'
          '    return f("tests/e.py")\n')
    assert [n.path for _, t in python_prose(py) for n in named_paths(t)] == [
        "docs/a.md", "tests/c.py", "tests/d.py"]
    c = 'char *s = "tests/a.c"; /* tests/b.c\n tests/c.c */ // tests/d.c\n'
    assert [(line, n.path) for line0, t in c_comments(c) for n in named_paths(t, line0)
            for line in [n.line]] == [(1, "tests/b.c"), (2, "tests/c.c"), (2, "tests/d.c")]


def test_a_miss_is_reported_where_it_is() -> None:
    tree = Tree(["docs/a.md", "tests/x.py"])
    assert tree.has("tests/*.py") and tree.has("docs/") and not tree.has("tests/*.c")
    assert tree.has("docs/{a,b}.md") and tree.has("docs/<page>.md")
    assert normalise("docs/a.md", Named(3, "../tests/x.py", True)) == "tests/x.py"
    assert normalise("docs/a.md", Named(3, "../../x", True)) is None
    assert normalise("bench/a.py", Named(3, "tests/support/engines.Cri")) == \
        "tests/support/engines.py"
    assert built_only("arbiter/native/bin/vgpu-hook") and not built_only("arbiter/nativex")


def test_what_git_ignores_is_not_checked() -> None:
    assert ignored(["tests/__pycache__/x.pyc", "tests/x.py"]) == {"tests/__pycache__/x.pyc"}
