"""The frame: every sample bucketed into fixed-width time buckets, per subject (each GPU,
and the host), with the derived signals computed per bucket and the job windows the
attribution reads. Fed samples in time order; calls back after each bucket closes."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuwatch.advisor.attribution import (
    SHARE_CATEGORIES,
    Attribution,
    JobWindow,
    SpanTotals,
    attribute_group,
    host_kernel_share,
)
from gpuwatch.advisor.facts import cc_number
from gpuwatch.advisor.vocabulary import CONFIG_KEYS, VOCABULARY
from gpuwatch.advisor.windows import Ring, ring_mean, ring_mean_in_phase, ring_sums
from gpuwatch.job.protocol import CLEANUPS

# how long after a job's end (its hook's exit report, or the last bucket NVML listed its
# process in) its phases' rules are still judged: that bucket and the next (a sample that
# missed the process once does not end it; two seconds let a rule whose condition held
# mostly on the job's last seconds start in the idle after it: fw_hf_predict_ddp)
JOB_OVER_GRACE = 1.0

# NVML clock event reason bits (nvmlClocksEventReason* in nvml.h)
_SW_POWER_CAP = 0x4
_HW_SLOWDOWN = 0x8
_SW_THERMAL = 0x20
_HW_THERMAL = 0x40
_HW_POWER_BRAKE = 0x80

# raw fields that live on gpu lines
_GPU_RAW = [n for n, d in VOCABULARY.items() if d.table == "gpu" and not d.derived]
_GPM_FIELDS = ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp16_active",
               "fp32_active", "fp64_active")
_HOST_RAW = {"cpu_util": "cpu_util", "load1": "load1", "load5": "load5",
             "host_mem_used_bytes": "mem_used_bytes", "host_mem_total_bytes": "mem_total_bytes",
             "swap_used_bytes": "swap_used_bytes", "job_cpu_cores": "job_cpu_cores",
             "job_processes": "job_processes", "job_rss_bytes": "job_rss_bytes",
             "job_main_cpu_cores": "job_main_cpu_cores",
             "job_workers_cpu_cores": "job_workers_cpu_cores",
             "job_loader_workers": "job_loader_workers",
             "job_loader_cpu_cores": "job_loader_cpu_cores",
             "job_write_bytes_per_second": "job_write_bytes_per_second",
             "job_loader_workers_started": "job_loader_workers_started"}
_AUTOCAST_ON = {"bfloat16", "bf16", "float16", "fp16", "half", "torch.bfloat16",
                "torch.float16"}


def _get(obj: Any) -> Callable[[str], Any]:
    if type(obj) is dict:
        return obj.get
    return lambda k: getattr(obj, k, None)


# -- accumulating one bucket ------------------------------------------------------------
class _Acc:
    """The samples of one open bucket for one table: sums, counts and last values."""

    __slots__ = ("last", "n", "s")

    def __init__(self) -> None:
        self.s: dict[str, float] = {}
        self.n: dict[str, float] = {}
        self.last: dict[str, Any] = {}

    def add(self, name: str, v: float) -> None:
        s = self.s
        if name in s:
            s[name] += v
            self.n[name] += 1
        else:
            s[name] = v
            self.n[name] = 1
        self.last[name] = v

    def add_n(self, name: str, total: float, n: float) -> None:
        """``n`` samples at once, summing to ``total`` (a trace's `steps` line)."""
        s = self.s
        if name in s:
            s[name] += total
            self.n[name] += n
        else:
            s[name] = total
            self.n[name] = n
        self.last[name] = total / n if n else total

    def add_weighted(self, name: str, v: float, w: float) -> None:
        """``v`` counted ``w`` times (a step standing for several)."""
        self.add_n(name, v * w, w)

    def mean(self, name: str) -> float | None:
        n = self.n.get(name)
        return self.s[name] / n if n else None

    def clear(self) -> None:
        self.s.clear()
        self.n.clear()
        self.last.clear()


class Table:
    """The history of one subject's signals of one kind (a GPU's, the host's, a job's)."""

    __slots__ = ("acc", "ever", "frame", "keep", "keeps", "rings")

    def __init__(self, frame: Frame, keeps: Mapping[str, int] | None = None) -> None:
        self.frame = frame
        self.keep = frame.keep  # buckets the longest window reads (fixed per frame)
        # signals whose readers all look back less far: their own (Frame.gpu_keeps)
        self.keeps = keeps or {}
        self.acc = _Acc()
        self.rings: dict[str, Ring] = {}
        self.ever: bool = False  # any sample seen (a hook that never reported stays unknown)

    def push(self, idx: int, name: str, value: float | None, weight: float = 1.0) -> None:
        # the frame calls this for every signal of every subject at every bucket: Ring.push
        # and Ring.trim's test are written out here rather than called
        ring = self.rings.get(name)
        if ring is None:
            if value is None:
                return
            ring = self.rings[name] = Ring(idx, self.keeps.get(name, self.keep))
        vals = ring.vals
        n = len(vals)
        gap = idx - ring.base - n
        if gap > 0:  # a gap: skip ahead, keeping at most what windows use
            if gap > ring.keep:
                ring.reset(idx)
                n = 0
            else:
                for _ in range(gap):
                    ring.push(None)
                n += gap
        vals.append(value)
        psum, pw = ring.psum, ring.pw
        if value is None or weight <= 0:
            if value is None:
                ring.last_none = ring.base + n
            psum.append(psum[-1])
            pw.append(pw[-1])
        else:
            psum.append(psum[-1] + value * weight)
            pw.append(pw[-1] + weight)
        if n >= ring.trim_at:  # len(vals) > 2 * keep: Ring.trim's own test
            ring.trim(ring.keep)


class Subject:
    """One GPU (or, with ``gpu`` None, the host and jobs not tied to a GPU)."""

    def __init__(self, frame: Frame, gpu: int | None, first: int) -> None:
        self.gpu = gpu
        self.first = first  # first bucket with data: windows before it are incomplete
        self.gpu_table = Table(frame, frame.gpu_keeps)
        self.job = Table(frame)
        # the CPU of this GPU's own job trees (its rank and that rank's workers), from the
        # host line's per-tree ``jobs``: per-rank evidence without the hook
        self.cpu = Table(frame)
        self.config: dict[str, Any] = {}
        self.facts: dict[str, Any] = {}
        self.pids: set[int] = set()
        self.prev_loss_scale: float | None = None
        # GradScaler's calibration is over: a step it did not skip, at a known scale, or
        # CALIBRATION_SKIPS skips. The skips before it (the scale halving from 65536 until
        # the gradients fit fp16, two to a few steps) are not counted as skipped steps
        self.scale_settled = False
        self.calibration_skips = 0
        self.proc_pids: set[int] = set()
        # the newest bucket in which NVML listed a process on the GPU (None: never, or
        # no process list in the data)
        self.procs_last: int | None = None
        # the job the hook reports for this GPU: its pid and rank; its attribution's clock
        # starts when its first step ends (job_warm), not at process start
        self.job_pid: int | None = None
        self.job_rank: int | None = None
        # the pid holding the most of this GPU's memory, and, where it is a process whose
        # steps the hook reports on another GPU (torch.nn.DataParallel: one process, the
        # hook's device the first of its GPUs), that GPU's subject: its job is this one's
        self.main_pid: int | None = None
        self.job_via: Subject | None = None
        self.gap_zero = False  # step_gap_seconds' newest value is 0 (pushed once)
        # without the hook: (launch digest, rank, world size) of this GPU's main process,
        # from its environment (host.py); the ranks of one launch are one job
        self.dist: tuple[str, int, int] | None = None
        # the debugging switches the environment of the jobs on this GPU turns on, by name
        # (host.py's debug_env, as the newest host line says); None where no tree says
        self.debug_env: frozenset[str] | None = None
        self.iterators_seen = 0  # DataLoader iterators whose first batch the hook marked
        self.job_last: int | None = None  # the bucket of its newest step
        # the bucket after its first step ended: GPU and host windows of a job the hook
        # reports start here, so start-up (imports, CUDA init, compiling) is not judged
        self.job_warm: int | None = None
        self.job_t1: float | None = None  # when its newest step ended
        # when the steps its span counts (those read from job_warm on) began: the whole
        # run's wall clock runs from here to job_t1, so the time matches the steps summed
        self.span_t0: float | None = None
        self.span = SpanTotals()  # the attribution's inputs summed since the first step
        self.steps_seen = 0.0  # every step the hook reported for this job, counted exactly
        # the durations of its timed steps, summed, and how many (a pause and a long step
        # left out: _pause, _long)
        self.timed_sum = 0.0
        self.timed_n = 0.0
        # its long steps (_long): how many, their time, their time beyond the usual step,
        # and the step numbers of the newest (where a `step` line named them)
        self.long_n = 0
        self.long_sum = 0.0
        self.long_excess = 0.0
        self.long_at: list[int] = []
        self.span_at_last_step: JobWindow | None = None
        # phases (`phase` lines): the one in force, the seconds of each so far, what the
        # open bucket gained, the line's other counts; the problems its hook reported
        self.phase_table = Table(frame)
        self.phase: str | None = None
        self.phase_pid: int | None = None
        self.phase_seconds: dict[str, float] = {}
        # of phase_seconds' "eval", what came before the first step: an evaluation ahead
        # of training, which the hook counts as serving until the process trains
        # (docs/hook.md, "Phases"); "since the first step" measures leave it out
        self.eval_before = 0.0
        self.phase_spans: list[tuple[str, float, float]] = []  # (phase, begin, end)
        self.phase_t: float | None = None  # the time of its last `phase` line
        self.phase_info: dict[str, Any] = {}
        self.hook_seen = False  # a hook reports for this GPU's job (steps, settings, phases)
        self.problems: list[dict[str, Any]] = []
        self.hook_off = False
        # where in its bucket the newest GPU line fell (0-1): from it, _gpm_before reads how
        # much of the interval a reading describes (the sample interval before its line)
        # lies in the bucket before
        self.gpu_offset = 0.5
        # without the hook: the first bucket its GPU ran kernels for its process (before
        # it, a job is starting up: workers prefetching while the GPU idles is no training)
        self.first_busy: int | None = None
        # without the hook: the last bucket in which its process looked like it trained
        # (what the span counts); a training rule's evidence stands as read by then
        self.bare_last: int | None = None
        # seconds since its process's first work, those in which it idled while the job
        # wrote to storage, and the stretches of them (gpu_idle_writing, whole run)
        self.iw_seconds = 0
        self.iw_idle = 0
        self.iw_bursts = 0
        self.iw_prev = False
        # the processes NVML listed on it at its previous sample (pid -> memory), and its
        # used memory's share at its last few samples: a process gone while the memory
        # was full (feed_gpu, gone_full)
        self.prev_proc_mem: dict[Any, float] = {}
        self.recent_full: list[float] = []
        self.full_since: int | None = None  # the bucket its memory last became full
        self.full_before: int | None = None  # the same, as of the previous sample
        self.gone_seen: set[Any] = set()  # the processes listed when one left it full
        # the first bucket its GPU worked at all, whichever processes NVML listed (where
        # it lists none: a container that hides them, or a rank not on its GPU yet)
        self.first_util: int | None = None
        self.micro_sum = 0.0  # backward() calls summed over the steps that counted them
        # seconds of evaluation, checkpoints and compiling when the span began and at its
        # newest step: the whole run's training time leaves them out
        self.nontrain_t0 = 0.0
        self.nontrain_t1 = 0.0
        self.micro_n = 0.0
        # judged by another process (Frame.judge_only): its GPU's rings keep only what the
        # frame reads of them for other subjects (_GPU_READS)
        self.light = False

    def new_scaler(self) -> None:
        """A new job's steps on this GPU: its GradScaler calibrates anew."""
        self.prev_loss_scale = None
        self.scale_settled = False
        self.calibration_skips = 0


# frameworks whose gradient accumulation takes each micro-batch from the training
# DataLoader (Frame._micro_size)
_ACCUMULATING = ("transformers", "accelerate", "lightning")


class Frame:
    """Bucketed history of every subject, fed samples in time order.

    ``on_bucket(idx)`` is called after each bucket closes (evaluation time =
    ``(idx + 1) * res``). Only signals in ``needed`` (and what they derive from) are kept.
    """

    def __init__(self, res: float, needed: Iterable[str], keep_seconds: float,
                 on_bucket: Callable[[int], None] | None = None,
                 gpu_reads: Mapping[str, int] | None = None) -> None:
        self.res = float(res)
        # how long each GPU line's readings cover (the sampler's interval: a recording's
        # meta says it; else the daemon's default, 1 s)
        self.sample_seconds = 1.0
        self.keep = max(4, math.ceil(keep_seconds / self.res) + 2)
        # the attribution's inputs are always kept: the report's jobs list reads them
        self.needed = set(needed) | _dependencies(set(needed)) | _ATTRIBUTION_INPUTS
        # a GPU signal every reader of which looks back fewer buckets than the longest
        # window (``gpu_reads``: the rules', by signal; the frame's own are _GPU_READS)
        # keeps only that many: a daemon's rings hold each GPU's signals, and a few
        # counters' 10-minute windows would otherwise make them all that long
        self.gpu_keeps = _gpu_keeps(self.needed, gpu_reads, self.keep)
        self.on_bucket = on_bucket
        self.idx: int | None = None  # the open bucket
        self.subjects: dict[int | None, Subject] = {}
        self.host = Subject(self, None, 0)
        self.subjects[None] = self.host
        self.host_acc = _Acc()
        self.host_tables = Table(self)
        self.facts: dict[str, Any] = {}
        # the GPU a process's hook lines without a GPU of their own go to: the one the hook
        # named for it (hook_gpu), else the GPU it holds memory on (pid_gpu). A process on
        # several GPUs (torch.nn.DataParallel, a stray context of a rank on GPU 0) stays
        # with the GPU it was first seen on until another holds over twice its memory there
        self.pid_gpu: dict[int, int] = {}
        self._pid_mem: dict[int, float] = {}
        self.hook_gpu: dict[int, int] = {}
        self.job_of_pid: dict[int, Subject] = {}  # the subject whose steps a pid reports
        self.rank_seen: set[int] = set()
        self._gpu_raw = [f for f in _GPU_RAW if f in self.needed]
        # what a GPU's bucket keeps when it closes, in order: (signal, its mean or else
        # its last value)
        self._gpu_close = [(f, VOCABULARY[f].agg == "mean") for f in self._gpu_raw] + [
            (f, True) for f in ("clock_power_capped", "clock_thermal", "clock_hw_slowdown",
                                "gpu_processes", "gpu_process_mem_bytes", "main_shared_gpus")
            if f in self.needed
        ] + [(f, False) for f in ("gpu_lost", "xid_errors_total") if f in self.needed]
        self._gpm_needed = "gpm" in self.needed or any(f in self.needed for f in _GPM_FIELDS)
        # a GPU no rule of this frame's engine judges (judge_only): what its bucket keeps,
        # the rings the frame reads itself of every GPU, and the fields they come from
        self.light: Callable[[int], bool] | None = None
        self._gpu_raw_light = [f for f in self._gpu_raw if f in _LIGHT_RAW]
        self._gpu_close_light = [(f, m) for f, m in self._gpu_close if f in _GPU_READS]
        self._bucket_pids: set[int] = set()
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.hook_steps = False
        self.hook_config = False
        self.debug_envs = False  # some GPU's debug_env is known (Subject.debug_env)
        self.hook_phases = False
        # the subjects whose process, read as serving a model, trained after all (its hook
        # counts that time as an evaluation now): the engine withdraws what it read there
        self.trained_after_serving: list[Subject] = []
        self.problems: list[dict[str, Any]] = []  # `hook_problem` lines, for the report
        self._attr_cache: dict[tuple[int, int], dict[int | None, Attribution | None]] = {}
        # this bucket's job of each subject (_group_key), made at its first attribution
        self._group_keys: dict[int | None, Any] | None = None
        self.job_ends: list[dict[str, Any]] = []  # `job_end` lines, for the report
        self.startup_batch: dict[int, float] = {}  # pid -> its loader's batch before training
        # pid -> the bucket its hook reported its end in (job_end); the newest OOM's bucket
        self.ended_pids: dict[Any, int] = {}
        self.last_oom_idx: int | None = None

    # -- facts -------------------------------------------------------------------------
    def set_meta(self, meta: Mapping[str, Any]) -> None:
        """A recording's meta line (or the daemon's GPU facts): GPU model, CC, host CPUs."""
        cc = meta.get("compute_capability")
        if cc:
            self.facts["compute_capability"] = cc_number(cc)
        if meta.get("host_cpus"):
            self.facts["host_cpus"] = float(meta["host_cpus"])
        if meta.get("sample_hz"):
            self.sample_seconds = 1.0 / float(meta["sample_hz"])
        if meta.get("gpu_name"):
            self.facts["gpu_name"] = meta["gpu_name"]

    def set_gpu_info(self, gpu: int, name: str | None = None, cc: Any = None,
                     gpm: bool | None = None) -> None:
        subj = self._subject(gpu)
        if name:
            subj.facts["gpu_name"] = name
        if cc:
            subj.facts["compute_capability"] = cc_number(cc)
        if gpm:
            subj.facts["gpm"] = 1.0

    def _subject(self, gpu: int) -> Subject:
        subj = self.subjects.get(gpu)
        if subj is None:
            subj = self.subjects[gpu] = Subject(self, gpu, self.idx or 0)
            subj.light = self.light is not None and self.light(gpu)
        return subj

    def judge_only(self, judged: Callable[[int | None], bool]) -> None:
        """Only the GPUs ``judged`` are asked about by rules (a share of a recording
        split over processes, split.py): every other GPU is bucketed *lightly*, its rings
        keeping only what the frame reads of every GPU for the others (``_GPU_READS``:
        the attribution's utilization of a job's ranks, the memory an out-of-memory
        death is pinned on, a shared job's batch room), and its processes, facts and
        memory events followed as ever. What the HTML report's timeline reads of the
        frame (``jobs``: the attribution) is among them. Call before any sample is fed:
        a ring left partly written would read as a gap."""
        if self.idx is not None:
            raise RuntimeError("judge_only() after samples were fed")
        self.light = lambda gpu: not judged(gpu)
        for gpu, subj in self.subjects.items():
            if gpu is not None:
                subj.light = not judged(gpu)

    def gpus(self) -> list[int]:
        return sorted(g for g in self.subjects if g is not None)

    # -- feeding -----------------------------------------------------------------------
    def _advance(self, t: float) -> None:
        if self.t_first is None:
            self.t_first = t
        if self.t_last is None or t > self.t_last:
            self.t_last = t
        idx = int(t // self.res)
        if self.idx is None:
            self._start(idx)
            return
        if idx > self.idx:
            self.flush_to(idx)

    def _start(self, idx: int) -> None:
        """The first bucket: for every subject made before it (a recording's meta line names
        its GPUs first), the first with data, so its windows reach back no further."""
        self.idx = idx
        for subj in self.subjects.values():  # the host among them
            subj.first = idx

    def flush_to(self, idx: int) -> None:
        """Close every bucket before ``idx`` (evaluating after each one)."""
        if self.idx is None:
            self._start(idx)
            return
        while self.idx < idx:
            self._close(self.idx)
            nxt = self.idx + 1
            # long gaps: nothing to evaluate in between; jump (rings skip ahead on push)
            if idx - nxt > self.keep:
                nxt = idx - self.keep
            self.idx = nxt

    def feed_gpu(self, s: Any) -> None:
        get = _get(s)
        t = get("t")
        self._advance(t)
        gpu = get("gpu")
        subj = self._subject(gpu)
        subj.gpu_offset = (t / self.res) % 1.0
        acc = subj.gpu_table.acc
        subj.gpu_table.ever = True
        light = subj.light
        if get("lost"):
            if not light:
                acc.add("gpu_lost", 1.0)
            # what it held before is no process that left (a reset, a fallen-off GPU)
            subj.prev_proc_mem = {}
            subj.recent_full.clear()
            subj.full_since = subj.full_before = None
            return
        if not light:
            acc.add("gpu_lost", 0.0)
        # the hot loop of a long recording: inlined _Acc.add
        sums, counts, lasts = acc.s, acc.n, acc.last
        for f in self._gpu_raw_light if light else self._gpu_raw:
            v = get(f)
            if v is not None:
                if f in sums:
                    sums[f] += v
                    counts[f] += 1
                else:
                    sums[f] = v
                    counts[f] = 1
                lasts[f] = v
        if self._gpm_needed and "gpm" not in subj.facts \
                and any(get(f) is not None for f in _GPM_FIELDS):
            subj.facts["gpm"] = 1.0
        reasons = get("clock_event_reasons")
        if reasons is not None and not light:
            r = int(reasons)
            acc.add("clock_power_capped", 1.0 if r & _SW_POWER_CAP else 0.0)
            acc.add("clock_thermal", 1.0 if r & (_SW_THERMAL | _HW_THERMAL) else 0.0)
            acc.add("clock_hw_slowdown", 1.0 if r & (_HW_SLOWDOWN | _HW_POWER_BRAKE) else 0.0)
        procs = get("processes")
        if procs is not None:
            mem = 0.0
            pids = set()
            main: tuple[float, int] | None = None
            for p in procs:
                pg = _get(p)
                pid = pg("pid")
                m = pg("mem_used_bytes")
                if pid is not None:
                    if m and (main is None or m > main[0]):
                        main = (m, pid)
                    pids.add(pid)
                    was = self.pid_gpu.get(pid)
                    if was is None or was == gpu or (m or 0) > 2 * self._pid_mem.get(pid, 0):
                        self.pid_gpu[pid] = gpu
                        self._pid_mem[pid] = m or 0
                if m:
                    mem += m
            if not light:
                acc.add("gpu_processes", float(len(procs)))
                acc.add("gpu_process_mem_bytes", mem)
            self._gone_full(subj, procs, get("mem_used_bytes"), get("mem_total_bytes"))
            subj.proc_pids = pids
            if pids:
                subj.procs_last = self.idx
            self._bucket_pids |= pids
            self._main_process(subj, acc, main[1] if main is not None else None)
        xid = get("xid_total") if not light else None
        if xid:
            acc.add("xid_errors_total", float(sum(xid.values())))
        elif "xid_errors_total" in self.needed and reasons is not None and not light:
            acc.add("xid_errors_total", 0.0)
        cc = get("compute_capability")
        if cc:
            subj.facts["compute_capability"] = cc_number(cc)
        name = get("name")
        if name:
            subj.facts["gpu_name"] = name

    def _gone_full(self, subj: Subject, procs: list[Any], used: Any, total: Any) -> None:
        """A process that held most of the GPU's memory is gone from NVML's list, and the
        memory with it, right after that memory filled: what a job killed by CUDA
        out-of-memory looks like from outside. Leaves ``gone_full`` and its figures on the
        GPU (``fact`` reads it OOM_HOLD_SECONDS at most, and not where the process's hook
        reported its end, or any process reported an OOM around then: DDP peers killed
        after a rank's OOM). Fires only where:

        - the memory was GONE_FULL_RATIO full at one of the GONE_FULL_SAMPLES samples before
          and had filled (crossed that ratio) within GONE_FULL_FILLED_SECONDS: a job that
          holds the card full all its life (TensorFlow's or vLLM's up-front reservation,
          a PyTorch job tuned to the brim) and then ends is no death by OOM;
        - the used memory fell by half of what the process held: a process query that
          failed once (an empty list) leaves the memory where it was.

        A process not listed when it left that then holds memory on the GPU ends it."""
        now: dict[Any, float] = {}
        for p in procs:
            pg = _get(p)
            pid = pg("pid")
            if pid is not None:
                now[pid] = float(pg("mem_used_bytes") or 0.0)
        known = isinstance(used, (int, float)) and isinstance(total, (int, float)) and total > 0
        recent = subj.recent_full
        before = list(recent)
        if known:
            ratio = used / total
            recent.append(ratio)
            if len(recent) > GONE_FULL_SAMPLES:
                del recent[0]
            if ratio >= GONE_FULL_RATIO:
                if subj.full_since is None:
                    subj.full_since = self.idx
            else:
                subj.full_since = None
        facts = subj.facts
        if facts.get("gone_full") and any(m > 0 and pid not in subj.gone_seen
                                          for pid, m in now.items()):
            for k in GONE_FULL_FACTS:  # another job holds memory on it: over
                facts.pop(k, None)
            facts["gone_full"] = 0.0
        full = max(before, default=0.0)
        filled = subj.full_before
        subj.full_before = subj.full_since
        if known and full >= GONE_FULL_RATIO and filled is not None \
                and self.idx is not None \
                and (self.idx - filled) * self.res <= GONE_FULL_FILLED_SECONDS:
            for pid, held in subj.prev_proc_mem.items():
                if pid in now or held < GONE_FULL_OWN * total \
                        or used > full * total - 0.5 * held:
                    continue
                ended = self.ended_pids.get(pid)
                if ended is not None and abs(ended - self.idx) * self.res <= GONE_FULL_NEAR:
                    continue  # its hook said how it ended
                facts["gone_full"] = 1.0
                facts["gone_full_pid"] = pid
                facts["gone_full_idx"] = self.idx
                facts["gone_full_ratio"] = full
                facts["gone_full_bytes"] = held
                facts["gone_full_filled_seconds"] = (self.idx - filled) * self.res
                subj.gone_seen = set(now)
        subj.prev_proc_mem = now

    def _main_process(self, subj: Subject, acc: _Acc, pid: int | None) -> None:
        """``subj``'s main process (the most memory): on how many GPUs the same process is
        the main one (``main_shared_gpus``), and whether it is a process whose steps the
        hook reports for another GPU (``job_via``)."""
        subj.main_pid = pid
        via = self.job_of_pid.get(pid) if pid is not None else None
        subj.job_via = via if via is not None and via is not subj and not subj.job.ever \
            else None
        if "main_shared_gpus" in self.needed and not subj.light:
            n = 0.0
            if pid is not None:
                for other in self.subjects.values():
                    if other.main_pid == pid and other.gpu is not None:
                        n += 1.0
            acc.add("main_shared_gpus", n)

    def feed_host(self, s: Any) -> None:
        get = _get(s)
        self._advance(get("t"))
        acc = self.host_acc
        per_core = get("cpu_util_per_core")
        if per_core and "host_cpus" not in self.facts:
            self.facts["host_cpus"] = float(len(per_core))
        cpu = get("cpu_util")
        if cpu is None and per_core:
            cpu = sum(per_core) / len(per_core)
        if cpu is not None:
            acc.add("cpu_util", float(cpu))
        for name, field in _HOST_RAW.items():
            if name == "cpu_util":
                continue
            v = get(field)
            if v is not None:
                acc.add(name, float(v))
        jobs = get("jobs")
        if jobs:
            self._feed_jobs(jobs)
        elif self.debug_envs:
            self._set_debug_envs({})  # no job on any GPU now

    def _feed_jobs(self, jobs: Iterable[Any]) -> None:
        """Each job tree's CPU, summed per GPU its root is on (``gpus`` in the tree, or
        the GPUs whose latest gpu line lists its pid: older recordings)."""
        per: dict[int, list[float]] = {}
        dists: dict[int, tuple[str, int, int] | None] = {}
        envs: dict[int, frozenset[str]] = {}
        for j in jobs:
            jg = _get(j)
            pid = jg("pid")
            gpus = jg("gpus") or [g for g, sj in self.subjects.items()
                                  if g is not None and pid in sj.proc_pids]
            debug = jg("debug_env")
            if debug is not None:  # every GPU the process is on runs as its switches say
                for g in gpus:
                    envs[int(g)] = envs.get(int(g), frozenset()) | frozenset(map(str, debug))
            if len(gpus) == 1:  # a rank's tree: its launch (a launcher's own has none)
                dist_job, rank, world = jg("dist_job"), jg("rank"), jg("world_size")
                g = int(gpus[0])
                if dist_job is not None and rank is not None and world is not None:
                    dists[g] = (str(dist_job), int(rank), int(world))
                else:
                    dists.setdefault(g, None)
            main, workers = jg("main_cpu_cores"), jg("workers_cpu_cores")
            if main is None or workers is None:
                continue
            procs = float(jg("processes") or 1)
            # the children torch names as its DataLoader workers, where any is (torch
            # 2.5+); else every child counts as one
            loaders = jg("loader_workers")
            if loaders:
                nworkers, busy = float(loaders), float(jg("loader_cpu_cores") or 0.0)
            else:
                nworkers, busy = max(0.0, procs - 1.0), float(workers)
            write = jg("main_write_bytes_per_second")
            started = jg("loader_workers_started")
            for g in gpus:
                t = per.setdefault(int(g), [0.0, 0.0, 0.0, 0.0, 0.0, -1.0, -1.0])
                t[0] += 1.0
                t[1] += float(main)
                t[2] += float(workers)
                t[3] += nworkers
                t[4] += busy
                if write is not None:  # -1: no tree on it says
                    t[5] = max(t[5], 0.0) + float(write)
                if started is not None:  # likewise
                    t[6] = max(t[6], 0.0) + float(started)
        for g, dist in dists.items():  # each line says it anew: a job that ended has none
            subj = self.subjects.get(g)
            if subj is not None:
                subj.dist = dist
        if envs or self.debug_envs:
            self._set_debug_envs(envs)
        for g, (mains, main, workers, nworkers, busy, write, started) in per.items():
            subj = self.subjects.get(g)
            if subj is None:  # a GPU no gpu line described: nothing to judge it by
                continue
            acc = subj.cpu.acc
            if write >= 0.0:
                acc.add("write", write)
            if started >= 0.0:
                acc.add("started", started)
            acc.add("mains", mains)
            acc.add("main", main)
            acc.add("workers", workers)
            acc.add("nworkers", nworkers)
            acc.add("loading", busy)

    def _idle_writing(self, idx: int, subj: Subject, util: float, light: bool = False
                      ) -> None:
        """Whether the GPU idled in bucket ``idx`` while its job's main process wrote to
        storage (a checkpoint, seen from outside), and the whole run's share of such
        seconds since its process first worked on it (not on a GPU bucketed lightly: its
        rules are judged elsewhere)."""
        ring = subj.cpu.rings.get("job_write_bytes_per_second")
        # this bucket's own reading only (a ring's mean reads back to its newest value: a
        # job gone since its last save would keep writing for ever)
        wrote = ring.mean(idx + 1, 1) if ring is not None and ring.end() == idx + 1 else None
        if wrote is None or subj.first_busy is None:
            subj.iw_prev = False  # unknown seconds part two stretches
            return
        idle = wrote >= IDLE_WRITE_BYTES and util < IDLE_WRITE_UTIL
        subj.iw_seconds += 1
        if idle:
            subj.iw_idle += 1
            if not subj.iw_prev:
                subj.iw_bursts += 1
        subj.iw_prev = idle
        tab = subj.gpu_table
        tab.push(idx, "gpu_idle_writing", 1.0 if idle else 0.0)
        if not light and subj.iw_seconds * self.res >= IDLE_WRITE_MIN_SECONDS:
            tab.push(idx, "idle_writing_ratio", subj.iw_idle / subj.iw_seconds)
            tab.push(idx, "idle_writing_bursts", float(subj.iw_bursts))

    def _hook_starts(self, subj: Subject) -> None:
        """``subj``'s job sent its first step: from the next bucket on it is judged by
        the hook's steps. What was summed before it from NVML and psutil alone (the
        process looked like it trained) is dropped, so the whole run's split is the
        hook's alone."""
        subj.job_warm = self.idx + 1
        subj.span = SpanTotals()
        subj.span_at_last_step = None
        subj.span_t0 = None
        subj.bare_last = None

    def _span_begins(self, subj: Subject, begin: float) -> None:
        """A step line read in a bucket the span counts: its steps began at ``begin``."""
        if subj.job_warm is not None and self.idx is not None and self.idx >= subj.job_warm:
            if subj.span_t0 is None:
                subj.nontrain_t0 = self._nontrain(subj)
            subj.span_t0 = begin if subj.span_t0 is None else min(subj.span_t0, begin)

    def _stepping(self, get: Callable[[str], Any], t_end: float) -> tuple[Subject, bool]:
        """The subject a `step` or `steps` line ending at ``t_end`` reports for, told of its
        job (pid, rank, the newest step); True where it is the job's first."""
        pid, rank = get("pid"), get("rank")
        subj = self._job_subject(get("gpu"), pid, rank)
        self.hook_steps = True
        if pid is not None:
            if subj.job_pid != pid:
                subj.new_scaler()  # another job on this GPU: its own GradScaler
                subj.micro_sum = subj.micro_n = 0.0  # and its own accumulation
                for name in LOSS_FACTS:  # and its own losses
                    subj.facts.pop(name, None)
                self._oom_over(subj, pid)
            subj.job_pid = pid
            if self.job_of_pid.get(pid) is not subj:
                self.job_of_pid[pid] = subj
        if rank is not None:
            subj.job_rank = int(rank)
        subj.job_last = self.idx
        first_step = subj.job_warm is None and self.idx is not None
        if first_step:
            self._hook_starts(subj)
        subj.job_t1 = t_end if subj.job_t1 is None else max(subj.job_t1, t_end)
        subj.nontrain_t1 = self._nontrain(subj)
        return subj, first_step

    def feed_step(self, s: Any) -> None:
        get = _get(s)
        t_end = get("t")
        self._advance(t_end)
        subj, first_step = self._stepping(get, t_end)
        job = subj.job
        job.ever = True
        acc = job.acc
        # a Prometheus-derived step line stands for several steps (``_count``)
        count = float(get("_count") or 1.0)
        acc.add("_steps", count)
        subj.steps_seen += count
        ss = get("step_seconds")
        dw = get("data_wait_seconds")
        self._span_begins(subj, t_end - float(ss or 0.0) * count)
        if first_step and count == 1:
            # the first iteration carries its one-off start (CUDA init, cuDNN autotuning,
            # compiling, DataLoader workers warming up): its time and wait are no
            # training's, and the windows after it must not read them
            ss = dw = None
        elif ss is not None and count == 1 and self._pause(subj, float(ss)):
            ss = dw = None
        elif ss is not None and count == 1 and not get("first_batch") \
                and self._long(subj, float(ss), float(dw or 0.0), t_end):
            self._long_step(subj, float(ss), get("step"))
            ss = dw = None
        if ss is not None:
            subj.timed_sum += float(ss) * count
            subj.timed_n += count
            # a line standing for ``count`` steps weighs as many: the sums of step time and
            # data wait (the attribution's) stay right, the means stay means
            acc.add_weighted("step_seconds", float(ss), count)
            if dw is not None:
                acc.add_weighted("data_wait_seconds", float(dw), count)
                acc.add_weighted("_dw_ss", float(ss), count)
        for f in ("batch_size", "mem_allocated_bytes", "mem_reserved_bytes",
                  "max_mem_allocated_bytes"):
            v = get(f)
            if v is not None:
                acc.add(f, float(v))
        loss = get("loss")
        if loss is not None:
            self._loss(subj, acc, float(loss), get("step"))
        micro = get("micro_batches")
        if micro:
            acc.add_weighted("micro_batches", float(micro), count)
            subj.micro_sum += micro * count
            subj.micro_n += count
        first = get("first_batch")
        if first is not None:
            acc.add("_fb_known", 1.0)
            if first:
                # the run's first iterator starts its workers whatever persistent_workers
                # says: only the ones after it are restarts
                subj.iterators_seen += 1
                if subj.iterators_seen > 1:
                    acc.add("_fb_dw", float(dw or 0.0))
        scale = get("loss_scale")
        skipped = get("skipped")
        fell = False
        had = subj.prev_loss_scale is not None
        if scale is not None:
            scale = float(scale)
            acc.add("loss_scale", scale)
            fell = had and scale < subj.prev_loss_scale
            subj.prev_loss_scale = scale
        if not subj.scale_settled:
            if skipped or fell:
                subj.calibration_skips += 1
                # skips on and on from the first step: no calibration, a collapse
                subj.scale_settled = subj.calibration_skips > CALIBRATION_SKIPS
            elif scale is not None and (skipped is False or had):
                subj.scale_settled = True  # (a hook without skip flags: the scale held)
        if subj.scale_settled and (skipped is not None or scale is not None):
            acc.add("_skip", 1.0 if (skipped or fell) else 0.0)
        self._activations(acc, get("batch_size"), get("mem_allocated_bytes"),
                          get("max_mem_allocated_bytes"), micro)

    def _loss(self, subj: Subject, acc: _Acc, loss: float, step: Any) -> None:
        """One loss the hook read (one step's per report). A NaN or infinite one is no
        value of the loss's windows (it would poison their sums): it counts in
        ``loss_nonfinite`` (1 for each such, 0 for each finite one). Until a loss is finite
        again, the readings in a row that were not (``loss_nonfinite_readings``), the step
        of the first of them (``loss_nonfinite_step``) and whether each was NaN
        (``loss_nonfinite_nan``: 1 all NaN, 0 all infinite, 0.5 both) are kept. The facts
        are the job's: another job on the GPU starts them anew (``_stepping``)."""
        facts = subj.facts
        if math.isfinite(loss):
            acc.add("loss", loss)
            acc.add("loss_nonfinite", 0.0)
            for name in LOSS_RUN_FACTS:
                facts.pop(name, None)
            facts["loss_finite_last"] = loss
            return
        acc.add("loss_nonfinite", 1.0)
        nan = 1.0 if loss != loss else 0.0
        run = facts.get("loss_nonfinite_readings", 0.0)
        facts["loss_nonfinite_nan"] = nan if not run or facts.get("loss_nonfinite_nan") == nan \
            else 0.5
        facts["loss_nonfinite_readings"] = run + 1.0
        if "loss_nonfinite_step" not in facts and isinstance(step, int):
            facts["loss_nonfinite_step"] = float(step)

    def _pause(self, subj: Subject, seconds: float) -> bool:
        """Whether one step of ``seconds`` is a pause between steps rather than a step: a
        minute or more (PAUSE_STEP_SECONDS), PAUSE_STEP_TIMES of the job's steps so far at
        least, after PAUSE_AFTER_STEPS timed ones. The loop worked on something else
        between two steps (metrics over a whole set, plots, host preprocessing; the rule
        host-work-between-steps says it): no step's time, and the windows after it must not
        read it as one (a mean step of 46 ms for steps of 5 ms; the host's share of the
        steps). It still counts as a step."""
        n = subj.timed_n
        return seconds >= PAUSE_STEP_SECONDS and n >= PAUSE_AFTER_STEPS \
            and seconds >= PAUSE_STEP_TIMES * subj.timed_sum / n

    def _long(self, subj: Subject, seconds: float, wait: float, t_end: float) -> bool:
        """Whether one step of ``seconds`` (``wait`` of it for data), ending at ``t_end``, is
        a long one: its
        own time LONG_STEP_TIMES of the job's usual step at least and LONG_STEP_SECONDS
        longer, after PAUSE_AFTER_STEPS timed ones. What a loop or a callback does every N
        steps between two of them (a metric in Python over kept predictions, samples
        written for a person, empty_cache()) lands in the step after it; the rule
        work-every-n-steps reads them (long_step_share). Their time is no step's: the
        windows read the usual steps (a first batch of an iterator, and a slow batch, are
        the data's and stay)."""
        n = subj.timed_n
        if n < PAUSE_AFTER_STEPS:
            return False
        usual = subj.timed_sum / n
        if seconds - wait < LONG_STEP_TIMES * usual or seconds - usual < LONG_STEP_SECONDS:
            return False
        # its GPU worked through it (the closed buckets wholly inside it): a rank waiting
        # in a collective for a peer that evaluates or saves alone (its peer_away_share),
        # or GPU work the hook does not name; that stays the step's time
        if subj.gpu is not None and self.idx is not None:
            res = self.res
            busy = ring_mean(subj.gpu_table.rings.get("util"),
                             math.ceil((t_end - seconds) / res),
                             min(self.idx, math.floor(t_end / res)))
            if busy is not None and busy >= LONG_STEP_GPU_BUSY:
                return False
        return True

    def _long_step(self, subj: Subject, seconds: float, step: Any) -> None:
        usual = subj.timed_sum / subj.timed_n
        subj.long_n += 1
        subj.long_sum += seconds
        subj.long_excess += seconds - usual
        if step is not None:
            subj.long_at.append(int(step))
            del subj.long_at[:-9]
        else:
            subj.long_at.clear()  # the newest one's number is not known: no gaps to read

    def _push_long(self, idx: int, subj: Subject) -> None:
        """The job's long steps so far (_long): long_steps, long_step_share,
        long_step_seconds, long_step_every."""
        n = subj.long_n
        job = subj.job
        job.push(idx, "long_steps", float(n))
        if not n:
            return
        job.push(idx, "long_step_share", subj.long_excess / (subj.timed_sum + subj.long_sum))
        job.push(idx, "long_step_seconds", subj.long_sum / n)
        # steps between them, where they come on a schedule: the median gap of the newest
        # step numbers known, two gaps at least and all within a tenth of it (2 steps at
        # least: a `steps` line names its first step); none where they come unevenly
        # (recompiles, a slow batch now and then)
        at = subj.long_at
        gaps = sorted(b - a for a, b in zip(at, at[1:], strict=False))
        if len(gaps) >= 2 and gaps[0] > 0:
            mid = gaps[len(gaps) // 2]
            if gaps[-1] - gaps[0] <= max(2.0, 0.1 * mid):
                job.push(idx, "long_step_every", float(mid))

    def feed_steps(self, s: Any) -> None:
        """A `steps` line: a job's steps of one interval, summed (docs/trace-format.md)."""
        get = _get(s)
        n = get("steps") or 0
        if n <= 0:
            return
        t_end = get("t")
        self._advance(t_end)
        subj, _ = self._stepping(get, t_end)
        begin = get("begin_t")
        self._span_begins(subj, t_end if begin is None else min(float(begin), t_end))
        job = subj.job
        job.ever = True
        acc = job.acc
        acc.add("_steps", float(n))
        subj.steps_seen += n
        timed = get("timed") or 0
        ss, dw = get("step_seconds"), get("data_wait_seconds")
        longest = get("step_seconds_max")
        if timed and ss is not None and longest is not None \
                and self._pause(subj, float(longest)):
            # its longest step was a pause (_pause): the others' sums stand (its own wait
            # is not told apart: one batch's, the steps' share at most)
            timed -= 1
            ss = max(0.0, float(ss) - float(longest))
            if dw is not None:
                dw = min(float(dw), ss)
        elif timed and ss is not None and longest is not None and not get("first_batch") \
                and self._long(subj, float(longest), float(dw or 0.0), t_end):
            # its longest step was a long one (_long; the line's whole data wait counted
            # against it, so a slow batch is not one)
            self._long_step(subj, float(longest), get("first_step"))
            timed -= 1
            ss = max(0.0, float(ss) - float(longest))
            if dw is not None:
                dw = min(float(dw), ss)
        if timed and ss is not None:
            subj.timed_sum += float(ss)
            subj.timed_n += timed
            acc.add_n("step_seconds", float(ss), timed)
            if dw is not None:
                acc.add_n("data_wait_seconds", float(dw), timed)
                acc.add_n("_dw_ss", float(ss), timed)
        for f in ("batch_size", "mem_allocated_bytes", "mem_reserved_bytes",
                  "max_mem_allocated_bytes"):
            v = get(f)
            if v is not None:
                acc.add(f, float(v))
        micro_sum, micro_n = get("micro_batches"), get("micro_counted")
        micro = None
        if micro_sum and micro_n:
            acc.add_n("micro_batches", float(micro_sum), float(micro_n))
            micro = micro_sum / micro_n
            subj.micro_sum += micro_sum
            subj.micro_n += micro_n
        first = get("first_batch")
        if first is not None:
            acc.add("_fb_known", 1.0)
            if first:
                # the run's first iterator is no restart (as in feed_step); its own wait is
                # not told apart from the others', so it leaves its share of the sum
                restarts = first - (1 if subj.iterators_seen == 0 else 0)
                subj.iterators_seen += first
                if restarts > 0:
                    fb_dw = float(get("first_batch_data_wait_seconds") or 0.0)
                    acc.add_n("_fb_dw", fb_dw * restarts / first, restarts)
        scale = get("loss_scale")
        skipped = get("skipped")
        fell = False
        if scale is not None:
            scale = float(scale)
            acc.add("loss_scale", scale)
            fell = subj.prev_loss_scale is not None and scale < subj.prev_loss_scale
            subj.prev_loss_scale = scale
        if not subj.scale_settled:
            # a line that holds a step not skipped ends the calibration (its skips are the
            # calibration's), as do more than CALIBRATION_SKIPS skips
            subj.calibration_skips += int(skipped or 0)
            subj.scale_settled = (scale is not None and skipped is not None and skipped < n) \
                or subj.calibration_skips > CALIBRATION_SKIPS
        elif skipped is not None:
            acc.add_n("_skip", float(skipped), n)
        elif scale is not None:
            acc.add("_skip", 1.0 if fell else 0.0)
        self._activations(acc, get("batch_size"), get("mem_allocated_bytes"),
                          get("max_mem_allocated_bytes"), micro)

    @staticmethod
    def _activations(acc: _Acc, bs: Any, alloc: Any, peak: Any, micro: Any) -> None:
        """Activation memory per sample: the peak over what a step keeps, shared by the
        samples of one backward() (the micro-batch: with gradient accumulation the peak
        holds one micro-batch's activations, not the whole step's)."""
        if bs and alloc is not None and peak is not None:
            samples = bs / micro if micro and micro > 1 else bs
            acc.add("act_mem_per_sample_bytes", max(0.0, (peak - alloc) / samples))
            last = acc.last  # for the bucket's reading over the floor (_act_floor)
            last["_act_peak"] = peak
            last["_act_samples"] = samples
        elif not bs and alloc is not None and peak is not None and not (micro and micro > 1):
            # no batch size (a loop that feeds no DataLoader: ids or slices drawn on the
            # GPU): a step's activations as a whole, what the batch's memory grows from
            acc.add("act_mem_per_batch_bytes", max(0.0, peak - alloc))
            acc.last["_actb_peak"] = peak  # apart from a line's per-sample reading's

    def feed_config(self, s: Any) -> None:
        get = _get(s)
        t = get("t")
        if t is not None:
            self._advance(t)
        values = get("values")
        if values is None:  # a trace line: the config keys sit on the line itself
            values = {k: v for k, v in s.items() if k not in ("t", "kind", "pid", "rank", "gpu")}
        subj = self._job_subject(get("gpu"), get("pid"), get("rank"))
        self._oom_over(subj, get("pid"))
        self.hook_config = True
        subj.hook_seen = True
        # older hooks send no in_training: their settings count as they did
        settled = values.get("in_training", True) is not False
        values = _eval_interval(values)
        for k, v in values.items():
            if k in CONFIG_KEYS and (settled or k not in _MUTABLE):
                subj.config[k] = _config_value(v)
        if not settled:
            # what its loader's batch is before training settles: only a job that dies in
            # its first step is judged by it (out-of-memory)
            pid = get("pid")
            bs = values.get("batch_size")
            if pid is not None and isinstance(bs, (int, float)) and bs > 0 \
                    and len(self.startup_batch) < 10000:
                self.startup_batch[pid] = float(bs)
            return
        for k in _ABSENT_IS_NONE:  # the hook leaves these out once there is none
            if k not in values:
                subj.config.pop(k, None)
        if "autocast_dtype" in values:
            dtype = values.get("autocast_dtype")
            subj.config["autocast"] = 1.0 if str(dtype).lower() in _AUTOCAST_ON else 0.0
        # autocast entered inside a torch.compile'd forward is traced, never run: the hook
        # cannot see it there; the framework's own precision setting says it is on
        # (except under torch.nn.DataParallel, where the Trainer leaves the model out of
        # Accelerate's preparation, which is what applies autocast: its bf16=True is then
        # not in force)
        fw = str(values.get("fw_precision") or "").lower()
        dp = values.get("data_parallel_gpus")
        if subj.config.get("autocast") != 1.0 and ("bf16" in fw or "fp16" in fw
                                                    or fw.startswith("16")) \
                and not (isinstance(dp, (int, float)) and dp >= 2
                         and values.get("framework") == "transformers"):
            subj.config["autocast"] = 1.0
            subj.config["autocast_dtype"] = "bfloat16" if "bf16" in fw else "float16"
        if "batch_size" in values and values["batch_size"] is not None:
            subj.config["batch_size"] = float(values["batch_size"])

    def feed_phase(self, s: Any) -> None:
        """A `phase` line: what the job does now and its seconds in each phase so far.

        What each phase gained since the job's previous line lies just before this one:
        the phase in force then first, the one in force now last (its gain ends at ``t``).
        Those spans are laid on the time line (``phase_spans``), where each bucket's
        shares are read once the next bucket closes (lines may describe the bucket
        before their own)."""
        get = _get(s)
        t = float(get("t"))
        self._advance(t)
        pid = get("pid")
        subj = self._job_subject(get("gpu"), pid, get("rank"))
        self._oom_over(subj, pid)
        subj.hook_seen = True
        self.hook_phases = True
        seconds = get("seconds") or {}
        if pid is not None and pid != subj.phase_pid:
            subj.phase_pid = pid  # another process on this GPU: its own totals
            subj.phase_seconds = {}
            subj.eval_before = 0.0
            subj.phase_t = None
            for k in _EVAL_IDLE_KEYS:  # counted from its own evaluation batches
                subj.phase_info.pop(k, None)
        if pid is not None and subj.gpu is not None and subj.job_pid in (None, pid):
            # a process that reports phases and no steps yet (inference: generate() from a
            # model that device_map="auto" spread over several GPUs): the other GPUs it is
            # the main process of are its job's too (job_via), not jobs seen from outside.
            # Where its steps named a GPU, that stands; a GPU another process steps on is
            # not taken; a pid used again by a later process moves with it
            cur = self.job_of_pid.get(pid)
            if cur is not subj and (cur is None or cur.job_pid != pid):
                self.job_of_pid[pid] = subj
        gains: dict[str, float] = {}
        for name, total in seconds.items():
            gained = float(total) - subj.phase_seconds.get(name, 0.0)
            if gained > 0:
                gains[name] = gained
            subj.phase_seconds[name] = float(total)
        now = get("phase")
        before = subj.phase
        if subj.phase_seconds.get("inference") and not seconds.get("inference") \
                and now != "inference":
            # the process the hook read as serving trains after all: its hook counts that
            # time as an evaluation now (ahead of the first step), in this line's gain
            subj.phase_seconds.pop("inference")
            subj.eval_before += gains.pop("eval", 0.0)
            for k in _INFERENCE_KEYS:
                subj.phase_info.pop(k, None)
            self.trained_after_serving.append(subj)
        info = subj.phase_info
        if before == "eval" and gains.get("eval") and subj.phase_t is not None:
            self._eval_idle(subj, info, gains["eval"], get("eval_batches"),
                            get("eval_wait_seconds"), t)
        if before == "eval" and now == "train" and info.get("eval_idle_pending"):
            # the evaluation ended in training again: its idle gaps were no batch's fetch
            info["eval_idle_seconds"] = (info.get("eval_idle_seconds", 0.0)
                                         + info.pop("eval_idle_pending"))
        # the one in force now last, even where it was also in force before (a short
        # save or evaluation between two lines: it lies before the time since its end)
        order = sorted(gains, key=lambda n: (n == now, n != before))
        end = t
        for name in reversed(order):
            begin = end - gains[name]
            if subj.phase_t is not None:
                begin = max(begin, subj.phase_t)
            if begin < end:
                subj.phase_spans.append((name, begin, end))
            end = begin
        subj.phase_spans.sort(key=lambda sp: sp[1])
        subj.phase_t = t
        subj.phase = now
        for f in ("compiles", "checkpoints", "eval_batch_size", "inference_batch_size",
                  "inference_batches", "generate_calls", "eval_batches", "eval_wait_seconds",
                  "inference_wait_seconds", "eval_train_loader"):
            v = get(f)
            if v is not None:
                info[f] = v
        if get("hook_state") == "off":
            subj.hook_off = True
        calls, secs = get("calls"), get("call_seconds")
        if calls:
            for name in CLEANUPS:  # each: NAME_calls, NAME_seconds
                if name in calls:
                    info[f"{name}_calls"] = calls[name]
                    info[f"{name}_seconds"] = (secs or {}).get(name, 0.0)

    def _eval_idle(self, subj: Subject, info: dict[str, Any], gained: float, batches: Any,
                   waited: Any, t: float) -> None:
        """Evaluation time since the job's previous `phase` line in which no evaluation
        batch came, none was waited for, and its GPU idled (NVML util under
        EVAL_IDLE_UTIL over those buckets): time outside the model, most often the host
        at work on what the evaluation returned (gathered predictions, metrics). It is
        held as pending until the job trains again (``feed_phase``: then it adds to
        ``eval_idle_seconds``); a later line that counts a batch or more data wait drops
        it (the gap was a batch being fetched: the hook adds a fetch's wait when it
        returns; the loader's own end, a short wait, is subtracted), and so does an
        evaluation the process never leaves."""
        before = info.get("eval_batches")
        w_before = info.get("eval_wait_seconds")
        if not isinstance(batches, (int, float)) or not isinstance(before, (int, float)) \
                or batches <= 0:
            return
        wait = 0.0
        if isinstance(waited, (int, float)) and isinstance(w_before, (int, float)):
            wait = max(0.0, waited - w_before)
        if batches != before or wait > 0.1 * gained:
            info.pop("eval_idle_pending", None)
            return
        ring = subj.gpu_table.rings.get("util") if subj.gpu is not None else None
        res = self.res
        hi = int(t / res)
        lo = int(subj.phase_t / res)
        if ring is None or hi <= lo:  # within one bucket: none of it measured yet
            return
        util = ring.mean(hi, hi - lo)
        if util is not None and util < EVAL_IDLE_UTIL:
            info["eval_idle_pending"] = info.get("eval_idle_pending", 0.0) + gained - wait

    def feed_problem(self, s: Any) -> None:
        get = _get(s)
        self._advance(get("t"))
        subj = self._job_subject(get("gpu"), get("pid"), get("rank"))
        subj.hook_seen = True
        if get("what") == "hook.off":
            subj.hook_off = True
        if len(self.problems) < 200:
            self.problems.append({"t": get("t"), "pid": get("pid"), "rank": get("rank"),
                                  "gpu": subj.gpu, "what": get("what"),
                                  "error": get("error") or ""})

    def feed_end(self, s: Any) -> None:
        """A `job_end` line. A job that died of CUDA out-of-memory (the hook's exit report:
        torch.OutOfMemoryError) leaves on its GPU what the rule out-of-memory reads: its
        allocator's peak, its steps, its batch and micro-batches then, the phase it died in;
        they hold until another process reports on that GPU (``_oom_over``), and are read
        for OOM_HOLD_SECONDS at most (``fact``)."""
        get = _get(s)
        pid = get("pid")
        t = get("t")
        at = int(t // self.res) if isinstance(t, (int, float)) else self.idx
        if pid is not None and at is not None:
            if len(self.ended_pids) >= 10000:  # a daemon's years of jobs: the newest kept
                for old_pid in list(self.ended_pids)[:5000]:
                    del self.ended_pids[old_pid]
            self.ended_pids[pid] = at  # its end is known: not guessed from NVML
        if get("exit_reason") != "oom":
            return
        if at is not None and "cuda" in str(get("error") or "cuda").lower():
            self.last_oom_idx = at
        if t is not None:
            self._advance(t)
        error = str(get("error") or "")
        if error and "cuda" not in error.lower():
            return  # host memory (MemoryError)
        subj = self._job_subject(get("gpu"), pid, get("rank"))
        if subj.gpu is None:
            # a job that died before it named its GPU, whose pid NVML does not list (a
            # container): the one GPU whose memory was full as it died
            subj = self._full_gpu() or subj
        if subj.gpu is None:
            return
        facts = subj.facts
        facts["job_oom"] = 1.0
        facts["oom_pid"] = pid
        facts["oom_idx"] = self.idx
        peak = get("max_mem_allocated_bytes") or get("mem_allocated_bytes")
        facts["oom_peak_bytes"] = float(peak) if peak else None
        reserved = get("mem_reserved_bytes")
        facts["oom_reserved_bytes"] = float(reserved) if reserved else None
        steps = get("steps_total")
        facts["oom_steps"] = float(steps) if steps is not None else None
        # its own batch: the steps' where this pid stepped here, else its loader's as the
        # hook read it at start-up (a job that died in its first step)
        own = subj.job_pid == pid
        bs = None
        if own:  # the open bucket's, else the newest kept, else its settings'
            bs = subj.job.acc.last.get("batch_size")
            ring = subj.job.rings.get("batch_size")
            if bs is None and ring is not None:
                bs = ring.last(ring.end(), ring.end() - ring.base)
            if bs is None:
                bs = subj.config.get("batch_size")
        if bs is None:
            bs = self.startup_batch.get(pid)
        facts["oom_batch_size"] = float(bs) if bs else None
        facts["oom_micro_batches"] = (subj.micro_sum / subj.micro_n if own and subj.micro_n
                                      else None)
        # the phase it died in (its hook's newest `phase` line): an evaluation's batch, or
        # an inference process's
        owner = self.phase_owner(subj)
        phase = owner.phase if owner is not None and owner.phase_pid in (None, pid) else None
        facts["oom_in_eval"] = 1.0 if phase == "eval" else 0.0
        facts["oom_in_inference"] = 1.0 if phase == "inference" and not steps else 0.0
        eb = owner.phase_info.get("eval_batch_size") if owner is not None else None
        if eb is None:
            eb = self.config_value(subj, "fw_eval_batch_size")
        facts["oom_eval_batch_size"] = float(eb) if phase == "eval" and eb else None
        ib = owner.phase_info.get("inference_batch_size") if owner is not None else None
        facts["oom_inference_batch_size"] = (float(ib) if phase == "inference" and ib
                                             else None)

    def _oom_over(self, subj: Subject, pid: Any) -> None:
        """Another process reports for ``subj``'s GPU: an earlier job's death by OOM is not
        its own (the advice ends)."""
        if subj.facts.get("job_oom") and pid is not None and pid != subj.facts.get("oom_pid"):
            for k in OOM_FACTS:
                subj.facts.pop(k, None)
            subj.facts["job_oom"] = 0.0  # known false: the advice ends

    def _full_gpu(self) -> Subject | None:
        """The one GPU whose used memory reached 90 % of it in the last 15 s, if one did."""
        full = []
        for subj in self.subjects.values():
            if subj.gpu is None:
                continue
            ring = subj.gpu_table.rings.get("mem_used_ratio")
            seen = ring.values(ring.end(), 15) if ring is not None else []
            now = subj.gpu_table.acc.mean("mem_used_ratio")
            if now is not None:
                seen.append(now)
            if seen and max(seen) >= 0.9:
                full.append(subj)
        return full[0] if len(full) == 1 else None

    def _close_phase(self, idx: int, subj: Subject) -> None:
        """The shares of each phase in the bucket before ``idx`` (complete now: a line
        read in ``idx`` may describe it), and the whole run's seconds so far."""
        tab = subj.phase_table
        tab.ever = True
        res = self.res
        b = idx - 1
        lo, hi = b * res, (b + 1) * res
        share: dict[str, float] = {}
        spans = subj.phase_spans
        for name, begin, end in spans:
            overlap = min(end, hi) - max(begin, lo)
            if overlap > 0:
                share[name] = share.get(name, 0.0) + overlap
        covered = sum(share.values())
        if covered < res:  # time no line has described yet: the phase in force
            last = next((sp[0] for sp in reversed(spans) if sp[1] < hi), subj.phase)
            if last in _PHASE_NAMES:
                share[last] = share.get(last, 0.0) + (res - covered)
                covered = res
        subj.phase_spans = [sp for sp in spans if sp[2] > hi]
        if b >= subj.first:
            for name in _PHASE_NAMES:
                tab.push(b, f"phase_{name}", share.get(name, 0.0) / covered if covered else 0.0)
        sec = subj.phase_seconds
        for name in ("train", "startup", "compile", "checkpoint"):
            tab.push(idx, f"{name}_seconds", sec.get(name, 0.0))
        ev = max(0.0, sec.get("eval", 0.0) - subj.eval_before)  # since the first step
        tab.push(idx, "eval_seconds", ev)
        if ev and "peer_eval_seconds" in self.needed:
            self._peer_eval(idx, subj, tab)
        since_first = sec.get("train", 0.0) + ev + sec.get("checkpoint", 0.0)
        if since_first > 0:
            tab.push(idx, "eval_time_ratio", ev / since_first)
            tab.push(idx, "checkpoint_time_ratio", sec.get("checkpoint", 0.0) / since_first)
        info = subj.phase_info
        tab.push(idx, "compiles", info.get("compiles"))
        # each: NAME_calls, NAME_seconds; 0 until the hook counts one (its `phase` lines
        # leave out calls not made yet), so that a window reaching back before the first
        # counts them all, from the same line as the phase seconds it is read against
        for name in CLEANUPS:
            tab.push(idx, f"{name}_calls", info.get(f"{name}_calls", 0))
            tab.push(idx, f"{name}_seconds", info.get(f"{name}_seconds", 0.0))
        tab.push(idx, "checkpoints", info.get("checkpoints"))
        tab.push(idx, "eval_batch_size", info.get("eval_batch_size"))
        if info.get("eval_train_loader"):
            tab.push(idx, "eval_train_loader", 1.0)
        if ev:
            tab.push(idx, "eval_idle_seconds", info.get("eval_idle_seconds", 0.0))
        tab.push(idx, "inference_batch_size", info.get("inference_batch_size"))
        batches = (info.get("inference_batches") or 0)
        tab.push(idx, "inference_batches", float(batches) if batches else None)
        calls = info.get("generate_calls")
        tab.push(idx, "generate_calls", float(calls) if batches and calls is not None else None)
        waited, serving = info.get("inference_wait_seconds"), sec.get("inference", 0.0)
        tab.push(idx, "inference_wait_ratio", min(1.0, waited / serving)
                 if waited is not None and serving >= INFERENCE_WAIT_AFTER else None)

    def _job_subject(self, gpu: int | None, pid: int | None, rank: int | None) -> Subject:
        # which GPU a job's lines belong to: its own say, else the GPU its pid holds
        # memory on, else its rank where that names a GPU, else the only GPU
        if pid is not None:
            if gpu is None:
                gpu = self.hook_gpu.get(pid)
                if gpu is None:
                    gpu = self.pid_gpu.get(pid)
            elif self.hook_gpu.get(pid) != gpu:
                self.hook_gpu[pid] = gpu
        if gpu is None and rank is not None and rank in self.subjects:
            gpu = rank
        if gpu is None:
            gpus = self.gpus()
            if len(gpus) == 1:
                gpu = gpus[0]
        if gpu is None:
            return self.host
        return self._subject(gpu)

    def feed(self, s: Any) -> None:
        """Any sample: a trace line (dict with ``kind``) or a samples.py record."""
        if type(s) is dict:
            kind = s.get("kind")
        else:
            kind = _KIND_OF.get(type(s).__name__)
        if kind == "gpu":
            self.feed_gpu(s)
        elif kind == "host":
            self.feed_host(s)
        elif kind == "step":
            self.feed_step(s)
        elif kind == "steps":
            self.feed_steps(s)
        elif kind == "config":
            self.feed_config(s)
        elif kind == "phase":
            self.feed_phase(s)
        elif kind == "hook_problem":
            self.feed_problem(s)
        elif kind == "job_end":
            self.feed_end(s)
            if len(self.job_ends) < 1000:
                self.job_ends.append(dict(s) if type(s) is dict else
                                     {f: getattr(s, f) for f in s.__slots__})

    # -- closing a bucket ----------------------------------------------------------------
    def _close(self, idx: int) -> None:
        self._attr_cache.clear()
        self._group_keys = None
        need = self.needed
        host = self.host_tables
        a = self.host_acc
        gpus = [s for g, s in self.subjects.items() if g is not None]
        if gpus:
            self.facts["gpu_count"] = float(len(gpus))
        if a.n:
            host.ever = True
            for name in _HOST_RAW:
                if name in need:
                    host.push(idx, name, a.mean(name))
            cpus = self.facts.get("host_cpus")
            cpu = a.mean("cpu_util")
            if cpus and cpu is not None:
                host.push(idx, "cpu_free_cores", cpus * (1.0 - cpu))
            load = a.mean("load1")
            if cpus and load is not None:
                host.push(idx, "load_per_cpu", load / cpus)
            hu, ht = a.mean("host_mem_used_bytes"), a.mean("host_mem_total_bytes")
            if hu is not None and ht:
                host.push(idx, "host_mem_used_ratio", hu / ht)
            started = a.s.get("job_loader_workers_started")
            if started is not None and "loader_workers_started_per_minute" in need:
                host.push(idx, "loader_workers_started_per_minute", started * 60.0 / self.res)
            jc, jp = a.mean("job_cpu_cores"), a.mean("job_processes")
            if jp is not None:
                pids = self._bucket_pids
                if not pids:
                    pids = set().union(*(s.proc_pids for s in gpus)) if gpus else set()
                mains = float(max(1, len(pids))) if jp >= 1 else 0.0
                workers = max(0.0, jp - mains)
                jm, jw = a.mean("job_main_cpu_cores"), a.mean("job_workers_cpu_cores")
                # the children torch names as DataLoader workers, where any is: the
                # others (a framework's helper, compile workers) feed no steps
                jl = a.mean("job_loader_workers")
                jb = a.mean("job_loader_cpu_cores") if jl else None
                if jl:
                    workers = jl
                host.push(idx, "job_main_processes", mains)
                host.push(idx, "job_workers", workers)
                if jc is not None and mains > 0:
                    if jm is None:
                        # without the split, the mains are taken to use the first cores: a
                        # training loop's main process is busy whenever the GPU works
                        jm = min(jc, mains)
                        jw = jc - jm
                    host.push(idx, "main_cpu_cores", jm / mains)
                    host.push(idx, "main_busy_ratio", min(1.0, jm / mains))
                    if jw is not None:
                        host.push(idx, "workers_cpu_cores", jw)
                        busy = jb if jb is not None else jw
                        host.push(idx, "workers_busy_ratio",
                                  min(1.0, busy / workers) if workers >= 1 else None)
            a.clear()
        self._bucket_pids = set()
        for subj in self.subjects.values():
            self._close_job(idx, subj)
            if subj.phase is not None:
                self._close_phase(idx, subj)
            if subj.gpu is None:
                continue
            if subj.cpu.acc.n:
                self._close_cpu(idx, subj.cpu, subj.config.get("num_workers"))
            acc = subj.gpu_table.acc
            if not acc.n:
                continue
            tab = subj.gpu_table
            push = tab.push
            light = subj.light
            sums, counts, lasts = acc.s, acc.n, acc.last
            for name, mean in self._gpu_close_light if light else self._gpu_close:
                n = counts.get(name)  # acc.mean and acc.last, written out
                if n is not None:
                    push(idx, name, (sums[name] / n if n else None) if mean else lasts[name])
            used, total = acc.mean("mem_used_bytes"), acc.last.get("mem_total_bytes")
            if used is not None and total:
                tab.push(idx, "mem_used_ratio", used / total)
                if not light:
                    tab.push(idx, "mem_free_bytes", total - used)
            util = acc.mean("util")
            if not light:
                pw, pl = acc.mean("power_watts"), acc.last.get("power_limit_watts")
                if pw is not None and pl:
                    tab.push(idx, "power_ratio", pw / pl)
                busy = acc.mean("sm_active") if subj.facts.get("gpm") else None
                tab.push(idx, "busy_ratio", busy if busy is not None else util)
            # (a GPU bucketed lightly too: the attribution reads its seconds of idle
            # writing as its job's time away, for the other ranks)
            if util is not None and not _IDLE_WRITING.isdisjoint(need):
                self._idle_writing(idx, subj, util, light)
            if used is not None and total:
                tab.push(idx, "mem_headroom_bytes", max(0.0, 0.85 * total - used))
            if util is not None and util >= FIRST_WORK_UTIL:
                if subj.first_util is None:
                    subj.first_util = idx
                if subj.first_busy is None and subj.proc_pids:
                    subj.first_busy = idx
            acc.clear()
        no_hook = not self.hook_steps
        for subj in self.subjects.values():
            if subj.job_warm is not None:
                # with phases, a bucket's share of training is known once the next bucket
                # closes: the span takes the bucket before this one
                self._span_add(subj, idx - 1 if self.phase_owner(subj) is not None else idx)
            elif subj.gpu is not None and no_hook and subj.job_warm is None and subj.proc_pids \
                    and subj.first_busy is not None and not self.hook_attached(subj):
                # without the hook: the buckets in which the GPU's process looks like it
                # trains (kernels running, or its DataLoader workers pegged), or is away
                # from it saving (its GPU idle while it writes: the other ranks wait)
                w = self.job_window(subj, idx + 1, 1)
                if w is not None and w.util is not None and (
                        w.util >= 0.05 or w.workers_pegged or w.away > 0):
                    subj.span.add(w)
                    subj.span_at_last_step = subj.span.total()
                    subj.bare_last = idx
                    if len(subj.proc_pids) == 1:
                        subj.job_pid = next(iter(subj.proc_pids))
        if self.on_bucket is not None:
            self.on_bucket(idx)

    def _step_gap(self, idx: int, subj: Subject, steps: float) -> None:
        """Seconds since the job's last step, while its hook still says, in the last
        STALL_HEARD_SECONDS, that it is training (a process that ended, or went on to
        evaluate, save or compile, is not stalled): ``step_gap_seconds``."""
        heard = subj.phase_t
        if steps or subj.job_last is None or subj.hook_off or subj.phase != "train" \
                or heard is None or (idx + 1) * self.res - heard > STALL_HEARD_SECONDS:
            # stepping, or not known to be training now (ended, silent, evaluating,
            # saving): no gap, so a stall said before ends (a bare last() reads back the
            # newest value). Pushed once: the newest value stays 0 until a gap opens
            if not subj.gap_zero:
                subj.job.push(idx, "step_gap_seconds", 0.0)
                subj.gap_zero = True
            return
        subj.job.push(idx, "step_gap_seconds", (idx - subj.job_last) * self.res)
        subj.gap_zero = False

    def _close_job(self, idx: int, subj: Subject) -> None:
        job = subj.job
        acc = job.acc
        if not job.ever:
            return
        steps = acc.s.get("_steps", 0.0)
        job.push(idx, "step_rate", steps / self.res)
        if "steps_taken" in self.needed:
            job.push(idx, "steps_taken", subj.steps_seen)
        if "long_step_share" in self.needed:
            self._push_long(idx, subj)
        if "step_gap_seconds" in self.needed:
            self._step_gap(idx, subj, steps)
        if not steps:
            return
        if "step_seconds" in acc.n:
            ss_sum = acc.s["step_seconds"]
            job.push(idx, "step_seconds", ss_sum / acc.n["step_seconds"], acc.n["step_seconds"])
            if "data_wait_seconds" in acc.n:
                dw_sum, dss = acc.s["data_wait_seconds"], acc.s["_dw_ss"]
                job.push(idx, "data_wait_seconds", dw_sum / acc.n["data_wait_seconds"],
                         acc.n["data_wait_seconds"])
                if dss > 0:
                    job.push(idx, "data_wait_ratio", min(1.0, dw_sum / dss), dss)
        for name in ("batch_size", "mem_allocated_bytes", "mem_reserved_bytes",
                     "max_mem_allocated_bytes", "loss_scale"):
            if name in acc.last:
                job.push(idx, name, acc.last[name])
        if "act_mem_per_sample_bytes" in acc.last:
            job.push(idx, "act_mem_per_sample_bytes", self._act_floor(idx, job, acc))
        elif "act_mem_per_batch_bytes" in acc.last:
            job.push(idx, "act_mem_per_batch_bytes",
                     self._act_floor(idx, job, acc, "act_mem_per_batch_bytes"))
        if "micro_batches" in acc.n:
            micro = acc.mean("micro_batches")
            job.push(idx, "micro_batches", micro, acc.n["micro_batches"])
            bs = acc.last.get("batch_size")
            if bs and micro:
                job.push(idx, "micro_batch_size", self._micro_size(subj, bs, micro))
        self._batch_room(idx, subj, acc)
        if "loss" in acc.n:
            job.push(idx, "loss", acc.mean("loss"))
        if "loss_nonfinite" in acc.n:
            # weighed by the losses read in the bucket: a window's mean is their share
            job.push(idx, "loss_nonfinite", acc.mean("loss_nonfinite"), acc.n["loss_nonfinite"])
        if "_fb_known" in acc.n:
            fb = acc.s.get("_fb_dw", 0.0)
            n_fb = acc.n.get("_fb_dw", 0.0)
            ss_all = acc.s.get("step_seconds", 0.0)
            if ss_all > 0:
                job.push(idx, "first_batch_wait_ratio", min(1.0, fb / ss_all), ss_all)
            job.push(idx, "iterator_rate", n_fb / self.res)
            if n_fb:
                job.push(idx, "first_batch_wait_seconds", fb / n_fb, n_fb)
        if "_skip" in acc.n:
            job.push(idx, "skipped_ratio", acc.mean("_skip"), acc.n["_skip"])
        bs = acc.last.get("batch_size")
        if bs:
            job.push(idx, "samples_per_second", steps / self.res * bs)
        reserved = acc.last.get("mem_reserved_bytes")
        total = self._mem_total(subj)
        if reserved is not None and total:
            job.push(idx, "mem_reserved_ratio", reserved / total)
        acc.clear()

    def _micro_size(self, subj: Subject, bs: float, micro: float) -> float:
        """Samples per backward() of a step of ``bs`` samples in ``micro`` micro-batches.

        Under a framework that accumulates (the Trainer, Accelerate, Lightning), each
        micro-batch is one batch of the training DataLoader: its batch_size, as the hook
        read it, where the step holds within one loader batch of that many (their loaders
        read one batch ahead, so a run's first step holds one more and its last one
        fewer: a Trainer's last step of 2 micro-batches of 8 read 4). Otherwise the step's
        samples a call (a loop that splits a batch into chunks for its backward() calls;
        two loaders read side by side for each backward(): Lightning's CombinedLoader)."""
        if micro >= 1.5 and self.config_value(subj, "framework") in _ACCUMULATING:
            loader = self.config_value(subj, "batch_size")
            if isinstance(loader, (int, float)) and loader > 0 \
                    and loader * (micro - 1) <= bs <= loader * (micro + 1):
                return float(loader)
        return bs / micro

    def _act_floor(self, idx: int, job: Any, acc: _Acc,
                   name: str = "act_mem_per_sample_bytes") -> float:
        """Activation memory per sample (``name``: or a step's, where no batch size is
        known) over the least the job held in the last
        ACT_FLOOR_SECONDS (its weights, optimizer state and what else a step keeps): the
        hook reads what is allocated whenever it reports, often inside a step whose
        activations are live (a compiled step's 0.75-2.0 GiB against a 2.1 GiB peak), and
        the peak over that reading alone made them up to 20 times too small. Kept in
        ``acc.last`` for the bucket's batch room."""
        last = acc.last
        per = last[name]
        ring = job.rings.get("mem_allocated_bytes")
        whole = name == "act_mem_per_batch_bytes"
        samples = 1.0 if whole else last.get("_act_samples")
        peak = last.get("_actb_peak" if whole else "_act_peak")
        if ring is not None and samples and peak is not None:
            held = ring.values(idx + 1, max(1, math.ceil(ACT_FLOOR_SECONDS / self.res)))
            if held:
                per = max(per, (peak - min(held)) / samples)
                last[name] = per
        return per

    def _batch_room(self, idx: int, subj: Subject, acc: _Acc) -> None:
        """How many times the micro-batch fits: 1 + the GPU's headroom over what one
        micro-batch's activations take (batch advice's one measure of room); with no batch
        size known, over a step's activations as a whole (its one backward())."""
        per = acc.last.get("act_mem_per_sample_bytes")
        bs = acc.last.get("batch_size")
        if per and bs:
            micro = acc.mean("micro_batches") if "micro_batches" in acc.n else None
            need = per * (self._micro_size(subj, bs, micro) if micro else bs)
        else:
            # no batch size: a step's activations as a whole, where it takes one backward()
            need = acc.last.get("act_mem_per_batch_bytes") or 0.0
        if subj.gpu is None or need <= 0:
            return
        ring = subj.gpu_table.rings.get("mem_headroom_bytes")
        head = ring.last(idx + 1, 5) if ring is not None else None
        if head is None:
            return
        subj.job.push(idx, "batch_room", 1.0 + head / need)

    def _mem_total(self, subj: Subject) -> float | None:
        if subj.gpu is not None:
            ring = subj.gpu_table.rings.get("mem_total_bytes")
            v = subj.gpu_table.acc.last.get("mem_total_bytes")
            if v is None and ring is not None:
                v = ring.last(ring.end(), 1)
            return v
        return None

    # -- step-time attribution --------------------------------------------------------------
    def _job_table(self, subj: Subject) -> tuple[Table | None, Subject]:
        if subj.job.ever:
            # a hook that stopped measuring: its job is judged from NVML and psutil
            return (None, subj) if subj.hook_off else (subj.job, subj)
        # steps no GPU was named for are the only GPU's (subjects: the GPUs and the host)
        if subj.gpu is not None and self.host.job.ever and len(self.subjects) == 2:
            return (None, subj) if self.host.hook_off else (self.host.job, self.host)
        via = subj.job_via  # its main process reports its steps for another GPU
        if via is not None:
            return (None, subj) if via.hook_off else (via.job, via)
        return None, subj

    def hook_dead(self, subj: Subject) -> bool:
        """Whether the hook that reported for ``subj``'s job stopped measuring."""
        if subj.hook_off or (subj.job_via is not None and subj.job_via.hook_off):
            return True
        return (not subj.job.ever and not subj.hook_seen and len(self.subjects) <= 2
                and self.host.hook_off)

    def steps_stopped(self, subj: Subject, idx: int, grace: float = 2.0) -> bool:
        """Whether the hook reported steps for ``subj``'s job and none in the last
        ``grace`` seconds before bucket ``idx`` ended (the job ended or paused), or whose
        hook said the job ended (its `job_end` line) by then, after its newest step."""
        _, owner = self._job_table(subj)
        last = owner.job_last
        if last is None:
            return False
        if (idx - last) * self.res > grace:
            return True
        ended = self._ended_at(owner)
        return ended is not None and last <= ended <= idx

    def job_over(self, subj: Subject, idx: int, grace: float = JOB_OVER_GRACE) -> bool:
        """Whether ``subj``'s job ended more than ``grace`` seconds before bucket ``idx``
        ended: its hook said so (its `job_end` line), or NVML, which listed its process on
        the GPU, lists none since. A daemon that outlives the job (a service, or one
        started beside it) goes on reading its GPU idle, and windows that hold the job's
        last seconds beside that idleness are no training of it (some readings, such as
        the job's process tree, are not read again once it is gone: their windows would
        hold the last ones for ever)."""
        ended = self.job_end_bucket(subj)
        if ended is not None:
            return (idx - ended) * self.res > grace
        last = subj.procs_last
        return last is not None and not subj.proc_pids and (idx - last) * self.res > grace

    def job_end_bucket(self, subj: Subject) -> int | None:
        """The bucket in which the hook said ``subj``'s job ended (its `job_end` line)."""
        return self._ended_at(self._job_table(subj)[1])

    def _ended_at(self, owner: Subject) -> int | None:
        return self.ended_pids.get(owner.job_pid) if owner.job_pid is not None else None

    def bare_work_stopped(self, subj: Subject, idx: int, grace: float = 2.0) -> bool:
        """Without the hook: whether ``subj``'s process looked like it trained (the
        buckets its span counts: kernels running, or its DataLoader workers pegged) and
        has not in the last ``grace`` seconds before bucket ``idx`` ended (it ended,
        paused, or saves). With the hook's steps, :meth:`steps_stopped` says it."""
        last = subj.bare_last
        return last is not None and subj.job_warm is None and (idx - last) * self.res > grace

    def job_window(self, subj: Subject, end: int, n: int, clamp: bool = True,
                   stopped: bool = True) -> JobWindow | None:
        """The attribution's inputs for ``subj`` over the ``n`` buckets before ``end``,
        from its job's first step on (None: nothing to attribute). Wall time is training
        time: where the hook's phases say part of the window went to evaluation,
        checkpoints or compiling, that part is left out (the phases split the wall time
        first; docs/advice.md). A CPU-only job (no GPU in the data, the hook's steps on
        the host) gets its breakdown too, with no GPU share."""
        cpu_only = subj.gpu is None
        if cpu_only and (not subj.job.ever or len(self.subjects) > 1 or subj.hook_off):
            return None
        table, owner = self._job_table(subj)
        hook = table is not None
        if not hook and self.hook_attached(subj) and not self.hook_dead(subj):
            return None  # its hook reports no training step: starting up, or inference
        start = end - n
        if hook:
            # from the end of the job's first step: the first iteration carries its
            # one-off start (CUDA init, cuDNN autotuning, compiling), as the rules' do
            if owner.job_warm is None:
                return None
            start = max(start, owner.job_warm)
        else:
            start = max(start, subj.first)
        if end - start < 1:
            return None
        if hook:
            rings = table.rings
            step_total, _ = ring_sums(rings.get("step_seconds"), start, end)
            rate_sum, _ = ring_sums(rings.get("step_rate"), start, end)
            # steps that stopped long ago (many step times, and STEPS_GONE_SECONDS): the
            # stretch since the last one is not known to lie between steps (the job may
            # have finished its loop and be tearing down: DataLoader workers joined, a
            # final save, an upload), so the window ends at the last step's bucket; once a
            # step comes again, the gap lies between steps and counts
            last = owner.job_last
            if stopped and last is not None and last + 1 < end:
                # the job's step time: its run's so far (a window of slow steps may hold
                # none), else this window's
                sp = owner.span.s
                if sp.get("steps"):
                    step = sp.get("step_total", 0.0) / sp["steps"]
                else:
                    step = step_total / (rate_sum * self.res) if rate_sum > 0 else 0.0
                if self.steps_stopped(subj, end - 1,
                                      max(STEPS_GONE_SECONDS, STEPS_GONE_STEPS * step)):
                    end = last + 1
                    if end - start < 1:
                        return None
        if cpu_only:
            busy = util = 0.0  # no GPU: nothing of the step is GPU work
        else:
            gt = subj.gpu_table.rings
            busy_ring = gt.get("sm_active") if subj.facts.get("gpm") else None
            busy = ring_mean(busy_ring, start, end)
            util = ring_mean(gt.get("util"), start, end)
            if busy is None:
                busy = util
        # lookup_table's choice for the three: the GPU's own job trees once it has any,
        # else the host's
        rings = subj.cpu.rings if subj.cpu.ever else self.host_tables.rings
        main = ring_mean(rings.get("main_busy_ratio"), start, end)
        wb = ring_mean(rings.get("workers_busy_ratio"), start, end)
        workers = ring_mean(rings.get("job_workers"), start, end)
        wall = (end - start) * self.res
        away = 0.0
        phases = self.phase_owner(subj)
        if phases is not None:
            train_ring = phases.phase_table.rings.get("phase_train")
            train = ring_mean(train_ring, start, end)
            if train is not None:
                away = wall * (1.0 - min(1.0, max(train, 0.0)))
                wall *= max(train, 1e-3)
                if not cpu_only and end - start > 1 and train < 0.98:
                    # the GPU's busy share in the seconds the job trained, from how much
                    # of each second it trained (evaluating at a small batch reads the
                    # GPU less busy than the steps keep it: fw_hf_eval_heavy's seconds of
                    # steps 66 % SM active, its windows' plain mean 45-51 %, this 64-74 %;
                    # fw_hf_large_eval10's 67 %, 45 %, 70-77 %)
                    # GPM's counters describe the sample interval before their line:
                    # as much of it as lies in the bucket before is paired with that
                    # bucket's phases. NVML's util is the kernel time of its last sample
                    # period, shorter (1/6 s on many parts): its own bucket. On the fw_*
                    # recordings (H100, H200; lines 0.0-0.9 s into their buckets) these
                    # fit best: least residual on 24 of 26 GPUs for SM active, on 36 of
                    # 61 for util (benchmarks/phase_fit.py pairing)
                    w_util = ring_mean_in_phase(gt.get("util"), train_ring, start, end)
                    w_busy = ring_mean_in_phase(busy_ring, train_ring, start, end,
                                                self._gpm_before(subj))
                    if w_util is not None:
                        util = w_util
                    if w_busy is not None:
                        busy = w_busy
                    elif w_util is not None:  # no GPM: util is the busy share
                        busy = w_util
        if not hook:
            # no phases: the seconds the GPU idled while the job's main process wrote to
            # storage (gpu_idle_writing: a checkpoint seen from outside) are its time away
            # from training, for which the other ranks of its launch wait in their next
            # collective (fw_hf_save_ddp: ranks 1-3 waiting 17-36 % for rank 0's saves);
            # they stay in ``wall``, as all the time counts as training without the hook
            iw = None if cpu_only else ring_mean(subj.gpu_table.rings.get("gpu_idle_writing"),
                                                 start, end)
            return JobWindow(wall=wall, hook=False, busy=busy, util=util, main=main,
                             workers_busy=wb, workers=workers,
                             away=wall * iw if iw else 0.0, writes_read=iw is not None)
        dw, dw_steps = ring_sums(table.rings.get("data_wait_ratio"), start, end)
        # a step that began before the window still counts whole in it; a window's own
        # total is clamped (``clamp``), a run's is summed from unclamped buckets
        return JobWindow(wall=wall, hook=True, steps=rate_sum * self.res,
                         step_total=min(step_total, wall) if clamp else step_total,
                         data_total=dw if dw_steps > 0 else None, busy=busy, util=util,
                         main=main, workers_busy=wb, workers=workers, away=away)

    def train_start(self, subj: Subject) -> int | None:
        """The bucket from which ``subj``'s job is in training (after its first step), or
        None without the hook's steps."""
        if subj.job.ever and not subj.hook_off:  # the usual case first: asked every window
            return subj.job_warm
        table, owner = self._job_table(subj)
        if table is not None:
            return owner.job_warm
        host = self.host
        if subj.gpu is not None and not subj.job.ever and host.job.ever and not host.hook_off:
            # steps no GPU was named for, with several GPUs: the job drives them all, and
            # none of them is judged before its first step
            return host.job_warm
        return None

    def started_work(self, subj: Subject, end: int, buckets: int) -> bool:
        """Without the hook: whether ``subj``'s GPU has run kernels for its process for at
        least ``buckets`` buckets before ``end`` (before that, DataLoader workers
        prefetching while the GPU idles are start-up, not training)."""
        first = subj.first_busy if subj.proc_pids else subj.first_util
        return first is not None and end - first >= buckets

    def _peer_eval(self, idx: int, subj: Subject, tab: Table) -> None:
        """peer_eval_seconds: the most any other rank of ``subj``'s job evaluated since
        its first step (the ranks of _group_key); none for a job of one process."""
        mine = self._group_key(subj)
        if mine[0] == "alone":
            return
        peers = [max(0.0, s.phase_seconds.get("eval", 0.0) - s.eval_before)
                 for s in self.subjects.values()
                 if s is not subj and s.phase is not None and self._group_key(s) == mine]
        if peers:
            tab.push(idx, "peer_eval_seconds", max(peers))

    def _group_key(self, subj: Subject) -> Any:
        """Which ranks are one job: one process per GPU with a rank and the same world
        size (torchrun on one host); anything else stands alone."""
        if not subj.job.ever:
            # without the hook: the ranks its environment ties to one launch
            d = subj.dist
            if d is not None and d[2] >= 2 and not self.hook_steps:
                return ("launch", d[0], d[2])
            return ("alone", subj.gpu)
        ws = self.config_value(subj, "world_size")
        if subj.job_rank is None or (ws is not None and ws <= 1):
            return ("alone", subj.gpu)
        return ("ranks", ws)

    def attribution(self, subj: Subject, end: int, n: int) -> Attribution | None:
        """``subj``'s job's attribution over the ``n`` buckets before ``end``: made for
        the ranks of its job (those of ``_group_key``) at once, once per bucket, and for
        no other subject (an engine that judges a share of the GPUs, split.py, pays only
        for its own)."""
        key = (end, n)
        got = self._attr_cache.get(key)
        if got is None:
            got = self._attr_cache[key] = {}
        gpu = subj.gpu
        if gpu in got:
            return got[gpu]
        keys = self._group_keys
        if keys is None:
            keys = self._group_keys = {s.gpu: self._group_key(s)
                                       for s in self.subjects.values()}
        mine = keys.get(gpu)
        if mine is None:  # a subject made after this bucket's keys
            mine = keys[gpu] = self._group_key(subj)
        made = self._attribute_all(
            lambda s: self.job_window(s, end, n) if keys.get(s.gpu) == mine else None)
        for s in self.subjects.values():
            if keys.get(s.gpu) == mine:
                got[s.gpu] = made.get(s.gpu)
        return got[gpu]

    def _attribute_all(self, window: Callable[[Subject], JobWindow | None]
                       ) -> dict[int | None, Attribution]:
        groups: dict[Any, dict[int | None, tuple[JobWindow, int | None]]] = {}
        for subj in self.subjects.values():
            w = window(subj)
            if w is None:
                continue
            rank = subj.job_rank
            if rank is None and not w.hook and subj.dist is not None:
                rank = subj.dist[1]
            groups.setdefault(self._group_key(subj), {})[subj.gpu] = (w, rank)
        out: dict[int | None, Attribution] = {}
        for members in groups.values():
            out.update(attribute_group(members))
        return out

    def _whole_run(self, subj: Subject) -> JobWindow | None:
        w = subj.span_at_last_step
        if w is None or not w.hook or subj.span_t0 is None or subj.job_t1 is None:
            return w
        # the span sums the steps read from the bucket after the first step's on; buckets
        # round that out to whole ones, so its wall is taken from the steps' own clock:
        # from when the first of them began to when the last ended
        # (less what its phases spent meanwhile evaluating, saving or compiling)
        wall = subj.job_t1 - subj.span_t0 - max(0.0, subj.nontrain_t1 - subj.nontrain_t0)
        wall = max(wall, 1e-3)
        return w._replace(wall=wall, step_total=min(w.step_total, wall))

    def _nontrain(self, subj: Subject) -> float:
        """Seconds the job's phases spent evaluating, saving and compiling, so far."""
        owner = self.phase_owner(subj)
        if owner is None:
            return 0.0
        sec = owner.phase_seconds
        return (sec.get("eval", 0.0) - owner.eval_before + sec.get("checkpoint", 0.0)
                + sec.get("compile", 0.0))

    def jobs(self, end: int | None = None, n: int | None = None) -> list[dict[str, Any]]:
        """One entry per job and rank: ``pid``, ``rank``, ``gpu``, ``time_share``. Over the
        ``n`` buckets before ``end``, or (``n`` None) the whole run from each job's first
        step to its last."""
        if n is None:
            got = self._attribute_all(self._whole_run)
        else:
            e = end if end is not None else (self.idx or 0)
            got = self._attribute_all(lambda s: self.job_window(s, e, n))
        out = []
        for gpu in sorted(got, key=lambda g: -1 if g is None else g):
            a = got[gpu]
            subj = self.subjects[gpu]
            w = a.window
            pid = subj.job_pid
            if pid is None and len(subj.proc_pids) == 1:
                pid = next(iter(subj.proc_pids))
            entry: dict[str, Any] = {
                "pid": pid,
                "rank": a.rank,
                "gpu": gpu,
                "time_share": {c: round(a.shares[c], 4) for c in SHARE_CATEGORIES},
                "bottleneck": a.top(),
                "source": "hook" if w.hook else "nvml",
                "seconds": round(w.wall, 1),
                # the whole run's count is exact (the span leaves out the first step's
                # bucket); a window's is what its buckets hold
                "steps": (int(round(self._job_table(subj)[1].steps_seen)) if n is None
                          else int(round(w.steps))) if w.hook else None,
                "step_seconds": round(w.step_total / w.steps, 6) if w.hook and w.steps
                else None,
            }
            kernels = host_kernel_share(a.shares, w)
            if kernels is not None:
                entry["host_kernel_share"] = round(kernels, 4)
            if a.ranks > 1:
                entry["ranks"] = a.ranks
                entry["rank_score"] = round(a.score, 3)
                entry["slowest_rank"] = a.slowest_rank
            entry.update(self._job_extras(subj))
            out.append(entry)
        # jobs the hook reports that never trained (an inference process) or have not yet:
        # their phases, without a breakdown of steps they do not take
        for gpu, subj in sorted(self.subjects.items(), key=lambda kv: -1 if kv[0] is None
                                else kv[0]):
            if gpu in got or subj.phase is None or (gpu is None and self.gpus()):
                continue
            out.append({"pid": subj.phase_pid, "rank": subj.job_rank, "gpu": gpu,
                        "time_share": None, "bottleneck": None, "source": "hook",
                        "seconds": None, "steps": int(round(subj.steps_seen)) or None,
                        "step_seconds": None, **self._job_extras(subj)})
        return out

    def _job_extras(self, subj: Subject) -> dict[str, Any]:
        """What the hook says of a job besides its breakdown: its phases, the framework
        that drives it, its micro-batches, evaluation and inference batches."""
        out: dict[str, Any] = {}
        owner = self.phase_owner(subj)
        if owner is not None:
            out["phase"] = owner.phase
            seconds = dict(owner.phase_seconds)
            # `phase` lines come when the phase changes, else every few seconds: steps that
            # ended since the newest one say that training went on until the newest of them
            t1 = max((x for x in (subj.job_t1, owner.job_t1) if x is not None), default=None)
            if (owner.phase == "train" and owner.phase_t is not None and t1 is not None
                    and t1 > owner.phase_t):
                seconds["train"] = seconds.get("train", 0.0) + (t1 - owner.phase_t)
            elif owner.phase == "train" and owner.phase_t is not None and t1 is not None:
                # the hook counts training until another phase begins: where its newest
                # line came long after the newest step (the steps stopped: STEPS_GONE_*),
                # that time is the job's after its last step (a slow exit, work at the end
                # the hook does not name), not training
                after = owner.phase_t - t1
                n = max(owner.timed_n, subj.timed_n)
                step = (owner.timed_sum if owner.timed_n >= subj.timed_n
                        else subj.timed_sum) / n if n else 0.0
                if after >= max(STEPS_GONE_SECONDS, STEPS_GONE_STEPS * step):
                    after = min(after, seconds.get("train", 0.0))
                    seconds["train"] = seconds.get("train", 0.0) - after
                    seconds["after_steps"] = after
            out["phases"] = {k: round(v, 1) for k, v in seconds.items() if v > 0}
            info = owner.phase_info
            if info.get("compiles"):
                out["compiles"] = info["compiles"]
            if info.get("checkpoints"):
                out["checkpoints"] = info["checkpoints"]
            if info.get("eval_batches"):
                out["eval"] = {"batches": info["eval_batches"],
                               "batch_size": info.get("eval_batch_size")}
            if owner.phase == "inference" or info.get("inference_batches"):
                out["inference"] = {"batches": info.get("inference_batches"),
                                    "batch_size": info.get("inference_batch_size"),
                                    "generate_calls": info.get("generate_calls")}
        framework = self.config_value(subj, "framework")
        if framework and isinstance(framework, str):  # (a name, or nothing to say)
            out["framework"] = framework
        table, _ = self._job_table(subj)
        if table is not None and subj.micro_n:
            out["micro_batches"] = round(subj.micro_sum / subj.micro_n, 2)
        return out

    def _gpm_before(self, subj: Subject) -> float:
        """The share of the interval a GPM reading of ``subj`` describes (the sample
        interval before its line) that lies in the bucket before the line's own; several
        lines a bucket, each an interval shorter than it: half that share, on average."""
        span = self.sample_seconds / self.res
        return 1.0 - subj.gpu_offset if span >= 1.0 else span / 2

    def _span_add(self, subj: Subject, b: int) -> None:
        """Bucket ``b`` of a job the hook reports into its whole-run span."""
        if subj.job_warm is None or b < subj.job_warm:
            return
        # every bucket, a gap between steps too: the span is read as it stood at the
        # job's last step (span_at_last_step), so what follows that step never counts
        w = self.job_window(subj, b + 1, 1, clamp=False, stopped=False)
        if w is not None:
            subj.span.add(w)
            phases = self.phase_owner(subj)
            if phases is not None and subj.gpu is not None:
                # each bucket's GPU readings against its share of training, as the
                # windows' are (job_window), for the run's own fit
                by = phases.phase_table.rings.get("phase_train")
                p = ring_mean(by, b, b + 1)
                if p is not None:
                    gt = subj.gpu_table.rings
                    util = ring_mean(gt.get("util"), b, b + 1)
                    if util is not None:
                        subj.span.fit("util", util, p)
                    gpm = ring_mean(gt.get("sm_active"), b, b + 1) \
                        if subj.facts.get("gpm") else None
                    if gpm is None:
                        if util is not None:  # no GPM: util is the busy share
                            subj.span.fit("busy", util, p)
                    elif (p0 := ring_mean(by, b - 1, b)) is not None:
                        before = self._gpm_before(subj)
                        subj.span.fit("busy", gpm, (1.0 - before) * p + before * p0)
            if subj.job_last == b:
                subj.span_at_last_step = subj.span.total()

    def finish(self) -> None:
        """Close the open bucket (end of a recording), and the last bucket's phases and
        span, which wait for the next bucket otherwise."""
        if self.idx is None:
            return
        self.flush_to(self.idx + 1)
        for subj in self.subjects.values():
            if subj.phase is not None:
                self._close_phase(self.idx, subj)
                if subj.job_warm is not None:
                    self._span_add(subj, self.idx - 1)

    # -- reading ---------------------------------------------------------------------------
    def _close_cpu(self, idx: int, table: Table, loader_workers: Any = None) -> None:
        """A GPU's job CPU for bucket ``idx``; ``loader_workers``: the training
        DataLoader's ``num_workers`` where the hook reported it."""
        a = table.acc
        table.ever = True
        mains, main, workers, nworkers, loading, write = (
            a.mean(k) for k in ("mains", "main", "workers", "nworkers", "loading", "write"))
        # DataLoader workers started in the bucket: the sum over its host lines (each counts
        # those started since the line before)
        started = a.s.get("started")
        a.clear()
        if "job_write_bytes_per_second" in self.needed:  # what the idle-writing signals read
            table.push(idx, "job_write_bytes_per_second", write)
        if started is not None and "loader_workers_started_per_minute" in self.needed:
            table.push(idx, "loader_workers_started_per_minute", started * 60.0 / self.res)
        if not mains:
            return
        if nworkers is not None and isinstance(loader_workers, float) and loader_workers >= 0:
            # the tree's children beyond the training loader's workers are something else
            # (another loader's persistent workers, torch.compile's compile workers, a
            # framework's helper process): they do not feed the training steps, and
            # counted as its workers they would read as idle loader workers. Their CPU
            # stays in workers_cpu_cores (idle ones add nothing to the ratio below).
            nworkers = min(nworkers, float(loader_workers) * mains)
        table.push(idx, "job_main_processes", mains)
        table.push(idx, "job_workers", nworkers)
        table.push(idx, "main_cpu_cores", main / mains)
        table.push(idx, "main_busy_ratio", min(1.0, main / mains))
        table.push(idx, "workers_cpu_cores", workers)
        # None where it has no workers now: a window must not read an earlier bucket's
        # (start-up, when a launcher's tree held the other ranks) as this one's
        if loading is None:
            loading = workers
        table.push(idx, "workers_busy_ratio", min(1.0, loading / nworkers)
                   if nworkers is not None and nworkers >= 1 else None)

    def lookup_table(self, subj: Subject, name: str) -> Table | None:
        table = VOCABULARY[name].table
        if table == "gpu":
            return subj.gpu_table if subj.gpu is not None else None
        if table == "host":
            if subj.cpu.ever and name in PER_GPU_CPU:
                # its own trees' (a signal they never had, as workers_busy_ratio without
                # workers, is none: the host's is every job's together)
                return subj.cpu
            return self.host_tables
        if table == "job":
            job, _ = self._job_table(subj)
            if job is not None:
                return job
            if subj.job.ever or self.hook_dead(subj):
                return None  # its hook stopped: no step signals
            return self.host.job if self.host.job.ever and not self.host.hook_off else None
        if table == "phase":
            if subj.phase_table.ever:
                return subj.phase_table
            if subj.job_via is not None and subj.job_via.phase_table.ever:
                return subj.job_via.phase_table
            # phases no GPU was named for are the only GPU's (as steps are)
            if self.host.phase_table.ever and len(self.subjects) <= 2:
                return self.host.phase_table
            return None
        return None

    def _set_debug_envs(self, envs: dict[int, frozenset[str]]) -> None:
        """Each GPU's debugging switches as this host line's job trees say (``envs``; a
        GPU with no tree that read them has none known)."""
        for g, subj in self.subjects.items():
            if g is not None:
                subj.debug_env = envs.get(g)
        self.debug_envs = bool(envs)

    def config_value(self, subj: Subject, name: str) -> Any:
        if name in subj.config:
            return subj.config[name]
        via = subj.job_via
        if via is not None and name in via.config:
            return via.config[name]
        value = self.host.config.get(name)
        if value is None and subj.debug_env is not None:
            # a switch the hook did not say (no hook, an older one): as the daemon read the
            # job's environment (host.py)
            var = ENV_CONFIG.get(name)
            if var is not None:
                return 1.0 if var in subj.debug_env else 0.0
        return value

    def phase_owner(self, subj: Subject) -> Subject | None:
        """The subject whose `phase` lines speak for ``subj``'s job (None: no phases)."""
        if subj.phase is not None:
            return subj
        if subj.job_via is not None and subj.job_via.phase is not None:
            return subj.job_via
        if self.host.phase is not None and len(self.subjects) <= 2:
            return self.host
        return None

    def hook_attached(self, subj: Subject) -> bool:
        return subj.job.ever or subj.hook_seen or subj.job_via is not None or (
            len(self.subjects) <= 2 and (self.host.job.ever or self.host.hook_seen))

    def fact(self, subj: Subject, name: str) -> Any:
        if name == "hook":
            if self.hook_dead(subj):
                return 0.0
            return 1.0 if (subj.job.ever or subj.job_via is not None
                           or self.host.job.ever) else 0.0
        if name == "hook_attached":
            return 1.0 if self.hook_attached(subj) else 0.0
        if name == "phase":
            owner = self.phase_owner(subj)
            return owner.phase if owner is not None else None
        if name == "gpm":
            if subj.gpu is None:
                return None
            return subj.facts.get("gpm", 0.0)
        if name == "gone_full" and subj.facts.get("gone_full"):
            gone = subj.facts.get("gone_full_idx")
            if gone is not None and self.idx is not None \
                    and (self.idx - gone) * self.res > OOM_HOLD_SECONDS:
                return 0.0
            ended = self.ended_pids.get(subj.facts.get("gone_full_pid"))
            if ended is not None and gone is not None \
                    and abs(ended - gone) * self.res <= GONE_FULL_NEAR:
                return 0.0  # its hook's end report came after NVML's list
            if self.last_oom_idx is not None and gone is not None \
                    and abs(self.last_oom_idx - gone) * self.res <= GONE_FULL_NEAR:
                return 0.0  # a process reported its OOM then: out-of-memory says it
        if name == "job_oom" and subj.facts.get("job_oom"):
            # a death is news for OOM_HOLD_SECONDS: a daemon whose GPU then idles, or runs a
            # job without the hook, does not keep saying it
            dead = subj.facts.get("oom_idx")
            if dead is not None and self.idx is not None \
                    and (self.idx - dead) * self.res > OOM_HOLD_SECONDS:
                return 0.0
        if name in subj.facts:
            return subj.facts[name]
        return self.facts.get(name)


_KIND_OF = {"GpuSample": "gpu", "HostSample": "host", "StepSample": "step",
            "StepsSample": "steps", "ConfigSample": "config", "JobEnd": "job_end",
            "PhaseSample": "phase", "HookProblem": "hook_problem"}
# a GPU under this NVML util while its job evaluates and no evaluation batch comes is idle
# (eval_idle_seconds: the host at work on the evaluation's outputs)
EVAL_IDLE_UTIL = 0.15
# activation memory per sample is the peak over the least the job held this long
# (Frame._act_floor)
ACT_FLOOR_SECONDS = 30.0
# how long a job's death by CUDA out-of-memory is said after it, at most
OOM_HOLD_SECONDS = 3600.0
# a job's losses that were not finite, in a row (frame._loss), and its newest finite one
LOSS_RUN_FACTS = ("loss_nonfinite_step", "loss_nonfinite_nan", "loss_nonfinite_readings")
LOSS_FACTS = (*LOSS_RUN_FACTS, "loss_finite_last")
# what a job's death by CUDA out-of-memory leaves on its GPU (frame.feed_end)
OOM_FACTS = ("job_oom", "oom_pid", "oom_idx", "oom_peak_bytes", "oom_reserved_bytes",
             "oom_steps", "oom_batch_size", "oom_micro_batches", "oom_in_eval",
             "oom_eval_batch_size", "oom_in_inference", "oom_inference_batch_size")
# a process that held at least GONE_FULL_OWN of the GPU's memory and is gone from NVML's
# list while the GPU's memory was GONE_FULL_RATIO full at one of the GONE_FULL_SAMPLES
# samples before (frame._gone_full): in tests/data the jobs that died of CUDA
# out-of-memory left at 97.8 % and 99.9 %, every other process at 32 % or less
GONE_FULL_RATIO = 0.95
GONE_FULL_OWN = 0.5
GONE_FULL_SAMPLES = 5
# ... having filled (crossed GONE_FULL_RATIO) at most this long before it left
GONE_FULL_FILLED_SECONDS = 120.0
# a hook's end report or another process's OOM this close to it (seconds) explains it
GONE_FULL_NEAR = 120.0
GONE_FULL_FACTS = ("gone_full", "gone_full_pid", "gone_full_idx", "gone_full_ratio",
                   "gone_full_bytes", "gone_full_filled_seconds")
# settings training may still change: judged only from what the hook read once the job
# had finished an iteration (a config line's ``in_training``), never from start-up's
_MUTABLE = frozenset({"autocast", "autocast_dtype", "tf32", "cudnn_tf32", "fused_optimizer",
                      "optimizer", "grad_scaler", "gradient_checkpointing", "cudnn_benchmark",
                      "deterministic", "anomaly_detection",
                      "channels_last", "param_dtype"})
# the hook's settings that the daemon also reads of a job's environment (host.DEBUG_ENV),
# and the variable each is read from: where the hook said nothing of one, the environment
# answers (frame.config_value)
ENV_CONFIG = {"launch_blocking": "CUDA_LAUNCH_BLOCKING",
              "no_alloc_cache": "PYTORCH_NO_CUDA_MEMORY_CACHING",
              "dist_debug_detail": "TORCH_DISTRIBUTED_DEBUG"}
# without the hook, a GPU whose process has run any kernel (NVML util at least this) has
# begun its work; before that, its job is starting up
FIRST_WORK_UTIL = 0.01
# a job's steps have stopped, for its attribution, after this long without one and
# STEPS_GONE_STEPS of its step times (frame.job_window)
STEPS_GONE_SECONDS = 5.0
# one step this long, after this many timed ones, and this many times their mean, is a
# pause between steps (Frame._pause); the same minute and 20 step times as a stall's
PAUSE_STEP_SECONDS = 60.0
PAUSE_STEP_TIMES = 20.0
PAUSE_AFTER_STEPS = 20
# one step whose own time (its data wait left out) is this many of the job's usual step,
# and this much longer, is a long step (Frame._long)
LONG_STEP_TIMES = 10.0
LONG_STEP_SECONDS = 0.25
LONG_STEP_GPU_BUSY = 0.5  # NVML util over it: the GPU worked through it (Frame._long)
STEPS_GONE_STEPS = 8.0
# a job whose steps stopped counts as stalled only while its hook was heard saying it
# trains within this many seconds (its `phase` lines come every few seconds)
STALL_HEARD_SECONDS = 15.0
def _eval_interval(values: dict[str, Any]) -> dict[str, Any]:
    """The framework's evaluation interval as steps only where it is steps. Lightning's
    ``val_check_interval`` is a number of batches as an int and a share of an epoch as a
    float (1.0, its default: once an epoch); the Trainer's ``eval_steps`` counts steps only
    under ``eval_strategy="steps"``, and as a float below 1 is a share of the whole run."""
    if "fw_eval_every" not in values:
        return values
    every = values.get("fw_eval_every")
    out = dict(values)
    out.setdefault("fw_eval_fraction", None)  # not a share of an epoch unless below
    if every is None or isinstance(every, bool):
        return out
    fw = values.get("framework")
    if fw == "lightning" and isinstance(every, float):
        out["fw_eval_fraction"], out["fw_eval_every"] = every, None
    elif fw == "transformers" and (values.get("fw_eval_strategy", "steps") != "steps"
                                   or (isinstance(every, float) and every < 1)):
        out["fw_eval_every"] = None
    return out


# GradScaler's calibration at the start: at most this many skipped steps (it halves its
# scale from 65536 until the gradients fit fp16: a few halvings, never this many in a row)
CALIBRATION_SKIPS = 8
# config keys a hook leaves out when there is none (a DataParallel dropped, FSDP gone)
_ABSENT_IS_NONE = ("data_parallel_gpus", "fsdp_cpu_offload", "fsdp_version", "param_dtype")
# what a process's evaluations left (frame._eval_idle), its own: dropped for the next one
_INFERENCE_KEYS = ("inference_batch_size", "inference_batches", "generate_calls",
                   "inference_wait_seconds")
_EVAL_IDLE_KEYS = ("eval_idle_seconds", "eval_idle_pending", "eval_batches",
                   "eval_wait_seconds")
# an inference process's wait for data is a share of this many seconds of serving at least
INFERENCE_WAIT_AFTER = 5.0
# a second in which the GPU mostly idles (util under this) while its job's main process
# writes at least this much to storage: what saving a checkpoint looks like from outside
IDLE_WRITE_UTIL = 0.25
IDLE_WRITE_BYTES = 32 * 1024 * 1024
# the whole run's share of such seconds is judged once the GPU has worked this long
IDLE_WRITE_MIN_SECONDS = 20.0
_IDLE_WRITING = frozenset({"gpu_idle_writing", "idle_writing_ratio", "idle_writing_bursts"})
_PHASE_NAMES = ("startup", "compile", "train", "eval", "checkpoint", "inference")

# derived signals and what they are computed from (so the frame keeps those too)
_DEPENDS: dict[str, set[str]] = {
    "mem_used_ratio": {"mem_used_bytes", "mem_total_bytes"},
    "mem_free_bytes": {"mem_used_bytes", "mem_total_bytes"},
    "mem_used_growth_bytes_per_second": {"mem_used_bytes"},
    "mem_used_growth_r2": {"mem_used_bytes"},
    "power_ratio": {"power_watts", "power_limit_watts"},
    "mem_reserved_ratio": {"mem_total_bytes"},
    "cpu_free_cores": {"cpu_util"},
    "load_per_cpu": {"load1"},
    "host_mem_used_ratio": {"host_mem_used_bytes", "host_mem_total_bytes"},
    "job_workers": {"job_processes", "job_loader_workers"},
    "job_main_processes": {"job_processes"},
    "main_cpu_cores": {"job_cpu_cores", "job_processes", "job_main_cpu_cores"},
    "workers_cpu_cores": {"job_cpu_cores", "job_processes", "job_workers_cpu_cores"},
    "main_busy_ratio": {"job_cpu_cores", "job_processes", "job_main_cpu_cores"},
    "workers_busy_ratio": {"job_cpu_cores", "job_processes", "job_workers_cpu_cores",
                           "job_loader_workers", "job_loader_cpu_cores"},
    "gpu_idle_writing": {"util", "job_write_bytes_per_second"},
    "idle_writing_ratio": {"util", "job_write_bytes_per_second"},
    "idle_writing_bursts": {"util", "job_write_bytes_per_second"},
    "loader_workers_started_per_minute": {"job_loader_workers_started"},
}


# host signals a GPU also has of its own, from the job trees on it (``Subject.cpu``)
PER_GPU_CPU = frozenset({"job_main_processes", "job_workers", "main_cpu_cores",
                          "main_busy_ratio", "workers_cpu_cores", "workers_busy_ratio",
                          "job_write_bytes_per_second", "loader_workers_started_per_minute"})

_ATTRIBUTION_INPUTS = {"util", "sm_active", "step_seconds", "data_wait_ratio", "step_rate",
                       "main_busy_ratio", "workers_busy_ratio", "job_workers"}
# the GPU rings the frame reads itself, and how many buckets back (None: any number: the
# attribution's windows, an evaluation's idle time since the phase began). Every ring the
# frame reads of a GPU must be named here: a GPU bucketed lightly (judge_only) keeps only
# these (tests/test_advise_split.py compares such a frame with one that keeps all)
_GPU_READS: dict[str, int | None] = {"util": None, "sm_active": None, "mem_used_ratio": 15,
                                     "mem_headroom_bytes": 5, "mem_total_bytes": 1,
                                     "gpu_idle_writing": None}
# the fields of a gpu line those are made of: all a GPU bucketed lightly accumulates
_LIGHT_RAW = frozenset({"util", "sm_active", "mem_used_bytes", "mem_total_bytes"})


def _gpu_keeps(needed: Iterable[str], reads: Mapping[str, int] | None, keep: int
               ) -> dict[str, int]:
    """The buckets each GPU signal's ring keeps where that is less than ``keep``: as far
    as its readers look back (``reads``, the rules', by signal, and ``_GPU_READS``), with
    the margin ``keep`` has over the longest window (four buckets). ``reads`` None: the
    rules' readers are not known, and every ring keeps ``keep``."""
    if reads is None:
        return {}
    out: dict[str, int] = {}
    for name in needed:
        d = VOCABULARY.get(name)
        own = _GPU_READS.get(name, 0)
        if d is None or d.table != "gpu" or own is None:
            continue
        k = max(reads.get(name, 0), own) + 4
        if k < keep:
            out[name] = k
    return out


def _dependencies(names: set[str]) -> set[str]:
    out: set[str] = set()
    for n in names:
        out |= _DEPENDS.get(n, set())
    return out


def _config_value(v: Any) -> Any:
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)):
        try:
            return float(v)
        except OverflowError:  # a whole number past the largest float: none to judge by
            return None
    return v
