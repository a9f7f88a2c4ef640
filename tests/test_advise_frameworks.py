"""The framework classes of advice (docs/advice.md): phases, gradient accumulation,
inference, evaluation, start-up and compiling, framework-native actions, rules that do not
contradict each other, and a hook that says what it could not read, each judged through
`gpuwatch advise --replay` on a recording built from the class's ground truth
(tests/synthetic.py). The same classes recorded on GPUs are judged by
test_advise_gpu_recordings.py; the hook's side of them, with the real frameworks on the
CPU, by test_frameworks.py.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import synthetic
from test_advise_classes import WARNING_ONSET, advice, ids, job, judge, onset
from test_advise_support import advise_json, run_cli

LR = "learning rate"


def test_host_bound_job_with_room_gets_the_larger_batch_whatever_util_reads(tmp_path):
    """BERT-base fp32 at batch 8: util 60 %, SM 47 %, 4 % of memory, the main process
    holding the GPU up: raise-batch-size (it once missed the util/SM gates), within 20 s,
    in the Trainer's words, and no rule claiming there is no room."""
    run = synthetic.host_bound_bert()
    report = judge(tmp_path, run)
    a = advice(report, "raise-batch-size")
    assert onset(report, run, "raise-batch-size") <= WARNING_ONSET
    assert a["action"].startswith("Raise the batch size: TrainingArguments("
                                  "per_device_train_batch_size=8 → ")
    assert "(in torch: DataLoader(batch_size=" in a["action"]
    assert a["evidence"]["busy_in_steps"] < 0.5
    for other in report["advice"]:
        assert "no room" not in other["message"]


def test_kernels_running_most_of_the_time_are_said_too_small_not_kept_waiting(tmp_path):
    """The same steps with a kernel running 93 % of the time (NVML util) while the SMs are
    58 % active: the GPU is not waiting on its host between kernels, the kernels leave SMs
    idle. The batch is raised, and the reason says so: never "the main process keeps it
    waiting", which it says where util leaves the GPU idle (60 %)."""
    small = advice(judge(tmp_path, synthetic.host_bound_bert(util=0.93, sm_active=0.58)),
                   "raise-batch-size")
    assert small["evidence"]["busy_in_steps"] >= 0.5
    assert small["evidence"]["train_util"] == pytest.approx(0.93, abs=0.01)
    assert "a kernel is running 93 % of its training time" in small["message"], small["message"]
    assert "too small to keep every SM busy" in small["message"]
    assert "keeps it waiting" not in small["message"]
    waits = advice(judge(tmp_path, synthetic.host_bound_bert(util=0.60, sm_active=0.55),
                         "waits.jsonl"), "raise-batch-size")
    assert waits["evidence"]["busy_in_steps"] >= 0.5
    assert "the main process keeps it waiting" in waits["message"], waits["message"]
    assert "train_util" not in waits["evidence"] and "a kernel is running" not in waits["message"]


def test_the_host_share_says_how_much_of_it_a_kernel_ran(tmp_path):
    """The run's breakdown counts as host the time the SMs idle while the main process is
    busy; where NVML saw a kernel running through much of it (util 93 %, SMs 58 % active),
    the header, the Markdown table and the JSON say how much, so "host 42 %" is not read
    as a GPU left waiting for launches. Where util and SM active agree (57 %, 55 %) the
    share is small and nothing is said."""
    from test_advise_support import advise_text

    small = synthetic.host_bound_bert(util=0.93, sm_active=0.58).write(tmp_path / "k.jsonl")
    j = job(advise_json(small))
    assert j["time_share"]["host"] >= 0.35
    assert j["host_kernel_share"] == pytest.approx(0.93 - j["time_share"]["gpu"], abs=0.01)
    said = f"in {round(100 * j['host_kernel_share'])} % of the time a kernel ran but left " \
           "the SMs idle"
    (line,) = [ln for ln in advise_text(small).splitlines() if ln.startswith("GPU 0 (")]
    assert re.search(r"host \d+ % \(" + re.escape(said) + r"\)", line), line
    assert f"| {round(100 * j['time_share']['host'])} % ({said}) |" in \
        advise_text(small, "--format", "markdown")
    waits = synthetic.host_bound_bert(util=0.57, sm_active=0.55).write(tmp_path / "w.jsonl")
    j = job(advise_json(waits))
    assert j["host_kernel_share"] == pytest.approx(0.02, abs=0.01)
    (line,) = [ln for ln in advise_text(waits).splitlines() if ln.startswith("GPU 0 (")]
    assert "host " in line and "a kernel ran" not in line, line


def test_gpu_underused_names_small_kernels_where_a_kernel_ran_through_the_host_share(tmp_path):
    """A model that fills memory (97 %: no larger batch fits, so raise-batch-size is
    silent) with a kernel running 95 % of its steps and SMs 55 % active: gpu-underused's
    largest slice is the host share, but a kernel ran through most of it. It says so, and
    does not tell a busy main process to launch sooner or drop host syncs; the larger batch
    it names waits for memory made room for. Where util leaves the GPU idle (60 %), the
    host's own wording stands."""
    report = judge(tmp_path, synthetic.host_bound_bert(util=0.95, sm_active=0.55, full=True))
    assert "raise-batch-size" not in ids(report)
    a = advice(report, "gpu-underused")
    assert "though a kernel ran through most of it (the SMs idle inside kernels too small " \
        "to fill them)" in a["message"], a["message"]
    assert "collectives" not in a["message"]  # one process, on one GPU
    assert a["evidence"]["host_kernel_share"] == pytest.approx(0.95 - a["evidence"]["share_gpu"],
                                                               abs=0.02)
    assert "launching the kernels sooner would not fill the GPU" in a["action"]
    assert "once memory has room for it: gradient checkpointing first" in a["action"]
    assert "host syncs" not in a["action"] and "main process is busy while the GPU idles" \
        not in a["action"]
    waits = advice(judge(tmp_path, synthetic.host_bound_bert(util=0.60, sm_active=0.55,
                                                             full=True), "w.jsonl"),
                   "gpu-underused")
    assert "the host (main process busy, GPU idle)" in waits["message"], waits["message"]
    assert "host_kernel_share" not in waits["evidence"]
    assert waits["action"].startswith("The main process is busy while the GPU idles")
    assert "once memory has room for it" in waits["action"]


def test_accumulation_lowers_the_micro_batch_count_not_the_learning_rate(tmp_path):
    """Accelerate, micro-batch 4 x 16 accumulation steps: the lever is the micro-batch at
    the same effective batch (64), with the LR unchanged; never "batch_size=64 -> 128"."""
    run = synthetic.grad_accum()
    report = judge(tmp_path, run)
    assert "raise-batch-size" not in ids(report)
    a = advice(report, "reduce-gradient-accumulation")
    assert onset(report, run, "reduce-gradient-accumulation") <= WARNING_ONSET
    assert "16 micro-batches of 4 samples" in a["message"]
    assert "effective batch of 64" in a["action"] and "the learning rate as they are" in \
        a["action"]
    assert "Accelerator(gradient_accumulation_steps=16 → " in a["action"]
    assert "batch_size=4 → " in a["action"]
    assert "64 → 128" not in a["action"] and "x2" not in a["action"]
    (j,) = report["jobs"]
    assert j["micro_batches"] == 16 and j["framework"] == "accelerate"
    # the same job in the Trainer's words
    hf = judge(tmp_path, synthetic.grad_accum(framework="transformers"), "hf.jsonl")
    b = advice(hf, "reduce-gradient-accumulation")
    assert "TrainingArguments(gradient_accumulation_steps=16 → " in b["action"]
    assert "TrainingArguments(per_device_train_batch_size=4 → " in b["action"]


@pytest.mark.parametrize(("micro", "new_mb", "new_accum"), [(3, 12, 1), (12, 48, 1),
                                                          (6, 24, 1), (24, None, None)])
def test_fewer_micro_batches_keep_the_effective_batch_exactly(tmp_path, micro, new_mb,
                                                              new_accum):
    """Accumulation steps that are not a power of two: the micro-batch grows by a factor
    that divides them, so micro-batch x steps stays the effective batch (3 steps of 4
    once became 2 of 8: 16 samples, not 12)."""
    report = judge(tmp_path, synthetic.grad_accum(micro=micro))
    a = advice(report, "reduce-gradient-accumulation")
    eff = 4 * micro
    assert f"effective batch of {eff}" in a["action"]
    m = re.search(r"batch_size=4 → (\d+)\).*gradient_accumulation_steps="
                  rf"{micro} → (\d+)\)", a["action"])
    assert m, a["action"]
    mb, acc = int(m.group(1)), int(m.group(2))
    assert mb * acc == eff, (mb, acc)
    if new_mb is not None:
        assert (mb, acc) == (new_mb, new_accum)


def test_evaluation_is_its_own_phase_and_gets_its_own_advice(tmp_path):
    """80 % of the wall time evaluating at per_device_eval_batch_size=8: the training rules
    judge the training windows only (no batch x4, no LR), the evaluation gets its own."""
    run = synthetic.eval_heavy()
    report = judge(tmp_path, run)
    got = ids(report)
    assert "raise-batch-size" not in got and "gpu-underused" not in got
    a = advice(report, "speed-up-evaluation")
    assert a["evidence"]["eval_time_ratio"] == pytest.approx(run.truth[0]["eval"], abs=0.05)
    assert "TrainingArguments(per_device_eval_batch_size=8 → " in a["action"]
    assert "TrainingArguments(eval_steps=20 → " in a["action"]
    assert "the learning rate does not change" in a["action"]
    assert all(LR not in x["action"] or "does not change" in x["action"]
               for x in report["advice"])
    (j,) = report["jobs"]
    ph = j["phases"]
    assert ph["eval"] / (ph["eval"] + ph["train"]) == pytest.approx(run.truth[0]["eval"],
                                                                    abs=0.05)
    # the breakdown is of the training time: the GPU works through the steps
    assert j["time_share"]["gpu"] >= 0.7 and j["time_share"]["other"] <= 0.15
    text = run_cli("advise", "--replay", str(run.write(tmp_path / "e.jsonl"))).stdout
    assert "by phase:" in text and "evaluation" in text


def test_the_steps_busy_share_is_read_from_the_seconds_the_job_trained(tmp_path):
    """Half the time training (5 s of steps with the GPU's SMs 80 % active), half
    evaluating (5 s at 10 %): windows a third or more training are judged for the batch
    (raise-batch-size's train_share), and the GPU's busy share in the steps is that of the
    seconds the job trained (each second weighted by its share of training), not the
    window's mean (45 %, which read as a batch too small)."""
    from gpuwatch.advisor.engine import Engine
    from gpuwatch.advisor.rules import load_rules

    run = synthetic.eval_heavy(seconds=60.0, train=5.0, evaluate=5.0)
    e = Engine(load_rules())
    e.frame.set_meta(run.lines[0])
    for line in run.lines[1:]:
        e.feed(line)
    subj = e.frame.subjects[0]
    warm = subj.job_warm
    reads = [e.frame.job_window(subj, end, 15) for end in range(warm + 15, e.frame.idx, 3)]
    assert len(reads) >= 5
    for w in reads:
        assert 0.3 <= w.wall / (w.wall + w.away) <= 0.7  # judged for the batch
        assert w.busy == pytest.approx(0.8, abs=0.08)
    e.finish()
    assert "raise-batch-size" not in {f.rule.id for f in e.findings}
    (j,) = e.jobs()
    assert j["time_share"]["gpu"] >= 0.7


def test_a_batch_too_small_is_told_however_often_the_job_evaluates(tmp_path):
    """4 s of steps, then 6 s of evaluation, over and over (no 15 s window 60 % training),
    the steps host-bound (the SMs 15 % active while it trains, the main process pegged):
    the batch, its gain over all the time as well as in the steps (the evaluations kept as
    they are), ranked by the former."""
    run = synthetic.eval_heavy(seconds=60.0, train=4.0, evaluate=6.0)
    for d in run.lines:
        if d["kind"] == "gpu" and d.get("sm_active", 0) >= 0.5:
            d.update(util=0.3, sm_active=0.15, tensor_active=0.05)
    report = judge(tmp_path, run)
    a = advice(report, "raise-batch-size")
    assert a["evidence"]["busy_in_steps"] == pytest.approx(0.15, abs=0.05)
    steps_gain = float(re.match(r"up to ([0-9.]+)x samples per second",
                                a["expected_gain_text"]).group(1))
    away = float(re.search(r"take ([0-9]+) % of it", a["expected_gain_text"]).group(1)) / 100
    assert 0.4 <= away <= 0.7
    assert a["expected_gain"] == pytest.approx(1 / (away + (1 - away) / steps_gain), rel=0.03)
    assert a["expected_gain"] < steps_gain
    assert "of them evaluating, saving or compiling" in a["message"]
    assert "of its training time" in a["message"]


def test_a_collapsing_loss_scale_is_told_however_much_the_job_evaluates(tmp_path):
    """fp16 under a GradScaler whose scale halves every 8 steps, every other step skipped,
    in a job that evaluates 80 % of its time (2 s of steps, then 8 s of evaluation, over
    and over): no 15 s window is 60 % training, and the scale and the skipped steps are
    the training steps' own, so the collapse is judged at every bucket the job trains."""
    run = synthetic.eval_heavy(config={"autocast_dtype": "float16"})
    for d in run.lines:
        if d["kind"] == "step":
            d["loss_scale"] = 65536.0 / 2 ** (d["step"] // 8)
            d["skipped"] = d["step"] % 2 == 1
    report = judge(tmp_path, run)
    (j,) = report["jobs"]
    assert j["phases"]["train"] < 0.3 * (j["phases"]["train"] + j["phases"]["eval"])
    a = advice(report, "loss-scale-collapse")
    assert a["severity"] == "critical"
    # told within a few training windows of the first step, not at the run's end
    assert a["since"] - run.first_step <= 30.0, a["since"] - run.first_step
    assert "raise-batch-size" not in ids(report)


@pytest.mark.parametrize(("config", "says", "never"), [
    # Lightning's default: val_check_interval=1.0 (a float: once an epoch) with
    # check_val_every_n_epoch=1; an int val_check_interval would mean every N batches
    ({"framework": "lightning", "fw_eval_every": 1.0, "fw_eval_epochs": 1},
     lambda f: f"Trainer(check_val_every_n_epoch=1 → {math.ceil(f)}, val_check_interval=1.0)",
     "val_check_interval=1 → "),
    # ... on a run of 3 epochs (max_epochs=3): no further than its end, and said so (31
    # would never validate)
    ({"framework": "lightning", "fw_eval_every": 1.0, "fw_eval_epochs": 1, "fw_max_epochs": 3},
     lambda f: "Trainer(check_val_every_n_epoch=1 → 3, val_check_interval=1.0) (in torch: "
               "evaluate every 3 epochs) (the run's max_epochs=3: only after its last epoch)",
     r"epoch=1 → \d\d"),
    # ... on a run of one epoch validated once an epoch: it validates once already, so no
    # "less often" in epochs at all (check_val_every_n_epoch=1 → 1 would change nothing)
    ({"framework": "lightning", "fw_eval_every": 1.0, "fw_eval_epochs": 1, "fw_max_epochs": 1},
     lambda f: "Trainer(limit_val_batches=0.25)", "check_val_every_n_epoch"),
    # Lightning's max_epochs=-1 (no limit) is no cap
    ({"framework": "lightning", "fw_eval_every": 1.0, "fw_eval_epochs": 1, "fw_max_epochs": -1},
     lambda f: f"Trainer(check_val_every_n_epoch=1 → {math.ceil(f)}, val_check_interval=1.0)",
     "max_epochs"),
    # a share of an epoch, raised while it stays within one
    ({"framework": "lightning", "fw_eval_every": 0.02, "fw_eval_epochs": 1},
     lambda f: f"Trainer(val_check_interval=0.02 → {round(0.02 * f, 4):.3g}) (in torch: "
               f"evaluate every {round(0.02 * f, 4):.3g} of an epoch)",
     "check_val_every_n_epoch"),
    # validation by steps (check_val_every_n_epoch=None)
    ({"framework": "lightning", "fw_eval_every": 20, "fw_eval_epochs": None},
     lambda f: f"Trainer(val_check_interval=20 → {math.ceil(20 * f)})",
     "check_val_every_n_epoch"),
    # the Trainer evaluating once an epoch: eval_steps, left in the arguments, does nothing
    ({"fw_eval_strategy": "epoch"}, lambda f: "or on part of the set", "eval_steps"),
])
def test_evaluating_less_often_in_the_frameworks_own_units(tmp_path, config, says, never):
    """Most of the time evaluating: "evaluate less often" names the setting that controls
    it in the unit the job uses (steps, a share of an epoch, epochs), by the factor that
    brings evaluation to about a tenth of the time, never a setting that would mean
    something else."""
    report = judge(tmp_path, synthetic.eval_heavy(config=config))
    a = advice(report, "speed-up-evaluation")
    share = a["evidence"]["eval_time_ratio"]
    assert share == pytest.approx(0.8, abs=0.05)
    factor = 9 * share / max(1 - share, 0.05)
    assert says(factor) in a["action"] and not re.search(never, a["action"]), a["action"]


@pytest.mark.parametrize("hook", [True, False])
def test_the_time_before_the_first_step_is_never_judged_as_training(tmp_path, hook):
    """Persistent workers prefetching for 30 s with the GPU idle (Lightning DDP): no batch
    or data advice for the start-up, with the hook's phases or without the hook."""
    run = synthetic.startup_prefetch(hook=hook)
    report = judge(tmp_path, run)
    early = [a for a in report["advice"] if a["since"] < run.first_step + 5.0]
    assert early == [], [(a["id"], a["since"] - run.first_step) for a in early]
    assert not {"raise-batch-size", "add-dataloader-workers", "gpu-underused"} & ids(report)


def test_the_phase_in_force_runs_to_the_newest_step(tmp_path):
    """The daemon writes a `phase` line when the phase changes, else every few seconds:
    a report made between two (the notebook's `%gpuwatch report`, the live advice) counts
    the training that the steps since the newest line show, not the line's stale total."""
    run = synthetic.startup_prefetch(hook=True)
    full = judge(tmp_path, run)["jobs"][0]["phases"]
    # keep only the phase lines up to the first one that says "train": as if the report
    # were made right before the daemon's next phase line
    first_train = min(d["t"] for d in run.lines if d["kind"] == "phase"
                      and d["phase"] == "train")
    cut = synthetic.Run([d for d in run.lines if d["kind"] != "phase" or d["t"] <= first_train],
                        run.first_step, run.truth)
    stale = [d for d in cut.lines if d["kind"] == "phase"][-1]["seconds"].get("train", 0.0)
    last_step = max(d["t"] for d in run.lines if d["kind"] in ("step", "steps"))
    got = judge(tmp_path, cut)["jobs"][0]["phases"]
    assert stale < 5.0 < full["train"]
    assert got["train"] == pytest.approx(stale + (last_step - first_train), abs=1.0)
    assert got["startup"] == pytest.approx(full["startup"], abs=0.5)


def test_compiling_is_named(tmp_path):
    run = synthetic.compiling(compile_seconds=50.0)
    report = judge(tmp_path, run)
    a = advice(report, "long-compile")
    assert a["severity"] == "info"
    assert a["evidence"]["compile_seconds"] == pytest.approx(50.0, abs=1.0)
    assert "TORCHINDUCTOR_CACHE_DIR" in a["action"] and "block.compile()" in a["action"]
    assert job(report)["phases"]["compile"] == pytest.approx(50.0, abs=1.0)
    assert not {"raise-batch-size", "gpu-underused"} & ids(report)


def test_an_inference_process_is_named_and_never_told_about_the_learning_rate(tmp_path):
    run = synthetic.inference()
    report = judge(tmp_path, run)
    assert "raise-batch-size" not in ids(report)
    a = advice(report, "batch-inference-requests")
    assert "only runs inference" in a["message"] and "generate()" in a["action"]
    assert all(LR not in x["action"] for x in report["advice"])
    (j,) = report["jobs"]
    assert j["phase"] == "inference" and j["time_share"] is None
    assert report["hook"]["phases"] is True
    assert not any("No data from the torch hook" in n for n in report["notes"])
    text = run_cli("advise", "--replay", str(run.write(tmp_path / "i.jsonl"))).stdout
    assert "inference only, never a backward" in text


def test_a_hook_that_lost_a_fact_or_stopped_is_said(tmp_path):
    run = synthetic.host_bound_bert()
    t = run.first_step + 5.0
    extra = [{"t": t, "kind": "hook_problem", "pid": 4000, "gpu": 0, "what": "config.tf32",
              "error": "RuntimeError: mix of the legacy and new APIs"},
             {"t": t + 15.0, "kind": "hook_problem", "pid": 4000, "gpu": 0, "what": "hook.off",
              "error": "stopped measuring after 100 errors of its own"}]
    report = judge(tmp_path, synthetic.with_lines(run, extra))
    (note,) = [n for n in report["notes"] if "pid 4000" in n]
    assert "stopped measuring after 100 errors" in note and "config.tf32" in note
    assert "from NVML and the process tree only" in note
    assert [p["what"] for p in report["hook"]["problems"]] == ["config.tf32", "hook.off"]
    # a lost fact alone: said, and the rest stands
    report = judge(tmp_path, synthetic.with_lines(run, extra[:1]), "one.jsonl")
    (note,) = [n for n in report["notes"] if "pid 4000" in n]
    assert "could not read everything: config.tf32" in note
    assert "raise-batch-size" in ids(report)


def test_settings_read_before_the_first_step_are_not_taken_as_facts(tmp_path):
    """A bf16 job whose hook sent its settings before training began (autocast not yet
    entered) and in training: the setting in force is what is judged."""
    run = synthetic.resnet_fp32(config=False)
    cfg = {"num_workers": 8, "persistent_workers": True, "pin_memory": True,
           "uses_dataloader": True, "uses_conv": True, "tf32": False, "cudnn_benchmark": True,
           "fused_optimizer": True, "batch_size": 64, "channels_last": True}
    before = {"t": run.first_step - 1.0, "kind": "config", "pid": 4000, **cfg,
              "autocast_dtype": None, "in_training": False}
    during = {"t": run.first_step + 1.0, "kind": "config", "pid": 4000, **cfg,
              "autocast_dtype": "bfloat16", "in_training": True}
    report = judge(tmp_path, synthetic.with_lines(run, [before, during]))
    assert "enable-mixed-precision" not in ids(report)
    # and a job that turned autocast off once training began is told
    off = dict(during, autocast_dtype=None)
    on = dict(before, autocast_dtype="bfloat16")
    report = judge(tmp_path, synthetic.with_lines(run, [on, off]), "off.jsonl")
    assert "enable-mixed-precision" in ids(report)


def test_checkpointing_with_memory_to_spare_and_fp16_on_a_bf16_gpu(tmp_path):
    run = synthetic.host_bound_bert()
    cfg = [d for d in run.lines if d["kind"] == "config"][0]
    cfg.update(gradient_checkpointing=True, fw_grad_ckpt=True, autocast_dtype="float16",
               grad_scaler=True)
    report = judge(tmp_path, run)
    a = advice(report, "disable-gradient-checkpointing")
    assert "TrainingArguments(gradient_checkpointing=False)" in a["action"]
    b = advice(report, "use-bf16-not-fp16")
    assert "TrainingArguments(bf16=True, fp16=False)" in b["action"]


def _cpu_only(run: synthetic.Run, tmp_path: Path) -> Path:
    """``run`` as a job with no GPU in the data records it: no GPU lines, no GPU named."""
    lines = [d for d in run.lines if d["kind"] != "gpu"]
    lines[0] = {k: v for k, v in lines[0].items() if k not in ("gpus", "gpu_name",
                                                                "compute_capability")}
    for d in lines:
        d.pop("gpu", None)
    path = tmp_path / "cpu.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    return path


def test_a_cpu_only_job_gets_its_breakdown_and_data_advice(tmp_path):
    """No GPU at all (no gpu lines): the hook's steps still give the breakdown, the phases
    and what needs no GPU (data loading, evaluation)."""
    run = synthetic.starved_cnn()
    path = _cpu_only(run, tmp_path)
    report = json.loads(run_cli("advise", "--replay", str(path), "--format", "json").stdout)
    (j,) = report["jobs"]
    assert j["gpu"] is None and j["source"] == "hook"
    assert j["time_share"]["data"] == pytest.approx(run.truth[0]["data"], abs=0.05)
    assert "add-dataloader-workers" in ids(report)
    a = advice(report, "add-dataloader-workers")
    assert "GPU is busy" not in a["message"]
    text = run_cli("advise", "--replay", str(path)).stdout
    assert "CPU-only job" in text and "No GPU in this data" in text


def test_a_cpu_only_job_is_not_told_of_a_gpu_it_has_not(tmp_path):
    """A host-bound job with no GPU in the data (its GPU lines taken out): the breakdown
    says the step's own work is on the CPU, and nothing speaks of a GPU working under
    70 % of the time (gpu-underused said "the GPU works only 0 %" before)."""
    run = synthetic.host_bound_bert()
    path = _cpu_only(run, tmp_path)
    report = json.loads(run_cli("advise", "--replay", str(path), "--format", "json").stdout)
    (j,) = report["jobs"]
    assert j["gpu"] is None and j["time_share"]["host"] > 0.5
    assert not ids(report) & {"gpu-underused", "raise-batch-size", "enable-mixed-precision"}


def test_rule_files_keep_info_rules_out_of_the_catch_alls_suppressors():
    from gpuwatch.advisor.rules import load_rules

    rules = load_rules(()).by_id()
    for rid in rules["gpu-underused"].suppressed_by:
        assert rules[rid].severity != "info", rid


def test_onsets_of_the_new_warnings(tmp_path):
    """Warnings still start within 20 s of the first training step."""
    for build, rule in ((synthetic.host_bound_bert, "raise-batch-size"),
                        (synthetic.grad_accum, "reduce-gradient-accumulation")):
        run = build()
        assert onset(judge(tmp_path, run, f"{rule}.jsonl"), run, rule) <= WARNING_ONSET


def _reconfigured(run: synthetic.Run, **cfg: object) -> synthetic.Run:
    """The run with its hook's configuration lines changed (None: the key left out)."""
    for line in run.lines:
        if line.get("kind") == "config":
            line.update(cfg)
            for k in [k for k, v in cfg.items() if v is None]:
                line.pop(k)
    return run


def test_a_fabric_loop_is_advised_in_fabrics_words(tmp_path):
    """Lightning Fabric drives a loop of the user's own: the precision is Fabric's
    (Fabric(precision="bf16-mixed")), while the batch, the workers and the rest stay torch's
    DataLoader (fabric.setup_dataloaders takes a plain one)."""
    run = _reconfigured(synthetic.resnet_fp32(), framework="fabric", fw_precision="32-true")
    a = advice(judge(tmp_path, run), "enable-mixed-precision")
    assert a["action"].startswith('Train in bf16 mixed precision: Fabric(precision="bf16-mixed")'
                                  ' (in torch: torch.autocast("cuda", dtype=torch.bfloat16)')
    run = _reconfigured(synthetic.host_bound_bert(), framework="fabric",
                        fw_precision="32-true", fw_batch_size=None, fw_grad_accum=None)
    b = advice(judge(tmp_path, run, "batch.jsonl"), "raise-batch-size")
    assert b["action"].startswith("Raise the batch size: DataLoader(batch_size=8 → ")
    assert "(in torch:" not in b["action"]  # the torch form is Fabric's own here


def test_a_batch_samplers_batch_size_is_the_one_to_raise(tmp_path):
    """DataLoader(dataset, batch_sampler=SequenceSampler(dataset, batch_size=20)), as
    Lightning's LSTM demo makes its batches: the DataLoader's own batch_size is None, so
    the change is the sampler's, in any framework."""
    run = _reconfigured(synthetic.host_bound_bert(), framework="lightning", fw_batch_size=None,
                        fw_precision="32-true", batch_sampler="SequenceSampler")
    a = advice(judge(tmp_path, run), "raise-batch-size")
    assert a["action"].startswith("Raise the batch size: the batch size of the DataLoader's "
                                  "batch_sampler (SequenceSampler(..., batch_size=8 → ")
    assert "DataLoader(batch_size=" not in a["action"]
