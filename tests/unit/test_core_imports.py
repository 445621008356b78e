"""``import replaysafe_pg`` needs no LangGraph: replaysafe_pg.langgraph is an extra."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_core_package_loads_no_langgraph() -> None:
    code = ("import sys, replaysafe_pg, replaysafe_pg.ledger, replaysafe_pg.threads, "
            "replaysafe_pg.keys, replaysafe_pg.reconcile\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('langgraph', 'langchain_core') or m.startswith('replaysafe_pg.langgraph'))\n"
            "print(bad)\n"
            "assert not bad, bad")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
