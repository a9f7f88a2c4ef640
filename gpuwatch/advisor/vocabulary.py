"""The one vocabulary rules speak: every signal's name, table, unit and meaning.

Every data source (a recording, the live store, Prometheus) is mapped onto the trace
format's field names, so one rule file serves them all. A few names are renamed where the
trace uses one field name on two line kinds (the host's ``mem_used_bytes`` becomes
``host_mem_used_bytes``), and a few derived signals are defined here (``mem_used_ratio``,
``data_wait_ratio``, ``job_workers`` ...), computed per time bucket by :mod:`.frame`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SignalDef:
    """One name of the vocabulary."""

    name: str
    table: str  # gpu | host | job | phase | config | fact
    unit: str
    doc: str
    agg: str = "mean"  # how samples in one bucket combine: mean | last | counter
    derived: bool = False


def _defs() -> dict[str, SignalDef]:
    rows: list[tuple[str, str, str, str, str, bool]] = [
        # name, table, unit, agg, doc, derived
        ("util", "gpu", "ratio", "mean", "NVML utilization.gpu: time fraction a kernel ran", False),
        ("mem_util", "gpu", "ratio", "mean", "memory controller busy (not fullness)", False),
        ("mem_used_bytes", "gpu", "bytes", "mean", "device memory used (all processes)", False),
        ("mem_total_bytes", "gpu", "bytes", "last", "device memory size", False),
        ("power_watts", "gpu", "watts", "mean", "board power draw", False),
        ("power_limit_watts", "gpu", "watts", "last", "enforced power limit", False),
        ("temp_celsius", "gpu", "celsius", "mean", "GPU temperature", False),
        ("sm_clock_mhz", "gpu", "MHz", "mean", "SM clock", False),
        ("mem_clock_mhz", "gpu", "MHz", "mean", "memory clock", False),
        ("pstate", "gpu", "0-15", "last", "performance state (0 fastest)", False),
        ("clock_event_reasons", "gpu", "bitmask", "last", "NVML clock event reasons", False),
        ("energy_joules", "gpu", "joules", "counter", "energy since driver load", False),
        ("pcie_tx_bytes_per_second", "gpu", "bytes/s", "mean", "PCIe transmit", False),
        ("pcie_rx_bytes_per_second", "gpu", "bytes/s", "mean", "PCIe receive", False),
        ("pcie_replay_total", "gpu", "count", "counter", "PCIe replays", False),
        ("ecc_corrected_total", "gpu", "count", "counter", "corrected ECC errors", False),
        ("ecc_uncorrected_total", "gpu", "count", "counter", "uncorrected ECC errors", False),
        ("remapped_rows_correctable", "gpu", "rows", "last", "rows remapped (correctable)", False),
        ("remapped_rows_uncorrectable", "gpu", "rows", "last", "rows remapped (uncorrectable)",
         False),
        ("remapped_rows_pending", "gpu", "0/1", "last", "a row remap waits for a GPU reset", False),
        ("remapped_rows_failure", "gpu", "0/1", "last", "a row remap failed", False),
        ("sm_active", "gpu", "ratio", "mean", "GPM: SMs busy (time x SMs)", False),
        ("sm_occupancy", "gpu", "ratio", "mean", "GPM: resident warps / maximum", False),
        ("tensor_active", "gpu", "ratio", "mean", "GPM: tensor pipes busy", False),
        ("dram_active", "gpu", "ratio", "mean", "GPM: DRAM interface busy", False),
        ("fp16_active", "gpu", "ratio", "mean", "GPM: FP16 (non-tensor) pipe busy", False),
        ("fp32_active", "gpu", "ratio", "mean", "GPM: FP32 pipe busy", False),
        ("fp64_active", "gpu", "ratio", "mean", "GPM: FP64 pipe busy", False),
        # derived, per GPU
        ("gpu_idle_writing", "gpu", "0/1", "mean", ("1 for a second in which the GPU idled "
         "(util < 25 %) while its job's main process wrote >= 32 MiB/s to storage (mean over "
         "a window: the share of its time; what a checkpoint save looks like without the "
         "hook)"), True),
        ("idle_writing_ratio", "gpu", "ratio", "last", ("the share of the seconds since its "
         "process first worked on the GPU in which gpu_idle_writing held (whole run; from "
         "20 s of work on)"), True),
        ("idle_writing_bursts", "gpu", "count", "last", ("separate stretches of such seconds "
         "so far (one per save, seen from outside)"), True),
        ("mem_used_ratio", "gpu", "ratio", "mean", "mem_used_bytes / mem_total_bytes", True),
        ("mem_free_bytes", "gpu", "bytes", "mean", "mem_total_bytes - mem_used_bytes", True),
        ("power_ratio", "gpu", "ratio", "mean", "power_watts / power_limit_watts", True),
        ("busy_ratio", "gpu", "ratio", "mean", ("how busy the GPU is, the one measure batch "
         "advice reads: SM active where GPM exists, else NVML util"), True),
        ("mem_headroom_bytes", "gpu", "bytes", "mean", ("memory a larger batch may still "
         "take: 85 % of mem_total_bytes less mem_used_bytes (0 when over)"), True),
        ("gpu_processes", "gpu", "count", "mean", "processes holding memory on the GPU", True),
        ("gpu_process_mem_bytes", "gpu", "bytes", "mean",
         "memory the GPU's processes hold, summed", True),
        ("main_shared_gpus", "gpu", "count", "mean", ("GPUs whose main process (the one "
         "holding the most of its memory) is this GPU's: 2 or more, one process drives "
         "several GPUs (torch.nn.DataParallel, a model split across them)"), True),
        ("xid_errors_total", "gpu", "count", "counter", "XID errors seen, all codes", True),
        ("clock_power_capped", "gpu", "0/1", "mean", ("clocks held down by the power cap "
         "(mean over a window: fraction of time)"), True),
        ("clock_thermal", "gpu", "0/1", "mean", ("clocks held down for temperature "
         "(sw or hw thermal slowdown)"), True),
        ("clock_hw_slowdown", "gpu", "0/1", "mean", ("hardware slowdown or power brake "
         "(power supply, cooling)"), True),
        ("gpu_lost", "gpu", "0/1", "last", "the GPU fell off the bus", True),
        # host
        ("cpu_util", "host", "ratio", "mean", "host CPU busy, all cores", False),
        ("load1", "host", "tasks", "mean", "1-minute load average", False),
        ("load5", "host", "tasks", "mean", "5-minute load average", False),
        ("host_mem_used_bytes", "host", "bytes", "mean", ("host memory used (trace: host "
         "line mem_used_bytes)"), False),
        ("host_mem_total_bytes", "host", "bytes", "last", "host memory size", False),
        ("swap_used_bytes", "host", "bytes", "mean", "swap used", False),
        ("job_cpu_cores", "host", "cores", "mean", ("CPU cores busy in the job's process "
         "trees (1.6 = 160 %)"), False),
        ("job_processes", "host", "count", "mean", "processes in the job's trees", False),
        ("job_rss_bytes", "host", "bytes", "mean", "summed RSS of the job's trees", False),
        ("job_main_cpu_cores", "host", "cores", "mean", ("CPU cores busy in the job's main "
         "process(es) alone (optional field)"), False),
        ("job_workers_cpu_cores", "host", "cores", "mean", ("CPU cores busy in the main "
         "processes' children (optional field)"), False),
        ("job_loader_workers", "host", "count", "mean", ("the children torch names as its "
         "DataLoader workers (pt_data_worker, torch 2.5+; optional field)"), False),
        ("job_write_bytes_per_second", "host", "bytes/s", "mean", ("bytes per second the "
         "job's main processes wrote to storage (/proc/PID/io write_bytes: files on a disk, "
         "not tmpfs, pipes or sockets; optional field)"), False),
        ("job_loader_cpu_cores", "host", "cores", "mean", ("CPU cores busy in those "
         "DataLoader workers (optional field)"), False),
        ("job_loader_workers_started", "host", "count", "mean", ("DataLoader workers started "
         "in the job's trees since the line before (optional field)"), False),
        # derived, host
        ("cpu_free_cores", "host", "cores", "mean", "host_cpus x (1 - cpu_util)", True),
        ("load_per_cpu", "host", "ratio", "mean", "load1 / host_cpus", True),
        ("host_mem_used_ratio", "host", "ratio", "mean", "host memory used / total", True),
        ("job_main_processes", "host", "count", "mean", ("processes using a GPU (the job "
         "roots: one per rank)"), True),
        ("job_workers", "host", "count", "mean", ("the jobs' DataLoader workers: the "
         "children torch names so where any is (job_loader_workers), else every process "
         "that is not a GPU user (job_processes - job_main_processes); at most the "
         "training loader's num_workers where the hook reports it"), True),
        ("loader_workers_started_per_minute", "host", "per minute", "mean", ("DataLoader "
         "workers started in the job's trees, per minute (job_loader_workers_started over each "
         "bucket): a DataLoader with persistent_workers=False starts its whole pool of "
         "workers at every epoch and every evaluation"), True),
        ("main_cpu_cores", "host", "cores", "mean", ("job_main_cpu_cores per main process; "
         "without the split, min(job_cpu_cores, mains) / mains"), True),
        ("workers_cpu_cores", "host", "cores", "mean", ("job_workers_cpu_cores; without the "
         "split, job_cpu_cores minus the mains' estimate"), True),
        ("main_busy_ratio", "host", "ratio", "mean", ("how busy each main process is "
         "(1 = one core pegged)"), True),
        ("workers_busy_ratio", "host", "ratio", "mean", ("how busy each worker is on average "
         "(1 = every worker pegs a core; the named DataLoader workers' CPU where any is)"),
         True),
        # hook: step lines (per job, mapped to its GPU)
        ("step_seconds", "job", "seconds", "mean", ("wall time of one iteration (mean: per "
         "step)"), False),
        ("data_wait_seconds", "job", "seconds", "mean", ("time blocked in the DataLoader per "
         "step"), False),
        ("batch_size", "job", "samples", "last", "samples per step (step or config line)", False),
        ("loss_scale", "job", "scale", "last", "GradScaler scale (fp16 only)", False),
        ("loss", "job", "loss", "mean", ("training loss (the hook sends each report's newest "
         "iteration's, unscaled; finite ones only)"), False),
        ("loss_nonfinite", "job", "ratio", "mean", ("share of the losses the hook read that "
         "were NaN or infinite (each counts 1, a finite one 0)"), True),
        ("mem_allocated_bytes", "job", "bytes", "last", "torch allocated at step end", False),
        ("mem_reserved_bytes", "job", "bytes", "last", "torch caching allocator reserved", False),
        ("max_mem_allocated_bytes", "job", "bytes", "last", "torch peak allocated", False),
        # derived, hook
        ("data_wait_ratio", "job", "ratio", "mean", ("share of step time blocked on data "
         "(window mean: total wait / total step time)"), True),
        ("step_rate", "job", "steps/s", "mean", "steps per second", True),
        ("steps_taken", "job", "steps", "last", ("the job's steps the hook has reported so "
         "far (optimizer steps, counted exactly)"), True),
        ("long_steps", "job", "count", "last", ("the job's long steps so far: a step whose "
         "own time (its data wait left out) is 10 of its usual step and 0.25 s longer at "
         "least, after 20 timed ones (what the loop does every N steps between two; their "
         "time is no step's)"), True),
        ("long_step_share", "job", "ratio", "last", ("the long steps' time beyond the usual "
         "step, as a share of all the steps' time so far"), True),
        ("long_step_seconds", "job", "seconds", "last", "the long steps' mean duration so far",
         True),
        ("long_step_every", "job", "steps", "last", ("steps from one long step to the next "
         "(the median gap of the newest step numbers known, else the steps per long step)"),
         True),
        ("step_gap_seconds", "job", "seconds", "last", ("seconds since the job's last step "
         "while its hook still reports it training (0 while steps come, and once the hook "
         "falls silent or another phase begins)"), True),
        ("samples_per_second", "job", "samples/s", "mean", "step_rate x batch_size", True),
        ("skipped_ratio", "job", "ratio", "mean", ("share of steps GradScaler skipped (or the "
         "loss scale fell)"), True),
        ("act_mem_per_sample_bytes", "job", "bytes", "last", ("activation memory per sample: "
         "(max_mem_allocated - the least allocated at a step's end over the last 30 s) / "
         "batch_size"), True),
        ("mem_reserved_ratio", "job", "ratio", "mean", "mem_reserved_bytes / mem_total_bytes",
         True),
        ("first_batch_wait_ratio", "job", "ratio", "mean", ("share of step time spent waiting "
         "for the first batch of a restarted DataLoader iterator (step lines' first_batch; "
         "the run's first iterator does not count)"), True),
        ("first_batch_wait_seconds", "job", "seconds", "mean", ("data wait of a new "
         "iterator's first batch (window mean: per new iterator)"), True),
        ("iterator_rate", "job", "1/s", "mean", ("new DataLoader iterators (epochs) started "
         "per second"), True),
        ("mem_allocated_growth_bytes_per_second", "job", "bytes/s", "mean", ("torch "
         "allocated at step end: its least-squares slope over the window, per second"),
         True),
        ("mem_allocated_growth_r2", "job", "ratio", "mean", ("how straight that rise is "
         "(R^2 of the fit: 1 = a steady rate)"), True),
        ("mem_used_growth_bytes_per_second", "gpu", "bytes/s", "mean", ("the GPU's used "
         "memory (NVML): its least-squares slope over the window, per second"), True),
        ("mem_used_growth_r2", "gpu", "ratio", "mean", ("how straight that rise is (R^2 of "
         "the fit)"), True),
        ("micro_batches", "job", "count", "mean", ("backward() calls per optimizer step: the "
         "gradient accumulation the job runs (1: none)"), False),
        ("micro_batch_size", "job", "samples", "last", ("samples per backward(): the "
         "training DataLoader's batch_size where each micro-batch is one of its batches "
         "(the steps' batch_size within one batch of micro_batches of them: Accelerate's "
         "loaders read one ahead), else batch_size / micro_batches"), True),
        ("batch_room", "job", "times", "last", ("how many times the micro-batch fits in memory "
         "now (1 + mem_headroom_bytes / the micro-batch's activations): the one measure of "
         "room that batch advice reads"), True),
        ("act_mem_per_batch_bytes", "job", "bytes", "last", ("a step's activation memory as "
         "a whole where the hook knows no batch size (a loop that feeds no DataLoader) and "
         "the step takes one backward(): the allocator's peak over the least the job held "
         "in the last 30 s; batch_room reads it then"), True),
        # phases (the hook's `phase` lines): each a share of wall time per bucket, so a
        # window's mean is the share of that window
        ("phase_train", "phase", "ratio", "mean", "share of wall time in training steps", True),
        ("phase_eval", "phase", "ratio", "mean", ("share of wall time evaluating (another "
         "DataLoader, or the model in eval() between optimizer steps)"), True),
        ("phase_startup", "phase", "ratio", "mean", "share of wall time before the first step",
         True),
        ("phase_compile", "phase", "ratio", "mean", "share of wall time in torch.compile", True),
        ("phase_checkpoint", "phase", "ratio", "mean", "share of wall time saving checkpoints",
         True),
        ("phase_inference", "phase", "ratio", "mean", ("share of wall time serving a model "
         "(forward passes, generate(); a process that never runs backward)"), True),
        ("train_seconds", "phase", "seconds", "last", "seconds in training steps so far", True),
        ("eval_seconds", "phase", "seconds", "last", ("seconds evaluating since the first "
         "step (an evaluation before it, ahead of training, left out)"), True),
        ("peer_eval_seconds", "phase", "seconds", "last", ("the most seconds any other rank "
         "of this job evaluated since its first step (none for a single process): a rank "
         "that evaluates alone while the others wait"), True),
        ("eval_idle_seconds", "phase", "seconds", "last", ("seconds of evaluation so far in "
         "which no evaluation batch came or was waited for and the GPU idled (NVML util under "
         "15 %, between two of the hook's phase lines): the host at work on what the "
         "evaluation returned (gathered predictions, metrics)"), True),
        ("startup_seconds", "phase", "seconds", "last", "seconds before the first step", True),
        ("compile_seconds", "phase", "seconds", "last", "seconds in torch.compile so far", True),
        ("checkpoint_seconds", "phase", "seconds", "last", "seconds saving checkpoints so far",
         True),
        ("eval_time_ratio", "phase", "ratio", "last", ("evaluation's share of the time since "
         "the first step (eval / (train + eval + checkpoint), whole run)"), True),
        ("checkpoint_time_ratio", "phase", "ratio", "last", ("checkpoints' share of the time "
         "since the first step (whole run)"), True),
        ("compiles", "phase", "count", "last", "torch.compile compilations so far", True),
        ("gc_collect_calls", "phase", "count", "last", ("gc.collect() calls while the job "
         "trained, so far (the hook's; absent until the job made one, or any empty_cache())"),
         True),
        ("gc_collect_seconds", "phase", "seconds", "last", ("seconds spent inside those "
         "gc.collect() calls, so far"), True),
        ("empty_cache_calls", "phase", "count", "last", ("torch.cuda.empty_cache() calls "
         "while the job trained, so far (the Trainer's torch_empty_cache_steps, Accelerate's "
         "clear_device_cache; absent as gc_collect_calls is)"), True),
        ("empty_cache_seconds", "phase", "seconds", "last", ("seconds spent inside those "
         "empty_cache() calls, so far (what the next step's allocations pay again is not in "
         "it)"), True),
        ("train_generate_calls", "phase", "count", "last", ("Hugging Face generate() calls "
         "inside the training steps so far (an RL fine-tuning loop's rollouts: TRL's "
         "GRPOTrainer; absent as gc_collect_calls is)"), True),
        ("train_generate_seconds", "phase", "seconds", "last", ("seconds spent inside those "
         "generate() calls, so far"), True),
        ("checkpoints", "phase", "count", "last", ("checkpoint saves during training so far "
         "(torch.save, the framework's own save method; a save within a save counts once)"),
         True),
        ("eval_batch_size", "phase", "samples", "last", "the evaluation DataLoader's batch size",
         True),
        ("eval_train_loader", "phase", "bool", "last", ("1 once an evaluation read batches of "
         "a DataLoader that trains (a training accuracy in a pass of its own, validation on "
         "the training loader): its batch size is the training's"), True),
        ("inference_batch_size", "phase", "samples", "last", ("samples per batch (or sequences "
         "per generate() call) of an inference process"), True),
        ("inference_batches", "phase", "count", "last", ("batches and generate() calls of an "
         "inference process so far"), True),
        ("generate_calls", "phase", "count", "last", ("generate() calls of an inference "
         "process so far (0: its batches came from DataLoaders)"), True),
        ("inference_wait_ratio", "phase", "ratio", "last", ("share of an inference process's "
         "time since its first batch spent waiting for its DataLoader's next batch (whole run; "
         "from 5 s of serving on)"), True),
        # hook: config facts (current value; windows don't apply)
        ("num_workers", "config", "count", "last", "DataLoader num_workers", False),
        ("pin_memory", "config", "bool", "last", "DataLoader pin_memory", False),
        ("persistent_workers", "config", "bool", "last", "DataLoader persistent_workers", False),
        ("prefetch_factor", "config", "batches", "last", "DataLoader prefetch_factor", False),
        ("batch_sampler", "config", "text", "last", ("the class of the training DataLoader's "
         "batch_sampler where it makes the batches (DataLoader(batch_sampler=...): its "
         "batch_size is None); null otherwise"), False),
        ("autocast_dtype", "config", "text", "last", ("autocast dtype ('bfloat16', 'float16'; "
         "null when off)"), False),
        ("param_dtype", "config", "text", "last", ("FSDP1's mixed-precision param_dtype "
         "where set, else the dtype of the optimizer's first parameter ('bfloat16' for a "
         "model cast with model.to(torch.bfloat16); 'float32' also where only float32 "
         "adapters or master weights are optimized, so it is read only as a half-precision "
         "model's sign)"), False),
        ("tf32", "config", "bool", "last", "TF32 matmuls allowed", False),
        ("cudnn_benchmark", "config", "bool", "last", "torch.backends.cudnn.benchmark", False),
        ("deterministic", "config", "bool", "last", ("the job asked for reproducible "
         "kernels: torch.use_deterministic_algorithms (Lightning's "
         "Trainer(deterministic=True)) or torch.backends.cudnn.deterministic"), False),
        ("anomaly_detection", "config", "bool", "last", ("autograd's anomaly detection is on "
         "(torch.autograd.set_detect_anomaly(True), Lightning's Trainer(detect_anomaly=True))"),
         False),
        ("launch_blocking", "config", "bool", "last", ("the job's environment has "
         "CUDA_LAUNCH_BLOCKING=1 (each kernel launch waits for the kernel); as the hook "
         "reads it, else as the daemon read the process's environment as it started"), False),
        ("no_alloc_cache", "config", "bool", "last", ("the job's environment has "
         "PYTORCH_NO_CUDA_MEMORY_CACHING=1 (torch's caching allocator off: each tensor's "
         "memory is a cudaMalloc and a cudaFree); read as launch_blocking is"), False),
        ("dist_debug_detail", "config", "bool", "last", ("the job's environment has "
         "TORCH_DISTRIBUTED_DEBUG=DETAIL (each collective checked against the other ranks' "
         "first); read as launch_blocking is"), False),
        ("ddp_find_unused", "config", "bool", "last", ("the job's DistributedDataParallel "
         "has find_unused_parameters=True (absent without DDP)"), False),
        ("ddp_static_graph", "config", "bool", "last", ("the job's DistributedDataParallel "
         "has static_graph=True (absent without DDP)"), False),
        ("ddp_unused_bytes", "config", "bytes", "last", ("bytes of the parameters the "
         "forward pass left unused, as DDP's own statistics recorded them at the iterations "
         "it samples (1 to 10, then every 100th); absent before the first, and where "
         "find_unused_parameters is off"), False),
        ("fused_optimizer", "config", "bool", "last", "optimizer uses a fused kernel", False),
        ("sparse_grads", "config", "bool", "last", ("the job trains a parameter with sparse "
         "gradients (nn.Embedding or EmbeddingBag with sparse=True): fused SGD refuses them"),
         False),
        ("gradient_checkpointing", "config", "bool", "last", "activation checkpointing on",
         False),
        ("uses_conv", "config", "bool", "last",
         "the model has convolution layers (a patch embedding alone does not count)", False),
        ("world_size", "config", "count", "last", "distributed world size", False),
        ("data_parallel_gpus", "config", "count", "last", ("devices one torch.nn.DataParallel "
         "replicates the model over (its device_ids; absent without one)"), False),
        ("fsdp_cpu_offload", "config", "bool", "last", ("the job's FSDP units keep their "
         "parameters on the CPU (FSDP1's cpu_offload, FSDP2's CPUOffloadPolicy; absent "
         "without FSDP1, and for FSDP2 without offload)"), False),
        ("fsdp_version", "config", "count", "last", ("the FSDP whose offload the hook read: "
         "1 (FullyShardedDataParallel) or 2 (fully_shard); absent with fsdp_cpu_offload"),
         False),
        ("channels_last", "config", "bool", "last", ("the model's parameters are in "
         "torch.channels_last memory format"), False),
        ("cudnn_tf32", "config", "bool", "last", ("torch.backends.cudnn.allow_tf32: cuDNN "
         "runs FP32 convolutions as TF32 (on by default)"), False),
        ("uses_dataloader", "config", "bool", "last", ("the job iterates a torch DataLoader "
         "(false: the hook saw none)"), False),
        ("step_source", "config", "text", "last", ("what the hook counts as a step: "
         "'optimizer' (optimizer.step) or 'backward' (loops without torch.optim)"), False),
        ("grad_scaler", "config", "bool", "last", "an enabled torch.amp.GradScaler (fp16)", False),
        ("optimizer", "config", "text", "last", "the optimizer's class (AdamW, SGD...)", False),
        ("framework", "config", "text", "last", ("what drives the loop: 'transformers' (the "
         "Trainer), 'lightning', 'accelerate', 'fabric' (Lightning Fabric), "
         "'transformers.pipeline' (a Hugging Face pipeline()), 'sentence_transformers' (its "
         "encode()); absent for a plain loop"), False),
        ("fw_args", "config", "text", "last", ("the class of the Hugging Face Trainer's "
         "arguments (TrainingArguments, or a subclass: TRL's SFTConfig...), which its knobs "
         "name"), False),
        ("fw_batch_size", "config", "samples", "last", ("the framework's per-device train "
         "batch (per_device_train_batch_size)"), False),
        ("fw_grad_accum", "config", "count", "last", ("the framework's gradient accumulation "
         "steps (gradient_accumulation_steps, accumulate_grad_batches)"), False),
        ("fw_precision", "config", "text", "last", ("the framework's precision setting "
         "('bf16', 'fp16', 'fp32'; Lightning's 'bf16-mixed'...)"), False),
        ("fw_tf32", "config", "bool", "last", "TrainingArguments(tf32=...)", False),
        ("fw_optim", "config", "text", "last", "TrainingArguments(optim=...)", False),
        ("fw_num_workers", "config", "count", "last", "TrainingArguments(dataloader_num_workers)",
         False),
        ("fw_grad_ckpt", "config", "bool", "last", "the framework's gradient_checkpointing",
         False),
        ("fw_eval_batch_size", "config", "samples", "last", ("the framework's eval batch "
         "(per_device_eval_batch_size; Lightning: the val DataLoader's)"), False),
        ("fw_eval_every", "config", "steps", "last", ("how often the framework evaluates, in "
         "training steps (eval_steps with eval_strategy \"steps\"; Lightning: an int "
         "val_check_interval)"), False),
        ("fw_eval_strategy", "config", "text", "last", ("TrainingArguments(eval_strategy): "
         "'no' (the Trainer evaluates only when the script calls evaluate() or predict()), "
         "'steps' or 'epoch'"), False),
        ("fw_eval_fraction", "config", "ratio", "last", ("Lightning: a float "
         "val_check_interval, the share of an epoch between validations (1.0: once an "
         "epoch, its default)"), False),
        ("fw_eval_epochs", "config", "count", "last", ("Lightning: check_val_every_n_epoch "
         "(absent for validation by steps)"), False),
        ("fw_max_epochs", "config", "count", "last", ("Lightning: max_epochs, the run's "
         "length in epochs (absent or -1: no limit)"), False),
        ("fw_eval_batches", "config", "batches", "last", "Lightning's limit_val_batches", False),
        ("fw_reload_loaders", "config", "count", "last", ("Lightning: "
         "reload_dataloaders_every_n_epochs (0, its default: the loaders are built once)"),
         False),
        ("fw_task", "config", "text", "last", "a Hugging Face pipeline()'s task", False),
        ("fw_auto_batch", "config", "bool", "last", ("the framework sizes the batch itself to "
         "what fits in memory (TrainingArguments(auto_find_batch_size=True); Lightning: a "
         "BatchSizeFinder callback; a loop under accelerate's find_executable_batch_size)"),
         False),
        ("fw_eval_accum", "config", "count", "last", "TrainingArguments(eval_accumulation_steps)",
         False),
        ("fw_eval_generate", "config", "bool", "last", ("the evaluations generate "
         "(Seq2SeqTrainingArguments(predict_with_generate=True))"), False),
        ("fw_eval_gen_len", "config", "count", "last",
         "Seq2SeqTrainingArguments(generation_max_length)", False),
        ("fw_eval_gen_beams", "config", "count", "last",
         "Seq2SeqTrainingArguments(generation_num_beams)", False),
        ("fw_best_metric", "config", "text", "last", ("the metric that picks the best "
         "checkpoint (TrainingArguments(metric_for_best_model))"), False),
        ("fw_compile", "config", "bool", "last", "TrainingArguments(torch_compile)", False),
        ("fw_debug_overflow", "config", "bool", "last", ("TrainingArguments(debug="
         "\"underflow_overflow\"): a forward hook on every module checking its tensors for "
         "inf and nan"), False),
        ("fw_save_strategy", "config", "text", "last", "TrainingArguments(save_strategy)", False),
        ("fw_save_every", "config", "steps", "last", ("how often the framework saves a "
         "checkpoint (save_steps; Lightning: ModelCheckpoint's every_n_train_steps, 0 when it "
         "saves by epoch or time)"), False),
        ("fw_save_only_model", "config", "bool", "last", ("checkpoints without the optimizer's "
         "state (save_only_model; Lightning: ModelCheckpoint's save_weights_only)"), False),
        ("autocast", "config", "bool", "last", "autocast to a 16-bit type is on", True),
        # step-time attribution (docs/advice.md): each is a share of the window's wall time
        # since the job's first step, and the five always sum to 1; any window function
        # reads the share over its window (``mean(share_data, 15s)``, ``last`` = 15 s)
        ("share_data", "job", "ratio", "mean", ("share of wall time blocked in the "
         "DataLoader (claimed first)"), True),
        ("share_sync", "job", "ratio", "mean", ("share of wall time this rank waits on a slower "
         "peer in collectives (several ranks only; claimed second)"), True),
        ("share_gpu", "job", "ratio", "mean", ("share of wall time the GPU works (SM active "
         "where GPM exists, else NVML util; claimed third)"), True),
        ("share_host", "job", "ratio", "mean", ("share of wall time the main process is busy "
         "inside steps while the GPU idles (Python, launches, host syncs)"), True),
        ("share_other", "job", "ratio", "mean", ("the rest: outside steps (pauses, evaluation, "
         "checkpoints) or nobody busy"), True),
        ("gpu_busy", "job", "ratio", "mean", ("the GPU busy share the attribution uses: SM "
         "active where GPM exists, else NVML util, over the job's training time"), True),
        ("train_util", "job", "ratio", "mean", ("NVML util (the share of time any kernel "
         "runs) over the job's training time: evaluations, checkpoints and compiling left out "
         "where the hook's phases tell them; without the hook, all of it"), True),
        ("host_kernel_share", "job", "ratio", "mean", ("the part of share_host during "
         "which NVML util saw a kernel running (util less SM active and share_sync): SMs "
         "idle inside kernels too small to fill them, not a GPU waiting for its next "
         "launch; 0 without GPM (util is then the busy measure)"), True),
        ("busy_in_steps", "job", "ratio", "mean", ("how busy the GPU is while training steps "
         "run: the GPU's share of the time inside steps (the hook's step times), else "
         "busy_ratio's; batch advice's measure of a step too small for the GPU"), True),
        ("job_busy_in_steps", "job", "ratio", "mean", ("the highest busy_in_steps among the "
         "ranks of this job (a single process: its own): its ranks share one batch size, and "
         "the busiest of them fills its GPU first"), True),
        ("job_rank", "job", "rank", "last", "the job's rank (0 for a single process)", True),
        ("job_ranks", "job", "count", "last", ("ranks of this job on this host: those the hook "
         "reports, else those whose environment ties them to one launch (1: a single "
         "process)"), True),
        ("rank_score", "job", "ratio", "mean", ("the fastest rank's own time per step over "
         "this rank's (1: sets no one's pace; below 0.75: a straggler)"), True),
        ("slowest_rank", "job", "rank", "last", "the rank with the lowest rank_score", True),
        ("peer_away_share", "job", "ratio", "mean", ("share of wall time this rank waited in "
         "its next collective while a peer was away from training longer than itself "
         "(evaluating, saving or compiling alone: the hook's phases; without the hook, its "
         "GPU idle while its main process wrote to storage)"), True),
        ("away_rank", "job", "rank", "last", ("the rank that was away from training the "
         "longest, where this rank waited for it"), True),
        ("peer_straggler", "job", "0/1", "last", ("another rank of this job is a straggler "
         "(rank_score < 0.75) that this rank waits for"), True),
        ("data_over_peers", "job", "ratio", "mean", ("the slowest rank's: its data wait as a "
         "share of its own time (the time it does not wait for a peer), less the other "
         "ranks' median share of theirs (none on other ranks): what it does more of than "
         "they do"), True),
        ("host_over_peers", "job", "ratio", "mean", ("the same, of its main process's time "
         "while its GPU idles (host)"), True),
        ("gpu_over_peers", "job", "ratio", "mean", "the same, of its GPU work", True),
        ("straggler_gain", "job", "ratio", "last", ("step time now over step time once the "
         "slowest rank's own bottleneck is gone: the other ranks' median pace, or its own GPU "
         "work where that is slower (how much faster the job would go)"), True),
        # facts
        ("compute_capability", "fact", "major.minor", "last", ("the GPU's compute capability "
         "as a number (8.6, 9.0)"), False),
        ("host_cpus", "fact", "cores", "last", "logical CPUs on the host", False),
        ("gpu_count", "fact", "count", "last", "GPUs seen on the host", False),
        ("gpm", "fact", "0/1", "last", ("whether GPM fields (sm_active, tensor_active...) are "
         "measured on this GPU"), False),
        ("hook", "fact", "0/1", "last", "whether the torch hook reports steps for this GPU's job",
         False),
        ("hook_attached", "fact", "0/1", "last", ("whether a torch hook reports for this GPU's "
         "job at all (steps, settings or phases)"), False),
        ("job_oom", "fact", "0/1", "last", ("1 where this GPU's job died of CUDA "
         "out-of-memory (the hook's exit report: torch.OutOfMemoryError), until another job "
         "steps on it"), False),
        ("oom_peak_bytes", "fact", "bytes", "last", ("that job's allocator peak "
         "(max_memory_allocated) when it died"), False),
        ("oom_reserved_bytes", "fact", "bytes", "last", ("the memory that job's allocator "
         "held reserved when it died"), False),
        ("oom_steps", "fact", "count", "last", "the training steps that job took before it died",
         False),
        ("oom_batch_size", "fact", "samples", "last", ("that job's batch size (samples per "
         "optimizer step) when it died"), False),
        ("oom_micro_batches", "fact", "count", "last", ("that job's backward() calls per "
         "optimizer step (gradient accumulation), where the hook counted them"), False),
        ("oom_in_eval", "fact", "0/1", "last", ("1 where that job died evaluating (its "
         "hook's newest phase)"), False),
        ("oom_eval_batch_size", "fact", "samples", "last", ("the evaluation batch it ran "
         "when it died evaluating"), False),
        ("oom_in_inference", "fact", "0/1", "last", ("1 where that job died running "
         "inference, never having trained (its hook's newest phase)"), False),
        ("oom_inference_batch_size", "fact", "samples", "last", ("the inference batch it ran "
         "when it died so"), False),
        ("gone_full", "fact", "0/1", "last", ("1 where a process that held at least half of "
         "this GPU's memory left NVML's list, and the memory with it, within 2 minutes of "
         "that memory filling to 95 % or more, and no hook reported its end or an OOM then "
         "(what a CUDA out-of-memory death looks like from outside), until another process "
         "holds memory on it, an hour at most"), False),
        ("gone_full_pid", "fact", "count", "last", "that process's pid", False),
        ("gone_full_ratio", "fact", "ratio", "last", ("the GPU's used memory (share) at its "
         "fullest in the last samples before that process left"), False),
        ("gone_full_bytes", "fact", "bytes", "last", ("the memory that process itself held "
         "at its last sample"), False),
        ("gone_full_filled_seconds", "fact", "seconds", "last", ("how long before that "
         "process left the GPU's memory had become full (2 minutes at most)"), False),
        ("loss_nonfinite_step", "fact", "count", "last", ("the step of the first NaN or "
         "infinite loss the hook read since its last finite one (absent once a loss is finite "
         "again)"), False),
        ("loss_nonfinite_nan", "fact", "0/1", "last", ("of those losses: 1 where all were NaN, "
         "0 where all were infinite, 0.5 where both came"), False),
        ("loss_nonfinite_readings", "fact", "count", "last", ("how many losses the hook read "
         "in a row were NaN or infinite (absent once one is finite)"), False),
        ("loss_finite_last", "fact", "loss", "last", ("the newest finite loss the hook read"),
         False),
        ("phase", "fact", "text", "last", ("what the job does now, by its hook: 'startup', "
         "'compile', 'train', 'eval', 'checkpoint', 'inference' (absent without phases)"),
         False),
    ]
    return {r[0]: SignalDef(name=r[0], table=r[1], unit=r[2], agg=r[3], doc=r[4], derived=r[5])
            for r in rows}


VOCABULARY: dict[str, SignalDef] = _defs()
CONFIG_KEYS = {n for n, d in VOCABULARY.items() if d.table == "config" and not d.derived}
