"""`gpuwatch advise --prometheus` as the fleet report, end to end with real parts.

Debian's Prometheus on loopback scrapes two `gpuwatch run --replay` daemons every second,
as two hosts (an input-bound run on gpu-1, a small-batch run on gpu-2), with the alerting
rules of prometheus/ loaded. The fleet report must give each host its own advice, with
nothing crossing from one host to the other, and --match must narrow it to one host.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from conftest import DATA, PROMETHEUS, REPO, wait_for
from test_advise_support import SIX, run_cli

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="needs prometheus")

HOSTS = {"gpu-1:9442": "input_bound", "gpu-2:9442": "small_batch"}


def offline_ids(recording: str) -> set[str]:
    """The required advice `advise --replay` gives for the whole recording."""
    proc = run_cli("advise", "--replay", str(DATA / f"{recording}.jsonl"), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return {a["id"] for a in json.loads(proc.stdout)["advice"]} & SIX


def fleet(url: str, *extra: str) -> dict[str, Any]:
    proc = run_cli("advise", "--prometheus", url, "--window", "120", "--format", "json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def host_ids(report: dict[str, Any]) -> dict[str, set[str]]:
    return {h["instance"]: {a["id"] for a in h["advice"]} & SIX for h in report["hosts"]}


@pytest.fixture(scope="module")
def expected() -> dict[str, set[str]]:
    want = {inst: offline_ids(rec) for inst, rec in HOSTS.items()}
    # the two recordings must call for different advice, or crossing could not be seen
    assert all(want.values()) and not set.intersection(*want.values()), want
    return want


def test_fleet_report_per_host_nothing_crossing(gpuwatch_daemon, prometheus, expected):
    daemons = {inst: gpuwatch_daemon("--replay", str(DATA / f"{rec}.jsonl"),
                                     "--web.listen-address", "127.0.0.1:0")
               for inst, rec in HOSTS.items()}
    addr = {inst: d.url.removeprefix("http://") for inst, d in daemons.items()}
    prom = prometheus(list(addr.values()), scrape_interval="1s",
                      rule_files=(REPO / "prometheus" / "alerts.yml",),
                      target_labels={a: {"instance": inst} for inst, a in addr.items()})
    for inst in HOSTS:
        prom.wait_for(f'gpuwatch_train_steps_total{{instance="{inst}"}}', timeout=30)

    # poll the CLI until each host has its own advice (a readiness wait: the rules need
    # some seconds of evidence), then judge the last report
    last: dict[str, Any] = {}

    def each_host_advised() -> bool:
        last.update(fleet(prom.url))
        got = host_ids(last)
        return all(expected[inst] <= got.get(inst, set()) for inst in HOSTS)

    wait_for(each_host_advised, "each host's own advice in the fleet report", timeout=60,
             interval=2.0)
    report = last
    assert report["source"]["kind"] == "prometheus"
    assert [h["instance"] for h in report["hosts"]] == sorted(HOSTS)
    got = host_ids(report)
    for inst in HOSTS:
        others = set().union(*(expected[o] for o in HOSTS if o != inst))
        assert got[inst] & others == set(), f"{inst} got another host's advice: {got}"
    for host in report["hosts"]:
        # every GPU of the host, answering; the hook's job with its GPU; its own advice only
        assert [(g["gpu"], g["up"]) for g in host["gpus"]] == [(0, True)]
        assert host["jobs"] and all(j["gpu"] == 0 and j["steps_total"] for j in host["jobs"])
        assert all(a["instance"] == host["instance"] for a in host["advice"])
    # the replays run at their recorded pace: the small-batch run steps far faster
    step = {h["instance"]: h["jobs"][0]["step_seconds"] for h in report["hosts"]}
    assert step["gpu-2:9442"] < step["gpu-1:9442"]
    # each host's step-time breakdown is its own: the input-bound run waits for data
    shares = {h["instance"]: h["jobs"][0]["time_share"] for h in report["hosts"]}
    assert all(shares.values()), shares
    assert max(shares["gpu-1:9442"], key=shares["gpu-1:9442"].get) == "data", shares
    assert shares["gpu-2:9442"]["data"] < 0.1 < shares["gpu-1:9442"]["data"], shares

    # --match narrows the report to one host, and its advice stays that host's
    one = fleet(prom.url, "--match", 'instance=~"gpu-1.*"')
    assert [h["instance"] for h in one["hosts"]] == ["gpu-1:9442"]
    assert {a["instance"] for a in one["advice"]} <= {"gpu-1:9442"}
    assert expected["gpu-1:9442"] <= host_ids(one)["gpu-1:9442"]
    assert one["source"]["selector"] == 'instance=~"gpu-1.*"'

    # the text report groups per host and names each host's job
    text = run_cli("advise", "--prometheus", prom.url, "--window", "120")
    assert text.returncode == 0, text.stderr
    sections = text.stdout.split("\n== ")
    assert [s.split(":", 2)[0] + ":" + s.split(":", 2)[1] for s in sections[1:]] == sorted(HOSTS)
    for section in sections[1:]:
        inst = section.split(":", 2)[0] + ":" + section.split(":", 2)[1]
        assert "\njob pid " in section
        for rule in expected[inst]:
            assert rule in section
        for other in HOSTS:
            if other != inst:
                assert all(rule not in section for rule in expected[other])

    # the alerting rules evaluate against the real series without an error
    groups = prom.api("rules")["groups"]
    assert {g["name"] for g in groups} == {"gpuwatch-exporter", "gpuwatch-gpu-health",
                                           "gpuwatch-advice"}
    bad = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"]
           if r["health"] not in ("ok", "unknown") or r.get("lastError")]
    assert bad == []
    # each daemon's live advice reaches Alertmanager's side as its own alert (pending: the
    # rules' `for` is longer than this test), and healthy hosts raise no health alert
    def advice_alerts() -> set[tuple[str, str]]:
        got = {(a["labels"]["instance"], a["labels"]["rule"])
               for a in prom.api("alerts")["alerts"]
               if a["labels"]["alertname"] == "GpuwatchAdviceWarning"}
        want = {(inst, rule) for inst in HOSTS for rule in expected[inst]}
        return got if want <= got else set()

    got = wait_for(advice_alerts, "advice alerts for each host", timeout=30, interval=1.0)
    for inst, rule in got:
        others = set().union(*(expected[o] for o in HOSTS if o != inst))
        assert rule not in others, f"{inst} alerted another host's advice {rule}"
    other_alerts = {a["labels"]["alertname"] for a in prom.api("alerts")["alerts"]
                    if not a["labels"]["alertname"].startswith("GpuwatchAdvice")}
    assert other_alerts == set()


def test_match_selector_errors(prometheus):
    prom = prometheus(["127.0.0.1:9"], scrape_interval="1s")
    for selector, words in (('instance=~"("', "bad regular expression"),
                            ("instance", 'expected LABEL="VALUE"'),
                            ('instance="a" job="b"', "expected ','"),
                            ('__name__="up"', "__name__ can't be matched"),
                            # Python's re accepts lookahead, Prometheus' RE2 does not
                            ('instance=~"(?=a)"', "refused the query")):
        proc = run_cli("advise", "--prometheus", prom.url, "--match", selector)
        assert proc.returncode == 2, (selector, proc.stdout, proc.stderr)
        assert words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr) < 400, proc.stderr
    proc = run_cli("advise", "--prometheus", prom.url, "--match", 'instance="nowhere"',
                   "--window", "60")
    assert proc.returncode == 2
    assert 'no gpuwatch_* series matching {instance="nowhere"}' in proc.stderr


def test_prometheus_source_errors_are_short(gpuwatch_daemon):
    # nothing listening: one short line naming the URL, no encoded query
    t0 = time.monotonic()
    proc = run_cli("advise", "--prometheus", "http://127.0.0.1:9")
    assert proc.returncode == 2
    assert proc.stderr.startswith("gpuwatch: error: nothing answers at http://127.0.0.1:9 ")
    assert "query_range" not in proc.stderr and len(proc.stderr) < 300, proc.stderr
    assert time.monotonic() - t0 < 30
    # a gpuwatch daemon is not a Prometheus server: say so
    daemon = gpuwatch_daemon("--demo", "--web.listen-address", "127.0.0.1:0")
    proc = run_cli("advise", "--prometheus", daemon.url)
    assert proc.returncode == 2
    assert "is it a Prometheus server?" in proc.stderr and len(proc.stderr) < 400, proc.stderr


def test_window_and_match_need_prometheus(tmp_path):
    # issue #8: --window did nothing with --url although --help said so; now refused
    for args, words in ((("--url", "http://127.0.0.1:9", "--window", "60"), "--window"),
                        (("--window", "60"), "--window"),
                        (("--demo", "--window", "60"), "--window"),
                        (("--url", "http://127.0.0.1:9", "--match", 'instance="a"'), "--match")):
        proc = run_cli("advise", *args)
        assert proc.returncode == 2, args
        assert f"{words} applies to --prometheus only" in proc.stderr, proc.stderr
    help_text = run_cli("advise", "--help").stdout
    assert "--url" not in help_text.split("--window", 1)[1].split("--match", 1)[0]
