"""The Prometheus alert rules that ship with the package (replaysafe_pg/alerts), checked
with ``promtool test rules`` against what ``replaysafe-pg metrics`` prints for a real
database in each state: an action unknown for 14, 16 and 20 minutes, a multi-effect action,
an expired lease nobody sweeps, and a healthy database. The printed samples become promtool
input series held constant over time; each alert must fire when it should and not before.

promtool comes with Debian's ``prometheus`` package (.ci/run installs it as root); without
it these tests are skipped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import run
from prometheus_client.parser import text_string_to_metric_families

from replaysafe_pg import Ledger, Threads

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (Debian: apt-get install prometheus; .ci/run does it as root)")

RULES = Path(str(files("replaysafe_pg") / "alerts" / "replaysafe-rules.yml"))
OPERABILITY = Path(__file__).resolve().parents[2] / "docs" / "operability.md"
AGE = "ReplaysafeUnknownActionsTooOld"
MULTI = "ReplaysafeMultiEffectAction"
SWEEP = "ReplaysafeExpiredLeasesNotSwept"
ALERTS = (AGE, MULTI, SWEEP)
# How long the input series last, in minutes (one sample a minute).
SPAN = 40


# --- the database in each state (as the schema owner, backdated with the functions' p_now) ---

def healthy(dsn: str) -> None:
    """Finished, failed, retryable and live actions and a thread: nothing needs attention."""
    with Ledger(dsn, tenant_id="A", worker_id="w") as led:
        led.complete(led.claim("done", "refund", {}), {"ok": True})
        led.fail(led.claim("refused", "refund", {}), {"reason": "card_closed"})
        led.fail(led.claim("again", "refund", {}), {"reason": "rate_limited"}, retryable=True)
        led.claim("live", "refund", {}, lease=timedelta(hours=1))
    with Threads(dsn, tenant_id="A", user_id="u") as th:
        th.write("t", {"n": 1}, 0)


def unknown_for(minutes: float) -> Callable[[str], None]:
    def seed(dsn: str) -> None:
        became_unknown = datetime.now(UTC) - timedelta(minutes=minutes)
        with Ledger(dsn, tenant_id="A", worker_id="w") as led:
            claim = led.claim("u", "refund", {}, lease=timedelta(seconds=30),
                              now=became_unknown - timedelta(seconds=5))
            led.mark_unknown(claim, {"reason": "timeout"}, now=became_unknown)
    return seed


def multi_effect(dsn: str) -> None:
    """Two succeeded attempts: attempt 1's lease expired (reclaim), attempt 2 claimed and
    succeeded, then attempt 1 reported its success too."""
    now = datetime.now(UTC)
    with Ledger(dsn, tenant_id="A", worker_id="w") as led:
        first = led.claim("m", "refund", {}, lease=timedelta(minutes=1), on_expired="reclaim",
                          now=now - timedelta(minutes=10))
        second = led.claim("m", "refund", {}, on_expired="reclaim")
        assert second.attempt == 2
        led.complete(second, {"n": 2})
        led.complete(first, {"n": 1})


def expired_lease(dsn: str) -> None:
    """A running action whose 30-second lease expired a minute ago; no sweep ran."""
    with Ledger(dsn, tenant_id="A", worker_id="w") as led:
        led.claim("e", "refund", {}, lease=timedelta(seconds=30),
                  now=datetime.now(UTC) - timedelta(seconds=90))


# --- metrics output -> promtool ---------------------------------------------------------------

def scraped(dsn: str, *options: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample ``replaysafe-pg metrics`` prints."""
    result = run("metrics", *options, dsn=dsn)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return [(s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(result.stdout) for s in family.samples]


def _selector(name: str, labels: dict[str, str]) -> str:
    def quoted(value: str) -> str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    inside = ",".join(f"{k}={quoted(v)}" for k, v in sorted(labels.items()))
    return f"{name}{{{inside}}}"


def input_series(samples: list[tuple[str, dict[str, str], float]]) -> list[dict[str, str]]:
    """Each sample as a series holding its value for SPAN minutes."""
    return [{"series": _selector(name, labels), "values": f"{value!r}x{SPAN}"}
            for name, labels, value in samples]


def value_of(samples: list[tuple[str, dict[str, str], float]], name: str) -> float:
    (value,) = [v for n, _labels, v in samples if n == name]
    return value


def humanize_duration(seconds: float) -> str:
    """Prometheus' humanizeDuration for a value of a second or more."""
    s = int(seconds)
    days, hours, minutes, secs = s // 86400, s // 3600 % 24, s // 60 % 60, s % 60
    if days:
        return f"{days}d {hours}h {minutes}m {secs}s"
    if hours:
        return f"{hours}h {minutes}m {secs}s"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def firing(alert: str, value: float, tenant: str | None = "A") -> dict[str, Any]:
    """The alert as promtool must see it: labels and annotations, rendered."""
    where = f" (tenant {tenant})" if tenant is not None else ""
    labels = {"severity": "critical" if alert == MULTI else "warning"}
    if tenant is not None:
        labels["tenant"] = tenant
    shown = f"{value:g}"
    annotations = {
        AGE: {
            "summary": f"An action has been unresolved for more than 15 minutes{where}",
            "description": "The oldest unknown action (or running action with an expired lease) "
                           f"has waited {humanize_duration(value)}: nobody knows whether its "
                           "effect happened. Reconcile it with the provider, or resolve it by "
                           "hand.",
        },
        MULTI: {
            "summary": f"{shown} action(s) had their effect more than once{where}",
            "description": "Two or more attempts of the same action succeeded: the side effect "
                           "(a refund, an email, a payment) happened more than once. Undo the "
                           "extra effect at the provider; find the actions with "
                           "`replaysafe-pg audit`.",
        },
        SWEEP: {
            "summary": f"{shown} expired lease(s) not swept for 10 minutes{where}",
            "description": "Running actions whose worker stopped renewing the lease have not "
                           "been turned unknown by a sweep: is the `replaysafe-pg sweep` job "
                           "running?",
        },
    }[alert]
    annotations["runbook_url"] = f"docs/operability.md#{alert.lower()}"
    return {"exp_labels": labels, "exp_annotations": annotations}


Checks = list[tuple[str, str, list[dict[str, Any]]]]  # (eval time, alert, the alerts firing)


def promtool_test(tmp_path: Path, series: list[dict[str, str]],
                  checks: Checks) -> subprocess.CompletedProcess[str]:
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": alerts}
                                for at, alert, alerts in checks],
        }],
    }
    # JSON is YAML: promtool reads it as its test file.
    path = tmp_path / "replaysafe-rules.test.yml"
    path.write_text(json.dumps(test, indent=2))
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True,
                          timeout=60)


def assert_rules_pass(tmp_path: Path, series: list[dict[str, str]], checks: Checks) -> None:
    done = promtool_test(tmp_path, series, checks)
    assert done.returncode == 0, done.stdout + done.stderr


def quiet(at: str, *alerts: str) -> Checks:
    return [(at, alert, []) for alert in alerts]


# --- the tests ----------------------------------------------------------------------------------

def test_the_rules_file_is_valid() -> None:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 rules found" in done.stdout


def test_metrics_alert_rules_prints_the_shipped_file() -> None:
    result = run("metrics", "--alert-rules")
    assert result.exit_code == 0
    assert result.stdout == RULES.read_text()


def test_each_alert_has_a_runbook_entry_in_the_docs() -> None:
    headings = {line.removeprefix("### ").strip() for line in OPERABILITY.read_text().splitlines()
                if line.startswith("### ")}
    assert set(ALERTS) <= headings, headings


def test_a_healthy_database_fires_no_alert(dsn: str, tmp_path: Path) -> None:
    healthy(dsn)
    samples = scraped(dsn)
    assert value_of(samples, "replaysafe_oldest_unresolved_age_seconds") == 0
    checks = [c for at in ("0m", "11m", "30m") for c in quiet(at, *ALERTS)]
    assert_rules_pass(tmp_path, input_series(samples), checks)


def test_an_action_unknown_for_14_minutes_is_inside_the_window(dsn: str, tmp_path: Path) -> None:
    unknown_for(14)(dsn)
    samples = scraped(dsn)
    assert 840 <= value_of(samples, "replaysafe_oldest_unresolved_age_seconds") < 900
    checks = quiet("0m", *ALERTS) + quiet("30m", *ALERTS)
    assert_rules_pass(tmp_path, input_series(samples), checks)


@pytest.mark.parametrize("minutes", [16, 20])
def test_an_action_unknown_past_the_window_fires_at_once(dsn: str, tmp_path: Path,
                                                         minutes: int) -> None:
    unknown_for(minutes)(dsn)
    samples = scraped(dsn)
    age = value_of(samples, "replaysafe_oldest_unresolved_age_seconds")
    assert minutes * 60 <= age < minutes * 60 + 60
    checks: Checks = [("0m", AGE, [firing(AGE, age)]), ("5m", AGE, [firing(AGE, age)]),
                      *quiet("0m", MULTI, SWEEP), *quiet("11m", MULTI, SWEEP)]
    assert_rules_pass(tmp_path, input_series(samples), checks)


def test_a_multi_effect_action_fires_at_once(dsn: str, tmp_path: Path) -> None:
    multi_effect(dsn)
    samples = scraped(dsn)
    assert value_of(samples, "replaysafe_multi_effect_actions") == 1
    checks: Checks = [("0m", MULTI, [firing(MULTI, 1)]), *quiet("0m", AGE, SWEEP),
                      *quiet("11m", AGE, SWEEP)]
    assert_rules_pass(tmp_path, input_series(samples), checks)


def test_totals_without_the_tenant_label_fire_without_one(dsn: str, tmp_path: Path) -> None:
    multi_effect(dsn)
    samples = scraped(dsn, "--no-tenant-label")
    assert all("tenant" not in labels for _name, labels, _v in samples), samples
    checks: Checks = [("0m", MULTI, [firing(MULTI, 1, tenant=None)])]
    assert_rules_pass(tmp_path, input_series(samples), checks)


def test_an_unswept_expired_lease_fires_after_twice_the_sweep_interval(
        dsn: str, tmp_path: Path) -> None:
    expired_lease(dsn)
    samples = scraped(dsn)
    assert value_of(samples, "replaysafe_expired_leases") == 1
    assert value_of(samples, "replaysafe_oldest_unresolved_age_seconds") < 900
    checks: Checks = [*quiet("0m", *ALERTS), *quiet("9m", *ALERTS),
                      ("11m", SWEEP, [firing(SWEEP, 1)]), *quiet("11m", AGE, MULTI)]
    assert_rules_pass(tmp_path, input_series(samples), checks)


def test_the_checks_would_catch_an_alert_that_fires_too_early(dsn: str, tmp_path: Path) -> None:
    """The harness is not vacuous: claiming the sweep alert fires at 9 minutes fails."""
    expired_lease(dsn)
    done = promtool_test(tmp_path, input_series(scraped(dsn)),
                         [("9m", SWEEP, [firing(SWEEP, 1)])])
    assert done.returncode != 0
    assert SWEEP in done.stdout + done.stderr
