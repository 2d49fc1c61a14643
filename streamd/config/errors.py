"""The one exception a bad config raises, and the exit code that goes with it."""

from __future__ import annotations

from collections.abc import Iterable

EX_CONFIG = 78
"""Exit status for a bad config (sysexits.h EX_CONFIG); systemd units can treat it as 'do not restart'."""


class ConfigError(Exception):
    """Every problem found in one config, one line each: ``file:line: key.path: what was expected, what
    was found, how to fix it``. Raised once, after all problems are collected."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems: list[str] = list(problems)
        super().__init__(self.problems)

    def __str__(self) -> str:
        return "\n".join(self.problems)
