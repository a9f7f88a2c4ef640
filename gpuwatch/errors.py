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


def file_problem(verb: str, what: str, path: str, err: OSError) -> str:
    """The one wording of a file gpuwatch could not open, read or write, whichever command
    met it: ``cannot read trace run.jsonl: No such file or directory``."""
    return f"cannot {verb} {what} {path}: {err.strerror or err}"


def file_error(verb: str, what: str, path: str, err: OSError) -> UserError:
    """:func:`file_problem` as the error to raise (``raise file_error(...) from err``)."""
    return UserError(file_problem(verb, what, path, err))
