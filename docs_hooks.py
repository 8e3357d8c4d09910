"""MkDocs hooks (mkdocs.yml's `hooks:`) for podrun's documentation site.

At every build they generate, from the code as it is, the pages that must not drift from it: the
command-line reference from the argparse parser (podrun.cli.build_parser) and the job spec's
reference from its JSON Schema (`python -m podrun schema`). The README is the site's front page
(index.md), and links between the README and docs/ are written as GitHub shows them (`docs/x.md`,
`../README.md`), then made into the site's own here.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import subprocess
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parent
LINK = re.compile(r"(\]\()([^)\s#]*)(#[^)\s]*)?(\))")

sys.path.insert(0, str(REPO))  # this tree's podrun, not one installed in the environment


def on_files(files: Files, config) -> Files:
    generated = {
        "index.md": (REPO / "README.md").read_text(),
        "reference/cli.md": cli_reference(),
        "reference/spec.md": spec_reference(),
    }
    for path, content in generated.items():
        files.append(File.generated(config, path, content=content))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Links as a reader on GitHub follows them, made site links: the README's `docs/x.md` from the front
    page, and `../README.md` from a page in docs/."""
    readme = page.file.src_uri == "index.md"
    here = "" if readme else posixpath.dirname(f"docs/{page.file.src_uri}")

    def site_link(match: re.Match) -> str:
        opening, path, anchor, closing = match.groups()
        if not path or "://" in path:
            return match.group(0)
        target = posixpath.normpath(posixpath.join(here, path))
        if target == "README.md":
            target = "docs/index.md"
        if not target.startswith("docs/"):
            return match.group(0)
        page_dir = "docs" if readme else here
        return f"{opening}{posixpath.relpath(target, page_dir)}{anchor or ''}{closing}"

    return LINK.sub(site_link, markdown)


# --- the command-line reference ------------------------------------------------------------------------
def cli_reference() -> str:
    """Each command's --help as argparse prints it, at a fixed width (the parser's formatter reads COLUMNS):
    the same page on every machine."""
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "102"
    try:
        return _cli_reference()
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


def _cli_reference() -> str:
    from podrun.cli import build_parser

    parser, every_command = build_parser([])  # without a command named: every command, without options
    parts = ["# Command-line reference", "",
             "Generated from podrun's own argument parser when this site is built: what `podrun COMMAND --help` "
             "prints. [Running jobs](../running-jobs.md) says what the commands do; [exit codes](../exit-codes.md) "
             "lists what they return.", "",
             "## podrun", "", "```text", parser.format_help().rstrip(), "```", ""]
    for name in every_command:
        _, commands = build_parser([name])
        parts += [f"## podrun {name}", "", "```text", commands[name].format_help().rstrip(), "```", ""]
    return "\n".join(parts)


# --- the job spec's reference --------------------------------------------------------------------------
def spec_reference() -> str:
    """One table per object of the spec's JSON Schema: each field, its type, default and description."""
    schema = json.loads(subprocess.run(
        [sys.executable, "-m", "podrun", "schema"], cwd=REPO, check=True, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}).stdout)
    definitions = schema.get("$defs", {})
    parts = ["# Job spec reference", "",
             "Generated from the spec's JSON Schema (`podrun schema`) when this site is built. "
             "[The job spec](../spec.md) explains each field, with examples.", ""]
    parts += object_table("The job spec (top level)", schema)
    for name in sorted(definitions):
        parts += object_table(f"`{name}`", definitions[name])
    return "\n".join(parts)


def object_table(title: str, schema: dict) -> list[str]:
    required = set(schema.get("required", []))
    lines = [f"## {title}", ""]
    if schema.get("description"):
        lines += [schema["description"], ""]
    lines += ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    for field, prop in schema.get("properties", {}).items():
        default = "required" if field in required else (
            f"`{json.dumps(prop['default'])}`" if "default" in prop else "")
        lines.append(f"| `{field}` | {type_of(prop)} | {default} | {cell(prop.get('description', ''))} |")
    return [*lines, ""]


def type_of(prop: dict) -> str:
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in prop:
        return " or ".join(type_of(choice) for choice in prop["anyOf"] if choice.get("type") != "null")
    if "enum" in prop:
        return " \\| ".join(f"`{value}`" for value in prop["enum"])
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {type_of(prop.get('items', {}))}"
    if kind == "object" and "patternProperties" in prop:
        return "map of " + " or ".join(type_of(value) for value in prop["patternProperties"].values())
    bounds = [f"{word} {prop[key]}" for key, word in
              (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤")) if key in prop]
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
