"""The hook and the advisor around the frameworks people train with, for real, on the CPU:
the Hugging Face Trainer (tiny BERT), Accelerate's ``accumulate()``, a Lightning Trainer
with a validation loop, and ``model.generate`` under ``no_grad`` (tiny GPT-2).

Each test runs ``gpuwatch run --record F -- python tests/scripts/frameworks/<script>.py``
(or attaches explicitly where the test needs that), and checks what the hook reported
(phases, micro-batches per step, the framework and its settings) against the script's
own clock (a TrainerCallback, a Lightning Callback: ``--out``), then what
``gpuwatch advise`` says of the recording. The versions are pinned in the test extra.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import clean_env

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("lightning")

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "scripts" / "frameworks"
RUN = [sys.executable, "-m", "gpuwatch", "run", "--web.listen-address", "127.0.0.1:0",
       "--quiet"]
# the hook's evaluation time against the script's: they start and stop a few lines of
# framework code apart (the callback runs after the last eval batch's bookkeeping)
EVAL_TOLERANCE = 0.15


def record(tmp_path: Path, script: str, *args: str, timeout: float = 300,
           env: dict[str, str] | None = None, ranks: int = 0) -> tuple[Path, dict]:
    """``script`` run under ``gpuwatch run --record``: (the recording, the script's truth);
    ``ranks``: under torchrun with that many processes (gloo on the CPU)."""
    rec, truth = tmp_path / f"{script}.jsonl", tmp_path / f"{script}.truth.json"
    env = clean_env(TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
                    TMPDIR=str(tmp_path), **(env or {}))
    launch = ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr",
              "127.0.0.1", "--master-port", str(free_port())] if ranks else []
    run = subprocess.run([*RUN, "--record", str(rec), "--", sys.executable, *launch,
                          str(SCRIPTS / f"{script}.py"), *args, "--out", str(truth)],
                         check=False, env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    return rec, json.loads(truth.read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lines(path: Path, kind: str) -> list[dict]:
    out = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [x for x in out if x.get("kind") == kind]


def steps_and_samples(rec: Path) -> tuple[int, int]:
    """The steps a recording counted, and their samples (per-step lines and summaries)."""
    step, steps = lines(rec, "step"), lines(rec, "steps")
    return (len(step) + sum(s["steps"] for s in steps),
            sum(s.get("batch_size") or 0 for s in step)
            + sum(s.get("samples") or 0 for s in steps))


def advise(path: Path) -> dict:
    run = subprocess.run([sys.executable, "-m", "gpuwatch", "advise", "--replay", str(path),
                          "--format", "json"], check=True, capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    return json.loads(run.stdout)


def last_config(path: Path) -> dict:
    configs = [c for c in lines(path, "config") if c.get("in_training")]
    assert configs, "no configuration read once training began"
    return configs[-1]


def test_trainer_evaluation_accumulation_and_its_settings(tmp_path: Path) -> None:
    """TrainingArguments(eval_strategy="steps", gradient_accumulation_steps=4,
    per_device_eval_batch_size=4): the evaluations are a phase of their own (not inside a
    step), each step counts its 4 micro-batches, the framework and its settings are read,
    and the advice speaks of the eval batch in TrainingArguments' words."""
    # a model and evaluation set large enough that evaluation and training take several
    # seconds on the CPU: speed-up-evaluation judges a share of at least 5 s of the time
    # since the first step, for 5 s, so the run goes on well past 10 s after its first step
    # (10 evaluations: ~14 s on this 2-core machine; 4, once, ended at 5.5 s and said nothing)
    rec, truth = record(tmp_path, "hf_trainer", "--steps", "60", "--eval-every", "6",
                        "--eval-samples", "1024", "--hidden", "128", "--layers", "4",
                        "--seq", "64")
    steps = lines(rec, "step") + lines(rec, "steps")
    assert sum(s.get("steps", 1) for s in steps) == truth["steps"] == 60
    assert {s["micro_batches"] for s in lines(rec, "step")} == {4}
    phases = lines(rec, "phase")
    final = phases[-1]["seconds"]
    print(f"hook: {final}, script's evaluations: {truth['eval_seconds']:.2f} s")
    assert final["eval"] == pytest.approx(truth["eval_seconds"], rel=EVAL_TOLERANCE, abs=0.3)
    # a step never holds an evaluation: the steps' seconds add up to the train phase's at
    # most (a step that held one would add a whole evaluation beyond it; half of one is the
    # margin). The first step belongs to start-up (its end ends start-up) and carries the
    # first-time work, so the sum reads the steps after it. Not the longest step against one
    # evaluation: on a loaded 2-core machine one step took 4.5 s beside evaluations of 4.2 s
    # (and on CI's fresh install the first took 3.2 s beside 2.0 s)
    first = min(s["step"] for s in lines(rec, "step"))
    timed = [s["step_seconds"] for s in lines(rec, "step")
             if s.get("step_seconds") and s["step"] != first]
    assert len(timed) >= 30
    assert sum(timed) <= final["train"] + 0.5 * truth["eval_seconds"] / truth["evals"]
    cfg = last_config(rec)
    assert cfg["framework"] == "transformers" and cfg["framework_version"]
    assert cfg["fw_grad_accum"] == 4 and cfg["fw_eval_batch_size"] == 4
    assert cfg["fw_batch_size"] == 8 and cfg["fw_eval_strategy"] == "steps"
    assert cfg["fw_auto_batch"] is False  # the batch is the script's
    assert cfg["batch_size"] == 8  # the DataLoader's: the micro-batch
    assert not lines(rec, "hook_problem")
    report = advise(rec)
    (job,) = report["jobs"]
    assert job["framework"] == "transformers" and job["micro_batches"] == 4
    assert job["phases"]["eval"] == pytest.approx(truth["eval_seconds"],
                                                  rel=EVAL_TOLERANCE, abs=0.3)
    (a,) = [a for a in report["advice"] if a["id"] == "speed-up-evaluation"]
    assert "TrainingArguments(per_device_eval_batch_size=4 → " in a["action"]
    assert "TrainingArguments(eval_steps=6 → " in a["action"]
    assert not [a for a in report["advice"] if "Scale the learning rate" in a["action"]]


def test_a_seq2seq_trainer_generating_in_its_evaluations_is_training(tmp_path: Path) -> None:
    """Seq2SeqTrainer(predict_with_generate=True) on a tiny T5: its evaluations call
    generate() on every batch, inside training. They are the eval phase, never an inference
    process; every step is counted; the generation settings are read."""
    rec, truth = record(tmp_path, "hf_seq2seq", "--steps", "300", "--eval-every", "60",
                        "--eval-samples", "256", "--gen-len", "24")
    steps = lines(rec, "step") + lines(rec, "steps")
    assert sum(s.get("steps", 1) for s in steps) == truth["steps"] == 300
    phases = lines(rec, "phase")
    assert {p["phase"] for p in phases} >= {"train", "eval"}
    assert "inference" not in {p["phase"] for p in phases}
    final = phases[-1]["seconds"]
    print(f"hook: {final}, script's evaluations: {truth['eval_seconds']:.2f} s")
    assert final["eval"] == pytest.approx(truth["eval_seconds"], rel=EVAL_TOLERANCE, abs=0.3)
    cfg = last_config(rec)
    assert cfg["fw_eval_generate"] is True and cfg["fw_eval_gen_len"] == 24
    assert not lines(rec, "hook_problem")
    (job,) = advise(rec)["jobs"]
    assert job["framework"] == "transformers" and not job.get("inference")


def test_a_seq2seq_evaluation_before_training_is_evaluation(tmp_path: Path) -> None:
    """trainer.evaluate() before trainer.train() on a Seq2SeqTrainer that generates: long
    enough (10 s at least) that the hook reads the process as serving a model meanwhile
    (its phase lines say inference), until it trains. Then that time is the evaluation's
    (the script's own clock), each of its batches counted once though generate() ran on
    each, and the job is no inference process."""
    # 4,096 sequences of up to 48 tokens: ~40 s on the 2-core development machine, well
    # past the 10 s after which the hook reads a process that never trained as serving
    rec, truth = record(tmp_path, "hf_seq2seq", "--evaluate-first", "--no-eval", "--steps",
                        "40", "--eval-samples", "4096", "--gen-len", "48")
    phases = lines(rec, "phase")
    assert "inference" in {p["phase"] for p in phases}, truth  # (it evaluated 10 s at least)
    final = phases[-1]
    assert "inference" not in final["seconds"] and final["phase"] == "train"
    print(f"hook: {final['seconds']}, script's evaluation: {truth['first_eval_seconds']:.2f} s")
    assert final["seconds"]["eval"] == pytest.approx(truth["first_eval_seconds"],
                                                     rel=EVAL_TOLERANCE)
    assert final["eval_batches"] == 4096 // 8 and final["eval_samples"] == 4096
    assert sum(s.get("steps", 1) for s in lines(rec, "step") + lines(rec, "steps")) == 40
    report = advise(rec)
    (job,) = report["jobs"]
    assert not job.get("inference") and "inference" not in job["phases"]
    assert not {a["id"] for a in report["advice"]} & {"batch-inference-requests",
                                                       "inference-in-fp32",
                                                       "inference-waits-for-data"}


@pytest.mark.parametrize("when", ["before", "after"])
def test_tf32_through_the_new_api_keeps_the_hook_measuring(tmp_path: Path, when: str) -> None:
    """transformers 5 sets TF32 through torch's fp32_precision API; from then on torch's
    legacy getters raise. The hook reads the new API: no fact lost, every step reported,
    before or after it attached ("before": the script attaches explicitly)."""
    if when == "before":
        rec, sock = tmp_path / "rec.jsonl", tmp_path / "hook.sock"
        cfg = tmp_path / "gpuwatch.yaml"
        cfg.write_text(f"hook_socket: {sock}\n")
        daemon = subprocess.Popen([*RUN, "--config.file", str(cfg), "--record", str(rec)],
                                  env=clean_env(), cwd=REPO, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not sock.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            truth = tmp_path / "truth.json"
            run = subprocess.run([sys.executable, str(SCRIPTS / "hf_trainer.py"), "--steps",
                                  "8", "--eval-every", "100", "--tf32-new-api", "before",
                                  "--out", str(truth)],
                                 env=clean_env(GPUWATCH_SOCKET=str(sock), TMPDIR=str(tmp_path)),
                                 cwd=tmp_path, capture_output=True, text=True, timeout=300)
            assert run.returncode == 0, run.stderr[-3000:]
            time.sleep(1.5)  # the exit report, then the recorder's 2 s reorder hold
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    else:
        rec, _ = record(tmp_path, "hf_trainer", "--steps", "8", "--eval-every", "100",
                        "--tf32-new-api", "after")
    assert not lines(rec, "hook_problem")
    steps = lines(rec, "step") + lines(rec, "steps")
    assert sum(s.get("steps", 1) for s in steps) == 8
    cfg = last_config(rec)
    assert cfg["tf32"] is True and cfg["float32_matmul_precision"] == "high"


def test_accelerate_accumulate_is_micro_batches_not_a_larger_batch(tmp_path: Path) -> None:
    rec, truth = record(tmp_path, "accelerate_accum", "--micro", "4", "--accum", "16",
                        "--steps", "12")
    steps = lines(rec, "step")
    assert len(steps) == truth["steps"] == 12
    assert {s["micro_batches"] for s in steps} == {16}
    # what each optimizer step took in: 16 x 4 (Accelerate's loader fetches one batch
    # ahead, so the first step holds 17 of them and the last 15)
    sizes = sorted(s["batch_size"] for s in steps)
    assert sizes[len(sizes) // 2] == 64 and 12 * 64 <= sum(sizes) <= 12 * 64 + 4
    cfg = last_config(rec)
    assert cfg["framework"] == "accelerate" and cfg["fw_grad_accum"] == 16
    assert cfg["batch_size"] == 4
    (job,) = advise(rec)["jobs"]
    assert job["micro_batches"] == 16 and job["framework"] == "accelerate"


def test_lightning_validation_is_a_phase(tmp_path: Path) -> None:
    rec, truth = record(tmp_path, "lightning_val", "--steps", "40", "--val-every", "10",
                        "--val-samples", "512", "--val-batch", "8")
    steps = lines(rec, "step") + lines(rec, "steps")
    assert sum(s.get("steps", 1) for s in steps) == 40
    final = lines(rec, "phase")[-1]["seconds"]
    print(f"hook: {final}, script's validations: {truth['eval_seconds']:.2f} s")
    assert final["eval"] == pytest.approx(truth["eval_seconds"], rel=EVAL_TOLERANCE, abs=0.3)
    cfg = last_config(rec)
    assert cfg["framework"] == "lightning" and cfg["fw_eval_every"] == 10
    assert cfg["fw_eval_batch_size"] == 8 and cfg["fw_precision"] == "32-true"
    phase = lines(rec, "phase")[-1]
    assert phase["eval_batch_size"] == 8 and phase["eval_batches"] >= 4 * 64
    assert "eval_train_loader" not in phase  # a validation loader of its own


@pytest.mark.parametrize("loop", ["plain", "lightning"])
def test_evaluating_on_the_training_data_is_evaluation(tmp_path: Path, loop: str) -> None:
    """A loop measuring its training accuracy after each epoch (model.eval(), the training
    loader again under torch.no_grad(), then the test set), and Lightning validating on
    the loader it trains on: the passes over the training data are evaluation, as the
    script's clock says, and its samples are the steps' only. Before, the first read as
    training (its seconds in the next step), the second hid Lightning's validation whole."""
    rec, truth = record(tmp_path, "shared_loaders", "--loop", loop, "--samples", "1024",
                        "--test-samples", "256", "--batch", "64", "--seconds", "4")
    steps, samples = steps_and_samples(rec)
    assert steps == truth["steps"] and samples == truth["samples"]
    phase = lines(rec, "phase")[-1]
    print(f"hook: {phase['seconds']}, the script's evaluations: "
          f"{truth['eval_seconds']:.2f} s in {truth['evals']}")
    assert phase["seconds"]["eval"] == pytest.approx(truth["eval_seconds"],
                                                     rel=EVAL_TOLERANCE, abs=0.3)
    per_eval = (1024 + 256) // 64 if loop == "plain" else 1024 // 64
    assert phase["eval_batches"] == truth["evals"] * per_eval
    # and the hook says the evaluation read the loader that trains: its batch is the
    # training's, which the advice must not offer as the evaluation's to raise
    assert phase["eval_train_loader"] is True


@pytest.mark.parametrize("in_thread", [False, True])
def test_a_slow_teardown_after_the_last_line_is_no_phase_of_the_job(
        tmp_path: Path, in_thread: bool) -> None:
    """A loop whose last act is an evaluation, then 3 s of teardown after the script's
    last line (on an H200 a plain loop's persistent DataLoader workers took 5 s each to
    stop at exit, 20 s for four, with the hook and without it): the exit report comes
    when the main thread ends, so the evaluation is the script's and the job's end is its
    last line's, not the process's. Before, the last phase ran on through the teardown
    (62 % evaluation on the H200 where the loop's clock said 43 %). With the loop in a
    thread the main thread leaves running, the report waits for that thread (and, as
    before, for the teardown: docs/hook.md, "Limits"): every step is counted (a report at
    the main thread's end would have left out the thread's later steps)."""
    args = ["--loop", "plain", "--samples", "512", "--test-samples", "128", "--batch", "64",
            "--seconds", "2", "--exit-seconds", "3"]
    rec, truth = record(tmp_path, "shared_loaders", *args,
                        *(["--in-thread"] if in_thread else []))
    steps, samples = steps_and_samples(rec)
    assert steps == truth["steps"] and samples == truth["samples"]
    phase = lines(rec, "phase")[-1]
    end = lines(rec, "job_end")[-1]
    print(f"hook: {phase['seconds']}, the script's evaluations: "
          f"{truth['eval_seconds']:.2f} s in {truth['evals']}; exit report "
          f"{end['t'] - phase['t']:+.2f} s from the last phase line")
    assert end["exit_reason"] == "exited" and end["steps_total"] == truth["steps"]
    if in_thread:
        return
    assert phase["seconds"]["eval"] == pytest.approx(truth["eval_seconds"],
                                                     rel=EVAL_TOLERANCE, abs=0.3)


def test_lightning_training_on_two_loaders_at_once_is_training(tmp_path: Path) -> None:
    """Lightning's CombinedLoader reads two training loaders side by side for each step (a
    dict from train_dataloader()), and validates on a third: both loaders train (every
    sample the steps' but one batch of the first, at the second step, before two steps in
    a row showed the pairing), the validation is evaluation. Before, each batch of the
    first loader read as an evaluation that the second's batch ended (as many
    "evaluations" as steps) and its samples were no step's."""
    rec, truth = record(tmp_path, "shared_loaders", "--loop", "combined", "--samples", "1024",
                        "--second", "256", "--test-samples", "256", "--batch", "64",
                        "--workers", "0", "--seconds", "4")
    steps, samples = steps_and_samples(rec)
    assert steps == truth["steps"]
    assert truth["samples"] == truth["steps"] * 2 * 64
    assert samples == truth["samples"] - 64
    phase = lines(rec, "phase")[-1]
    print(f"hook: {phase['seconds']}, the script's validations: "
          f"{truth['eval_seconds']:.2f} s in {truth['evals']}")
    assert phase["eval_batches"] == truth["evals"] * 256 // 64 + 1
    assert phase["seconds"]["eval"] == pytest.approx(truth["eval_seconds"],
                                                     rel=EVAL_TOLERANCE, abs=0.3)


def test_the_scripts_own_trainer_subclass_is_the_trainer(tmp_path: Path) -> None:
    """A Trainer subclass of the script's own (a compute_loss of its own: class weights, a
    custom loss), gradient_accumulation_steps=2: the framework is the Trainer, its settings
    read from its TrainingArguments. Before, the hook took only a Trainer whose class was
    transformers' own: a subclass defined anywhere else read as Accelerate (which the
    Trainer runs underneath), with Accelerate's accumulation (1) and its knobs' words."""
    rec, truth = record(tmp_path, "hf_trainer", "--subclass", "--steps", "8", "--accum", "2",
                        "--eval-every", "100", "--eval-samples", "8")
    steps, _ = steps_and_samples(rec)
    assert steps == truth["steps"] == 8
    cfg = last_config(rec)
    assert cfg["framework"] == "transformers" and cfg["fw_args"] == "TrainingArguments"
    assert cfg["fw_grad_accum"] == 2 and cfg["fw_batch_size"] == 8


def test_trls_sft_trainer_is_told_in_its_configs_words(tmp_path: Path) -> None:
    """TRL's SFTTrainer (a Trainer subclass; SFTConfig, a TrainingArguments subclass, with
    its own defaults: gradient checkpointing on) at micro-batch 8 with 2 accumulation
    steps, evaluating every 10 steps at eval batch 2: its steps, micro-batches and
    evaluations as its callback counts them, its settings read, and the advice written
    with SFTConfig(...), the class the script builds, and the micro-batch the loader's 8
    (the Trainer's last step reads one batch fewer: Accelerate read it ahead).
    100 steps: the advice asks 5 s of training and evaluation, then holds 5 s; 40 steps
    took 7 s on a quiet machine (CI's too), which ended the job before it could."""
    rec, truth = record(tmp_path, "trl_sft", "--trainer", "sft", "--steps", "100",
                        "--eval-every", "10", "--eval-samples", "256", "--eval-batch", "2",
                        "--accum", "2", timeout=600)
    steps, samples = steps_and_samples(rec)
    assert steps == truth["steps"] == 100 and samples == 100 * 2 * 8
    assert {s["micro_batches"] for s in lines(rec, "step")} == {2}
    cfg = last_config(rec)
    assert cfg["framework"] == "transformers" and cfg["fw_args"] == "SFTConfig"
    assert cfg["fw_grad_accum"] == 2 and cfg["fw_batch_size"] == 8
    assert cfg["fw_grad_ckpt"] is True  # SFTConfig's default
    report = advise(rec)
    (job,) = report["jobs"]
    print(f"hook: {job['phases']}, the callback's evaluations: {truth['eval_seconds']:.2f} s")
    assert job["framework"] == "transformers" and job["micro_batches"] == 2
    assert job["phases"]["eval"] == pytest.approx(truth["eval_seconds"],
                                                  rel=EVAL_TOLERANCE, abs=0.3)
    (a,) = [a for a in report["advice"] if a["id"] == "speed-up-evaluation"]
    assert a["evidence"]["micro_batch_size"] == 8
    assert "SFTConfig(per_device_eval_batch_size=2 → " in a["action"], a["action"]
    assert "TrainingArguments" not in a["action"]


def test_trls_grpo_trainer_generating_in_its_steps_is_training(tmp_path: Path) -> None:
    """TRL's GRPOTrainer: each step generates completions with the policy itself
    (generate() under no_grad inside the training step, most of the step's time), scores
    them and trains on them. The steps are counted as its callback counts them, and the
    generation is the steps' work: no evaluation and no inference; its calls and seconds
    are timed (all but the first step's, which comes before any backward(): then it could
    still be an inference process), and the advice is to generate faster, in GRPOConfig's
    words (vLLM)."""
    # 30 s from the script's start (its clock stops the training at a step's end): the
    # advice holds for 10 s of a 30 s window, and a step may take 0.1 s or 0.5 s here
    rec, truth = record(tmp_path, "trl_sft", "--trainer", "grpo", "--steps", "1000",
                        "--seconds", "30")
    steps, _ = steps_and_samples(rec)
    assert steps == truth["steps"] == truth["generate_calls"] >= 20
    phase = lines(rec, "phase")[-1]
    print(f"hook: {phase['seconds']}, {phase.get('calls')}, {phase.get('call_seconds')}; "
          f"the script's generate() {truth['generate_seconds']:.2f} s")
    assert set(phase["seconds"]) == {"startup", "train"}
    assert phase["generate_calls"] == 0 and phase["inference_batches"] == 0
    assert phase["seconds"]["train"] >= truth["generate_seconds"] * 0.9
    # every call but the first step's (the script timed each, the first apart: it may
    # take much longer than the rest, its kernels' first use)
    assert phase["calls"]["train_generate"] == steps - 1
    assert phase["call_seconds"]["train_generate"] == pytest.approx(
        truth["generate_seconds"] - truth["generate_first_seconds"], rel=0.1)
    cfg = last_config(rec)
    assert cfg["framework"] == "transformers" and cfg["fw_args"] == "GRPOConfig"
    report = advise(rec)
    (a,) = [a for a in report["advice"] if a["id"] == "speed-up-generation-in-training"]
    assert a["evidence"]["train_generate_calls"] >= 10
    assert a["action"].startswith(
        'Generate faster: GRPOConfig(use_vllm=True, vllm_mode="colocate")'), a["action"]


def test_a_second_trainer_in_the_same_process_is_counted(tmp_path: Path) -> None:
    """Two models trained one after the other, each by a Trainer of its own (the second
    at twice the batch), the first Trainer (and its optimizer) kept: every step of both,
    with their micro-batches, and the settings sent are the second Trainer's once it
    trains, and its batches are training's, not an evaluation's. Before, the first
    optimizer stayed the iteration clock while it lived, so the second Trainer's 20
    steps were never counted (on a GPU: a stalled job to the advisor), and the first
    Trainer's settings were sent for good."""
    rec, truth = record(tmp_path, "hf_trainer", "--runs", "2", "--steps", "20", "--accum", "2",
                        "--batch", "4", "--eval-every", "1000", "--eval-samples", "16")
    assert truth["steps"] == 40
    steps, samples = steps_and_samples(rec)
    assert steps == 40
    # the second Trainer's loader is new once training began, and its first step's two
    # micro-batches and the one read ahead come before any backward(): training's all
    # the same (before, every batch of it read as evaluation)
    assert samples == 20 * 2 * 4 + 20 * 2 * 8
    phase = lines(rec, "phase")[-1]
    assert phase["eval_batches"] == truth["evals"] * 16 // 4
    assert {s["micro_batches"] for s in lines(rec, "step")} == {2}
    assert last_config(rec)["fw_batch_size"] == 8
    (job,) = advise(rec)["jobs"]
    assert job["steps"] == 40 and job["micro_batches"] == 2


def test_a_second_lightning_fit_in_the_same_process_is_counted(tmp_path: Path) -> None:
    """Two models fitted one after the other, each by a Lightning Trainer of its own (the
    second at twice the batch), the first kept: every step and sample of both, and the
    settings of the second fit once it trains. Before, 160 of the 240 steps, and the
    first fit's batch size for good."""
    rec, truth = record(tmp_path, "lightning_two_fits")
    assert truth["steps"] == 2 * 640 // 8 + 2 * 640 // 16
    assert steps_and_samples(rec) == (truth["steps"], truth["samples"])
    cfg = last_config(rec)
    assert cfg["framework"] == "lightning" and cfg["fw_batch_size"] == truth["last_batch"]


def test_a_lightning_gan_counts_its_iterations_and_no_micro_batches(tmp_path: Path) -> None:
    """Lightning's manual optimization as its GAN example writes it: per batch the
    generator's backward() and step, then the discriminator's (Lightning's global_step
    counts both). One iteration a batch, the samples the steps took from an
    IterableDataset, the validations as a phase, and no micro-batches: the two
    backward() calls are two optimizers' losses, not gradient accumulation (before, every
    step said 2, which the advisor reads as accumulating micro-batches)."""
    rec, truth = record(tmp_path, "lightning_gan", "--val", "--iterable", "--samples", "3200",
                        "--seconds", "6")
    assert truth["global_step"] == 2 * truth["steps"]
    steps, samples = steps_and_samples(rec)
    assert steps == truth["steps"]
    # Lightning reads an iterable loader one batch ahead (to know its last): when the
    # training stops, that batch was fetched and no step trained on it
    assert samples - truth["samples"] in (0, 64)
    # no step counts micro-batches, the first neither: its one backward() before an
    # optimizer's step can be reported before the second optimizer's has shown the
    # pattern (seen with the suite's load beside it; before, it said 1 and the job 1.0)
    told = [s["micro_batches"] for s in lines(rec, "step") if "micro_batches" in s]
    assert told == []
    assert all(not s.get("micro_batches") for s in lines(rec, "steps"))
    phase = lines(rec, "phase")[-1]
    print(f"hook: {phase['seconds']}, the script's validations: "
          f"{truth['eval_seconds']:.2f} s in {truth['evals']}")
    assert phase["seconds"]["eval"] == pytest.approx(truth["eval_seconds"],
                                                     rel=EVAL_TOLERANCE, abs=0.3)
    # 800 images a validation, streamed by two workers of 400 each: 7 batches each
    assert phase["eval_batches"] == truth["evals"] * 14
    (job,) = advise(rec)["jobs"]
    assert job["steps"] == truth["steps"] and job["framework"] == "lightning"
    assert "micro_batches" not in job


def test_debugging_left_on_in_a_framework_is_reported_while_it_trains(tmp_path: Path) -> None:
    """Lightning's Trainer(detect_anomaly=True) turns autograd's anomaly detection on
    around its loop, and off after: the hook reads it on while the job trains (the
    settings sent after fit() returned read it off). CUDA_LAUNCH_BLOCKING=1 in the job's
    environment; the Trainer's debug="underflow_overflow"."""
    rec, _ = record(tmp_path, "lightning_val", "--steps", "1000", "--val-every", "2000",
                    "--detect-anomaly", env={"CUDA_LAUNCH_BLOCKING": "1"})
    training = [c for c in lines(rec, "config") if c.get("in_training")]
    assert any(c["anomaly_detection"] is True for c in training)
    assert all(c["launch_blocking"] is True for c in lines(rec, "config"))
    assert "fw_debug_overflow" not in training[-1]  # a Trainer's setting, not Lightning's
    assert not lines(rec, "hook_problem")
    rec, truth = record(tmp_path, "hf_trainer", "--steps", "12", "--eval-every", "1000",
                        "--debug-overflow")
    cfg = last_config(rec)
    assert cfg["fw_debug_overflow"] is True and cfg["anomaly_detection"] is False
    assert cfg["launch_blocking"] is False
    assert truth["steps"] == 12
    assert not lines(rec, "hook_problem")
    plain = tmp_path / "plain"
    plain.mkdir()
    rec, _ = record(plain, "hf_trainer", "--steps", "4", "--eval-every", "1000")
    assert last_config(rec)["fw_debug_overflow"] is False


def test_memory_freed_by_hand_while_training_is_counted_and_timed(tmp_path: Path) -> None:
    """gc.collect() from a TrainerCallback at every step of the real Trainer, and
    gc.collect() / torch.cuda.empty_cache() in a plain loop every 5th and 2nd step: each
    call made while training is counted (none of start-up's or evaluation's), with the
    seconds spent inside; the job's own calls reach it through torch's and gc's names."""
    rec, truth = record(tmp_path, "hf_trainer", "--steps", "12", "--eval-every", "6",
                        "--gc-every", "1")
    final = lines(rec, "phase")[-1]
    assert truth["steps"] == 12
    assert final["calls"] == {"gc_collect": 12}
    assert final["call_seconds"]["gc_collect"] > 0
    assert not lines(rec, "hook_problem")
    loop = tmp_path / "loop"
    loop.mkdir()
    rec = loop / "loop.jsonl"
    run = subprocess.run([*RUN, "--record", str(rec), "--", sys.executable,
                          str(REPO / "tests" / "scripts" / "train_cpu.py"), "--steps", "20",
                          "--workers", "0", "--gc-every", "5", "--empty-cache-every", "2"],
                         check=False, env=clean_env(), cwd=loop, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    final = lines(rec, "phase")[-1]
    assert final["calls"] == {"gc_collect": 4, "empty_cache": 10}
    assert set(final["call_seconds"]) == {"gc_collect", "empty_cache"}
    # a job that frees nothing by hand says nothing of it
    plain = tmp_path / "plain"
    plain.mkdir()
    rec, _ = record(plain, "hf_trainer", "--steps", "4", "--eval-every", "1000")
    assert all("calls" not in p for p in lines(rec, "phase"))


def test_the_trainers_ddp_default_search_for_unused_parameters_is_reported(
        tmp_path: Path) -> None:
    """The Trainer under torchrun (two processes, gloo): its DDP wrapper built with
    find_unused_parameters=True (its default for a model without gradient
    checkpointing), and DDP's own statistics finding nothing unused; with
    ddp_find_unused_parameters=False, off. Every rank reports it, and the hook loses no
    fact (DDP's statistics are read once its constructor finished)."""
    rec, truth = record(tmp_path, "hf_trainer", "--steps", "24", "--eval-every", "1000",
                        ranks=2)
    configs = [c for c in lines(rec, "config") if c.get("in_training")]
    final = {c["rank"]: c for c in configs}
    assert sorted(final) == [0, 1]
    for c in final.values():
        assert c["ddp_find_unused"] is True and c["ddp_unused_bytes"] == 0
        assert c["ddp_static_graph"] is False
    assert not lines(rec, "hook_problem")
    off = tmp_path / "off"
    off.mkdir()
    rec, _ = record(off, "hf_trainer", "--steps", "8", "--eval-every", "1000",
                    "--no-find-unused", ranks=2)
    for c in lines(rec, "config"):
        assert c.get("ddp_find_unused") in (None, False)
        assert "ddp_unused_bytes" not in c


def test_lightning_reloading_its_training_loader_each_epoch_is_still_training(
        tmp_path: Path) -> None:
    """Trainer(reload_dataloaders_every_n_epochs=1): a new training DataLoader each epoch
    (epochs of 8 batches). Each new loader's first batch is followed by a backward(), so it
    is training, not evaluation: every step counted, every epoch's first batch marked. Its
    persistent workers start again with each loader: the setting is named to undo."""
    rec, truth = record(tmp_path, "lightning_cnn", "--size", "32", "--batch", "32",
                        "--workers", "2", "--samples", "256", "--reload", "--seconds", "12")
    assert truth["loaders"] >= 5
    steps = lines(rec, "step") + lines(rec, "steps")
    assert sum(s.get("steps", 1) for s in steps) == truth["steps"]
    firsts = sum(int(s.get("first_batch") or 0) for s in steps)
    assert firsts == truth["loaders"]
    phase = lines(rec, "phase")[-1]
    assert phase["eval_batches"] == 0 and "eval" not in phase["seconds"]
    assert last_config(rec)["fw_reload_loaders"] == 1
    report = advise(rec)
    assert "speed-up-evaluation" not in {a["id"] for a in report["advice"]}
    (a,) = [a for a in report["advice"] if a["id"] == "dataloader-rebuilt-each-epoch"]
    assert a["action"].startswith("Trainer(reload_dataloaders_every_n_epochs=1 → 0)")
    assert a["evidence"]["persistent_workers"] == 1


def test_lightning_reloading_its_loader_and_validating_each_epoch_is_told_so(
        tmp_path: Path) -> None:
    """The same with validation at each epoch's end (Lightning's default): each new
    training loader's first batch comes while the hook still reads the validation before
    it. Every epoch's first batch is still marked, the validation is evaluation and
    nothing more, and the rebuilt loader is told however much of the time validates."""
    rec, truth = record(tmp_path, "lightning_cnn", "--size", "32", "--batch", "32",
                        "--workers", "2", "--samples", "256", "--reload",
                        "--val-samples", "128", "--val-batch", "8", "--seconds", "12")
    assert truth["loaders"] >= 4 and truth["evals"] >= truth["loaders"] - 1
    steps = lines(rec, "step") + lines(rec, "steps")
    assert sum(s.get("steps", 1) for s in steps) == truth["steps"]
    firsts = sum(int(s.get("first_batch") or 0) for s in steps)
    assert firsts == truth["loaders"]
    phase = lines(rec, "phase")[-1]
    # 16 batches a validation; none of the training loaders' first batches among them
    assert phase["eval_batches"] == 16 * truth["evals"]
    # the validations' time (the callback's clock), and a little of each epoch's end
    # after it (to the new loader's making: Lightning's epoch-end work, the old loader's
    # workers shut down; 40 ms an epoch on an H200), not the new epochs' starts as well
    assert 0.9 * truth["eval_seconds"] <= phase["seconds"]["eval"] \
        <= 1.3 * truth["eval_seconds"] + 0.15 * truth["evals"] + 0.3, \
        (phase["seconds"], truth["eval_seconds"])
    report = advise(rec)
    (a,) = [a for a in report["advice"] if a["id"] == "dataloader-rebuilt-each-epoch"]
    assert a["action"].startswith("Trainer(reload_dataloaders_every_n_epochs=1 → 0)")


def test_lightnings_batch_size_finder_is_reported(tmp_path: Path) -> None:
    """A BatchSizeFinder callback sizes the batch to what fits in memory on purpose: the
    hook reports it (fw_auto_batch), so no advice reads the full memory it leaves as a
    risk (enable-gradient-checkpointing is silent then). The loaders its trials make (one
    per batch size tried) are no epochs' starts; with persistent_workers=False every later
    epoch's is (the first epoch's loader is the tuner's last)."""
    rec, truth = record(tmp_path, "lightning_cnn", "--size", "32", "--batch", "8",
                        "--workers", "2", "--samples", "512", "--find-batch", "2",
                        "--no-persistent", "--seconds", "8")
    assert truth["found_batch"] == 16
    cfg = last_config(rec)
    assert cfg["framework"] == "lightning" and cfg["fw_auto_batch"] is True
    # the finder's trials are steps that ran (3 a trial; Lightning then restores the
    # weights and global_step): the hook counts every step run
    steps = lines(rec, "step") + lines(rec, "steps")
    assert sum(s.get("steps", 1) for s in steps) == truth["batches_run"] == truth["steps"] + 6
    firsts = [s for s in steps if s.get("first_batch")]
    assert sum(int(s["first_batch"]) for s in firsts) == truth["epochs"] - 1 >= 3
    assert {s["batch_size"] for s in lines(rec, "step") if s.get("first_batch")} <= {16}


def test_lightning_predict_is_an_inference_process_in_lightnings_words(tmp_path: Path) -> None:
    """Trainer.predict over and over, never a backward(): an inference process whose
    batches are the predict loader's, counted exactly, with Lightning named. Its one
    loader worker spends 5 ms of CPU an item (80 ms a batch of 16, a tiny CNN's forward a
    few ms): the process waits for data most of the time, and the hook times that wait."""
    rec, truth = record(tmp_path, "lightning_predict", "--accelerator", "cpu", "--size", "32",
                        "--batch", "16", "--workers", "1", "--samples", "256",
                        "--cpu-ms", "5", "--seconds", "12")
    assert truth["rounds"] >= 2
    assert not lines(rec, "step") and not lines(rec, "steps")
    phase = lines(rec, "phase")[-1]
    assert phase["phase"] == "inference" and phase["inference_batch_size"] == 16
    assert phase["inference_batches"] == truth["predict_batches"]
    serving = phase["seconds"]["inference"]
    print(f"waited {phase['inference_wait_seconds']} s of {serving} s serving")
    assert 0.5 * serving <= phase["inference_wait_seconds"] <= serving
    report = advise(rec)
    (job,) = report["jobs"]
    assert job["phase"] == "inference" and job["framework"] == "lightning"
    assert all("learning rate" not in a["action"] for a in report["advice"])


def test_generate_under_no_grad_is_an_inference_process(tmp_path: Path) -> None:
    rec, truth = record(tmp_path, "generate", "--seconds", "30")
    assert not lines(rec, "step") and not lines(rec, "steps")
    phase = lines(rec, "phase")[-1]
    assert phase["phase"] == "inference"
    assert phase["generate_calls"] == truth["generate_calls"] > 0
    assert phase["inference_batch_size"] == 1
    assert phase["seconds"]["inference"] >= 15
    report = advise(rec)
    (job,) = report["jobs"]
    assert job["phase"] == "inference" and job["time_share"] is None
    assert report["hook"]["phases"] is True
    assert not any("No data from the torch hook" in n for n in report["notes"])
    assert all("learning rate" not in a["action"] for a in report["advice"])
    (a,) = [a for a in report["advice"] if a["id"] == "batch-inference-requests"]
    assert "generate()" in a["action"]


@pytest.mark.parametrize("stream", [False, True], ids=["list", "generator"])
def test_a_pipeline_is_an_inference_process_in_its_own_words(tmp_path: Path,
                                                             stream: bool) -> None:
    """A text-classification pipeline() fed sentence by sentence (batch_size=1): every
    forward pass is one of its DataLoader's batches, counted exactly, and the pipeline is
    found on the inference batch's stack, whether its __call__ runs the loop (a list) or
    the caller drives the iterator it hands back (a generator)."""
    rec, truth = record(tmp_path, "hf_pipeline", "--hidden", "64", "--layers", "2",
                        "--sentences", "200", "--seconds", "12",
                        *(["--stream"] if stream else []))
    phase = lines(rec, "phase")[-1]
    assert phase["phase"] == "inference" and phase["generate_calls"] == 0
    assert phase["inference_batches"] == truth["sentences"] and phase["inference_batch_size"] == 1
    (cfg,) = {c["framework"]: c for c in lines(rec, "config") if c.get("framework")}.values()
    assert cfg["framework"] == "transformers.pipeline"
    assert cfg["fw_task"] == "text-classification" and cfg["framework_version"]
    assert not lines(rec, "hook_problem")


def test_a_loop_slicing_its_own_batches_is_an_inference_process(tmp_path: Path) -> None:
    """A BERT encoder in eval mode fed slices of a token tensor (no DataLoader, no
    generate()): before, the hook said start-up for the whole run, and every rule stayed
    silent. Each forward pass is counted exactly, with its batch."""
    rec, truth = record(tmp_path, "infer_loop", "--hidden", "32", "--layers", "2", "--seq",
                        "16", "--rows", "512", "--batch", "32", "--seconds", "12")
    phase = lines(rec, "phase")[-1]
    assert phase["phase"] == "inference" and phase["generate_calls"] == 0
    assert phase["inference_batches"] == truth["passes"] >= 64
    assert phase["inference_samples"] == truth["rows"]
    assert phase["inference_batch_size"] == 32
    configs = lines(rec, "config")
    assert configs[-1]["uses_dataloader"] is False
    assert not any(c.get("framework") for c in configs)
    assert not lines(rec, "hook_problem")
    (job,) = advise(rec)["jobs"]
    assert job["phase"] == "inference"
    assert job["inference"] == {"batches": truth["passes"], "batch_size": 32,
                                "generate_calls": 0}


def test_sentence_transformers_encode_is_an_inference_process_in_its_own_words(
        tmp_path: Path) -> None:
    """SentenceTransformer.encode(sentences, batch_size=32): its own loop over slices of
    the sentences, one forward pass per batch; the model is found on the pass's stack."""
    pytest.importorskip("sentence_transformers")
    rec, truth = record(tmp_path, "st_encode", "--hidden", "32", "--layers", "2",
                        "--sentences", "256", "--seconds", "12")
    phase = lines(rec, "phase")[-1]
    assert phase["phase"] == "inference"
    assert phase["inference_batches"] == truth["passes"] >= 64
    assert phase["inference_samples"] == truth["sentences"]
    assert phase["inference_batch_size"] == 32
    (cfg,) = {c["framework"]: c for c in lines(rec, "config") if c.get("framework")}.values()
    assert cfg["framework"] == "sentence_transformers"
    assert cfg["fw_task"] == "SentenceTransformer" and cfg["framework_version"]
    assert cfg["uses_dataloader"] is False
    assert not lines(rec, "hook_problem")


def test_trainer_predict_is_an_inference_process_in_the_trainers_words(tmp_path: Path) -> None:
    """Trainer.predict over and over (hf_textcls.py --predict, a tiny BERT classifier):
    no backward() ever, so an inference process; the framework is found from the
    inference batch's own stack (it was only looked for at a training iteration's end)."""
    rec, truth = record(tmp_path, "hf_textcls", "--hidden", "32", "--layers", "2",
                        "--seq", "32", "--batch", "16", "--predict", "--seconds", "12",
                        "--samples", "4096")
    assert truth["predict_rounds"] >= 1
    assert not lines(rec, "step") and not lines(rec, "steps")
    assert lines(rec, "phase")[-1]["phase"] == "inference"
    named = [c for c in lines(rec, "config") if c.get("framework")]
    assert named and named[-1]["framework"] == "transformers"
    report = advise(rec)
    (job,) = report["jobs"]
    assert job["phase"] == "inference" and job["framework"] == "transformers"
    (end,) = report["job_ends"]
    assert "having run inference only" in end["summary"]


def test_trainer_saving_every_few_steps_is_told_to_save_less_often(tmp_path: Path) -> None:
    """TrainingArguments(save_strategy="steps", save_steps=5) on a tiny BERT: each
    _save_checkpoint (model, optimizer, scheduler, RNG: several writes) is one save of the
    checkpoint phase, counted as the Trainer's on_save counts them, and a quarter of the
    run goes to them: slow-checkpointing, in the Trainer's words."""
    rec, truth = record(tmp_path, "hf_textcls", "--hidden", "64", "--layers", "2",
                        "--seq", "32", "--batch", "8", "--save-every", "5", "--seconds", "16")
    phase = lines(rec, "phase")[-1]
    # (how many fit in 16 s depends on the machine's load; the rule needs two)
    assert phase["checkpoints"] == truth["saves"] >= 2
    assert phase["seconds"]["checkpoint"] > 0
    cfg = last_config(rec)
    assert cfg["fw_save_every"] == 5 and cfg["fw_save_strategy"] == "steps"
    assert cfg["fw_save_only_model"] is False
    report = advise(rec)
    (job,) = report["jobs"]
    assert job["checkpoints"] == truth["saves"]
    share = phase["seconds"]["checkpoint"] / (phase["seconds"]["checkpoint"]
                                               + phase["seconds"]["train"])
    print(f"checkpoints: {phase['checkpoints']} saves, {share:.0%} of the time")
    (a,) = [a for a in report["advice"] if a["id"] == "slow-checkpointing"]
    assert "TrainingArguments(save_steps=5 → " in a["action"]
    assert "TrainingArguments(save_only_model=True)" in a["action"]
    assert a["evidence"]["checkpoints"] >= 2


@pytest.mark.parametrize("script,args", [
    ("lightning_cnn", ["--batch", "16", "--workers", "0", "--size", "16", "--ckpt-every",
                       "4", "--seconds", "6"]),
    ("accelerate_accum", ["--micro", "8", "--accum", "2", "--steps", "100000", "--seconds",
                          "5", "--save-every", "20"]),
])
def test_lightning_and_accelerate_saves_are_counted_once_each(tmp_path: Path, script: str,
                                                               args: list[str]) -> None:
    """Lightning's ModelCheckpoint(every_n_train_steps=4) and Accelerate's save_state()
    (safetensors for the model, torch.save for the rest): one save each, as the script's
    own callback or loop counts them."""
    rec, truth = record(tmp_path, script, *args)
    phase = lines(rec, "phase")[-1]
    assert phase["checkpoints"] == truth["saves"] >= 3
    assert phase["seconds"]["checkpoint"] > 0
    if script == "lightning_cnn":
        cfg = last_config(rec)
        assert cfg["fw_save_every"] == 4 and cfg["fw_save_only_model"] is False


def test_a_run_clm_no_trainer_style_loop(tmp_path: Path) -> None:
    """accel_clm.py, laid out as Hugging Face's run_clm_no_trainer.py: Accelerate with
    two micro-batches per optimizer step, a linear schedule, perplexity over an eval
    loader every 6 steps (gather_for_metrics) and save_state every 8: the evaluations
    are the eval phase (as long as the loop's own clock says), each save_state one
    checkpoint, each optimizer step one step of two micro-batches."""
    rec, truth = record(tmp_path, "accel_clm", "--n_embd", "32", "--n_layer", "1",
                        "--block_size", "32", "--vocab_size", "500",
                        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps",
                        "2", "--eval_every", "6", "--eval_samples", "256",
                        "--per_device_eval_batch_size", "2", "--checkpointing_steps", "8",
                        "--max_train_steps", "24", "--seconds", "600")
    steps = lines(rec, "step") + lines(rec, "steps")
    assert sum(s.get("steps", 1) for s in steps) == truth["steps"] == 24
    assert {s["micro_batches"] for s in lines(rec, "step")} == {2}
    phase = lines(rec, "phase")[-1]
    print(f"hook: {phase['seconds']}, the loop's evaluations: {truth['eval_seconds']:.2f} s")
    assert truth["evals"] == 4
    assert phase["seconds"]["eval"] == pytest.approx(truth["eval_seconds"], rel=EVAL_TOLERANCE,
                                                     abs=0.3)
    assert phase["eval_batch_size"] == 2
    assert phase["checkpoints"] == truth["saves"] == 3
    cfg = last_config(rec)
    assert cfg["framework"] == "accelerate" and cfg["fw_grad_accum"] == 2


def test_a_data_parallel_loop_reports_its_wrapper(tmp_path: Path) -> None:
    """dp_loop.py wraps its model in torch.nn.DataParallel (as on a GPU host; on the CPU it
    calls the module as it is): the hook counts each step and says a DataParallel was made
    (its device_ids: none without CUDA)."""
    rec, truth = record(tmp_path, "dp_loop", "--cpu", "--seconds", "2", "--batch", "8",
                        "--workers", "1")
    steps = lines(rec, "step") + lines(rec, "steps")
    assert sum(s.get("steps", 1) for s in steps) == truth["steps"] > 0
    cfg = last_config(rec)
    assert cfg["data_parallel_gpus"] == 0 and "framework" not in cfg


def test_a_fabric_loop_names_fabric_and_its_precision(tmp_path: Path) -> None:
    """The loop of Lightning's README for Fabric (lightning_demos.py --model fabric:
    fabric.setup, setup_dataloaders, fabric.backward, two micro-batches per step under
    no_backward_sync): each optimizer step one step of two micro-batches, and the framework
    is Fabric, found from its strategy on the step's stack, with Fabric's precision."""
    rec, truth = record(tmp_path, "lightning_demos", "--model", "fabric", "--cpu", "--batch",
                        "4", "--accum", "2", "--seconds", "1", "--words", "20000")
    steps = lines(rec, "step") + lines(rec, "steps")
    assert sum(s.get("steps", 1) for s in steps) == truth["steps"] >= 50
    assert {s["micro_batches"] for s in lines(rec, "step")} == {2}
    cfg = last_config(rec)
    assert cfg["framework"] == "fabric" and cfg["fw_precision"] == "32-true"
    assert cfg["fw_world_size"] == 1 and cfg["batch_size"] == 4
    assert cfg["batch_sampler"] is None
    (job,) = advise(rec)["jobs"]
    assert job["framework"] == "fabric"


def test_lightnings_lstm_demo_batches_by_its_own_sampler(tmp_path: Path) -> None:
    """Lightning's LSTM demo makes its batches with a batch_sampler (SequenceSampler, 20 a
    batch): the DataLoader's own batch_size is None; the hook reports the sampler's batch
    size and class, so advice can name the setting that exists."""
    rec, truth = record(tmp_path, "lightning_demos", "--model", "lstm", "--cpu", "--seconds",
                        "2", "--words", "20000")
    steps = lines(rec, "step") + lines(rec, "steps")
    assert sum(s.get("steps", 1) for s in steps) == truth["steps"] > 0
    cfg = last_config(rec)
    assert cfg["framework"] == "lightning" and cfg["batch_sampler"] == "SequenceSampler"
    assert cfg["batch_size"] == 20 and cfg.get("fw_batch_size") is None
    assert cfg["fw_max_epochs"] == -1  # the script's max_epochs=-1: no limit


def test_a_frameworks_own_batch_sampler_is_not_the_jobs() -> None:
    """Accelerate's prepare() under several processes rebuilds the DataLoader around a
    BatchSamplerShard of torch's BatchSampler (its batch_size None): the batch size is still
    the loader's (the Trainer's per_device_train_batch_size), not a sampler of the job's.
    A sampler of the job's own, wrapped by Accelerate the same way, is named."""
    import torch
    from accelerate.data_loader import prepare_data_loader
    from torch.utils.data import DataLoader

    from gpuwatch.advisor.knobs import knob
    from gpuwatch.job.hook.core import _own_batch_sampler

    class Chunks(torch.utils.data.Sampler):
        batch_size = 20

        def __iter__(self):  # noqa: ANN204
            return iter([list(range(k, k + 20)) for k in range(0, 80, 20)])

        def __len__(self) -> int:
            return 4

    data = list(range(100))
    shard = prepare_data_loader(DataLoader(data, batch_size=16), num_processes=2,
                                process_index=0, put_on_device=False)
    assert shard.batch_size is None and type(shard.batch_sampler).__name__ == \
        "BatchSamplerShard"
    assert _own_batch_sampler(shard.batch_sampler) is None
    own = DataLoader(data, batch_sampler=Chunks())
    assert _own_batch_sampler(own.batch_sampler) == "Chunks"
    wrapped = prepare_data_loader(own, num_processes=2, process_index=0, put_on_device=False)
    assert _own_batch_sampler(wrapped.batch_sampler) == "Chunks"
    # Lightning's wrapper (its predict loop) keeps the sampler as _batch_sampler; its demos'
    # own samplers live in lightning's modules too and are the job's
    from lightning.pytorch.demos.lstm import SequenceSampler
    from lightning.pytorch.overrides.distributed import _IndexBatchSamplerWrapper
    assert _own_batch_sampler(_IndexBatchSamplerWrapper(DataLoader(
        data, batch_size=4).batch_sampler)) is None
    lstm = SequenceSampler(data, batch_size=20)
    assert _own_batch_sampler(lstm) == "SequenceSampler"
    assert _own_batch_sampler(_IndexBatchSamplerWrapper(lstm)) == "SequenceSampler"
    # what a recording made before this reads as (the hook reported the wrapper)
    assert knob("batch_size", "accelerate", 16, 32, "BatchSamplerShard") == \
        "DataLoader(batch_size=16 → 32)"
    assert knob("batch_size", "transformers", 8, 16, "Chunks").startswith(
        "TrainingArguments(per_device_train_batch_size=8 → 16)")


def test_the_trainers_knobs_name_the_arguments_class_the_script_builds() -> None:
    """The Hugging Face Trainer's knobs in the class of its arguments (fw_args): TRL's
    SFTConfig, GRPOConfig; TrainingArguments itself, or nothing said (a recording made
    before the hook sent it), as before; Seq2SeqTrainingArguments' own knob unchanged."""
    from gpuwatch.advisor.knobs import knob

    assert knob("batch_size", "transformers", 8, 16, None, "SFTConfig") == \
        "SFTConfig(per_device_train_batch_size=8 → 16) (in torch: DataLoader(batch_size=16))"
    assert knob("grad_accum", "transformers", 4, 1, None, "GRPOConfig").startswith(
        "GRPOConfig(gradient_accumulation_steps=4 → 1)")
    for same in (None, "TrainingArguments", "not a name()"):
        assert knob("eval_every", "transformers", 10, 40, None, same).startswith(
            "TrainingArguments(eval_steps=10 → 40)")
    assert knob("eval_generate", "transformers", True, False, None,
                "Seq2SeqTrainingArguments").startswith(
        "Seq2SeqTrainingArguments(predict_with_generate=True → False)")
    # another framework's knobs are its own
    assert knob("batch_size", "lightning", 8, 16, None, "SFTConfig").startswith(
        "the training DataLoader(batch_size=8 → 16)")


def test_fabric_from_the_standalone_package_is_fabric() -> None:
    """`pip install lightning-fabric` names its modules lightning_fabric.*, not
    lightning.fabric.*: its strategy on the optimizer step's stack is Fabric all the
    same."""
    from gpuwatch.job.hook import frameworks

    src = ("class Strategy:\n    pass\n\n\nclass SingleDeviceStrategy(Strategy):\n"
           "    def optimizer_step(self, probe):\n        return probe()\n")
    ns: dict = {"__name__": "lightning_fabric.strategies.single_device"}
    exec(compile(src, "/env/site-packages/lightning_fabric/strategies/strategy.py", "exec"), ns)
    strategy = ns["SingleDeviceStrategy"]()
    got = strategy.optimizer_step(lambda: frameworks.detect(sys._getframe(1)))
    assert got == ("fabric", strategy)


def test_a_trainer_with_dynamic_padding_metrics_and_tokenizing_first(tmp_path: Path) -> None:
    """hf_clm.py on the CPU: a GPT-2 under the Trainer, batches padded to their longest
    sample, compute_metrics over the gathered logits, a second of "tokenization" after the
    model is placed. Every step is counted exactly, the evaluations are their own phase,
    the tokenization is start-up, and the optimizer's parameters are float32."""
    rec, truth = record(tmp_path, "hf_clm", "--steps", "12", "--dynamic", "--eval-every",
                        "6", "--metrics", "--preprocess-seconds", "1")
    steps = lines(rec, "step") + lines(rec, "steps")
    assert sum(s.get("steps", 1) for s in steps) == truth["steps"] == 12
    final = lines(rec, "phase")[-1]["seconds"]
    assert truth["evals"] == 2
    assert final["eval"] == pytest.approx(truth["eval_seconds"], rel=EVAL_TOLERANCE, abs=0.3)
    assert final["startup"] >= truth["preprocess_seconds"]
    cfg = last_config(rec)
    assert cfg["framework"] == "transformers" and cfg["param_dtype"] == "float32"
    assert cfg["autocast"] is False
    assert not lines(rec, "hook_problem")
    (job,) = advise(rec)["jobs"]
    assert job["steps"] == 12 and job["framework"] == "transformers"


def test_the_scripts_run_without_gpuwatch(tmp_path: Path) -> None:
    """The same scripts, with no gpuwatch anywhere, train the same number of steps (the
    hook changes nothing of the job)."""
    truth = tmp_path / "t.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWATCH", "PYTHONPATH"))}
    run = subprocess.run([sys.executable, str(SCRIPTS / "accelerate_accum.py"), "--steps", "3",
                          "--out", str(truth)], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(truth.read_text())["steps"] == 3


def test_the_trainers_batch_size_finder_settles_where_it_does_without_the_hook(
        tmp_path: Path) -> None:
    """TrainingArguments(auto_find_batch_size=True): each batch whose backward runs out of
    memory is tried again at 90 %. The hook must hold nothing of a failed attempt (its
    loss still holds the graph a failed backward did not free), or the next attempts run
    beside that memory and the Trainer settles on a smaller batch than the card allows
    (on an H200, GPT-2 at 56 samples instead of 186). The script plays the memory on the
    CPU: the batch settled on, with the hook and without, is the largest that fits."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWATCH", "PYTHONPATH"))}
    bare = tmp_path / "bare.json"
    run = subprocess.run([sys.executable, str(SCRIPTS / "hf_autobatch.py"), "--out", str(bare)],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    rec, truth = record(tmp_path, "hf_autobatch")
    expected = json.loads(bare.read_text())
    assert expected["tried"] == [64, 57, 51, 45, 40] and expected["trained_batch"] == 40
    assert truth["tried"] == expected["tried"] and truth["steps"] == 6
    steps = lines(rec, "step")
    assert len(steps) == 6 and {s["batch_size"] for s in steps[1:]} == {40}
    # the first step: the attempts that failed are start-up, not part of it. It holds its
    # batch and the one accelerate's loader fetches ahead, as in any Trainer run (not the
    # 2 x 257 samples of every attempt's two batches)
    assert steps[0]["batch_size"] == 2 * 40 and steps[0]["micro_batches"] == 1
    assert not lines(rec, "hook_problem")
    # the finder is said: its full memory is no risk to warn of
    assert last_config(rec)["fw_auto_batch"] is True
