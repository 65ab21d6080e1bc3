"""Fixtures of the agent tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.agent.agentkit import AgentProcess


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    """The agents a test starts (:func:`tests.agent.agentkit.start_agent`), killed at its end."""
    procs: list[AgentProcess] = []
    yield procs
    for p in procs:
        p.kill()
