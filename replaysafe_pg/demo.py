"""placeholder"""
from typing import Any


def run_demo(dsn: str, **kw: Any) -> dict[str, Any]:
    return {}
