"""The command-line reference page, generated from ``strategyjob.cli.build_parser()`` (the
parser the command uses), so every option is described once, in its ``help``."""

from __future__ import annotations

import argparse
import os

from strategyjob.cli import build_parser


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands by name, in the order ``--help`` lists them."""
    for action in parser._actions:  # noqa: SLF001 -- argparse declares no public way to list them
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001 -- the same
            return dict(action.choices)
    return {}


def render() -> str:
    """The page: the top-level help, then each subcommand's, as ``--help`` prints them."""
    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal's width: fix it for the page
    parser = build_parser()
    out = [
        "# `strategyjob` command line",
        "",
        "Generated from the command's own parser: what `strategyjob COMMAND --help` prints.",
        "",
        "```text",
        parser.format_help().rstrip(),
        "```",
    ]
    for name, sub in subcommands(parser).items():
        out += ["", f"## `strategyjob {name}`", "", "```text", sub.format_help().rstrip(), "```"]
    return "\n".join(out) + "\n"
