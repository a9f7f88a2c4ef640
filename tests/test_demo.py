"""What a newcomer opens first: /api/advice of `gpuwatch run --demo` (and of a daemon that
has just started sampling), right from the first request.

A replaying daemon answers with the recording judged ahead, the report `gpuwatch advise
--replay` gives; a sampling daemon judges what it has so far and, until its rules' windows
can be full, says that it is warming up and for how long. Neither claims "NVML found no
GPU" while it serves a GPU, nor "no data from the torch hook" about hook data it has.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import http_get, run_gpuwatch, wait_for
from nvml_stub import NvmlStub, StubGpu

from gpuwatch.advisor.report import HOOK_NOTE, render_text
from gpuwatch.daemon import Daemon
from gpuwatch.serve.config import Config


def _advice(url: str) -> dict:
    status, ctype, body = http_get(url + "/api/advice")
    assert status == 200 and ctype == "application/json", body
    return json.loads(body)


def _offline(tmp_path: Path, *args: str) -> dict:
    got = run_gpuwatch(["advise", *args, "--format", "json"], tmp_path)
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)


def test_the_demo_advice_is_right_from_the_first_request(gpuwatch_daemon, tmp_path):
    d = gpuwatch_daemon("--demo", "--web.listen-address", "127.0.0.1:0")
    # the first request, sent as soon as the daemon says where it serves
    first = _advice(d.url)
    status, _, body = http_get(d.url + "/api/snapshot")
    snap = json.loads(body)
    assert status == 200 and snap["infos"][0]["name"] == "NVIDIA H200"

    offline = _offline(tmp_path, "--demo")
    assert first["judged"] == offline["judged"]
    assert first["judged"]["gpu"] is True and first["judged"]["reason"] is None
    (gpu,) = first["judged"]["gpus"]
    assert gpu["training_seconds"] <= gpu["seconds"]
    assert first["hook"]["steps"] is True and HOOK_NOTE not in first["notes"]
    assert first["advice"] == offline["advice"] and first["jobs"] == offline["jobs"]
    assert [a["id"] for a in first["advice"]] == ["raise-batch-size"]
    assert first["source"]["kind"] == "replay"
    assert first["source"]["path"] == offline["source"]["path"] == "demo (bundled recording)"
    assert first["warming_up"] is None
    assert any("judged ahead" in n for n in first["notes"])

    # `gpuwatch advise` against the demo prints what `gpuwatch advise --demo` prints
    text = run_gpuwatch(["advise", "--url", d.url], tmp_path)
    demo = run_gpuwatch(["advise", "--demo"], tmp_path)
    assert text.returncode == demo.returncode == 0
    assert "NVML found no GPU" not in text.stdout and "No data from the torch hook" not in text.stdout
    served = text.stdout.split("\n", 1)
    assert served[0].startswith("gpuwatch advice: recording demo (bundled recording), 37 s, "
                                f"replayed by the daemon at {d.url} (torch hook data: steps)")
    assert demo.stdout.split("\n", 1)[1] in served[1]  # all but the header, and a note more
    assert d.stop() == 0


def test_a_replay_still_being_judged_says_it_is_warming_up(gpuwatch_daemon, tmp_path):
    """A recording too long to judge before the first request: the answer says so, how far
    it got and about how long is left, and claims nothing about GPUs or the hook."""
    demo = Path(__file__).resolve().parents[1] / "gpuwatch" / "data" / "demo.jsonl"
    lines = demo.read_text().splitlines()
    meta, body = lines[0], lines[1:]
    t0 = json.loads(body[0])["t"]
    span = json.loads(body[-1])["t"] - t0 + 0.1
    long = tmp_path / "long.jsonl"
    with long.open("w") as f:  # the demo 60 times over: about 37 minutes of data
        f.write(meta + "\n")
        for k in range(60):
            for line in body:
                rec = json.loads(line)
                rec["t"] = rec["t"] + k * span
                f.write(json.dumps(rec) + "\n")
    d = gpuwatch_daemon("--replay", str(long), "--web.listen-address", "127.0.0.1:0")
    first = _advice(d.url)
    if first["warming_up"] is None:
        pytest.skip("this machine judged 37 minutes of data within the first request's wait")
    warm = first["warming_up"]
    assert warm["reason"].startswith("judging the recording ahead")
    assert warm["needed_seconds"] == pytest.approx(60 * span - 0.1, abs=1)
    assert "NVML found no GPU" not in json.dumps(first)
    assert HOOK_NOTE not in first["notes"]
    # the text of that very answer, as `gpuwatch advise --url` renders it
    assert "Warming up: judging the recording ahead" in render_text(first)
    # and the command itself, which asks a second or so later (its interpreter's start):
    # a machine that has judged the 37 minutes by then gets the judged report instead
    text = run_gpuwatch(["advise", "--url", d.url], tmp_path).stdout
    if "Warming up: judging the recording ahead" not in text:
        assert _advice(d.url)["warming_up"] is None
        assert text.startswith("gpuwatch advice: recording ") and "NVML found no GPU" not in text
    # and once judged, the whole recording's report
    done = wait_for(lambda: (r := _advice(d.url))["warming_up"] is None and r,
                    "the recording judged ahead", timeout=300)
    assert done["source"]["kind"] == "replay" and done["hook"]["steps"] is True
    assert done["advice"]
    assert d.stop() == 0


def test_a_sampling_daemon_says_it_is_warming_up_and_for_how_long(tmp_path):
    """Sampling GPUs (the NVML stub here): from the first request the report names the
    GPUs it serves and says it is warming up, never that NVML found no GPU."""
    stub = NvmlStub([StubGpu(0), StubGpu(1)])
    cfg = Config(listen_address="127.0.0.1:0", interval=0.1, slow_interval=0.5,
                 hook_socket=str(tmp_path / "hook.sock"))
    daemon = Daemon(cfg, sampler_kwargs={"nvml_module": stub})
    daemon.start()
    try:
        reports = [_advice(daemon.url)]
        wait_for(lambda: reports.append(_advice(daemon.url)) or reports[-1]["judged"]["gpus"],
                 "the GPUs judged")
        for rep in reports:
            assert rep["source"]["kind"] == "live"
            assert "NVML found no GPU" not in json.dumps(rep)
            warm = rep["warming_up"]
            assert warm is not None and warm["ready_in_seconds"] > 0
            assert warm["judged_seconds"] < warm["needed_seconds"] == 25
            assert "most rules need 25 s" in warm["reason"]
        first, last = reports[0], reports[-1]
        if not first["judged"]["gpus"]:
            assert first["judged"]["reason"].startswith(("no GPU sample is old enough",
                                                          "no sample yet"))
        assert [g["gpu"] for g in last["judged"]["gpus"]] == [0, 1]
        for g in last["judged"]["gpus"]:
            assert g["training_seconds"] <= g["seconds"]
        # the text report opens with it, and never says that nothing calls for a change
        from gpuwatch.advisor.report import render_text

        for rep in (first, last):
            text = render_text(rep, width=100)
            assert text.split("\n")[2].startswith("Warming up: the advisor has judged")
            assert "calls for a change" not in text and "no training job ran" not in text
            if rep["judged"]["gpus"]:
                assert "No advice yet: the advisor is warming up" in " ".join(text.split())
            else:
                said = " ".join(text.split())
                assert ("could not be judged, because no GPU sample is old enough" in said
                        or "could not be judged, because no sample yet" in said), said
    finally:
        for gpu in stub.gpus:
            gpu.release()
        daemon.stop()
