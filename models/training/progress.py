"""How a long job in ``models`` (``mmserve train-fusion``) reports progress without knowing who watches.

The job asks a ``ProgressFactory`` for one bar per stage, with the stage's
total steps; the command line passes ``tqdm`` (whose constructor has this
shape when called with keywords, see ``server.cli``), tests pass nothing and
get ``silent_progress``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class ProgressBar(Protocol):
    def update(self, n: int = 1) -> object: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> object: ...

    def close(self) -> object: ...


ProgressFactory = Callable[[str, int], ProgressBar]  # (description, total steps) -> a bar


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def silent_progress(description: str, total: int) -> ProgressBar:
    """A bar that shows nothing."""
    return _Silent()
