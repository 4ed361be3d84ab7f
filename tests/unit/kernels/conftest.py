"""Run every kernel test under the Triton interpreter, on the CPU.

The variable is set per test (not at import), on purpose: ``kernels`` is
imported during collection, before this fixture runs, which is the order the
server and model tests produce too. The kernels pick their mode at launch, so
this must still work.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
