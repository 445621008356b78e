"""The agent of docs/langgraph.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("langgraph")

DOC = Path(__file__).resolve().parents[2] / "docs" / "langgraph.md"


def test_the_react_agent_example_runs(dsn: str, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    example = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)[0]
    monkeypatch.setenv("REPLAYSAFE_DSN", dsn)
    exec(compile(example, str(DOC), "exec"), {"__name__": "docs_example"})
    assert "Done: refunded 1500 on o_42" in capsys.readouterr().out
