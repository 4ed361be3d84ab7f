"""Warnings the model libraries print at start-up that a user of the server cannot act on, dropped.

transformers warns once per process that a model's ``loss_type`` is unset
(``loss_type=None ... unrecognized``) when anything reads the model's
``loss_function`` property; tracing or exporting a tower reads every
property of the module, so every start printed it. The server never
computes a loss, so the line says nothing about what it serves. Only that
message is dropped: every other warning of the library still reaches the log.
"""

from __future__ import annotations

import logging

_MODELING_LOGGER = "transformers.modeling_utils"
_LOSS_TYPE_PREFIX = "`loss_type="


class _DropLossTypeWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_LOSS_TYPE_PREFIX)


def drop_unactionable_library_warnings() -> None:
    """Install the filter (once per process; calling again adds nothing)."""
    logger = logging.getLogger(_MODELING_LOGGER)
    if not any(isinstance(existing, _DropLossTypeWarning) for existing in logger.filters):
        logger.addFilter(_DropLossTypeWarning())
