"""Where Horovod's time goes on CPU: an account of one multi-worker run's steps.

One N-worker `chexflow train` run writes Horovod's timeline (HOROVOD_TIMELINE, the coordinator's
view); N independent one-worker runs go at the same time (the cores' contention without
Horovod). Per timed step the account gives:
- the step time of the Horovod run and of an independent worker, and their difference (what
  Horovod costs per step beyond sharing the cores);
- from the timeline, how long the gradients' allreduces were active (the union of their ALLREDUCE
  intervals, fused tensors counted once), split into the copy into the fusion buffer, the
  reduction itself (GLOO_ALLREDUCE or MPI_ALLREDUCE) and the copy out, and the bytes reduced;
- the copy-and-sum cost of those bytes on one core (numpy, single-threaded: copy in, add the
  other rank's buffer, copy out), the arithmetic an allreduce cannot avoid.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from chexflow.bench.training import train_command

PHASES = {"MEMCPY_IN_FUSION_BUFFER": "copy_in", "GLOO_ALLREDUCE": "reduce",
          "MPI_ALLREDUCE": "reduce", "MEMCPY_OUT_FUSION_BUFFER": "copy_out"}
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def read_timeline(path: Path) -> list[dict]:
    """Horovod's timeline events (the file is a JSON array Horovod may leave unclosed)."""
    text = path.read_text().rstrip().rstrip(",")
    return json.loads(text if text.endswith("]") else text + "]")


def _union_ms(intervals: list[tuple[int, int]]) -> float:
    total, end = 0, None
    for b, e in sorted(intervals):
        if end is None or b > end:
            total += e - b
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1000.0


def gradient_steps(events: list[dict]) -> list[dict]:
    """Per training step (the i-th allreduce of every gradient tensor of a Distributed*
    optimizer): active allreduce ms and its phases (unions over tensors) and bytes reduced."""
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("name") == "process_name" and "name" in e.get("args", {})}
    grads = {pid for pid, n in names.items() if "Distributed" in n and "_Allreduce" in n}
    # per tensor: a stack of open activities, then one record per ALLREDUCE
    records: dict[int, list[dict]] = defaultdict(list)
    stacks: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for e in events:
        pid = e.get("pid")
        if pid not in grads or e.get("ph") not in ("B", "E"):
            continue
        if e["ph"] == "B":
            if e["name"] == "ALLREDUCE":
                records[pid].append({"phases": defaultdict(list)})
            stacks[pid].append((e["name"], e["ts"]))
            continue
        name, begin = stacks[pid].pop()
        if not records[pid]:
            continue
        rec = records[pid][-1]
        if name == "ALLREDUCE":
            rec["interval"] = (begin, e["ts"])
            args = e.get("args", {})
            shape = json.loads(args.get("shape", "[]").replace(" ", "") or "[]")
            rec["bytes"] = int(np.prod(shape or [1])) * DTYPE_BYTES.get(args.get("dtype"), 4)
        elif name in PHASES:
            rec["phases"][PHASES[name]].append((begin, e["ts"]))
    steps = min((len(r) for r in records.values()), default=0)
    out = []
    for i in range(steps):
        recs = [r[i] for r in records.values() if "interval" in r[i]]
        phases = defaultdict(list)
        for r in recs:
            for k, v in r["phases"].items():
                phases[k] += v
        out.append({
            "allreduce_ms": _union_ms([r["interval"] for r in recs]),
            **{f"{k}_ms": _union_ms(phases[k]) for k in ("copy_in", "reduce", "copy_out")},
            "bytes": sum(r["bytes"] for r in recs), "tensors": len(recs),
        })
    return out


def copy_and_sum_ms(nbytes: int, repeats: int = 5) -> float:
    """Copy `nbytes` of float32 into a buffer, add another rank's buffer, copy back: the best
    of `repeats` on one core (numpy's add and copy are single-threaded)."""
    n = max(1, nbytes // 4)
    rng = np.random.default_rng(0)
    grads, other = rng.random(n, np.float32), rng.random(n, np.float32)
    fused = np.empty(n, np.float32)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(fused, grads)
        np.add(fused, other, out=fused)
        np.copyto(grads, fused)
        best = min(best, time.perf_counter() - t)
    return best * 1000.0


def _run(cmds: list[list[str]], env: dict | None = None) -> None:
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=env) for c in cmds]
    for p, c in zip(procs, cmds, strict=True):
        err = p.communicate()[1]
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(c)} failed:\n{err[-3000:]}")


def _metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def account(work: Path, data: Path, model: str, size: int, batch: int, steps: int,
            workers: int = 2, repeats: int = 1, setting: str = "defaults",
            args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> dict:
    """The account of `repeats` runs (each: the Horovod run with `setting`, i.e. `chexflow
    train` arguments `args` and environment `env`, then the independent workers)."""
    kw = dict(model=model, size=size, batch=batch, steps=steps, extra=("--threads", "1"))
    runs = []
    for _ in range(repeats):
        tmp = Path(tempfile.mkdtemp(prefix="allreduce-", dir=work))
        timeline = tmp / "timeline.json"
        horovod_kw = {**kw, "extra": (*kw["extra"], *args)}
        _run([train_command(tmp / "horovod", data, workers=workers, **horovod_kw)],
             env={**os.environ, **(env or {}), "HOROVOD_TIMELINE": str(timeline)})
        horovod = _metrics(tmp / "horovod")
        solo = [tmp / f"independent-{i}" for i in range(workers)]
        _run([train_command(o, data, workers=1, **kw) for o in solo])
        timed = gradient_steps(read_timeline(timeline))[horovod["warmup_steps"]:]
        nbytes = int(statistics.median(s["bytes"] for s in timed))
        runs.append({
            "horovod_step_ms": horovod["step_time_ms"],
            "independent_step_ms": statistics.median(_metrics(o)["step_time_ms"] for o in solo),
            **{k: statistics.median(s[k] for s in timed)
               for k in ("allreduce_ms", "copy_in_ms", "reduce_ms", "copy_out_ms")},
            "gradient_mb": nbytes / 1e6,
            "tensors": int(statistics.median(s["tensors"] for s in timed)),
            "copy_and_sum_ms": copy_and_sum_ms(nbytes),
            "timed_steps": len(timed),
        })
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    summary["lost_ms"] = summary["horovod_step_ms"] - summary["independent_step_ms"]
    return {"model": model, "setting": setting, "image_size": size, "batch_per_worker": batch,
            "steps": steps, "workers": workers, "threads_per_worker": 1, "runs": runs,
            "median": summary}


def markdown(acct: dict) -> str:
    """The account as a Markdown table (medians over runs, per timed step)."""
    m = acct["median"]
    rows = [
        ("step, Horovod run", m["horovod_step_ms"]),
        (f"step, {acct['workers']} independent workers at once", m["independent_step_ms"]),
        ("lost per step to Horovod", m["lost_ms"]),
        ("allreduce active (timeline)", m["allreduce_ms"]),
        ("  copy into fusion buffer", m["copy_in_ms"]),
        ("  reduction (gloo/MPI)", m["reduce_ms"]),
        ("  copy out of fusion buffer", m["copy_out_ms"]),
        (f"copy-and-sum of {m['gradient_mb']:.1f} MB on one core", m["copy_and_sum_ms"]),
    ]
    lines = [f"\nAllreduce account ({acct.get('setting', 'defaults')}): {acct['model']} "
             f"{acct['image_size']} px, batch "
             f"{acct['batch_per_worker']}/worker, {acct['workers']} workers x 1 thread, "
             f"{len(acct['runs'])} run(s), {m['tensors']:.0f} gradient tensors per step", "",
             "| per step | ms |", "|---|---|"]
    lines += [f"| {name} | {value:.1f} |" for name, value in rows]
    return "\n".join(lines) + "\n"
