"""Logging set-up: one line per event on stderr, and 'say once' helpers."""

from __future__ import annotations

import logging
import threading

_said: set[str] = set()
_said_lock = threading.Lock()


def setup(level: str = "info") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def once(logger: logging.Logger, key: str, level: int, msg: str, *args: object) -> None:
    """Log ``msg`` the first time ``key`` is seen in this process, never again."""
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    logger.log(level, msg, *args)
