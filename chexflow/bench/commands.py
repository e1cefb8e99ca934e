"""`chexflow bench [--quick] [--gpu] [--out DIR] [--only NAME ...]` and `chexflow bench tables
[--check]`."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from chexflow.envs import REPO_ROOT

COMPARISONS = ("preprocessing", "input-pipeline", "orchestration", "scaling", "katib")
# long (one 2-worker run per option per repeat): run only when named in --only
ON_REQUEST = ("horovod-options", "allreduce-levers", "allreduce-account", "real-pods",
              "katib-cluster", "tf-stack", "contention", "inference", "cluster-faults",
              "image-pull", "serving")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="throughput and overheads, side by side and interleaved (JSON, Markdown, PNG)",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks the plumbing")
    p.add_argument("--gpu", action="store_true", help="the single-GPU sweep (needs a GPU)")
    p.add_argument("--out", type=Path, default=Path("runs/bench"))
    p.add_argument("--only", nargs="+", choices=COMPARISONS + ON_REQUEST,
                   help="run only these comparisons (horovod-options, allreduce-levers and "
                   "allreduce-account, where a Horovod timeline accounts for each step's time, "
                   "run only when named)")
    p.add_argument("--repeats", type=int,
                   help="runs of each side (default 3, input-pipeline 5; --quick 1)")
    p.add_argument("--kubeconfig", type=Path,
                   help="real-pods (an MPIJob on a local cluster's real node against local "
                   "horovodrun, and a TrainJob against the MPIJob) and katib-cluster (the real "
                   "Katib's per-trial overhead against the local runner's), only when named: "
                   "the kubeconfig of a running `chexflow cluster up --real-node --trainer` "
                   "(--katib for katib-cluster; default: the bench starts a cluster of its own); "
                   "cluster-faults (the supervised cluster's processes SIGKILLed while an MPIJob "
                   "trains: docs/bench/cluster-faults.json) needs its state folder beside it")
    p.add_argument("--baseline-python", type=Path,
                   help="tf-stack: the TF 2.15 trainer's python (default .venv-tf2.15/bin/python, "
                   "created on first use)")
    p.set_defaults(func=run_bench)
    tables = p.add_subparsers(dest="bench_command", metavar="ACTION").add_parser(
        "tables", help="make the docs' tables of figures from their JSON under docs/bench/")
    tables.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 when a page's table differs from its JSON")
    tables.add_argument("--docs", type=Path, default=REPO_ROOT / "docs",
                        help="the folder of pages (default: this checkout's docs/)")
    tables.set_defaults(func=run_tables)


def run_tables(args: argparse.Namespace) -> int:
    """`chexflow bench tables [--check]`: the pages whose tables are stale, rewritten or not."""
    from chexflow.bench.tables import update

    stale = update(args.docs, args.check)
    for page in stale:
        print(f"{page}: {'stale' if args.check else 'made anew'}")
    return 1 if args.check and stale else 0


def synth_tfrecords(work: Path, images: int, source_px: int, size: int) -> Path:
    """A generated NIH dataset preprocessed to `size` px TFRecords (made once per work dir)."""
    data = work / f"tfrecords-{size}"
    if (data / "manifest.json").exists():
        return data
    raw = work / f"raw-{source_px}"
    cli = [sys.executable, "-m", "chexflow.cli"]
    if not (raw / "Data_Entry_2017.csv").exists():
        subprocess.run([*cli, "data", "synth", "--out", str(raw), "--images", str(images),
                        "--size", str(source_px)], check=True, capture_output=True)
    subprocess.run([*cli, "preprocess", "--csv", str(raw / "Data_Entry_2017.csv"), "--images",
                    str(raw / "images"), "--out", str(data), "--image-size", str(size),
                    "--overwrite"], check=True, capture_output=True)
    return data


def run_bench(args: argparse.Namespace) -> int:
    from chexflow.bench import allreduce, katib_overhead, orchestration, preprocessing, training
    from chexflow.bench.core import write_report

    out: Path = args.out
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    if args.gpu:
        return run_gpu(out, work, args.quick)
    quick = args.quick
    repeats = args.repeats or (1 if quick else 3)
    wanted = args.only or COMPARISONS
    if "cluster-faults" in wanted:  # its own table (chexflow.bench.cluster_faults)
        from chexflow.bench import cluster_faults

        path = cluster_faults.run(work / "cluster-faults", synth_tfrecords(work, 120, 64, 64),
                                  out, 4 if quick else cluster_faults.EPOCHS, args.kubeconfig)
        print(path.read_text())
        print(f"wrote {path}")
        wanted = [w for w in wanted if w != "cluster-faults"]
        if not wanted:
            return 0
    if "contention" in wanted:  # its own clusters and report (chexflow.bench.contention)
        from chexflow.bench import contention

        small = ["--nodes", "24", "--run-seconds", "10", "20", "--fit-jobs", "5"] if quick else []
        code = contention.main(["--out", str(out / "contention"), *small])
        wanted = [w for w in wanted if w != "contention"]
        if not wanted:
            return code
    # CPU sizes: 64 px keeps DenseNet-121 at a useful number of steps on 2 cores.
    size, batch, steps = (32, 4, 4) if quick else (64, 16, 30)
    results = []
    if "preprocessing" in wanted:
        n, px = (40, 128) if quick else (1500, 1024)
        results.append(preprocessing.run(work / "preprocessing", n, px, 224, 2, repeats))
    data = None
    if {"input-pipeline", "scaling", "horovod-options", "allreduce-levers", "allreduce-account",
            "real-pods", "tf-stack"} & set(wanted):
        data = synth_tfrecords(work, 120 if quick else 1200, 64, size)
    if "input-pipeline" in wanted:
        # runs of one side vary by about ±10% on 2 busy cores: 5 a side read the ratio to ±3%
        input_repeats = args.repeats or (1 if quick else 5)
        for model in ("resnet50",) if quick else ("densenet121", "resnet50"):
            results.append(training.input_pipeline(work, data, model, size, batch, steps,
                                                   input_repeats))
    if "orchestration" in wanted:
        results.append(orchestration.run(work / "orchestration", "resnet50", size, batch, steps,
                                         workers=1 if quick else 2, repeats=repeats))
    if "scaling" in wanted:
        results += training.scaling(work, data, "resnet50", size, batch, steps, repeats)
    extra, sections = {"quick": quick, "repeats": repeats}, []
    if "horovod-options" in wanted:
        options = training.horovod_options(work, data, "resnet50", size, batch, steps, repeats)
        results += options
        # where the fastest setting that gives gloo's numbers still loses time: one account run
        sides = training.horovod_option_sides(mpi=shutil.which("mpirun") is not None)
        best = training.best_setting(options, sides)
        extra["horovod_options_best"] = best
        extra["horovod_options_account"] = allreduce.account(
            work, data, "resnet50", size, batch, steps, setting=best, args=sides[best].args,
            env=sides[best].env)
        sections.append(allreduce.markdown(extra["horovod_options_account"]))
    if "allreduce-levers" in wanted:
        results += training.allreduce_levers(work, data, "resnet50", size, batch, steps, repeats)
    if "tf-stack" in wanted:
        from chexflow.bench import tf_stack

        results.append(tf_stack.run(work / "tf-stack", data, "densenet121", size, batch, steps,
                                    repeats, args.baseline_python))
    if "inference" in wanted:
        from chexflow.bench import inference

        data = data or synth_tfrecords(work, 120 if quick else 1200, 64, size)
        results.append(inference.run(work / "inference", data, work / "raw-64" / "images", size,
                                     batch, repeats))
    if "katib" in wanted:
        results.append(katib_overhead.run(work / "katib", 5 if quick else 20, repeats))
    if "katib-cluster" in wanted:
        from chexflow.bench import katib_cluster

        results += katib_cluster.run(work / "katib-cluster", 3 if quick else 5, repeats,
                                     args.kubeconfig)
    if "allreduce-account" in wanted:
        extra["allreduce_account"] = allreduce.account(work, data, "resnet50", size, batch, steps,
                                                       repeats=repeats)
        sections.append(allreduce.markdown(extra["allreduce_account"]))
    if "real-pods" in wanted:
        from chexflow.bench import real_pods

        pods = real_pods.run(work, data, real_pods.Settings("densenet121", size, batch, steps),
                             repeats, args.kubeconfig)
        results += pods
        sections += [real_pods.markdown(r.as_dict()) for r in pods]
    if "image-pull" in wanted:  # its own cluster with a registry (chexflow.bench.image_pull)
        from chexflow.bench import image_pull

        pulls = image_pull.run(work / "image-pull", repeats)
        results += pulls
        sections.append(image_pull.markdown(pulls[0].as_dict()))  # the runs of all sides
    if "serving" in wanted:  # its own cluster with KServe (chexflow.bench.serving)
        from chexflow.bench import serving

        data = data or synth_tfrecords(work, 120 if quick else 1200, 64, size)
        served = serving.run(work / "serving", work / "raw-64" / "images", size,
                             32 if quick else 256, repeats)
        results += served
        sections.append(serving.markdown(served[0].as_dict()))
    doc = write_report(results, out, extra, sections)
    if "real-pods" in wanted:
        for r, png in zip(pods, ("bench-real-pods-startup.png",
                                 "bench-trainjob-startup.png"), strict=True):
            real_pods.plot_startup(r.as_dict(), out / png)
    print((out / "bench.md").read_text())
    print(f"wrote {out / 'bench.json'}, {out / 'bench.md'}, {out / 'bench.png'}")
    return 0 if all(r["met"] for r in doc["results"]) or quick else 1


def run_gpu(out: Path, work: Path, quick: bool) -> int:
    from chexflow.bench import gpu

    gpus = gpu.require_gpu()
    plan = gpu.SweepPlan.quick() if quick else gpu.SweepPlan()
    data = synth_tfrecords(work, 512 if quick else 4096, 256, plan.image_size)
    rows = gpu.sweep(work / "gpu", data, plan)
    gpu.write_report(rows, out, gpus, plan)
    print((out / "bench-gpu.md").read_text())
    print(f"wrote {out / 'bench-gpu.json'}, {out / 'bench-gpu.md'}, {out / 'bench-gpu.png'}")
    return 0 if all("error" not in r for r in rows) else 1
