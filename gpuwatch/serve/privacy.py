"""What the daemon may publish about other people's processes.

/metrics and /api/snapshot name the processes on each GPU and their users (psutil's
``name()`` and ``username()``); command lines are never read, so never published. Of
each GPU job's environment only ``RANK``, ``WORLD_SIZE``, a digest of its rendezvous and
the names of the debugging switches it turns on (host.DEBUG_ENV) are kept (host.py), for
the advisor, never a variable's text. Clusters
that must not publish names or users set, in the configuration file::

    privacy:
      export_process_names: false
      export_users: false

and :func:`redact` drops them from every snapshot served over HTTP; pids, memory and
utilization stay, so dashboards and alerts keep working. Recordings and the advisor, which
stay on the host, still see them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from gpuwatch.samples import Snapshot


@dataclass(frozen=True)
class Privacy:
    export_process_names: bool = True
    export_users: bool = True

    @property
    def redacts(self) -> bool:
        return not (self.export_process_names and self.export_users)


def redact(snapshot: Snapshot, privacy: Privacy) -> Snapshot:
    """``snapshot`` without what ``privacy`` keeps from being published."""
    if not privacy.redacts:
        return snapshot
    drop: dict[str, None] = {}
    if not privacy.export_process_names:
        drop["name"] = None
    if not privacy.export_users:
        drop["user"] = None
    gpus = tuple(replace(g, processes=tuple(replace(p, **drop) for p in g.processes))
                 if g.processes else g for g in snapshot.gpus)
    host = snapshot.host
    if host is not None and host.jobs:
        host = replace(host, jobs=tuple(replace(j, **drop) for j in host.jobs))
    return replace(snapshot, gpus=gpus, host=host)


def redacting(source: Callable[[], Snapshot], privacy: Privacy) -> Callable[[], Snapshot]:
    """A snapshot source that redacts (``source`` itself when nothing is to be dropped)."""
    if not privacy.redacts:
        return source
    return lambda: redact(source(), privacy)
