"""Typed errors of the protocol adapters."""

from __future__ import annotations


class RowFailedError(Exception):
    """One row of a multi-row request was refused or failed; ``error`` says why.

    The whole request fails with it (both protocols answer a request as a
    unit), and the answer names the row so the client can find the bad item.
    """

    def __init__(self, row_index: int, error: Exception) -> None:
        super().__init__(f"row {row_index}: {error}")
        self.row_index = row_index
        self.error = error
