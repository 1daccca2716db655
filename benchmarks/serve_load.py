"""Served vs in-process steps/s for rlvr/Arithmetic-v0 (issue 46's performance goal), loopback only, bounded.

Three ways to run the same episodes (reset, then one step with a fixed response; verification included):

- ``in_process``: ``gym.make("rlvr/Arithmetic-v0")`` in this process, one thread.
- ``rlvr_serve``: ``rlvr serve --env rlvr/Arithmetic-v0`` in a subprocess (uvicorn), N concurrent WebSocket sessions
  from one asyncio client process, each playing a fixed number of episodes.
- ``openenv_stock``: the same env (``rlvr_envs.serve.SessionEnv``) behind openenv-core's own server
  (``openenv.core.env_server.create_fastapi_app``: its stock ``/ws`` loop), same client. openenv-core ships no
  reference server for a text env; this is its reference server class serving ours.

Per run: steps/s (env steps; each episode is one reset and one step, so episodes/s is the same number), client-side
p50/p99 latency of a step round trip and of a reset, the server's RSS after the run, and for ``rlvr serve`` its
``/metrics`` (server-side step and verify latency). Writes ``benchmarks/results/serve_load.json``. On a 2-core
machine the server and the client share the cores; read the served figures as a floor.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/serve_load.py            # 64 and 256 sessions, ~2 min
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parent.parent
ENV_ID = "rlvr/Arithmetic-v0"
RESPONSE = "The answer is \\boxed{42}."


def latency_ms(prefix: str, samples_s: list[float]) -> dict[str, float | None]:
    """``{prefix}_p50_ms`` and ``{prefix}_p99_ms`` of latencies in seconds, as the server's ``/metrics`` computes
    them (``rlvr_envs.serve.metrics.percentiles``)."""
    from rlvr_envs.serve.metrics import percentiles

    got = percentiles([x * 1000 for x in samples_s])
    return {f"{prefix}_p50_ms": got["p50"], f"{prefix}_p99_ms": got["p99"]}


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


# -- in-process ------------------------------------------------------------------------------------------------------
def in_process(seconds: float) -> dict[str, Any]:
    import gymnasium as gym

    import rlvr_envs  # noqa: F401

    env = gym.make(ENV_ID)
    steps, latencies = 0, []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.reset(seed=steps)
        t0 = time.perf_counter()
        env.step(RESPONSE)
        latencies.append(time.perf_counter() - t0)
        steps += 1
    wall = time.perf_counter() - start
    return {"steps": steps, "wall_s": round(wall, 3), "steps_per_s": round(steps / wall, 1),
            **latency_ms("step", latencies),
            "rss_mb": rss_mb(os.getpid())}


# -- servers (each in its own process) --------------------------------------------------------------------------------
def run_stock_server(port: int, max_sessions: int) -> None:
    import uvicorn
    from openenv.core.env_server import create_fastapi_app

    from rlvr_envs.serve import ServedEnvs, SessionEnv, TextAction, TextObservation

    served = ServedEnvs.probe([ENV_ID])
    app = create_fastapi_app(functools.partial(SessionEnv, served), TextAction, TextObservation,
                             max_concurrent_envs=max_sessions)
    # uvicorn's defaults, as openenv's server template runs it (permessage-deflate on)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def start_server(kind: str, max_sessions: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if kind == "rlvr_serve":
        cmd = [sys.executable, "-m", "rlvr_envs.cli", "serve", "--env", ENV_ID, "--port", str(port),
               "--max-sessions", str(max_sessions), "--log-level", "warning"]
    else:
        cmd = [sys.executable, __file__, "--stock-server", str(port), "--max-sessions", str(max_sessions)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{kind} server did not come up in 60 s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- the load client (its own process, so it does not share a GIL with the server) -----------------------------------
async def play(url: str, sessions: int, episodes: int, deadline_s: float) -> dict[str, Any]:
    from websockets.asyncio.client import connect

    ws_url = url.replace("http", "ws", 1) + "/ws"
    step_lat: list[float] = []
    reset_lat: list[float] = []
    errors: list[str] = []
    stop_at = time.monotonic() + deadline_s

    async def one(index: int) -> int:
        done = 0
        async with connect(ws_url, max_size=None, open_timeout=60) as ws:
            for episode in range(episodes):
                if time.monotonic() > stop_at:
                    break
                t0 = time.perf_counter()
                await ws.send(json.dumps({"type": "reset", "data": {"seed": index * episodes + episode}}))
                reply = json.loads(await ws.recv())
                t1 = time.perf_counter()
                await ws.send(json.dumps({"type": "step", "data": {"text": RESPONSE}}))
                step = json.loads(await ws.recv())
                t2 = time.perf_counter()
                if reply["type"] != "observation" or step["type"] != "observation" or not step["data"]["done"]:
                    errors.append(json.dumps([reply, step])[:300])
                    break
                reset_lat.append(t1 - t0)
                step_lat.append(t2 - t1)
                done += 1
            await ws.send(json.dumps({"type": "close"}))
        return done

    start = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(sessions)), return_exceptions=True)
    wall = time.perf_counter() - start
    steps = sum(r for r in results if isinstance(r, int))
    errors += [repr(r)[:300] for r in results if isinstance(r, BaseException)]
    return {"sessions": sessions, "episodes_per_session": episodes, "steps": steps, "wall_s": round(wall, 3),
            "steps_per_s": round(steps / wall, 1), **latency_ms("step", step_lat), **latency_ms("reset", reset_lat),
            "errors": errors[:5], "n_errors": len(errors)}


def run_client(url: str, sessions: int, episodes: int, deadline_s: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--client", url, "--sessions", str(sessions), "--episodes", str(episodes),
           "--deadline", str(deadline_s)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=deadline_s + 60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"client failed: {out.stderr[-2000:]}")
    run = json.loads(out.stdout.strip().splitlines()[-1])
    run["client_cpu_s"] = round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 3)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--steps-per-run", type=int, default=6144,
                        help="episodes per (server, N) run, split evenly over the N sessions")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each (server, N), alternating")
    parser.add_argument("--deadline", type=float, default=40.0, help="seconds one client run may take")
    parser.add_argument("--in-process-seconds", type=float, default=3.0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/serve_load.json"))
    parser.add_argument("--stock-server", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--max-sessions", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--episodes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.stock_server:
        run_stock_server(args.stock_server, args.max_sessions)
        return
    if args.client:
        print(json.dumps(asyncio.run(play(args.client, args.sessions[0], args.episodes, args.deadline))))
        return

    max_sessions = max(args.sessions)
    report: dict[str, Any] = {
        "env_id": ENV_ID, "response": RESPONSE, "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                                             "platform": platform.platform(),
                                                             "loadavg_at_start": os.getloadavg()},
        "note": ("loopback; server and client processes share the machine's cores (and whatever else runs on it); "
                 "runs alternate between the two servers, `repeats` times, and the figures are the upper-median run "
                 "(the faster of two)"),
        "servers": {"rlvr_serve": "`rlvr serve` (its own /ws loop; uvicorn without permessage-deflate)",
                    "openenv_stock": "openenv-core create_fastapi_app serving the same SessionEnv (stock /ws loop; "
                                     "uvicorn defaults, permessage-deflate on, as openenv's server template runs)"},
        "in_process": in_process(args.in_process_seconds), "served": {}, "runs": []}
    print("in_process", report["in_process"], flush=True)
    servers = {kind: start_server(kind, max_sessions) for kind in ("rlvr_serve", "openenv_stock")}
    try:
        for kind, (proc, _) in servers.items():
            report["served"][kind] = {"idle_rss_mb": rss_mb(proc.pid)}
        for repeat in range(args.repeats):
            for n in args.sessions:
                for kind, (proc, url) in servers.items():  # alternate, so a busy spell on the machine hits both
                    server_cpu = cpu_s(proc.pid)
                    run = run_client(url, n, max(1, args.steps_per_run // n), args.deadline)
                    run.update(server=kind, repeat=repeat, server_cpu_s=round(cpu_s(proc.pid) - server_cpu, 3),
                               server_rss_mb=rss_mb(proc.pid))
                    run["server_cpu_ms_per_step"] = round(1000 * run["server_cpu_s"] / max(run["steps"], 1), 3)
                    if kind == "rlvr_serve":
                        with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
                            metrics = json.loads(response.read())
                        run["server_metrics"] = {k: metrics[k] for k in ("sessions_open", "steps_total", "step_ms",
                                                                         "verify_ms")}
                    report["runs"].append(run)
                    print(kind, n, {k: v for k, v in run.items() if k != "server_metrics"}, flush=True)
    finally:
        for proc, _ in servers.values():
            stop_server(proc)
    for kind in servers:
        for n in args.sessions:
            runs = sorted((r for r in report["runs"] if r["server"] == kind and r["sessions"] == n),
                          key=lambda r: r["steps_per_s"])
            median = runs[len(runs) // 2]
            report["served"][kind][str(n)] = {k: median[k] for k in (
                "steps_per_s", "step_p50_ms", "step_p99_ms", "reset_p50_ms", "reset_p99_ms", "server_cpu_ms_per_step",
                "server_rss_mb", "n_errors")} | {"steps_per_s_all_runs": [r["steps_per_s"] for r in runs]}
    base = report["in_process"]["steps_per_s"]
    report["ratios"] = {f"{kind}_{n}_vs_in_process": round(runs[str(n)]["steps_per_s"] / base, 4)
                        for kind, runs in report["served"].items() for n in args.sessions}
    report["ratios"].update({f"rlvr_serve_vs_openenv_stock_{n}": round(
        report["served"]["rlvr_serve"][str(n)]["steps_per_s"]
        / max(report["served"]["openenv_stock"][str(n)]["steps_per_s"], 1e-9), 3) for n in args.sessions})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["ratios"], indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
