"""The Grafana dashboards and Prometheus recording rules, against real parts.

Two ``gpuwatch run --replay`` daemons (two recordings, as two hosts), a real Prometheus
scraping them every second with prometheus/recording.yml loaded; then every PromQL
expression of every dashboard panel and every rule goes through Prometheus' HTTP API:
accepted, naming only series the exporter declares, and returning data wherever the
recordings carry it. The dashboards are also rendered to PNG from that data.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time

import pytest
import yaml
from conftest import DATA, PROMTOOL, REPO, http_get, wait_for

if str(REPO) not in sys.path:  # grafana/ is a folder of the checkout, not of the package
    sys.path.insert(0, str(REPO))

from grafana import render as gr  # noqa: E402

DASHBOARDS = sorted((REPO / "grafana" / "dashboards").glob("*.json"))
RECORDING = REPO / "prometheus" / "recording.yml"
ALERTS = REPO / "prometheus" / "alerts.yml"
PROVISIONING = REPO / "grafana" / "provisioning"
HOSTS = ("h200_input_bound_w2.jsonl", "h200_fp16_collapse.jsonl")

# panels whose series no recording in tests/data carries, and why
NO_DATA_IN_RECORDINGS = {
    ("gpuwatch-fleet", "XID errors (5 min)"): "no recording holds an XID error",
}

HAVE_SDK = importlib.util.find_spec("grafana_foundation_sdk") is not None
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")


def boards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in DASHBOARDS}


def recording_rules() -> dict[str, str]:
    groups = yaml.safe_load(RECORDING.read_text())["groups"]
    return {r["record"]: r["expr"] for g in groups for r in g["rules"]}


def alert_rules() -> dict[str, str]:
    if not ALERTS.exists():
        return {}
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"] if "alert" in r}


def metric_names(expr: str) -> set[str]:
    """gpuwatch series and recording rules an expression names (strings, label matchers and
    grouping lists cannot hold one)."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}", "{}", bare)
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", bare)
    return set(re.findall(r"\b(gpuwatch_[a-z0-9_]+|[a-z_]+:[a-z0-9_]+:[a-z0-9_]+)", bare))


def base_names(names: set[str], rules: dict[str, str]) -> set[str]:
    """``names`` with each recording rule replaced by the series its expression reads."""
    out = set()
    for name in names:
        out |= base_names(metric_names(rules[name]), rules) if name in rules else {name}
    return out


def all_queries() -> list[tuple[str, gr.Panel, str]]:
    """(dashboard uid, panel, the expression with every variable set to All)."""
    out = []
    for uid, board in boards().items():
        values = gr.all_values(board, 1.0)
        for panel in gr.panels(board):
            for target in panel.targets:
                out.append((uid, panel, gr.substitute(target.expr, values)))
    return out


# -- the files themselves -------------------------------------------------------------

@pytest.mark.skipif(not HAVE_SDK, reason="grafana-foundation-sdk is not installed "
                                         "(pip install -e '.[dashboards]')")
def test_committed_dashboards_are_what_the_builder_makes(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "grafana.build", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    built = {p.name: p.read_text() for p in tmp_path.glob("*.json")}
    committed = {p.name: p.read_text() for p in DASHBOARDS}
    assert built.keys() == committed.keys()
    stale = [name for name in built if built[name] != committed[name]]
    assert not stale, f"{stale} differ from what grafana/build.py makes: run python3 -m grafana.build"
    check = subprocess.run([sys.executable, "-m", "grafana.build", "--check"], cwd=REPO,
                           capture_output=True, text=True, timeout=120, check=False)
    assert check.returncode == 0, check.stderr


def test_dashboards_are_grafana_10_with_the_variables_units_and_legends():
    assert {p.stem for p in DASHBOARDS} == {"gpuwatch-fleet", "gpuwatch-node",
                                            "gpuwatch-training"}
    for uid, board in boards().items():
        assert board["uid"] == uid and board["schemaVersion"] >= 36
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for name in ("instance", "gpu"):
            v = variables[name]
            assert v["type"] == "query" and v["multi"] and v["includeAll"], (uid, name)
            assert v["allValue"] == ".*" and v["datasource"]["uid"] == "${datasource}"
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), uid
        for panel in gr.panels(board):
            where = f"{uid} / {panel.title}"
            assert panel.type in {"timeseries", "stat", "state-timeline"}, where
            assert panel.raw["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel.unit, f"{where} has no unit"
            assert panel.raw.get("description"), f"{where} has no description"
            assert panel.targets, where
            for target in panel.targets:
                assert '$instance' in target.expr, f"{where}: {target.expr} ignores $instance"
                grouped = re.search(r"^\w+ by \(([^)]*)\)", target.expr)
                if panel.type == "stat" or (grouped and "instance" not in grouped.group(1)):
                    continue  # one number, or aggregated over hosts on purpose
                assert "{{instance}}" in target.legend, f"{where}: legend without the host"
                if 'gpu=~"$gpu"' in target.expr and "by (instance)" not in target.expr:
                    assert "GPU {{gpu}}" in target.legend, f"{where}: legend without the GPU"


def test_each_dashboard_shows_what_it_is_for():
    rules = recording_rules()
    wanted = {
        "gpuwatch-fleet": {
            "gpuwatch_gpu_utilization_ratio", "gpuwatch_gpu_sm_active_ratio",
            "gpuwatch_gpu_tensor_active_ratio", "gpuwatch_gpu_memory_used_bytes",
            "gpuwatch_gpu_power_watts", "gpuwatch_gpu_temperature_celsius",
            "gpuwatch_gpu_clock_event_reason", "gpuwatch_gpu_xid_errors_total",
            "gpuwatch_gpu_ecc_errors_total", "gpuwatch_gpu_remapped_rows",
            "gpuwatch_gpu_up", "gpuwatch_advice_active"},
        "gpuwatch-node": {
            "gpuwatch_process_gpu_memory_used_bytes", "gpuwatch_host_cpu_utilization_ratio",
            "gpuwatch_host_cpu_core_utilization_ratio", "gpuwatch_gpu_clock_event_reason",
            "gpuwatch_advice_active"},
        "gpuwatch-training": {
            "gpuwatch_train_step_seconds", "gpuwatch_train_samples_per_second",
            "gpuwatch_train_data_wait_ratio", "gpuwatch_train_loss_scale",
            "gpuwatch_train_skipped_steps_total", "gpuwatch_train_memory_allocated_bytes",
            "gpuwatch_job_main_cpu_cores", "gpuwatch_job_workers_cpu_cores",
            "gpuwatch_train_time_share_ratio", "gpuwatch_advice_active"},
    }
    for uid, board in boards().items():
        used = set()
        for panel in gr.panels(board):
            for target in panel.targets:
                used |= base_names(metric_names(target.expr), rules)
        assert wanted[uid] - used == set(), uid
    # the fleet's throttle reasons are a state timeline
    fleet = boards()["gpuwatch-fleet"]
    assert any(p.type == "state-timeline" and "clock_event_reason" in p.targets[0].expr
               for p in gr.panels(fleet))


def test_provisioning_points_grafana_at_the_dashboards_and_the_data_source():
    ds = yaml.safe_load((PROVISIONING / "datasources" / "gpuwatch.yaml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["uid"] == "gpuwatch-prometheus"
    for board in boards().values():
        (var,) = [v for v in board["templating"]["list"] if v["name"] == "datasource"]
        assert var["current"]["value"] == source["uid"]
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "gpuwatch.yaml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")


@needs_promtool
def test_recording_rules_pass_promtool_and_follow_the_naming():
    proc = subprocess.run([PROMTOOL, "check", "rules", str(RECORDING)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in recording_rules():
        assert re.fullmatch(r"[a-z_]+:gpuwatch_[a-z0-9_]+:[a-z0-9_]+", name), name
    # each one is used by a dashboard, or it is only load on Prometheus
    used = set()
    for _, _, expr in all_queries():
        used |= metric_names(expr)
    assert set(recording_rules()) - used == set()


def test_metric_names_sees_series_and_rules_but_not_labels():
    # the extraction the end-to-end test relies on
    expr = ('sum by (instance, gpu) (rate(gpuwatch_gpu_xid_errors_total{xid="gpuwatch_no"}'
            '[5m])) / on (instance) instance:gpuwatch_gpu_power_watts:sum')
    assert metric_names(expr) == {"gpuwatch_gpu_xid_errors_total",
                                  "instance:gpuwatch_gpu_power_watts:sum"}


# -- end to end -----------------------------------------------------------------------

def _declared(daemons) -> set[str]:
    names = set()
    for d in daemons:
        status, _, text = http_get(d.url + "/metrics")
        assert status == 200
        names |= set(re.findall(r"^# HELP (\S+) ", text, re.M))
    return names


@pytest.mark.slow
def test_every_dashboard_and_rule_query_against_two_hosts(gpuwatch_daemon, prometheus,
                                                          tmp_path):
    daemons = [gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--quiet", "--replay",
                               str(DATA / name)) for name in HOSTS]
    targets = [d.url.removeprefix("http://") for d in daemons]
    rule_files = [RECORDING] + ([ALERTS] if ALERTS.exists() else [])
    prom = prometheus(targets, scrape_interval="1s", rule_files=tuple(rule_files))
    started = time.time()
    wait_for(lambda: len(prom.query('up{job="gpuwatch"} == 1')) == 2,
             "Prometheus to scrape both daemons", 60, prom.proc)

    # every family is declared from the first scrape on, sampled or not
    declared = _declared(daemons)
    rules = recording_rules()
    loaded = {r["name"] for g in prom.api("rules")["groups"] for r in g["rules"]}
    assert set(rules) <= loaded, "Prometheus did not load every recording rule"

    # every query is accepted and names only declared series or recording rules
    def check_names(where: str, expr: str) -> None:
        for name in metric_names(expr):
            if name in rules:
                continue
            assert name in declared, f"{where}: {name} is not declared by the exporter"

    queries = all_queries()
    for uid, panel, expr in queries:
        prom.api("query", query=expr)  # raises with Prometheus' error if rejected
        check_names(f"{uid} / {panel.title}", expr)
    for name, expr in [*rules.items(), *alert_rules().items()]:
        prom.api("query", query=expr)
        check_names(name, expr)

    # the panels whose data the recordings carry return data (from at least one of their
    # queries: a panel may also draw a series that only a real GPU host has)
    wanted: dict[tuple[str, str], list[str]] = {}
    for uid, panel, expr in queries:
        if (uid, panel.title) in NO_DATA_IN_RECORDINGS:
            continue
        wanted.setdefault((uid, panel.title), []).append(expr)

    def has_data(exprs: list[str]) -> bool:
        return any(prom.api("query_range", query=e, start=str(started), end=str(time.time()),
                            step="1")["result"] for e in exprs)

    left = dict(wanted)
    deadline = time.monotonic() + 75
    while left and time.monotonic() < deadline:
        left = {key: exprs for key, exprs in left.items() if not has_data(exprs)}
        if left:
            time.sleep(1)
    assert not left, "no data in: " + "; ".join(f"{u} / {t}" for u, t in sorted(left))
    # both hosts appear, each under its own instance, in a per-GPU panel
    util = prom.query('gpuwatch_gpu_utilization_ratio{instance=~".*"}')
    assert {r["metric"]["instance"] for r in util} == set(targets)

    # what a user would see: every dashboard rendered from this data, nothing empty that
    # the recordings carry
    counts = gr.render_all(gr.Prometheus(prom.url), tmp_path, started, time.time(), step=1.0)
    for uid, per_panel in counts.items():
        assert (tmp_path / f"dashboard-{uid.removeprefix('gpuwatch-')}.png").stat().st_size > 0
        for title, n in per_panel.items():
            if (uid, title) in wanted:
                assert n > 0, f"{uid} / {title} rendered empty"


def test_every_stat_panel_says_how_it_reduces_its_range():
    """A "mean" stat is the mean over the dashboard's range, not its last sample (issue 15:
    "Mean GPU utilization 0 %" beside graphs near 100 %); counts and states are now."""
    seen = 0
    for uid, board in boards().items():
        for panel in gr.panels(board):
            if panel.type != "stat":
                continue
            seen += 1
            calcs = panel.raw["options"]["reduceOptions"]["calcs"]
            desc = panel.raw["description"]
            if panel.title.startswith("Mean "):
                assert calcs == ["mean"], (uid, panel.title, calcs)
                assert desc.endswith("Mean over the dashboard's time range."), desc
            else:
                assert calcs == ["lastNotNull"], (uid, panel.title, calcs)
                assert desc.endswith("Now (the last sample in the time range)."), desc
    assert seen >= 8


def test_the_renderer_reduces_a_stat_as_the_panel_says():
    fleet = boards()["gpuwatch-fleet"]
    stats = {p.title: p for p in gr.panels(fleet) if p.type == "stat"}
    busy_then_idle = [0.95, 0.97, 0.96, 0.98, float("nan"), 0.0]
    mean = gr.reduce_series(stats["Mean GPU utilization"], busy_then_idle)
    assert mean == pytest.approx(sum([0.95, 0.97, 0.96, 0.98, 0.0]) / 5)
    assert gr.reduce_series(stats["Hosts reporting"], [1.0, 2.0, 2.0]) == 2.0
    odd = dict(stats["Hosts reporting"].raw, options={"reduceOptions": {"calcs": ["delta"]}})
    with pytest.raises(ValueError, match="delta"):
        gr.reduce_series(gr.Panel("x", "Odd", "stat", "none", (), {}, odd), [1.0])


def test_the_renderer_writes_units_as_grafana_does():
    assert gr.format_value(0.5, "percentunit") == "50%"
    assert gr.format_value(80 * 2**30, "bytes") == "80 GiB"
    assert gr.format_value(1.98e9, "hertz") == "1.98 GHz"
    assert gr.format_value(0.023, "s") == "23 ms"
    assert gr.format_value(3200, "suffix: samples/s") == "3.2 K samples/s"
    assert gr.format_value(2.0, "none", decimals=0) == "2"


def test_every_variable_a_query_uses_is_given_a_value():
    for board in boards().values():
        values = gr.all_values(board, 1.0)
        for panel in gr.panels(board):
            for target in panel.targets:
                assert "$" not in gr.substitute(target.expr, values)
    with pytest.raises(KeyError, match=r"\$nope"):
        gr.substitute('x{a=~"$nope"}', {})
