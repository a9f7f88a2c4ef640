"""The alerting rules in prometheus/: promtool's checks, their unit tests, and the
mixin conventions every alert keeps (name, severity, annotations, a runbook section).

The unit tests themselves are promtool's (prometheus/tests/*.yml); this file runs them
and proves they would catch a broken alert: each alert in turn is made unable to fire
and the unit tests must fail.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import PROMTOOL, REPO

pytestmark = pytest.mark.skipif(PROMTOOL is None,
                                reason="promtool is not installed (apt-get install prometheus)")

PROM_DIR = REPO / "prometheus"
ALERTS = PROM_DIR / "alerts.yml"
UNIT_TESTS = sorted((PROM_DIR / "tests").glob("*.yml"))
DOC = REPO / "docs" / "alerts.md"
SEVERITIES = {"critical", "warning", "info"}


def promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def alert_rules(path: Path = ALERTS) -> list[dict]:
    doc = yaml.safe_load(path.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def doc_anchors() -> set[str]:
    # GitHub's anchors: lower case, spaces to '-', punctuation dropped
    heads = re.findall(r"^#+\s+(.+?)\s*$", DOC.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in heads}


def test_promtool_check_rules_is_clean():
    files = sorted(PROM_DIR.glob("*.yml"))
    assert ALERTS in files
    proc = promtool("check", "rules", *map(str, files))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # promtool also warns (exit 0) about e.g. duplicate rules: none here
    assert "warning" not in (proc.stdout + proc.stderr).lower(), proc.stdout + proc.stderr


def test_promtool_unit_tests_pass():
    assert UNIT_TESTS, "no promtool unit tests in prometheus/tests/"
    proc = promtool("test", "rules", *map(str, UNIT_TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_follows_the_mixin_conventions():
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), "alert names must be unique"
    anchors = doc_anchors()
    for r in rules:
        name = r["alert"]
        assert re.fullmatch(r"Gpuwatch(?:[A-Z][a-z0-9]+)+", name), name
        assert r.get("labels", {}).get("severity") in SEVERITIES, name
        notes = r.get("annotations", {})
        assert notes.get("summary") and notes.get("description"), name
        url = notes.get("runbook_url", "")
        assert url == f"docs/alerts.md#{name.lower()}", (name, url)
        assert name.lower() in anchors, f"docs/alerts.md has no section for {name}"


def test_every_alert_has_firing_and_quiet_unit_tests():
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in UNIT_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {r["alert"] for r in alert_rules()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested quiet"
    assert (firing | quiet) - names == set(), "unit tests name alerts that do not exist"


def test_unit_tests_catch_an_alert_that_cannot_fire(tmp_path: Path):
    """Each alert in turn loses its expression (one that never returns anything): its unit
    tests must notice every time, so none of them passes vacuously. Each broken copy runs
    only the test cases that check that alert, which keeps this fast."""
    # (the test file's evaluation interval, a test case) for every case of every file
    cases = []
    for path in UNIT_TESTS:
        doc = yaml.safe_load(path.read_text())
        cases += [(doc.get("evaluation_interval", "1m"), case) for case in doc["tests"]]
    survivors = []
    for gi, group in enumerate(yaml.safe_load(ALERTS.read_text())["groups"]):
        for ri, rule in enumerate(group["rules"]):
            if "alert" not in rule:
                continue
            name = rule["alert"]
            work = tmp_path / name
            (work / "tests").mkdir(parents=True)
            broken = yaml.safe_load(ALERTS.read_text())
            broken["groups"][gi]["rules"][ri]["expr"] = "vector(1) == 2"
            (work / "alerts.yml").write_text(yaml.safe_dump(broken, sort_keys=False))
            units = []
            for n, (every, case) in enumerate(cases):
                checks = [c for c in case.get("alert_rule_test", []) if c["alertname"] == name]
                if checks:
                    unit = work / "tests" / f"case{n}.yml"
                    unit.write_text(yaml.safe_dump({
                        "rule_files": ["../alerts.yml"], "evaluation_interval": every,
                        "tests": [{**case, "alert_rule_test": checks}]}))
                    units.append(str(unit))
            assert units, f"no unit test checks {name}"
            if promtool("test", "rules", *units).returncode == 0:
                survivors.append(name)
    assert survivors == []
