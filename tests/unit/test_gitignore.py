"""What ships from a workdir is what git lists there (podrun/shipping/ignore.py): checked against the real
`git ls-files --cached --others --exclude-standard` on generated trees of nested ignore files, and on
the classic traps one by one."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from podrun.shipping import ignore, scan

from helpers import examples

LS_FILES = ("ls-files", "-z", "--cached", "--others")


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """Real git, blind to this machine's configuration: no system or global config, no global
    excludes file, so only the tree's own rules count."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", HOME=os.devnull, XDG_CONFIG_HOME=os.devnull)
    return subprocess.run(["git", "-c", "core.excludesFile=/dev/null", *args], cwd=cwd, env=env,
                          capture_output=True, check=False)


def git_init(top: Path) -> None:
    top.mkdir(parents=True, exist_ok=True)
    assert git(top, "init", "-q", "--template=", ".").returncode == 0  # no template: no hooks to copy


def git_lists(workdir: Path, *excludes: str) -> list[str]:
    excludes = excludes or ("--exclude-standard",)
    listed = git(workdir, *LS_FILES, *excludes)
    assert listed.returncode == 0, listed.stderr
    return sorted(os.fsdecode(path) for path in listed.stdout.split(b"\0") if path)


def write(top: Path, files: dict[str, str]) -> None:
    for relative, content in files.items():
        path = top / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def ships(workdir: Path) -> list[str]:
    listed = ignore.shipped_files(workdir)
    assert listed == sorted(listed, key=os.fsencode)
    return listed


# generated trees: names and pattern pieces from small pools, the common ones drawn more often, so
# that patterns hit files and negations meet exclusions

NAMES = st.one_of(*[st.sampled_from(["a", "b", "build", "keep.txt", "x.txt", "y.py"])] * 2,
                  st.sampled_from(["#h", "!n", "t ", "abc", "k.py"]))
SEGMENTS = st.one_of(*[st.sampled_from(["a", "b", "build", "keep.txt", "x.txt", "*.txt", "*.py", "*", "**"])] * 3,
                     st.sampled_from(["?", "[ab]", "[!a]*", "k*", "*e*", "[[:alpha:]]", "\\#h", "\\!n", "t\\ ",
                                      "#h", "!n", "b**", "**b", "a**c", "t", "y.py"]))


class Directory(NamedTuple):
    entries: dict[str, Directory | None]  # None: a file
    gitignore: str | None
    podrunignore: str | None


def join_pattern(negation: str, anchor: str, segments: list[str], directory: str, trailing: str) -> str:
    return negation + anchor + "/".join(segments) + directory + trailing


PATTERNS = st.builds(join_pattern, st.sampled_from(["", "", "!"]), st.sampled_from(["", "", "", "/"]),
                     st.one_of(*[st.lists(SEGMENTS, min_size=1, max_size=1)] * 3,
                               st.lists(SEGMENTS, min_size=2, max_size=3)),
                     st.sampled_from(["", "", "", "/"]), st.sampled_from(["", "", "", " ", "  ", "\\ "]))
LINES = st.one_of(PATTERNS, PATTERNS, PATTERNS, st.sampled_from(["# a comment", "", "   "]))
IGNORE_FILES = st.one_of(st.none(), *[st.builds(lambda lines, newline, last: newline.join(lines) + last,
                                                st.lists(LINES, min_size=1, max_size=5),
                                                st.sampled_from(["\n", "\r\n"]), st.sampled_from(["", "\n"]))] * 3)


def directories(depth: int, podrunignore: bool) -> st.SearchStrategy[Directory]:
    entry = st.none() if depth == 0 else st.none() | directories(depth - 1, podrunignore)
    return st.builds(Directory, st.dictionaries(NAMES, entry, min_size=1, max_size=5), IGNORE_FILES,
                     IGNORE_FILES if podrunignore else st.none())


def materialize(tree: Directory, path: Path) -> list[Path]:
    """Write the tree; returns its directories, parents first."""
    path.mkdir(exist_ok=True)
    made = [path]
    for name, entry in tree.entries.items():
        if entry is None:
            (path / name).write_text(name)
        else:
            made += materialize(entry, path / name)
    for name, content in ((".gitignore", tree.gitignore), (".podrunignore", tree.podrunignore)):
        if content is not None:
            (path / name).write_bytes(content.encode())
    return made


def git_ignores_a_directory_down_to(top: Path, workdir: Path) -> bool:
    relative = workdir.relative_to(top).parts
    # "./": a name such as ":x" would otherwise read as pathspec magic
    return any(git(top, "check-ignore", "-q", "--no-index", "--", "./" + "/".join(relative[:depth])).returncode == 0
               for depth in range(1, len(relative) + 1))


CLASSIC = Directory({"x.txt": None, "sub": Directory({"keep.txt": None, "x.txt": None}, "!keep.txt\n", None)},
                    "*.txt\n", None)


@pytest.fixture(scope="module")
def git_dir(tmp_path_factory) -> Path:
    """One repository for all generated trees, each its work tree through a `.git` file (as a linked
    worktree's or a submodule's is): a `git init` per tree would double the properties' time."""
    top = tmp_path_factory.mktemp("repository")
    git_init(top)
    return top / ".git"


def generated_repository(tree: Directory, scratch: str, git_dir: Path) -> tuple[Path, list[Path]]:
    top = Path(scratch) / "repo"
    made = materialize(tree, top)
    (top / ".git").write_text(f"gitdir: {git_dir}\n")
    return top, made


@pytest.mark.slow
@settings(max_examples=examples(500), deadline=None, database=None)
@given(tree=directories(3, podrunignore=False), data=st.data())
@example(tree=CLASSIC, data=None)
def test_what_ships_is_what_git_lists(git_dir, tree, data):
    with tempfile.TemporaryDirectory() as scratch:
        top, made = generated_repository(tree, scratch, git_dir)
        # the workdir: the repository's top, or a directory below it (the rules above then apply)
        workdir = top if data is None else data.draw(st.sampled_from(made))
        expected = git_lists(workdir)
        shipped = ships(workdir)
        if shipped and not expected:  # the one deliberate difference: see podrun/shipping/ignore.py
            assert git_ignores_a_directory_down_to(top, workdir)
        else:
            assert shipped == expected


@pytest.mark.slow
@settings(max_examples=examples(250), deadline=None, database=None)
@given(tree=directories(2, podrunignore=True))
def test_podrunignore_reads_as_appended_to_the_gitignore_beside_it(git_dir, tree):
    # git's oracle: a per-directory file holding both, the way `.podrunignore` is specified
    with tempfile.TemporaryDirectory() as scratch:
        top, made = generated_repository(tree, scratch, git_dir)
        shipped = ships(top)
        for directory in made:
            parts = [(directory / name).read_bytes() for name in (".gitignore", ".podrunignore")
                     if (directory / name).is_file()]
            (directory / ".both").write_bytes(b"\n".join(parts))
        expected = [path for path in git_lists(top, "--exclude-per-directory=.both")
                    if os.path.basename(path) != ".both"]
        assert shipped == expected


def test_a_deeper_negation_re_includes_what_a_shallower_rule_excludes(tmp_path):
    write(tmp_path, {".gitignore": "*.txt\n", "x.txt": "", "sub/.gitignore": "!keep.txt\n", "sub/keep.txt": "",
                     "sub/x.txt": "", "sub/deeper/keep.txt": ""})
    git_init(tmp_path)
    assert ships(tmp_path) == git_lists(tmp_path) == [".gitignore", "sub/.gitignore", "sub/deeper/keep.txt",
                                                      "sub/keep.txt"]
    assert git(tmp_path, "add", "-A").returncode == 0
    assert ships(tmp_path) == git_lists(tmp_path)  # the same once added: git add -A follows the rules too


def test_a_negation_in_a_deeper_directory_does_not_reach_through_a_directory_name(tmp_path):
    # `!d` names the directory d, not the files in it: x/d/f.txt stays excluded by `*.txt`
    write(tmp_path, {".gitignore": "*.txt\n", "x/.gitignore": "!d\n", "x/d/f.txt": "", "x/d/g.py": ""})
    git_init(tmp_path)
    assert ships(tmp_path) == git_lists(tmp_path) == [".gitignore", "x/.gitignore", "x/d/g.py"]


def test_nothing_in_an_excluded_directory_comes_back(tmp_path):
    write(tmp_path, {".gitignore": "dir/\n!dir/keep\n", "dir/keep": "", "dir/other": "",
                     "dir/.gitignore": "!*\n", "dir/sub/keep": "", "main.py": ""})
    git_init(tmp_path)
    assert ships(tmp_path) == git_lists(tmp_path) == [".gitignore", "main.py"]


def test_an_anchored_pattern_matches_at_its_own_level_only(tmp_path):
    write(tmp_path, {".gitignore": "/build\na/local\n", "build/out": "", "src/build/kept": "",
                     "a/local": "", "src/a/local": "", "sub/.gitignore": "/cache/\n", "sub/cache/x": "",
                     "sub/deeper/cache/y": ""})
    git_init(tmp_path)
    assert ships(tmp_path) == git_lists(tmp_path) == [
        ".gitignore", "src/a/local", "src/build/kept", "sub/.gitignore", "sub/deeper/cache/y"]


def test_double_asterisks_span_directories(tmp_path):
    write(tmp_path, {".gitignore": "logs/**/*.log\n**/tmp\nab**/c\n", "logs/a.log": "", "logs/x/y/b.log": "",
                     "logs/x/keep.txt": "", "deep/down/tmp": "", "ab/x/y/c": "", "abc": "", "b/c": ""})
    git_init(tmp_path)
    assert ships(tmp_path) == git_lists(tmp_path) == [".gitignore", "b/c", "logs/x/keep.txt"]


def test_escapes_comments_and_trailing_spaces(tmp_path):
    write(tmp_path, {".gitignore": "# comment\n\\#h\n\\!n\nt\\ \nsp   \n\n  \n[ab]*.py\r\n",
                     "#h": "", "!n": "", "t ": "", "t": "", "sp": "", "# comment": "", "a.py": "", "c.py": ""})
    git_init(tmp_path)
    assert ships(tmp_path) == git_lists(tmp_path) == ["# comment", ".gitignore", "c.py", "t"]


def test_podrunignore_excludes_more_and_re_includes(tmp_path):
    write(tmp_path, {".gitignore": "*.log\n", ".podrunignore": "data/\n!debug.log\n", "app.py": "",
                     "run.log": "", "debug.log": "", "data/big.bin": "",
                     # the deeper .gitignore wins over the shallower .podrunignore
                     "sub/.gitignore": "*.log\n", "sub/debug.log": "", "sub/data/excluded.bin": "",
                     "other/.podrunignore": "*.py\n", "other/x.py": "", "other/debug.log": ""})
    assert ships(tmp_path) == [".gitignore", ".podrunignore", "app.py", "debug.log", "other/.podrunignore",
                               "other/debug.log", "sub/.gitignore"]


def test_symlinks_ship_as_links_and_are_not_followed(tmp_path):
    write(tmp_path, {".gitignore": "build/\n", "target/inner.py": "", "rules": "*\n", "sub/file": ""})
    (tmp_path / "to-file").symlink_to("rules")
    (tmp_path / "to-dir").symlink_to("target")
    (tmp_path / "build").symlink_to("target")  # not a directory: `build/` does not match it
    (tmp_path / "broken").symlink_to("nowhere")
    (tmp_path / "sub" / ".gitignore").symlink_to("../rules")  # git does not read it
    git_init(tmp_path)
    assert ships(tmp_path) == git_lists(tmp_path) == [
        ".gitignore", "broken", "build", "rules", "sub/.gitignore", "sub/file", "target/inner.py", "to-dir",
        "to-file"]


def test_dot_git_entries_fifos_and_nested_repositories(tmp_path):
    write(tmp_path, {"main.py": "", "worktree/.git": "gitdir: /elsewhere\n", "worktree/a.py": "",
                     "nested/b.py": ""})
    os.mkfifo(tmp_path / "fifo")
    git_init(tmp_path)
    git_init(tmp_path / "nested")
    assert git_lists(tmp_path) == ["main.py", "nested/", "worktree/a.py"]
    assert ships(tmp_path) == ["main.py", "nested/b.py", "worktree/a.py"]  # a nested repository ships whole


def test_rules_above_the_workdir_apply_as_in_git(tmp_path):
    write(tmp_path, {".gitignore": "*.log\n/code/generated/\nsecret*\n", "code/.gitignore": "!keep.log\n",
                     "code/train.py": "", "code/train.log": "", "code/keep.log": "", "code/generated/x.py": "",
                     "code/deep/generated/y.py": "", "code/secrets.txt": "", "code/run.tmp": "", "code/notes": ""})
    git_init(tmp_path)
    (tmp_path / ".git" / "info").mkdir()
    (tmp_path / ".git" / "info" / "exclude").write_text("*.tmp\nnotes\n")
    (tmp_path / "code" / ".podrunignore").write_text("!notes\n")
    listed = git_lists(tmp_path / "code")
    assert listed == [".gitignore", ".podrunignore", "deep/generated/y.py", "keep.log", "train.py"]
    assert ships(tmp_path / "code") == sorted([*listed, "notes"])  # re-included by .podrunignore


def test_rules_above_a_linked_worktree_include_its_repository_info_exclude(tmp_path):
    write(tmp_path / "main", {"a.py": "", "a.tmp": ""})
    git_init(tmp_path / "main")
    assert git(tmp_path / "main", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
               "-m", "init").returncode == 0
    assert git(tmp_path / "main", "worktree", "add", "-q", str(tmp_path / "linked")).returncode == 0
    (tmp_path / "main" / ".git" / "info").mkdir(exist_ok=True)
    (tmp_path / "main" / ".git" / "info" / "exclude").write_text("*.tmp\n")
    write(tmp_path / "linked", {"b.py": "", "b.tmp": ""})
    assert ships(tmp_path / "linked") == git_lists(tmp_path / "linked") == ["b.py"]


def test_a_workdir_git_ignores_still_ships_its_files(tmp_path):
    write(tmp_path, {".gitignore": "exp/\n*.log\n", "exp/a/train.py": "", "exp/a/out.log": ""})
    git_init(tmp_path)
    assert git_lists(tmp_path / "exp" / "a") == []  # git lists nothing inside an ignored directory
    assert ships(tmp_path / "exp" / "a") == ["train.py"]  # but the rules still apply to what is in it


def test_outside_any_repository_the_workdir_is_the_top(tmp_path):
    write(tmp_path, {"code/.gitignore": "*.pyc\n", "code/a.py": "", "code/a.pyc": ""})
    assert ships(tmp_path / "code") == [".gitignore", "a.py"]
    assert ships(tmp_path / "missing") == []


def test_scan_ships_what_git_lists(tmp_path, home):
    write(tmp_path, {".gitignore": "*.txt\n__pycache__/\n", "train.py": "", "notes.txt": "",
                     "__pycache__/train.pyc": "", "configs/.gitignore": "!keep.txt\n", "configs/keep.txt": "",
                     "configs/other.txt": ""})
    git_init(tmp_path)
    tree = scan.scan(tmp_path)
    assert tree.files == git_lists(tmp_path) == [".gitignore", "configs/.gitignore", "configs/keep.txt",
                                                 "train.py"]
    (tmp_path / "configs" / "keep.txt").write_text("changed")
    assert scan.scan(tmp_path).digest != tree.digest  # a re-included file is part of the digest
