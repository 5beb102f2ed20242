"""argparse for the non-Hydra commands, with the project's error contract."""

from __future__ import annotations

import argparse
from typing import NoReturn

from raco_cli.errors import ConfigError


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (ConfigError: exit 2, no usage dump).

    ``command`` names the command in the message (default: the parser's ``prog``); a
    subclass sets it so that its sub-command parsers, which argparse builds from the same
    class, report under the parent command's name.
    """

    command: str | None = None

    def error(self, message: str) -> NoReturn:
        name = self.command or self.prog
        raise ConfigError(f"{name}: {message} (see {name} --help)")
