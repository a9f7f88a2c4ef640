"""Step-time attribution: a job's (each rank's) wall time split into data, sync, GPU,
host and other (docs/advice.md), and each rank's standing among the job's ranks."""

from __future__ import annotations

from typing import Any, NamedTuple

from gpuwatch.advisor.windows import phase_level

# categories in the order they claim wall time (docs/advice.md): each takes only what the
# ones before it left, so the five always sum to 1 (the PyTorch profiler TensorBoard
# plugin's priority-claim design)
SHARE_CATEGORIES = ("data", "sync", "gpu", "host", "other")
SHARE_SIGNALS = {f"share_{c}": c for c in SHARE_CATEGORIES}
_OVER_PEERS = {"data_over_peers": "data", "host_over_peers": "host", "gpu_over_peers": "gpu"}
RANK_SIGNALS = frozenset({"gpu_busy", "train_util", "host_kernel_share", "job_rank",
                          "job_ranks", "rank_score", "slowest_rank", "peer_straggler",
                          "straggler_gain", "busy_in_steps", "job_busy_in_steps",
                          "peer_away_share", "away_rank", "data_over_peers",
                          "host_over_peers", "gpu_over_peers"})
ATTRIBUTION_SIGNALS = frozenset(SHARE_SIGNALS) | RANK_SIGNALS
# nvidia-resiliency-ext flags a rank whose score (best rank's time / its own) is below this
STRAGGLER_SCORE = 0.75
# workers this busy (each pegging its core) are the bottleneck when nothing else is
_WORKERS_PEGGED = 0.8
# a peer away from training (a phase) longer than a rank by this share of the rank's
# time: the rank waited for it (smaller differences are the phases' own jitter)
AWAY_MIN = 0.02


class JobWindow(NamedTuple):
    """What the attribution reads of one job over a stretch of wall time (``wall`` s).

    A named tuple (immutable, like a frozen dataclass, but made several times faster: the
    frame makes one per subject at every bucket a rule reads the attribution)."""

    wall: float
    hook: bool  # step times measured by the hook (else NVML and psutil alone)
    steps: float = 0.0  # steps that ended in it
    step_total: float = 0.0  # their summed step time, seconds
    data_total: float | None = None  # summed DataLoader wait, seconds
    busy: float | None = None  # GPU busy share: SM active where GPM exists, else util
    util: float | None = None  # NVML util (time any kernel ran: NCCL spin kernels count)
    main: float | None = None  # main process busy (1 = one core)
    workers_busy: float | None = None  # DataLoader workers busy (1 = each pegs a core)
    workers: float | None = None  # DataLoader worker processes
    # seconds of the same stretch the process spent outside training (evaluation,
    # checkpoints, compiling: the hook's phases), which ``wall`` leaves out; while one rank
    # is away, the others wait for it in their next collective. Without the hook: the
    # seconds its GPU idled while its main process wrote to storage (a save seen from
    # outside), which ``wall`` holds (``writes_read``: they were read)
    away: float = 0.0
    writes_read: bool = False

    @property
    def workers_pegged(self) -> bool:
        """DataLoader workers, each keeping its core busy: what the GPU waits for."""
        return bool(self.workers) and (self.workers_busy or 0.0) >= _WORKERS_PEGGED

    def need(self) -> float:
        """Share of wall time this rank's own pipeline leaves its GPU without work: its
        data wait, or the time NVML saw no kernel at all (a rank that waits on a peer runs
        NCCL kernels meanwhile, so it needs little)."""
        if self.hook:
            data = (self.data_total or 0.0) / self.wall
        else:  # pegged DataLoader workers: what the GPU's idle time waits for (claim_shares)
            data = 1.0 - min(1.0, max(0.0, self.busy)) \
                if self.workers_pegged and self.busy is not None else 0.0
        idle = 1.0 - self.util if self.util is not None else 0.0
        return min(1.0, max(data, idle))


class SpanTotals:
    """A job's attribution inputs summed bucket by bucket since its first step; where the
    hook's phases mix training with evaluations or saves, the GPU's busy and util levels
    of the training are fitted from each bucket's reading and share of training (``fit``),
    as a window's are (windows.ring_mean_in_phase)."""

    __slots__ = ("s", "f")

    _KEYS = ("wall", "steps", "step_total", "data_total", "busy", "util", "main",
             "workers_busy", "workers", "away")

    def __init__(self) -> None:
        self.s: dict[str, float] = {}
        # per level ("busy", "util"): the least-squares sums phase_level reads
        self.f: dict[str, list[float]] = {}

    def fit(self, key: str, v: float, p: float) -> None:
        """One bucket's reading ``v`` of ``key``, of which a share ``p`` was training."""
        p = min(1.0, max(0.0, p))
        q = 1.0 - p
        f = self.f.get(key)
        if f is None:
            f = self.f[key] = [0.0] * 7
        f[0] += 1.0
        f[1] += p
        f[2] += p * p
        f[3] += p * q
        f[4] += q * q
        f[5] += v * p
        f[6] += v * q

    def add(self, w: JobWindow) -> None:
        s = self.s
        s["wall"] = s.get("wall", 0.0) + w.wall
        s["hook"] = 1.0 if w.hook else s.get("hook", 0.0)
        if w.writes_read:
            s["writes_read"] = 1.0
        for k in ("steps", "step_total", "away"):
            s[k] = s.get(k, 0.0) + getattr(w, k)
        if w.data_total is not None:
            s["data_total"] = s.get("data_total", 0.0) + w.data_total
        for k in ("busy", "util", "main", "workers_busy", "workers"):
            v = getattr(w, k)
            if v is not None:  # a time-weighted mean over the buckets that measured it
                s[k] = s.get(k, 0.0) + v * w.wall
                s["_w_" + k] = s.get("_w_" + k, 0.0) + w.wall

    def total(self) -> JobWindow | None:
        s = self.s
        if not s.get("wall"):
            return None

        def mean(k: str) -> float | None:
            w = s.get("_w_" + k)
            return s[k] / w if w else None

        def level(k: str) -> float | None:
            f = self.f.get(k)
            fitted = phase_level(*f) if f is not None else None
            return fitted if fitted is not None else mean(k)

        return JobWindow(wall=s["wall"], hook=bool(s.get("hook")), steps=s.get("steps", 0.0),
                         step_total=s.get("step_total", 0.0), data_total=s.get("data_total"),
                         busy=level("busy"), util=level("util"), main=mean("main"),
                         workers_busy=mean("workers_busy"), workers=mean("workers"),
                         away=s.get("away", 0.0), writes_read=bool(s.get("writes_read")))


class Attribution(NamedTuple):
    """One job's (one rank's) wall time split into the five categories, and its rank's
    standing among the job's ranks."""

    shares: dict[str, float]
    window: JobWindow
    rank: int | None = None
    ranks: int = 1
    score: float = 1.0
    slowest_rank: int | None = None
    peer_straggler: bool = False
    straggler_gain: float = 1.0
    # the highest busy_in_steps among the job's ranks (its own, for a single process): the
    # ranks of one job share one batch size, and the busiest of them fills up first
    job_busy: float | None = None
    # the share of this rank's time it waited while a peer was away from training longer
    # than itself (a phase: evaluating, saving, compiling alone), and which rank that was
    away_wait: float = 0.0
    away_rank: int | None = None
    # the slowest rank's: each slice's share of its own time (the time it does not wait
    # for a peer) above the other ranks' median share of theirs ({} on other ranks): what
    # it does more of than they do (data wait, host time, GPU work)
    over_peers: dict[str, float] = {}

    def value(self, name: str) -> float | None:
        if name in SHARE_SIGNALS:
            return self.shares[SHARE_SIGNALS[name]]
        if name == "gpu_busy":
            return self.window.busy
        if name == "train_util":
            return self.window.util
        if name == "host_kernel_share":
            return host_kernel_share(self.shares, self.window)
        if name == "busy_in_steps":
            return busy_in_steps(self.shares, self.window)
        if name == "job_busy_in_steps":
            return self.job_busy if self.ranks > 1 else busy_in_steps(self.shares, self.window)
        if name == "job_rank":
            return float(self.rank) if self.rank is not None else 0.0
        if name == "job_ranks":
            return float(self.ranks)
        if name == "rank_score":
            return self.score
        if name == "slowest_rank":
            return float(self.slowest_rank) if self.slowest_rank is not None else None
        if name == "peer_straggler":
            return 1.0 if self.peer_straggler else 0.0
        if name == "straggler_gain":
            return self.straggler_gain
        if name == "peer_away_share":  # the hook's phases tell it, else a peer's saves
            return self.away_wait if self.window.hook or self.window.writes_read else None
        if name == "away_rank":
            return float(self.away_rank) if self.away_rank is not None else None
        if name in _OVER_PEERS:
            return self.over_peers.get(_OVER_PEERS[name])
        return None

    def top(self) -> str:
        """The largest slice: the bottleneck ("gpu": the GPU itself, which is as it
        should be)."""
        return max(SHARE_CATEGORIES, key=lambda c: self.shares[c])


def busy_in_steps(shares: dict[str, float], w: JobWindow) -> float | None:
    """The GPU's share of the time inside training steps (pauses between them, an
    evaluation the hook did not tell apart, left out); without the hook, all of the time
    counts as steps."""
    in_step = min(1.0, w.step_total / w.wall) if w.hook and w.wall > 0 else 1.0
    return min(1.0, shares["gpu"] / in_step) if in_step > 0.05 else None


def host_kernel_share(shares: dict[str, float], w: JobWindow) -> float | None:
    """The part of the host share during which NVML saw a kernel running: the SMs idle
    inside kernels too small to fill them (or a collective's, beyond the wait on a peer
    that ``sync`` claims), not a GPU left waiting for its next launch. ``util`` less the
    SMs' active share and the peers' wait, at most the host share; None without util (and
    0 where util is the busy measure, no GPM)."""
    if w.util is None:
        return None
    return min(shares["host"], max(0.0, min(1.0, w.util) - shares["gpu"] - shares["sync"]))


def claim_shares(w: JobWindow, sync: float = 0.0) -> dict[str, float] | None:
    """Split ``w``'s wall time by priority claims; None when the GPU was not measured."""
    if w.wall <= 0 or w.busy is None:
        return None
    busy = min(1.0, max(0.0, w.busy))
    if w.hook:
        in_step = min(1.0, w.step_total / w.wall)
        data = min(in_step, (w.data_total or 0.0) / w.wall)
        sync = min(max(0.0, sync), in_step - data)
        gpu = min(busy, 1.0 - data - sync)
        room = max(0.0, in_step - data - sync - gpu)
        # inside steps, the GPU idle and no data wait: the main process is at work (Python,
        # launches, a host sync) unless psutil saw it idle (sleeping, blocked on I/O)
        host = min(room, w.main) if w.main is not None else room
    else:
        # without step times, all the time counts as training: a rank's wait for a slower
        # peer first (the ranks of one launch, host.py), then GPU work; pegged DataLoader
        # workers are taken to be what the rest waits for, else the main process
        sync = min(1.0, max(0.0, sync))
        gpu = min(busy, 1.0 - sync)
        rest = 1.0 - gpu - sync
        if w.workers_pegged:
            data, host = rest, 0.0
        else:
            # the seconds its GPU idled while the main process wrote (a save: ``away``)
            # are no step's host time: they stay ``other``, as the hook's phases leave a
            # save out of the steps
            rest_in_steps = max(0.0, rest - w.away / w.wall)
            data = 0.0
            host = min(rest_in_steps, w.main) if w.main is not None else 0.0
    data, sync, gpu, host = max(0.0, data), max(0.0, sync), max(0.0, gpu), max(0.0, host)
    total = sum((data, sync, gpu, host))
    if total > 1.0:
        data, sync, gpu, host = data / total, sync / total, gpu / total, host / total
        total = 1.0
    return {"data": data, "sync": sync, "gpu": gpu, "host": host, "other": 1.0 - total}


def _training_need(w: JobWindow, need: float) -> float:
    """``need`` (``w.need()``) of its training time. Without the hook ``wall`` holds the
    seconds the rank was away saving (its GPU idle: all need); they are left out as the
    hook's phases leave them out of its ``wall``, so the rank that saved is no straggler of
    the steps (fw_hf_save_ddp without the hook: rank 0 idle 60 % of its time, 20-27 % of it
    saving, read as the others' slower peer)."""
    if w.hook or w.away <= 0 or w.wall <= 0:
        return need
    a = min(w.away / w.wall, 0.95)
    return max(0.0, need - a) / (1.0 - a)


def attribute_group(windows: dict[Any, tuple[JobWindow, int | None]]
                    ) -> dict[Any, Attribution]:
    """Attribution for the ranks of one job (a single process: a group of one).

    A rank whose own pipeline needs less of each step than the slowest rank's waits for it
    in the collectives: that difference is its ``sync`` share, claimed before GPU work
    (NCCL kernels spinning on a peer keep NVML util high but do no work). So does a rank
    while a peer is away from training longer than itself (rank 0 saving a checkpoint or
    evaluating alone): the others wait in their next step's collective. That wait counts
    in its ``sync`` share (the larger of the two readings, which can see the same wait),
    but not in the ranks' standing: the rank that was away is no straggler of the
    training steps."""
    if len(windows) == 1:
        # a job of one process (the usual case): no peer to wait for, no standing to rank
        ((k, (w, rank)),) = windows.items()
        if w.wall > 0:  # need() divides by it: a zero wall takes the long way, as before
            shares = claim_shares(w, 0.0)
            return {} if shares is None else {k: Attribution(shares, w, rank)}
    needs = {k: w.need() for k, (w, _) in windows.items()}
    multi = len(windows) >= 2
    top = max(needs.values(), default=0.0)
    syncs = {k: (top - n if multi else 0.0) for k, n in needs.items()}
    # the standing, from the needs of the training time alone (without the hook, a rank's
    # seconds away saving are in its need: the others' wait for them is claimed, as the
    # hook's is, but the rank that saved is not the steps' straggler)
    tneeds = {k: _training_need(w, needs[k]) for k, (w, _) in windows.items()}
    ttop = max(tneeds.values(), default=0.0)
    own = {k: max(1e-6, 1.0 - (ttop - n if multi else 0.0)) for k, n in tneeds.items()}
    claimed = syncs
    away_waits: dict[Any, float] = {}
    away_rank = None
    away = max((w.away for w, _ in windows.values()), default=0.0)
    if multi and away > 0:
        claimed = dict(syncs)
        away_rank = max(windows.values(), key=lambda wr: wr[0].away)[1]
        for k, (w, _) in windows.items():
            waited = away - w.away
            if w.wall > 0 and waited >= AWAY_MIN * (w.wall + w.away):
                away_waits[k] = min(1.0, waited / w.wall)
                claimed[k] = max(syncs[k], away_waits[k])
    best = min(own.values(), default=1.0)
    slowest = max(own, key=lambda k: own[k]) if multi else None
    slow_rank = windows[slowest][1] if slowest is not None else None
    shares_of = {k: claim_shares(w, claimed[k]) for k, (w, _) in windows.items()}
    others = sorted(v for k, v in own.items() if k != slowest)
    gain = 1.0
    if others and slowest is not None:
        mid = len(others) // 2
        pace = others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2
        # with its own bottleneck (data wait, host time) gone, the slowest rank still does
        # its GPU work: the job goes at the slower of that and the others' median pace
        sh = shares_of[slowest]
        if sh is not None and max(sh["data"], sh["host"]) >= sh["gpu"]:
            pace = max(pace, own[slowest] * (1.0 - max(sh["data"], sh["host"])))
        gain = own[slowest] / pace
    slow_score = best / own[slowest] if slowest is not None else 1.0
    over: dict[str, float] = {}
    if others and slowest is not None and shares_of[slowest] is not None:
        mine = shares_of[slowest]
        theirs = [(shares_of[k], own[k]) for k in own if k != slowest
                  and shares_of[k] is not None]
        if theirs:
            for c in _OVER_PEERS.values():
                peers = sorted(sh[c] / o for sh, o in theirs)
                mid = len(peers) // 2
                median = peers[mid] if len(peers) % 2 else (peers[mid - 1] + peers[mid]) / 2
                over[c] = mine[c] / own[slowest] - median
    busies = [b for k, (w, _) in windows.items() if shares_of[k] is not None
              and (b := busy_in_steps(shares_of[k], w)) is not None]
    job_busy = max(busies) if busies else None
    out = {}
    for k, (w, rank) in windows.items():
        shares = shares_of[k]
        if shares is None:
            continue
        out[k] = Attribution(shares=shares, window=w, rank=rank, ranks=len(windows),
                             score=best / own[k], slowest_rank=slow_rank,
                             peer_straggler=(multi and k != slowest
                                             and slow_score < STRAGGLER_SCORE),
                             straggler_gain=max(1.0, gain) if multi else 1.0,
                             job_busy=job_busy, away_wait=away_waits.get(k, 0.0),
                             away_rank=away_rank if k in away_waits else None,
                             over_peers=over if k == slowest else {})
    return out
