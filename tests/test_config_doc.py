"""docs/CONFIG.md documents exactly what the code accepts: every extra-config key (and every
key of the `mooncake` object), and every command and flag of `galahad` (its --help)."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

from hicache_galahad.config.mooncake import MooncakeOptions
from hicache_galahad.config.options import EXTRA_CONFIG_KEYS, SGLANG_KEYS
from hicache_galahad.ops.cli import build_parser

DOC = (Path(__file__).resolve().parent.parent / "docs" / "CONFIG.md").read_text()


def _section(title: str) -> str:
    start = DOC.index(title)
    following = re.search(r"^## ", DOC[start + len(title) :], re.MULTILINE)
    return DOC[start : start + len(title) + following.start()] if following else DOC[start:]


def _table_keys(text: str) -> set[str]:
    return set(re.findall(r"^\| `([a-z_0-9]+)` \|", text, re.MULTILINE))


def test_every_extra_config_key_is_documented_and_every_documented_key_exists():
    keys_section = _section("## Extra-config keys")
    main_table, mooncake_table = keys_section.split("The `mooncake` object", 1)
    assert _table_keys(main_table) == set(EXTRA_CONFIG_KEYS)
    assert _table_keys(mooncake_table) == {
        field.name for field in dataclasses.fields(MooncakeOptions)
    }
    for key in SGLANG_KEYS:
        assert f"`{key}`" in keys_section


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_and_flag_is_documented_and_nothing_else():
    commands = _commands()
    cli_section = _section("## The `galahad` command")
    documented_commands = set(re.findall(r"^### `galahad ([a-z]+)", cli_section, re.MULTILINE))
    assert documented_commands == set(commands)
    for name, parser in commands.items():
        start = cli_section.index(f"### `galahad {name}")
        end = cli_section.find("\n### ", start + 1)
        text = cli_section[start : end if end > 0 else None]
        flags = _flags(parser)
        documented = set(re.findall(r"`(--[a-z][a-z-]*)", text))
        assert documented == flags, name


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    """The long options of a parser and of its subcommands."""
    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found |= _flags(child)
        found |= {option for option in action.option_strings if option.startswith("--")}
    return found - {"--help"}


def test_help_of_every_command_runs():
    for name, parser in _commands().items():
        assert parser.format_help().startswith(f"usage: galahad {name}")
