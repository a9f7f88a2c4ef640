"""The exception hierarchy: a few classes with messages a user can act on."""

from __future__ import annotations


class GpuwatchError(Exception):
    """Base of every error gpuwatch raises on purpose."""


class UserError(GpuwatchError):
    """Bad input from the user (a file, a flag, a rule): shown as one clear message, exit 2."""


class FileFormatError(UserError):
    """A file that does not parse: names the file and line, and what was expected.

    ``problems`` holds every problem found as (line, message); a file with several
    problems is reported in one message rather than one at a time.
    """

    def __init__(self, path: str, problems: list[tuple[int | None, str]]) -> None:
        self.path = path
        self.problems = list(problems)
        lines = [f"{path}:{line}: {msg}" if line is not None else f"{path}: {msg}"
                 for line, msg in self.problems]
        super().__init__("\n".join(lines))
