"""Build gpuwatch's Grafana dashboards as code (Grafana Foundation SDK) and write their JSON.

    python3 -m grafana.build            # rewrite grafana/dashboards/*.json
    python3 -m grafana.build --check    # exit 1 if the committed JSON is not what this builds

Three dashboards for Grafana 10 and later, each with a ``datasource`` variable and
multi-select ``instance`` / ``gpu`` variables: the fleet at a glance, one host in depth, and
the training jobs the hook reports. Every query uses only series of docs/metrics.md or
recording rules of prometheus/recording.yml; tests/test_fleet_dashboards.py runs each one
through a real Prometheus scraping two gpuwatch daemons.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

with warnings.catch_warnings():
    # the SDK nudges towards its dashboard v2 schema, which only Grafana 12 reads; the v1
    # schema built here is what Grafana 10 and 11 load
    warnings.simplefilter("ignore", DeprecationWarning)
    from grafana_foundation_sdk.builders import common as cb
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import common as cm
    from grafana_foundation_sdk.models import dashboard as dm

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards"

# the data source that grafana/provisioning/datasources/gpuwatch.yaml creates
DATASOURCE_UID = "gpuwatch-prometheus"
# Grafana 10.0's own schema version: every Grafana from 10.0 on migrates forward from it
SCHEMA_VERSION = 38
DS = cm.DataSourceRef(type_val="prometheus", uid="${datasource}")

# selectors every query starts from (the variables are regexes: All is ".*")
HOST = 'instance=~"$instance"'
GPU = 'instance=~"$instance", gpu=~"$gpu"'
JOB = 'instance=~"$instance", gpu=~"$gpu", rank=~"$rank"'
LEGEND_GPU = "{{instance}} GPU {{gpu}}"
# pid tells ranks apart (one process each); an empty rank (a job without
# torch.distributed) would only leave a dangling "rank" in every legend
LEGEND_JOB = "{{instance}} GPU {{gpu}} pid {{pid}}"

# instance_gpu:gpuwatch_gpu_clock_event_reason:worst codes (prometheus/recording.yml)
THROTTLE_CODES: tuple[tuple[str, str, str], ...] = (
    ("0", "none", "green"), ("1", "idle", "text"), ("2", "app clocks", "blue"),
    ("3", "display clocks", "blue"), ("4", "sync boost", "blue"),
    ("5", "SW power cap", "yellow"), ("6", "SW thermal", "orange"),
    ("7", "HW slowdown", "red"), ("8", "HW thermal", "red"), ("9", "HW power brake", "red"),
)
PSTATES = {str(n): (f"P{n}", "green" if n == 0 else "blue" if n < 8 else "text")
           for n in range(16)}
SEVERITY_COLORS = {"critical": "red", "warning": "orange", "info": "blue"}


# -- building blocks ----------------------------------------------------------------

def query(expr: str, legend: str, ref: str = "A", instant: bool = False
          ) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)
    return q.instant() if instant else q.range()


def _targets(panel: Any, queries: Sequence[tuple[str, str]], instant: bool = False) -> Any:
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(query(expr, legend, chr(ord("A") + i), instant))
    return panel


def mapping(options: dict[str, tuple[str, str]]) -> dm.ValueMap:
    return dm.ValueMap(options={
        value: dm.ValueMappingResult(text=text, color=color, index=i)
        for i, (value, (text, color)) in enumerate(options.items())})


def series(title: str, unit: str, queries: Sequence[tuple[str, str]], *, desc: str,
           span: int = 8, height: int = 8, lo: float | None = None, hi: float | None = None,
           stacked: bool = False, log: bool = False, legend: bool = True,
           decimals: int | None = None) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(desc).datasource(DS).unit(unit)
             .span(span).height(height).line_width(1).fill_opacity(10 if not stacked else 60)
             .show_points(cm.VisibilityMode.NEVER)
             .legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                     .placement(cm.LegendPlacement.BOTTOM).show_legend(legend))
             .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
                      .sort(cm.SortOrder.DESCENDING)))
    if lo is not None:
        panel = panel.min(lo)
    if hi is not None:
        panel = panel.max(hi)
    if decimals is not None:
        panel = panel.decimals(decimals)
    if stacked:
        panel = panel.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL))
    if log:
        panel = panel.scale_distribution(cb.ScaleDistributionConfig()
                                         .type(cm.ScaleDistribution.LOG).log(2))
    return _targets(panel, queries)


def ratio(title: str, queries: Sequence[tuple[str, str]], *, desc: str, **kw: Any
          ) -> timeseries.Panel:
    """A 0-1 series shown as 0-100 %."""
    return series(title, "percentunit", queries, desc=desc, lo=0, hi=1, **kw)


# A stat panel reduces its series over the dashboard's time range to one number: "now"
# (the last sample) for states and counts (hosts reporting, advice in force), the mean
# for a level that moves (utilization, power), whose last sample may fall in an idle
# moment. The description says which.
NOW, MEAN = "lastNotNull", "mean"
_CALC_WORDS = {NOW: "Now (the last sample in the time range).",
               MEAN: "Mean over the dashboard's time range."}


def single(title: str, unit: str, expr: str, *, desc: str, calc: str, span: int = 3,
           thresholds: Sequence[tuple[float | None, str]] = ((None, "green"),)
           ) -> stat.Panel:
    steps = [dm.Threshold(value=value, color=color) for value, color in thresholds]
    panel = (stat.Panel().title(title).description(f"{desc} {_CALC_WORDS[calc]}")
             .datasource(DS).unit(unit)
             .span(span).height(4).graph_mode(cm.BigValueGraphMode.AREA)
             .color_mode(cm.BigValueColorMode.VALUE)
             .reduce_options(cb.ReduceDataOptions().calcs([calc]).values(False))
             .thresholds(db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps)))
    return panel.with_target(query(expr, "", instant=False))


def states(title: str, queries: Sequence[tuple[str, str]], options: dict[str, tuple[str, str]],
           *, desc: str, span: int = 12, height: int = 8) -> statetimeline.Panel:
    panel = (statetimeline.Panel().title(title).description(desc).datasource(DS)
             .unit("none").span(span).height(height).show_value(cm.VisibilityMode.NEVER)
             .merge_values(True).row_height(0.8).fill_opacity(80).line_width(0)
             .mappings([mapping(options)])
             .color_scheme(db.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
             .thresholds(db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE)
                         .steps([dm.Threshold(value=None, color="green")]))
             .legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                     .placement(cm.LegendPlacement.BOTTOM).show_legend(True)))
    return _targets(panel, queries)


def advice_panel(selector: str, *, desc: str, span: int = 24) -> statetimeline.Panel:
    panel = states("Advice in force",
                   [(f"gpuwatch_advice_active{{{selector}}} == 1",
                     "{{instance}} GPU {{gpu}}: {{rule}} ({{severity}})")],
                   {"1": ("active", "orange")}, desc=desc, span=span)
    for severity, color in SEVERITY_COLORS.items():
        panel = panel.override_by_regexp(
            rf".*\({severity}\)$",
            [dm.DynamicConfigValue(id_val="mappings", value=[mapping({"1": (severity, color)})])])
    return panel


def variables(extra: Sequence[db.QueryVariable] = ()) -> list[Any]:
    def multi(name: str, label: str, definition: str) -> db.QueryVariable:
        return (db.QueryVariable(name).label(label).datasource(DS)
                .query({"query": definition, "refId": f"{name}-var"}).definition(definition)
                .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
                .sort(dm.VariableSort.NATURAL_ASC).multi(True).include_all(True)
                .all_value(".*")
                .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"])))

    return [
        db.DatasourceVariable("datasource").label("Data source").type("prometheus")
        .current(dm.VariableOption(selected=True, text="gpuwatch", value=DATASOURCE_UID)),
        multi("instance", "Host", "label_values(gpuwatch_up, instance)"),
        multi("gpu", "GPU", 'label_values(gpuwatch_gpu_info{instance=~"$instance"}, gpu)'),
        *extra,
    ]


def dashboard(uid: str, title: str, desc: str, extra_vars: Sequence[Any] = ()
              ) -> db.Dashboard:
    board = (db.Dashboard(title).uid(uid).description(desc).tags(["gpuwatch", "gpu"])
             .time("now-1h", "now").refresh("30s").timezone("browser")
             .tooltip(dm.DashboardCursorSync.CROSSHAIR).editable()
             .link(db.DashboardLink("gpuwatch").type(dm.DashboardLinkType.DASHBOARDS)
                   .tags(["gpuwatch"]).as_dropdown(True).include_vars(True)
                   .keep_time(True)))
    for var in variables(extra_vars):
        board = board.with_variable(var)
    return board


# -- the dashboards -----------------------------------------------------------------

def fleet() -> db.Dashboard:
    b = dashboard("gpuwatch-fleet", "gpuwatch / Fleet",
                  "Every host and GPU that Prometheus scrapes gpuwatch on, at a glance.")
    b = (b.with_row(db.Row("Fleet"))
         .with_panel(single("Hosts reporting", "none", f"count(gpuwatch_up{{{HOST}}} == 1)",
                            desc="gpuwatch daemons Prometheus scrapes.", calc=NOW))
         .with_panel(single("GPUs answering", "none",
                            f"count(gpuwatch_gpu_up{{{GPU}}} == 1)",
                            desc="GPUs whose NVML reads succeed (gpuwatch_gpu_up == 1).",
                            calc=NOW))
         .with_panel(single("GPUs lost", "none",
                            f"count(gpuwatch_gpu_up{{{GPU}}} == 0) or vector(0)",
                            desc="GPUs that stopped answering NVML (fell off the bus, XID 79).",
                            calc=NOW, thresholds=((None, "green"), (1, "red"))))
         .with_panel(single("Mean GPU utilization", "percentunit",
                            f"avg(instance:gpuwatch_gpu_utilization_ratio:avg{{{HOST}}})",
                            desc="Mean over hosts of each host's mean NVML utilization.",
                            calc=MEAN))
         .with_panel(single("Mean SM active", "percentunit",
                            f"avg(instance:gpuwatch_gpu_sm_active_ratio:avg{{{HOST}}})",
                            desc="Mean over hosts of each host's mean GPM SM activity: how "
                                 "much of the utilization did work.", calc=MEAN))
         .with_panel(single("Mean power, all GPUs", "watt",
                            f"sum(instance:gpuwatch_gpu_power_watts:sum{{{HOST}}})",
                            desc="Power drawn by every selected host's GPUs together.",
                            calc=MEAN))
         .with_panel(single("Critical advice", "none",
                            f'sum(instance_severity:gpuwatch_advice_active:count'
                            f'{{{HOST}, severity="critical"}}) or vector(0)',
                            desc="Pieces of critical advice in force (these page).",
                            calc=NOW, thresholds=((None, "green"), (1, "red"))))
         .with_panel(single("Warnings", "none",
                            f'sum(instance_severity:gpuwatch_advice_active:count'
                            f'{{{HOST}, severity="warning"}}) or vector(0)',
                            desc="Pieces of warning advice in force.",
                            calc=NOW, thresholds=((None, "green"), (1, "orange")))))
    b = (b.with_row(db.Row("Utilization"))
         .with_panel(ratio("GPU utilization", [(f"gpuwatch_gpu_utilization_ratio{{{GPU}}}",
                                                LEGEND_GPU)],
                           desc="NVML utilization: the share of time any kernel ran. 100 % "
                                "says only that the GPU was never idle; SM and tensor "
                                "activity say how much of it worked."))
         .with_panel(ratio("SM active", [(f"gpuwatch_gpu_sm_active_ratio{{{GPU}}}",
                                          LEGEND_GPU)],
                           desc="GPM: share of time the SMs had a warp resident (Hopper "
                                "and newer). Low beside high utilization: small kernels."))
         .with_panel(ratio("Tensor active", [(f"gpuwatch_gpu_tensor_active_ratio{{{GPU}}}",
                                              LEGEND_GPU)],
                           desc="GPM: share of time the tensor pipes were busy. Near zero "
                                "while training: no mixed precision / TF32.")))
    b = (b.with_row(db.Row("Memory, power, temperature"))
         .with_panel(ratio("GPU memory used",
                           [(f"instance_gpu:gpuwatch_gpu_memory_used:ratio{{{GPU}}}",
                             LEGEND_GPU)],
                           desc="Device memory in use over total (how full, not how busy)."))
         .with_panel(series("Power", "watt",
                            [(f"gpuwatch_gpu_power_watts{{{GPU}}}", LEGEND_GPU)], lo=0,
                            desc="Power draw per GPU."))
         .with_panel(series("Temperature", "celsius",
                            [(f"gpuwatch_gpu_temperature_celsius{{{GPU}}}", LEGEND_GPU)],
                            desc="GPU core temperature.")))
    throttle = {code: (text, color) for code, text, color in THROTTLE_CODES}
    b = (b.with_row(db.Row("Throttling and health"))
         .with_panel(states("Clock throttle reason (worst active)",
                            [(f"instance_gpu:gpuwatch_gpu_clock_event_reason:worst{{{GPU}}}",
                              LEGEND_GPU)], throttle,
                            desc="The costliest clock event reason active on each GPU. "
                                 "SW power cap is routine under load; HW slowdown, HW "
                                 "thermal and HW power brake are not."))
         .with_panel(states("GPU answering",
                            [(f"gpuwatch_gpu_up{{{GPU}}}", LEGEND_GPU)],
                            {"1": ("up", "green"), "0": ("LOST", "red")},
                            desc="1 while NVML answers for the GPU, 0 once it is lost."))
         .with_panel(series("XID errors (5 min)", "none",
                            [(f"instance_gpu_xid:gpuwatch_gpu_xid_errors:increase5m{{{GPU}}}",
                              LEGEND_GPU + " XID {{xid}}")], lo=0, decimals=0,
                            desc="XID errors per code over the last 5 minutes. 48, 63, 64, "
                                 "74, 79, 92, 94, 95 point at hardware; 13, 31, 43 mostly "
                                 "at the application."))
         .with_panel(series("ECC errors (5 min)", "none",
                            [(f"instance_gpu_type:gpuwatch_gpu_ecc_errors:increase5m{{{GPU}}}",
                              LEGEND_GPU + " {{type}}")], lo=0, decimals=0,
                            desc="Volatile ECC errors over the last 5 minutes; any "
                                 "uncorrected one corrupts what was running."))
         .with_panel(series("Remapped rows", "none",
                            [(f"gpuwatch_gpu_remapped_rows{{{GPU}}}",
                              LEGEND_GPU + " {{type}}"),
                             (f"gpuwatch_gpu_remapped_rows_pending{{{GPU}}}",
                              LEGEND_GPU + " pending"),
                             (f"gpuwatch_gpu_remapped_rows_failure{{{GPU}}}",
                              LEGEND_GPU + " failed")], lo=0, decimals=0,
                            desc="Rows remapped in device memory; pending (1) waits for a "
                                 "GPU reset, failed (1) means the GPU needs service.")))
    b = (b.with_row(db.Row("Advice"))
         .with_panel(advice_panel(HOST, desc="What the advisor on each host says now, one row "
                                             "per rule and GPU, coloured by severity. "
                                             "`gpuwatch advise --prometheus` gives the "
                                             "evidence.")))
    return b


def node() -> db.Dashboard:
    b = dashboard("gpuwatch-node", "gpuwatch / Node and GPU",
                  "One host in depth: every GPU signal, its processes and the host's CPU.")
    b = (b.with_row(db.Row("GPU activity"))
         .with_panel(ratio("Utilization, SM active, SM occupancy",
                           [(f"gpuwatch_gpu_utilization_ratio{{{GPU}}}", LEGEND_GPU + " util"),
                            (f"gpuwatch_gpu_sm_active_ratio{{{GPU}}}", LEGEND_GPU + " SM active"),
                            (f"gpuwatch_gpu_sm_occupancy_ratio{{{GPU}}}",
                             LEGEND_GPU + " SM occupancy")],
                           desc="NVML utilization beside the GPM SM counters.", span=12))
         .with_panel(ratio("Pipes: tensor, FP16, FP32, FP64",
                           [(f"gpuwatch_gpu_tensor_active_ratio{{{GPU}}}",
                             LEGEND_GPU + " tensor"),
                            (f"gpuwatch_gpu_fp16_active_ratio{{{GPU}}}", LEGEND_GPU + " FP16"),
                            (f"gpuwatch_gpu_fp32_active_ratio{{{GPU}}}", LEGEND_GPU + " FP32"),
                            (f"gpuwatch_gpu_fp64_active_ratio{{{GPU}}}", LEGEND_GPU + " FP64")],
                           desc="GPM per-pipe activity: FP32 busy with tensor idle means "
                                "training without mixed precision.", span=12))
         .with_panel(ratio("DRAM active and memory controller",
                           [(f"gpuwatch_gpu_dram_active_ratio{{{GPU}}}", LEGEND_GPU + " DRAM"),
                            (f"gpuwatch_gpu_memory_utilization_ratio{{{GPU}}}",
                             LEGEND_GPU + " memory controller")],
                           desc="How busy device memory was (GPM DRAM active; NVML memory "
                                "controller utilization).", span=12))
         .with_panel(series("PCIe throughput", "Bps",
                            [(f"gpuwatch_gpu_pcie_transmit_bytes_per_second{{{GPU}}}",
                              LEGEND_GPU + " transmit"),
                             (f"gpuwatch_gpu_pcie_receive_bytes_per_second{{{GPU}}}",
                              LEGEND_GPU + " receive")], lo=0, span=12,
                            desc="Host-device traffic (slow tier: every 30 s by default).")))
    b = (b.with_row(db.Row("Memory and processes"))
         .with_panel(series("Device memory", "bytes",
                            [(f"gpuwatch_gpu_memory_used_bytes{{{GPU}}}", LEGEND_GPU + " used"),
                             (f"gpuwatch_gpu_memory_total_bytes{{{GPU}}}",
                              LEGEND_GPU + " total")], lo=0,
                            desc="Device memory in use and in total."))
         .with_panel(series("Memory per process", "bytes",
                            [(f"gpuwatch_process_gpu_memory_used_bytes{{{GPU}}}",
                              "{{instance}} GPU {{gpu}} {{name}} pid {{pid}} ({{user}})")],
                            lo=0, desc="Device memory each process holds, as NVML lists it."))
         .with_panel(ratio("SM utilization per process",
                           [(f"gpuwatch_process_gpu_sm_utilization_ratio{{{GPU}}}",
                             "{{instance}} GPU {{gpu}} {{name}} pid {{pid}} ({{user}})")],
                           desc="Per-process SM utilization where NVML gives it.")))
    reasons = {"0": ("-", "transparent"), "1": ("active", "orange")}
    b = (b.with_row(db.Row("Power, clocks, throttling"))
         .with_panel(series("Power and limit", "watt",
                            [(f"gpuwatch_gpu_power_watts{{{GPU}}}", LEGEND_GPU + " draw"),
                             (f"gpuwatch_gpu_power_limit_watts{{{GPU}}}",
                              LEGEND_GPU + " limit")], lo=0,
                            desc="Power draw against the enforced limit."))
         .with_panel(series("Temperature", "celsius",
                            [(f"gpuwatch_gpu_temperature_celsius{{{GPU}}}", LEGEND_GPU)],
                            desc="GPU core temperature."))
         .with_panel(series("Clocks", "hertz",
                            [(f"gpuwatch_gpu_sm_clock_hertz{{{GPU}}}", LEGEND_GPU + " SM"),
                             (f"gpuwatch_gpu_memory_clock_hertz{{{GPU}}}",
                              LEGEND_GPU + " memory")], lo=0,
                            desc="SM and memory clocks; an SM clock that drops under load "
                                 "is throttled (see the reasons)."))
         .with_panel(states("Clock event reasons (those active in the range)",
                            [(f"gpuwatch_gpu_clock_event_reason{{{GPU}}} and on (instance, gpu, "
                              f"reason) max_over_time(gpuwatch_gpu_clock_event_reason{{{GPU}}}"
                              f"[$__range]) == 1", LEGEND_GPU + " {{reason}}")],
                            reasons, span=16,
                            desc="Each clock event (throttle) reason that was active at some "
                                 "time in the range, per GPU; the fleet dashboard shows the "
                                 "worst one."))
         .with_panel(states("Performance state",
                            [(f"gpuwatch_gpu_pstate{{{GPU}}}", LEGEND_GPU)], PSTATES, span=8,
                            desc="P-state: P0 is the fastest; an idle GPU drops to P8.")))
    b = (b.with_row(db.Row("Host"))
         .with_panel(ratio("Host CPU", [(f"gpuwatch_host_cpu_utilization_ratio{{{HOST}}}",
                                         "{{instance}} all cores")],
                           desc="Host CPU busy over all cores."))
         .with_panel(ratio("Host CPU per core",
                           [(f"gpuwatch_host_cpu_core_utilization_ratio{{{HOST}}}",
                             "{{instance}} core {{core}}")], legend=False,
                           desc="Each core (no legend: there can be hundreds; hover for "
                                "names). One pegged core beside idle ones is a "
                                "single-threaded bottleneck."))
         .with_panel(series("Load average", "none",
                            [(f"gpuwatch_host_load1{{{HOST}}}", "{{instance}} 1 min"),
                             (f"gpuwatch_host_load5{{{HOST}}}", "{{instance}} 5 min"),
                             (f"gpuwatch_host_load15{{{HOST}}}", "{{instance}} 15 min")], lo=0,
                            desc="Runnable processes, averaged."))
         .with_panel(series("Host memory", "bytes",
                            [(f"gpuwatch_host_memory_used_bytes{{{HOST}}}", "{{instance}} used"),
                             (f"gpuwatch_host_memory_total_bytes{{{HOST}}}",
                              "{{instance}} total"),
                             (f"gpuwatch_host_swap_used_bytes{{{HOST}}}",
                              "{{instance}} swap used")], lo=0,
                            desc="Host memory and swap in use.", span=12))
         .with_panel(series("gpuwatch itself", "suffix: /s",
                            [(f"rate(gpuwatch_ticks_total{{{HOST}}}[$__rate_interval])",
                              "{{instance}} sampling ticks"),
                             (f"sum by (instance) (rate(gpuwatch_errors_total{{{HOST}}}"
                              f"[$__rate_interval]))", "{{instance}} errors")], lo=0, span=12,
                            desc="The daemon's sampling ticks and errors per second: ticks "
                                 "at 1/interval and no errors when it keeps up.")))
    b = (b.with_row(db.Row("Advice"))
         .with_panel(advice_panel(GPU, desc="Advice in force on these GPUs.")))
    return b


def training() -> db.Dashboard:
    rank = (db.QueryVariable("rank").label("Rank").datasource(DS)
            .query({"query": 'label_values(gpuwatch_train_up{instance=~"$instance"}, rank)',
                    "refId": "rank-var"})
            .definition('label_values(gpuwatch_train_up{instance=~"$instance"}, rank)')
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.NATURAL_ASC)
            .multi(True).include_all(True).all_value(".*")
            .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"])))
    b = dashboard("gpuwatch-training", "gpuwatch / Training job",
                  "The training jobs that report through gpuwatch's torch hook: speed, "
                  "where the step time goes, precision, memory, CPU and the advice.",
                  extra_vars=[rank])
    b = (b.with_row(db.Row("Speed"))
         .with_panel(series("Step time", "s",
                            [(f"gpuwatch_train_step_seconds{{{JOB}}}", LEGEND_JOB)], lo=0,
                            span=6, desc="Mean step time over each report of the hook."))
         .with_panel(series("Throughput", "suffix: samples/s",
                            [(f"gpuwatch_train_samples_per_second{{{JOB}}}", LEGEND_JOB)],
                            lo=0, span=6, desc="Training samples per second."))
         .with_panel(ratio("Data wait", [(f"gpuwatch_train_data_wait_ratio{{{JOB}}}",
                                          LEGEND_JOB)], span=6,
                           desc="Share of the step spent blocked on the DataLoader: above "
                                "~10 % the GPU waits for input."))
         .with_panel(ratio("GPU utilization and SM active",
                           [(f"gpuwatch_gpu_utilization_ratio{{{GPU}}}", LEGEND_GPU + " util"),
                            (f"gpuwatch_gpu_sm_active_ratio{{{GPU}}}",
                             LEGEND_GPU + " SM active")], span=6,
                           desc="The job's GPUs from NVML and GPM, beside its steps.")))
    # a job without a pid label is the advisor's estimate for a GPU without the hook
    shares = (f'label_replace(gpuwatch_train_time_share_ratio{{{JOB}}}, '
              f'"pid", "-", "pid", "")')
    b = (b.with_row(db.Row("Where the step time goes"))
         .with_panel(ratio("Step-time breakdown (selected jobs together)",
                           [(f"avg by (category) (gpuwatch_train_time_share_ratio{{{JOB}}})",
                             "{{category}}")], stacked=True, span=12,
                           desc="Each step split into waiting for data, host-bound work "
                                "(Python, launches, syncs), GPU compute, waiting on peers "
                                "and the rest, averaged over the selected jobs: pick one "
                                "host and rank to read one job."))
         .with_panel(ratio("Step-time breakdown per job",
                           [(shares, LEGEND_JOB + ": {{category}}")], span=12,
                           desc="The same shares, one line per job and category; a rank "
                                "whose sync share stands out waits on a straggler.")))
    b = (b.with_row(db.Row("Precision and memory"))
         .with_panel(series("Loss scale", "none",
                            [(f"gpuwatch_train_loss_scale{{{JOB}}}", LEGEND_JOB)], log=True,
                            desc="GradScaler's loss scale (log axis). Halving on every "
                                 "step down to 0 is a collapse: the loss went inf/NaN."))
         .with_panel(ratio("Skipped steps",
                           [(f"instance_pid_rank:gpuwatch_train_skipped_steps:ratio_rate1m"
                             f"{{{JOB}}}", LEGEND_JOB)],
                           desc="Share of optimizer steps GradScaler skipped over the last "
                                "minute; 100 % means nothing is being learned."))
         .with_panel(series("Allocator memory", "bytes",
                            [(f"gpuwatch_train_memory_allocated_bytes{{{JOB}}}",
                              LEGEND_JOB + " allocated"),
                             (f"gpuwatch_train_memory_reserved_bytes{{{JOB}}}",
                              LEGEND_JOB + " reserved"),
                             (f"gpuwatch_train_memory_max_allocated_bytes{{{JOB}}}",
                              LEGEND_JOB + " peak")], lo=0,
                            desc="torch's caching allocator: allocated, reserved, peak.")))
    b = (b.with_row(db.Row("CPU and steps"))
         .with_panel(series("Job CPU: main process vs workers", "suffix: cores",
                            [(f"gpuwatch_job_main_cpu_cores{{{HOST}}}",
                              "{{instance}} main {{name}} {{pid}}"),
                             (f"gpuwatch_job_workers_cpu_cores{{{HOST}}}",
                              "{{instance}} workers of {{name}} {{pid}}")], lo=0,
                            desc="CPU cores busy in the job's main process and in its "
                                 "descendants (DataLoader workers). Main near 1 core: "
                                 "Python-bound; workers pegged: add workers."))
         .with_panel(series("Steps per second", "suffix: steps/s",
                            [(f"instance_pid_rank:gpuwatch_train_steps:rate1m{{{JOB}}}",
                              LEGEND_JOB)], lo=0,
                            desc="Optimizer steps per second over the last minute."))
         .with_panel(states("Job reporting",
                            [(f"gpuwatch_train_up{{{JOB}}}", LEGEND_JOB)],
                            {"1": ("reporting", "green"), "0": ("ended", "text")},
                            span=8, desc="1 while the job reports, 0 after it ended.")))
    b = (b.with_row(db.Row("Advice"))
         .with_panel(advice_panel(GPU, desc="Advice in force on the job's GPUs.")))
    return b


DASHBOARDS = {"gpuwatch-fleet": fleet, "gpuwatch-node": node, "gpuwatch-training": training}


def render(build: Any) -> str:
    model = build().build()
    model.schema_version = SCHEMA_VERSION
    # stable ids in grid order, so links to a panel (viewPanel=N) survive a rebuild
    for number, panel in enumerate(model.panels or [], start=1):
        panel.id_val = number
    return json.dumps(model, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m grafana.build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed files instead of writing them")
    parser.add_argument("--out", type=Path, default=OUT, help="folder to write (default: %(default)s)")
    args = parser.parse_args(argv)
    stale = []
    args.out.mkdir(parents=True, exist_ok=True)
    for uid, build in DASHBOARDS.items():
        path = args.out / f"{uid}.json"
        text = render(build)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
        else:
            path.write_text(text)
    if stale:
        print("out of date (run python3 -m grafana.build): "
              + ", ".join(str(p) for p in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
