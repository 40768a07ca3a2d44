"""The command line's argparse: errors that name the closest spelling, help that shows each default."""

from __future__ import annotations

import argparse
import re
from typing import Any, NoReturn

from service.cli.errors import EXIT_USAGE, CliError, closest


class HelpFormatter(argparse.HelpFormatter):
    """Every option's default in its help, unless it has none worth showing (None, False, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default: Any = action.default
        shown = default not in (None, False, [], argparse.SUPPRESS) and "%(default)" not in text
        if shown and action.option_strings and not isinstance(action, argparse._VersionAction):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """argparse whose errors name the closest command, choice or option, and go through `report`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        hint = self._suggestion(message)
        raise CliError(message + (f"; did you mean {hint!r}?" if hint else ""), EXIT_USAGE, self.format_usage())

    def _suggestion(self, message: str) -> str | None:
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            return closest(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        unknown = re.match(r"unrecognized arguments: (\S+)", message)
        if unknown and unknown.group(1).startswith("-"):
            return closest(unknown.group(1), self._every_option())
        return None

    def _every_option(self) -> set[str]:
        options = set(self._option_string_actions)
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    options |= set(sub._option_string_actions)
        return options
