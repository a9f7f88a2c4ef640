"""A rule that raises (a bug in a rule or in gpuwatch) costs only its own verdict: the
other rules are judged as usual, the error is logged once with the rule's file and line,
and the report says it. Shown through `gpuwatch advise` in this process, with one of
the expression language's helpers made to fail for one value no built-in rule reaches."""

from __future__ import annotations

import json
import logging
import re

import pytest
from test_advise_support import DATA

from gpuwatch import cli
from gpuwatch.advisor import expr

BOOM = 12345.0  # pow2floor of exactly this raises: only the rules below ask it
RULES = """\
rules:
  - id: broken-condition
    title: a condition that raises
    severity: info
    when: mean(util, 5s) >= 0 and pow2floor(mean(util, 5s) * 0 + 12345) > 0
    message: never said
    action: none
  - id: broken-evidence
    title: evidence that raises
    severity: info
    when: mean(util, 5s) >= 0
    evidence:
      boom: pow2floor(mean(util, 5s) * 0 + 12345)
    message: busy {boom}
    action: none
"""


@pytest.fixture
def failing_pow2floor(monkeypatch):
    real = expr._pow2floor

    def pow2floor(x: float) -> float | None:
        if x == BOOM:
            raise ZeroDivisionError("made to fail for this test")
        return real(x)
    monkeypatch.setattr(expr, "_pow2floor", pow2floor)


def advise(capsys, *args: str) -> dict:
    assert cli.main(["advise", "--replay", str(DATA / "near_oom.jsonl"),
                     "--format", "json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_failing_rule_costs_only_its_own_verdict(tmp_path, capsys, caplog,
                                                   failing_pow2floor):
    plain = advise(capsys)
    (tmp_path / "mine.yaml").write_text(RULES)
    with caplog.at_level(logging.ERROR, logger="gpuwatch.advisor.engine"):
        got = advise(capsys, "--rules-dir", str(tmp_path))
    # every built-in verdict as without the broken rules, evidence and onsets included
    builtin = [a for a in got["advice"] if not a["id"].startswith("broken-")]
    assert builtin == plain["advice"] and builtin
    # the rule whose condition raised gives nothing; the one whose evidence raised gives
    # its advice without that number
    ids = {a["id"] for a in got["advice"]}
    assert "broken-condition" not in ids
    (ev,) = [a for a in got["advice"] if a["id"] == "broken-evidence"]
    assert ev["message"] == "busy ?" and "boom" not in ev["evidence"]
    # said once per rule in the log, with the rule's place, and in the report's notes
    said = [r for r in caplog.records if "failed evaluating" in r.getMessage()]
    assert len(said) == 2
    assert "broken-condition" in said[0].getMessage() and "mine.yaml:2" in said[0].getMessage()
    assert said[0].exc_info[0] is ZeroDivisionError
    notes = [n for n in got["notes"] if n.startswith("Rule broken-")]
    assert len(notes) == 2
    cond = next(n for n in notes if n.startswith("Rule broken-condition"))
    assert "mine.yaml:2" in cond and "ZeroDivisionError: made to fail" in cond
    assert "judged as not holding" in cond
    evid = next(n for n in notes if n.startswith("Rule broken-evidence"))
    # at its start and at each refresh of the evidence (every 10 s it holds)
    assert re.search(r"failed \d+ times evaluating its evidence", evid)
    assert "advice stands without the numbers" in evid


def test_the_live_advisor_goes_on_past_a_failing_rule(tmp_path, failing_pow2floor):
    from test_advise_live import play

    from gpuwatch.advisor import LiveAdvisor
    from gpuwatch.store import Store
    (tmp_path / "mine.yaml").write_text(RULES)

    class Config:
        rules_dirs = (str(tmp_path),)
    store = Store()
    advisor = LiveAdvisor(store, Config())
    play(store, advisor, "near_oom", every=3)
    report = advisor.report_json()
    ids = [a["id"] for a in report["advice"]]
    assert "enable-gradient-checkpointing" in ids and "broken-evidence" in ids
    assert "broken-condition" not in ids
    assert advisor.last_evaluation is not None
    (n, where, part, said) = advisor.engine.rule_errors["broken-condition"]
    assert n >= 10 and where.endswith("mine.yaml:2") and part == "condition"
