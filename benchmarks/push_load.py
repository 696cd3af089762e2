"""Push load: an open-loop schedule of ``rate`` POST /api/v1/push requests per second for ``duration``
seconds against a real ``omniwatch serve`` process on loopback (token set), from a bounded async httpx
clients in ``clients`` processes (each at most ``concurrency`` requests in flight; a request that cannot
start on time is sent late and counted). Each body is one verl step (~100 keys) of one of 10 runs, step numbers rising per run.

Reports the held rate (2xx answers per second of the run), errors by kind, and p50/p99 latency measured
from the *scheduled* send time (so a server that falls behind shows it, coordinated omission avoided)
and from the actual send time."""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import secrets
import time
from collections import Counter

import httpx
import orjson

from common import median, pct, rss_bytes, serve_process, verl_lines

RUNS = 10


async def _load(url: str, token: str, rate: float, duration: float, concurrency: int, worker: int = 0) -> dict:
    pool = [orjson.loads(line)["data"] for _, line in verl_lines(200, RUNS, seed=7)]
    next_step = [0] * RUNS
    sem = asyncio.Semaphore(concurrency)
    lat_sched, lat_send, errors, late = [], [], Counter(), 0
    ok = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=10.0, headers=headers) as client:
        async def one(i: int, scheduled: float):
            nonlocal ok
            r = i % RUNS
            next_step[r] += 1
            body = orjson.dumps({"project": "bench", "experiment": f"push{worker}-{r}", "step": next_step[r],
                                 "data": pool[i % len(pool)]})
            async with sem:
                t0 = time.perf_counter()
                try:
                    resp = await client.post("/api/v1/push", content=body)
                    if 200 <= resp.status_code < 300:
                        ok += 1
                    else:
                        errors[f"http_{resp.status_code}"] += 1
                except httpx.HTTPError as e:
                    errors[type(e).__name__] += 1
                t1 = time.perf_counter()
            lat_send.append(t1 - t0)
            lat_sched.append(t1 - scheduled)

        total = int(rate * duration)
        tasks = []
        start = time.perf_counter()
        for i in range(total):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -0.01:
                late += 1
            tasks.append(asyncio.create_task(one(i, scheduled)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    return {"requests": total, "ok": ok, "errors": errors, "late": late, "elapsed": elapsed,
            "lat_sched": lat_sched, "lat_send": lat_send, "cpu": time.process_time()}


def _worker(args) -> dict:
    return asyncio.run(_load(*args))


def _merge(parts: list[dict]) -> dict:
    errors = sum((Counter(p["errors"]) for p in parts), Counter())
    ok = sum(p["ok"] for p in parts)
    elapsed = max(p["elapsed"] for p in parts)
    sched = [x for p in parts for x in p["lat_sched"]]
    send = [x for p in parts for x in p["lat_send"]]
    return {"requests": sum(p["requests"] for p in parts), "ok": ok, "errors": dict(errors),
            "errors_total": sum(errors.values()), "sent_late": sum(p["late"] for p in parts),
            "elapsed_s": elapsed, "held_rate_per_s": ok / elapsed if elapsed else 0.0,
            "p50_ms": median(sched) * 1e3, "p99_ms": pct(sched, 99) * 1e3,
            "service_p50_ms": median(send) * 1e3, "service_p99_ms": pct(send, 99) * 1e3,
            "client_cpu_s": sum(p["cpu"] for p in parts)}


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc (clock ticks -> seconds)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(rate: float = 1000, duration: float = 10, concurrency: int = 8, clients: int = 4) -> dict:
    """``clients`` processes share the rate (one asyncio httpx client costs ~1-2 ms CPU a request, so
    one process cannot offer 1,000/s); ``concurrency`` bounds in-flight requests per client."""
    token = secrets.token_urlsafe(24)
    with serve_process([], env={"OMNIWATCH_PUSH_TOKEN": token}) as (proc, url):
        s0 = cpu_seconds(proc.pid)
        jobs = [(url, token, rate / clients, duration, concurrency, w) for w in range(clients)]
        with multiprocessing.get_context("spawn").Pool(clients) as pool:
            res = _merge(pool.map(_worker, jobs))
        res["server_cpu_s"] = cpu_seconds(proc.pid) - s0
        res["server_cpu_ms_per_request"] = res["server_cpu_s"] * 1e3 / max(1, res["requests"])
        res["server_rss_mib"] = rss_bytes(proc.pid) / 2**20
        with httpx.Client(base_url=url, timeout=10) as c:
            runs = c.get("/api/v1/runs").json()
        res["steps_applied"] = sum(r["steps_total"] for r in runs)
    res.update(target_rate_per_s=rate, duration_s=duration, clients=clients, concurrency_per_client=concurrency,
               cpus=os.cpu_count())
    return res
