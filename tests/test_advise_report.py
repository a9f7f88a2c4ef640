"""The report a person reads: units and precision in text and Markdown, raw numbers in the
JSON, plain English counts, and advice in the order that wins back the most time."""

from __future__ import annotations

import json
import re
import sys
from argparse import Namespace
from pathlib import Path

import pytest
from conftest import RECORDINGS as RECORDING_PATHS
from test_advise_support import DATA, ROOT, load, recording, run_cli, write

from gpuwatch.advise import build
from gpuwatch.advisor.report import render_markdown, render_text

TRAIN = ROOT / "tests" / "scripts" / "train_cpu.py"

RECORDINGS = [p.name for p in RECORDING_PATHS]
# what a report must never print: e-notation, "(s)" plurals; nor, in its evidence,
# key=value dumps or ratios with five digits (actions may quote code: num_workers=2)
RAW = re.compile(r"\d\.?\d*e[+-]\d\d|piece\(s\)")
RAW_EVIDENCE = re.compile(r"\b[a-z_]+=\d|\b0\.\d{4,}")


def advise(path: Path | str, fmt: str = "text", *extra: str) -> str:
    proc = run_cli("advise", "--replay", str(path), "--format", fmt, *extra)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def evidence_lines(text: str) -> str:
    """The Evidence: paragraphs of a text report, joined."""
    out, inside = [], False
    for line in text.splitlines():
        body = line.strip()
        if body.startswith("Evidence:"):
            inside = True
        elif not line.startswith("    ") or body.startswith(("Change:", "Expected gain:")):
            inside = False
        if inside:
            out.append(body)
    return " ".join(out)


def test_evidence_has_units_and_sensible_precision():
    raw = json.loads(advise(DATA / "small_batch.jsonl", "json"))["advice"]
    (a,) = [x for x in raw if x["id"] == "raise-batch-size"]
    util, step = a["evidence"]["util"], a["evidence"]["step_seconds"]
    assert 0.1 < util < 0.9 and 0.001 < step < 0.1  # whole percent, tenths of ms
    text = advise(DATA / "small_batch.jsonl")
    ev = evidence_lines(text)
    for shown in (f"util {100 * util:.0f} %", f"step {1000 * step:.1f} ms", "54.8 MiB",
                  "batch 2"):
        assert shown in ev, (shown, ev)
    assert str(util) not in text and str(step) not in text
    md = advise(DATA / "small_batch.jsonl", "markdown")
    assert f"| `util` | {100 * util:.0f} % |" in md
    assert f"| `step_seconds` | {1000 * step:.1f} ms |" in md


def test_json_keeps_raw_numbers():
    rep = json.loads(advise(DATA / "small_batch.jsonl", "json"))
    ev = rep["advice"][0]["evidence"]
    # the recording's own figures (tests/data/README.md): util about 0.2, 8 ms steps
    assert ev["util"] == pytest.approx(0.2, abs=0.01) and len(str(ev["util"])) > 4
    assert ev["step_seconds"] == pytest.approx(0.0083, abs=3e-4)
    assert ev["act_mem_per_sample_bytes"] > 5e7  # bytes, not "54.8 MiB"


@pytest.mark.parametrize("name", RECORDINGS)
def test_every_recording_reads_as_prose(name):
    # judged once, rendered both ways as `gpuwatch advise` does (advise.main)
    rep = build(Namespace(replay=str(DATA / name), demo=False, config_file=None,
                          rules_dir=None, format="text"))
    text, md = render_text(rep), render_markdown(rep)
    assert not RAW.findall(text) and not RAW.findall(md), RAW.findall(text + md)
    # an unknown template value prints as "?": a sentence must not lean on one
    assert not re.search(r"\w \?[:.,;]? ", text.replace("\n", " ")), text
    table = "\n".join(ln for ln in md.splitlines() if ln.startswith("| `"))
    bad = RAW_EVIDENCE.findall(evidence_lines(text)) + RAW_EVIDENCE.findall(table)
    assert not bad, bad


def test_near_full_memory_keeps_its_tenth():
    ev = evidence_lines(advise(DATA / "near_oom.jsonl"))
    assert "memory used 97.5 %" in ev and "memory free 3.5 GiB" in ev


RULES = """\
rules:
  - id: x-data-wait
    title: a small data-wait slice
    severity: warning
    when: mean(util, 15s) >= 0
    gain: 1 / (1 - 0.12)
    gain_text: "{expected_gain:.2f}x"
    message: 12 % of each step waits for data.
    action: Add one DataLoader worker.
  - id: x-host-overhead
    title: the big host-overhead slice
    severity: info
    when: mean(util, 15s) >= 0
    gain: 1 / (1 - 0.88)
    gain_text: "{expected_gain:.1f}x"
    message: 88 % of each step is host overhead.
    action: Capture the step in a CUDA graph.
  - id: x-failing
    title: a critical health item
    severity: critical
    when: mean(util, 15s) >= 0
    message: the GPU is failing.
    action: Drain the node.
  - id: x-no-estimate
    title: a warning without a gain estimate
    severity: warning
    when: mean(util, 15s) >= 0
    message: something else.
    action: Look.
"""


def test_advice_ordered_by_time_won_back(tmp_path):
    """Critical first; then the biggest slice (88 % host) before the 12 % data wait, even
    though that one is only 'info'; advice with no estimate last."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "order.yaml").write_text(RULES)
    rep = json.loads(advise(DATA / "small_batch.jsonl", "json", "--rules-dir", str(rules)))
    order = [a["id"] for a in rep["advice"]]
    assert order[0] == "x-failing"
    assert order.index("x-host-overhead") < order.index("raise-batch-size") \
        < order.index("x-data-wait") < order.index("x-no-estimate"), order
    text = advise(DATA / "small_batch.jsonl", "text", "--rules-dir", str(rules))
    assert f"{len(order)} pieces of advice" in text
    heads = [ln for ln in text.splitlines() if re.match(r"^\d+\. \[", ln)]
    assert [re.search(r"\] (\S+)", h).group(1) for h in heads] == order


# -- what was judged -----------------------------------------------------------------------
NOTHING = "nothing in this data calls for a change"


def test_a_real_cpu_only_job_says_the_gpu_was_not_judged(tmp_path):
    """`gpuwatch run --record` around a real torch job on this GPU-less machine: the report
    says the GPU and training rules could not be judged, and why."""
    rec = tmp_path / "cpu.jsonl"
    proc = run_cli("run", "--web.listen-address", "127.0.0.1:0", "--quiet", "--record",
                   str(rec), "--", sys.executable, str(TRAIN), "--steps", "20",
                   "--workers", "1", "--step-ms", "5")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in rec.read_text().splitlines() if x.strip()]
    assert not any(d.get("kind") == "gpu" for d in lines)  # the premise: no GPU here
    rep = json.loads(advise(rec, "json"))
    assert rep["judged"]["gpu"] is False and rep["judged"]["training"] is False
    assert "no GPU" in rep["judged"]["reason"]
    for fmt in ("text", "markdown"):
        out = advise(rec, fmt)
        assert "could not be judged" in out and "CPU-only" in out, out
        assert NOTHING not in out
        assert "comes from NVML" not in out  # the hook note is about GPU advice
    md = advise(rec, "markdown")
    # what the text's first line says of the hook, and no GPU table with no row in it
    assert "Torch hook data: steps" in md and "## GPUs" not in md


def test_an_idle_gpu_is_not_called_a_fine_training_run():
    text = advise(DATA / "idle.jsonl")
    assert "no training job ran on a GPU" in text and NOTHING not in text


def test_a_run_too_short_to_judge_is_not_called_no_training(tmp_path):
    """The first 12 s of a recording whose job trained under 5 s of it (too short for the
    rules): the report shows its step-time breakdown, so its verdict says it trained too
    briefly, with the seconds, never that no training job ran."""
    src = (DATA / "h200_small_model_batch4.jsonl").read_text().splitlines()
    rec = tmp_path / "short.jsonl"
    rec.write_text("\n".join(src[:1124]) + "\n")
    rep = json.loads(advise(rec, "json"))
    assert rep["judged"]["training"] is False and rep["jobs"]
    (g,) = rep["judged"]["gpus"]
    assert 0 < g["training_seconds"] < 10
    for fmt in ("text", "markdown", "html"):
        out = " ".join(advise(rec, fmt).split())
        assert "no training job ran" not in out, fmt
        assert f"too short to judge (GPU 0 {g['training_seconds']:g} s" in out, fmt


@pytest.mark.parametrize("name", ["tuned", "h200_tuned_b128", "h200_tf32"])
def test_a_busy_run_says_what_it_judged(name):
    rep = json.loads(advise(recording(name), "json"))
    g = rep["judged"]["gpus"][0]
    # what was judged is the step-time breakdown's own GPU share, shown above it
    (job,) = rep["jobs"]
    assert rep["judged"]["training"] is True and g["busy_signal"] == "breakdown"
    assert g["busy_ratio"] == pytest.approx(job["time_share"]["gpu"], abs=1e-3)
    assert g["busy_ratio"] >= 0.7
    assert g["training_seconds"] >= 20
    text = advise(recording(name))
    if not rep["advice"]:
        assert NOTHING in text and f"GPU 0 worked {100 * g['busy_ratio']:.0f} % of the" in text


def test_an_underused_training_gpu_is_never_called_fine(tmp_path):
    """The tuned run with SM active scaled to 0.6x of itself (~52 %): whether or not a rule
    names the cause, the report must not say that nothing calls for a change."""
    lines = load("tuned")
    for d in lines[1:]:
        if d["kind"] == "gpu" and d.get("sm_active") is not None:
            d["sm_active"] = round(d["sm_active"] * 0.6, 4)
    path = write(tmp_path / "half.jsonl", lines)
    rep = json.loads(advise(path, "json"))
    g = rep["judged"]["gpus"][0]
    assert 0.45 < g["busy_ratio"] < 0.6
    for fmt in ("text", "markdown"):
        out = advise(path, fmt)
        assert NOTHING not in out
        if not rep["advice"]:
            assert "not used fully" in out and f"{100 * g['busy_ratio']:.0f} %" in out
    # the report's own judgement without the rules that explain it: still never "fine"
    reduced = dict(rep, advice=[])
    for out in (render_text(reduced), render_markdown(reduced)):
        assert NOTHING not in out and "not used fully" in out


def test_an_inference_process_is_never_said_to_have_trained(tmp_path):
    """Trainer.predict on an H100 (fw_hf_predict): the report's closing line, with the
    rule that fired taken away, says the job ran inference, and its advice for an
    underused GPU is an inference process's; its ending says inference only."""
    rep = json.loads(advise(recording("fw_hf_predict"), "json"))
    (g,) = rep["judged"]["gpus"]
    assert g["busy_ratio"] >= 0.7
    reduced = dict(rep, advice=[])
    for out in (render_text(reduced), render_markdown(reduced)):
        assert NOTHING in out and "the job ran inference" in out and "trained" not in out
    # the same GPU less busy (SM active at half): an inference process's levers
    lines = load("fw_hf_predict")
    for d in lines[1:]:
        if d["kind"] == "gpu" and d.get("sm_active") is not None:
            d["sm_active"] = round(d["sm_active"] * 0.5, 4)
    half = json.loads(advise(write(tmp_path / "half.jsonl", lines), "json"))
    out = render_text(dict(half, advice=[]))
    assert "not used fully" in out and "An inference process that keeps its GPU" in out
    assert "A training job" not in out and "DataLoader workers" not in out
    assert "having run inference only" in rep["job_ends"][0]["summary"]


def test_the_biggest_slice_leads_with_the_built_in_rules(tmp_path):
    """Issue #9's example: a 2-GPU job with 1.2 ms steps, 12 % data wait and 88 % host
    overhead (main processes pegged, GPUs 10 % SM active). 'Add one DataLoader worker'
    once came in with the host advice; its one worker is 10 % busy, so the wait is the main
    process's own per-batch cost, which more workers do not cut: it is not said at all now,
    and the host slice's advice comes first."""
    import synthetic as syn

    steps = {g: syn.steady_steps(30.0, 0.0012, 0.000144) for g in (0, 1)}
    trees = [{"pid": 4000 + g, "gpus": [g], "cpu_cores": 1.1, "main_cpu_cores": 1.0,
              "workers_cpu_cores": 0.1, "processes": 2} for g in (0, 1)]
    config = {"world_size": 2, "num_workers": 1, "pin_memory": True,
              "persistent_workers": True, "autocast_dtype": "bfloat16",
              "fused_optimizer": True, "uses_dataloader": True, "batch_size": 64}
    run = syn.build(steps=steps, gpu=syn.const(util=0.2, sm_active=0.1, tensor_active=0.05,
                                               fp32_active=0.01, dram_active=0.05),
                    host=lambda rel: {"job_cpu_cores": 2.2, "job_main_cpu_cores": 2.0,
                                      "job_workers_cpu_cores": 0.2, "job_processes": 4,
                                      "jobs": trees},
                    configs={g: dict(config, rank=g) for g in (0, 1)})
    for d in run.lines:
        if d["kind"] == "step":
            d["rank"] = d["gpu"]
    path = run.write(tmp_path / "host_bound_ddp.jsonl")
    rep = json.loads(advise(path, "json"))
    order = [a["id"] for a in rep["advice"]]
    assert "add-dataloader-workers" not in order, order
    gains = [a.get("expected_gain") or 1.0 for a in rep["advice"]]
    assert gains == sorted(gains, reverse=True)  # no critical item here: by time won back
    first = rep["advice"][0]
    assert first["expected_gain"] > 3 and "main process" in first["message"]


@pytest.mark.parametrize("name", ["gpu_starved_cnn", "h200_input_bound_w2"])
def test_evidence_is_read_while_the_job_trains_not_from_its_teardown(name):
    """Both jobs keep every DataLoader worker pegged (gpu_starved_cnn.truth.json: 3 workers,
    6 ms of augmentation per sample). The advice holds a while after the last step; the
    evidence it shows must still be the training's, not the exited workers' (which once
    read "workers mostly idle: loading waits on storage" and `num_workers=0 -> 5`)."""
    rep = json.loads(advise(recording(name), "json"))
    (a,) = [x for x in rep["advice"] if x["id"] == "add-dataloader-workers"]
    truth = DATA / f"{name}.truth.json"
    workers = json.loads(truth.read_text())["workers"] if truth.exists() else 2
    assert a["evidence"]["job_workers"] == pytest.approx(workers, abs=0.2)
    assert a["evidence"]["workers_busy_ratio"] >= 0.8
    assert "I/O" not in a["message"] and f"num_workers={workers} → " in a["action"]


def test_markdown_shows_where_each_ranks_time_went():
    md = advise(DATA / "gpu_ddp_slow_rank.jsonl", "markdown")
    rows = [ln for ln in md.splitlines() if re.match(r"^\| [01] \| pid \d+ rank [01] \|", ln)]
    assert len(rows) == 2, md
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        shares = [float(c.rstrip(" %")) for c in cells[2:7]]
        assert sum(shares) == pytest.approx(100, abs=1.5)
    # rank 1 waits for its data; rank 0 waits for rank 1 in the collectives
    assert rows[0].endswith("| waiting on peers |") and rows[1].endswith("| data wait |")


def test_the_same_advice_on_several_gpus_is_one_block():
    """Accelerate's DDP on 4 H100s: each rank is told to fuse its optimizer in the same
    words, and to raise the job's one batch size with its own figures. The text and
    Markdown reports show each once, naming the four GPUs; the batch block says its
    figures are GPU 0's and gives the range of each evidence entry that differs over the
    four; the header counts both; the JSON keeps one item per GPU."""
    from gpuwatch.advisor.report import evidence_value

    path = recording("fw_accelerate_ddp")
    rep = json.loads(advise(path, "json"))
    fused = [a for a in rep["advice"] if a["id"] == "use-fused-optimizer"]
    assert sorted(a["gpu"] for a in fused) == [0, 1, 2, 3]
    batch = [a for a in rep["advice"] if a["id"] == "raise-batch-size"]
    assert sorted(a["gpu"] for a in batch) == [0, 1, 2, 3]
    assert len({a["action"] for a in batch}) == 1  # one change: the job's batch size
    assert len({a["message"] for a in batch}) > 1  # said with each rank's own figures
    n = len(rep["advice"])
    blocks = n - 6
    text = advise(path, "text")
    heads = [ln for ln in text.splitlines() if re.match(r"^\d+\. \[", ln)]
    assert len(heads) == blocks == 2
    assert heads[1] == "2. [INFO] use-fused-optimizer on GPUs 0, 1, 2, 3, confidence 0.60"
    order = sorted(a["gpu"] for a in batch)
    assert heads[0].startswith(f"1. [WARNING] raise-batch-size on GPUs {', '.join(map(str, order))},")
    flat = " ".join(text.split())
    assert f"{n} pieces of advice ({blocks} blocks: the same on several GPUs is one)" in flat
    assert " ".join(batch[0]["message"].split()) in flat  # the lead's own words
    util = [a["evidence"]["util"] for a in batch]
    lo, hi = evidence_value("util", min(util)), evidence_value("util", max(util))
    assert lo != hi
    assert (f"The figures above are GPU {batch[0]['gpu']}'s; over GPUs "
            f"{', '.join(map(str, order))}:" in flat)
    assert f"util {lo} to {hi}" in flat
    # an entry that reads alike on every GPU is not repeated as a range
    assert "batch 64 to" not in flat and "ranks 4 to" not in flat
    assert len({evidence_value("busy_in_steps", a["evidence"]["busy_in_steps"])
                for a in batch}) == 1 and "busy in steps 2" not in flat.split("over GPUs")[1]
    md = advise(path, "markdown")
    assert md.count("### ") == blocks
    assert "`use-fused-optimizer` (info, GPUs 0, 1, 2, 3, confidence 0.60)" in md


def test_blocks_join_only_words_that_match_and_give_the_gains_range():
    """Two ranks told to raise the batch for different reasons (one "too little work", the
    other kept waiting by its main process) keep their own blocks; four ranks told the
    same with gains of 6.4x to 7.2x are one block whose line gives that range."""
    hang = advise(recording("fw_accel_clm_fsdp_hang"), "text")
    heads = [ln for ln in hang.splitlines() if re.match(r"^\d+\. \[", ln)]
    assert sum("raise-batch-size on GPU " in h for h in heads) == 2
    rep = json.loads(advise(recording("fw_accel_clm_fsdp2_offload"), "json"))
    from gpuwatch.advisor.report import evidence_value

    gains = [a["expected_gain"] for a in rep["advice"] if a["id"] == "disable-fsdp-cpu-offload"]
    lo, hi = (evidence_value("expected_gain", g) for g in (min(gains), max(gains)))
    assert lo != hi
    flat = " ".join(advise(recording("fw_accel_clm_fsdp2_offload"), "text").split())
    assert f"expected gain {lo} to {hi}" in flat
