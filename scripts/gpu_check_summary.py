#!/usr/bin/python3
"""Headline figures of a gpu_check folder (scripts/gpu_check.sh), as text.

    gpu_check_summary.py FOLDER

Reads what the stages left in FOLDER (tests.xml, smoke.xml, info.txt,
profile.yaml, benchmarks.json, host_kernels.json, slice.h5) and prints, per
stage, what a reader of the device note needs: test counts and failures, the
bounds measured in the benchmark run, each kernel as a fraction of its bound,
the split sweep, the host kernels against their roofs, and the
slice's speedups with its checks (alpha strictly between 0 and 1, at least half
of WriteScope's KV outside VRAM). Whatever is missing is said to be missing.
Needs only the standard library; the slice section uses h5py when it is there.
"""

import json
import os
import statistics
import sys
import xml.etree.ElementTree as ElementTree


def stage_outcome(folder, stage):
    """Why a stage left no file: its line in stages.txt (`name result seconds limit ...`), or that it did not run."""
    try:
        with open(os.path.join(folder, "stages.txt")) as stages:
            for line in stages:
                fields = line.split()
                if fields and fields[0] == stage:
                    return f"the stage {fields[1]}" if len(fields) > 1 and fields[1] != "passed" else "the stage passed"
    except OSError:
        pass
    return "the stage did not run"


def tests_section(folder, name):
    path = os.path.join(folder, name + ".xml")
    if not os.path.exists(path):
        return [f"{name}: no {name}.xml ({stage_outcome(folder, name)})"]
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as error:
        return [f"{name}: {name}.xml could not be read ({error}; {stage_outcome(folder, name)})"]
    failed = [f"{case.get('classname')}.{case.get('name')}" for case in root.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    lines = [f"{name}: {root.get('tests')} tests, {len(failed)} failed, {root.get('disabled', 0)} disabled, "
             f"{float(root.get('time', 0)):.1f} s"]
    lines += [f"  FAILED {test}" for test in failed[:20]]
    if len(failed) > 20:
        lines.append(f"  ... and {len(failed) - 20} more")
    return lines


def matching_lines(path, title, keys, missing):
    """The lines of `path` that start with one of `keys`, under `title`."""
    if not os.path.exists(path):
        return [missing]
    lines = [title]
    with open(path) as source:
        for line in source:
            if any(line.strip().startswith(key) for key in keys):
                lines.append("  " + line.strip())
    return lines


def info_section(folder):
    return matching_lines(os.path.join(folder, "info.txt"), "machine:",
                          ("GPU execution space", "cpu_model", "cpu_path:", "amx:", "amx_bf16:", "host_threads",
                           "thread_placement", "gpu_name", "gpu_memory_bytes", "memory_bytes", "git_revision",
                           # per model shape: its CPU paths, next-pass level and token-major pass, as measured there
                           "next pass of", "tokens per pass", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v2-lite"),
                          "machine: no info.txt")


def profile_section(folder):
    keys = ("hbm_gbps", "pinned_h2d_gbps", "pageable_h2d_gbps", "chunk_bytes", "dram_read_gbps", "fma_glanes",
            "gemv_gbps", "threads", "path")
    return matching_lines(os.path.join(folder, "profile.yaml"), "profile (writescope calibrate):",
                          tuple(key + ":" for key in keys),
                          f"profile: no profile.yaml ({stage_outcome(folder, 'calibrate')})")


def benchmark_runs(folder, name):
    """(The iteration runs of FOLDER/name.json, lines on what was left out), or None where it is missing.

    A stage cut short leaves the file without its end: the runs written
    before the cut are read. Runs that report an error (no counters) are
    named and left out."""
    path = os.path.join(folder, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as source:
        text = source.read()
    notes = []
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        # Google Benchmark writes each run as it ends, as "    {...}" in the "benchmarks" list.
        end = text.rfind("\n    }")
        try:
            document = json.loads(text[:end + len("\n    }")] + "\n  ]\n}")
        except json.JSONDecodeError:
            raise ValueError(f"{name}.json is not JSON ({error})") from None
        notes.append(f"  {name}.json was cut short ({error}): the runs before the cut are read")
    runs = [b for b in document.get("benchmarks", []) if b.get("run_type") == "iteration"]
    failed = [b for b in runs if b.get("error_occurred")]
    notes += [f"  ERROR {b['name']}: {b.get('error_message', '?')}" for b in failed]
    return [b for b in runs if not b.get("error_occurred")], notes


def host_roofline_line(name, b):
    """A host kernel from DRAM (cpu_decode, expert_linear, cpu_experts) against min(DRAM read, its path's compute roof)."""
    return (f"  {name:48s} {b['GB/s']:8.1f}  {b['fraction_of_roofline']:.2f} of roofline "
            f"(DRAM {b['bound_GB/s']:.0f}, {b.get('label', '?')} {b['compute_bound_GB/s']:.0f}, "
            f"{b['threads']:.0f} threads); {b['fraction_of_sampled_roofline']:.2f} of the rates "
            f"sampled while it ran (DRAM {b['sampled_bound_GB/s']:.0f}, "
            f"{b['sampled_compute_bound_GB/s']:.0f}){l2_context(b)}")


def l2_context(b):
    """The sampled L2 reads against their fastest sample (HostProductSampler): below 1 in a shared host's slow periods."""
    return f"; L2 reads {b['l2_read_of_fastest']:.2f} of their fastest" if "l2_read_of_fastest" in b else ""


def benchmark_section(folder):
    read = benchmark_runs(folder, "benchmarks")
    if read is None:
        return [f"benchmarks: no benchmarks.json ({stage_outcome(folder, 'benchmarks')})"]
    runs, notes = read
    by_name = {b["name"]: b for b in runs}
    lines = ["bounds (GB/s, this run):"] + notes
    for name in ("pcie/pinned_h2d/1024/manual_time", "pcie/pinned_d2h/1024/manual_time",
                 "pcie/pageable_h2d/1024/manual_time", "hbm/device_to_device/1024/manual_time",
                 "host_dram/read/1024/manual_time"):
        if name in by_name:
            lines.append(f"  {name.split('/manual_time')[0]:28s} {by_name[name]['GB/s']:8.1f}")
    pinned = by_name.get("pcie/pinned_h2d/1024/manual_time", {}).get("GB/s")
    lines.append("kernels (decode: GB/s of KV or weights; prompt chunks: GFLOP/s; "
                 "fraction of the bound measured beside them):")
    for b in runs:
        name = b["name"].replace("/manual_time", "")
        if name.startswith(("gpu_decode/", "gpu_linear/", "gpu_experts/")):
            line = f"  {name:48s} {b['GB/s']:8.1f}  {b['fraction_of_bound']:.2f} of HBM {b['bound_GB/s']:.0f}"
            if "compute_bound_GB/s" in b:  # decode: its fp32 FMA bound too
                line += (f"; {b['fraction_of_roofline']:.2f} of the roofline (fp32 FMA "
                         f"{b['compute_bound_GB/s']:.0f} GB/s)")
            if name.startswith("gpu_experts/"):
                line += f", {b['real_time']:.0f} {b['time_unit']} a step"
            lines.append(line)
        elif name.startswith("gpu_prompt_linear/"):
            lines.append(f"  {name:48s} {b['GFLOP/s']:8.0f} GFLOP/s  {b['fraction_of_roofline']:.2f} of the roofline "
                         f"(fp32 FMA {b['compute_bound_GFLOP/s']:.0f} GFLOP/s, HBM {b['bound_GB/s']:.0f} GB/s)")
        elif name.startswith("cpu_decode/"):
            lines.append(host_roofline_line(name, b))
        elif name.startswith(("prefill/", "gpu_prefill/")):
            threads = f", {b['threads']:.0f} threads" if "threads" in b else ""
            lines.append(f"  {name:48s} {b['GFLOP/s']:8.0f} GFLOP/s  {b['fraction_of_compute_bound']:.2f} of "
                         f"{b.get('label', '?')} {b['compute_bound_GFLOP/s']:.0f} GFLOP/s "
                         f"({b['us_per_token']:.0f} us a prompt token{threads})")
    split = [b for b in runs if b["name"].startswith("split_decode/")]
    if split:
        lines.append("split sweep (cpu share: step GB/s; GPU path alone = streamed decode; CPU path alone):")
    for b in split:
        name = b["name"].replace("/manual_time", "")
        line = (f"  {name:40s} share {b['cpu_share']:.2f}: {b['GB/s']:7.1f} GB/s, "
                f"{b['fraction_of_bound']:.2f} of {b['bound_GB/s']:.1f} = min(gpu alone "
                f"{b['gpu_path_alone_GB/s']:.1f} + cpu alone {b['cpu_path_alone_GB/s']:.1f}, host DRAM read "
                f"{b['host_dram_read_GB/s']:.1f})")
        if pinned and b["cpu_share"] == 0:
            line += f"; streamed {b['GB/s'] / pinned:.2f} of pinned H2D"
        lines.append(line)
    return lines


def host_kernel_section(folder):
    read = benchmark_runs(folder, "host_kernels")
    if read is None:
        return [f"host kernels: no host_kernels.json ({stage_outcome(folder, 'host_kernels')})"]
    runs, notes = read
    # Where decode ran on AMX tiles, the stage ran those kernels again on the vector path.
    vector_runs, vector_notes = benchmark_runs(folder, "host_kernels_vector") or ([], [])
    lines = ["host kernels (GB/s; CPU decode from the last-level cache against its compute roof alone):"] + notes + \
        vector_notes
    for b in runs + vector_runs:
        name = b["name"].replace("/manual_time", "")
        if name.startswith(("expert_linear/", "cpu_experts/", "cpu_decode/")):
            lines.append(host_roofline_line(name, b))
        elif name.startswith("cpu_decode_from_cache/"):
            lines.append(f"  {name:48s} {b['GB/s']:8.1f}  {b['fraction_of_compute_bound']:.2f} of "
                         f"{b.get('label', '?')} {b['compute_bound_GB/s']:.0f} ({b['tokens']:.0f} tokens, "
                         f"{b['threads']:.0f} threads); {b['fraction_of_sampled_compute_bound']:.2f} of the rate "
                         f"sampled while it ran ({b['sampled_compute_bound_GB/s']:.0f}){l2_context(b)}")
        elif name.startswith("host_overlap/"):
            lines.append(f"  {name:48s} {b['GB/s']:8.1f}  {b['overlap']:.2f} of min(DRAM {b['bound_GB/s']:.0f}, "
                         f"in cache {b['in_cache_GB/s']:.0f}): the most a kernel of "
                         f"{b['multiply_adds_per_byte']:g} multiply-adds per byte reaches here")
    return lines


def slice_section(folder):
    path = os.path.join(folder, "slice.h5")
    if not os.path.exists(path):
        return [f"slice: no slice.h5 ({stage_outcome(folder, 'slice')})"]
    try:
        import h5py
        import numpy
    except ImportError:
        return ["slice: slice.h5 written; h5py or numpy missing here, figures in the archive"]
    lines = ["slice (tokens/s per system; WriteScope's split):"]
    rates, same_policy, checks = {}, {}, []
    with h5py.File(path, "r") as results:
        for group in results["runs"].values():
            attributes = group.attrs
            system, status = str(attributes["system"]), str(attributes["status"])
            policy = str(attributes.get("expert_policy", system))
            label = f"{system}[{policy}]" if system == "writescope" else system
            if status != "complete":
                lines.append(f"  {label:26s} {status}: {attributes['reason']}")
                continue
            rate = float(attributes["tokens_per_second"])
            lines.append(f"  {label:26s} {rate:8.2f} tokens/s, step {float(attributes['mean_step_seconds']) * 1e3:.0f} ms")
            if system != "writescope":
                rates[system] = rate
                continue
            same_policy[policy] = rate
            if int(attributes.get("system_comparison", 1)) != 1:
                continue
            rates[system] = rate
            alpha = numpy.asarray(group["alpha"])
            region = {name: float(numpy.sum(group["region_bytes"][name])) for name in group["region_bytes"]}
            outside = 1 - region["gpu_resident"] / max(sum(region.values()), 1.0)
            predicted = numpy.asarray(group["predicted_attention_seconds"])
            measured = numpy.asarray(group["attention_seconds"])
            ratio = statistics.median(predicted / numpy.maximum(measured, 1e-12))
            lines.append(f"  writescope alpha: mean {alpha.mean():.3f}, min {alpha.min():.3f}, max {alpha.max():.3f}; "
                         f"KV outside VRAM {outside:.2f}; attention predicted/measured (median) {ratio:.2f}")
            if "streamed_gbps" in group:
                streamed = numpy.asarray(group["streamed_gbps"])
                lines.append(f"  writescope streamed path: median {numpy.median(streamed):.1f} GB/s per step")
            checks.append(("alpha strictly between 0 and 1", 0 < alpha.min() and alpha.max() < 1))
            checks.append(("at least half of WriteScope's KV outside VRAM", outside >= 0.5))
    baselines = {system: rate for system, rate in rates.items() if system != "writescope"}
    if "writescope" in rates and baselines:
        best = max(baselines, key=baselines.get)
        lines.append(f"  speedup of writescope over the best baseline ({best}): "
                     f"{rates['writescope'] / baselines[best]:.2f}x; over each: " +
                     ", ".join(f"{s} {rates['writescope'] / r:.2f}x" for s, r in sorted(baselines.items())))
    else:
        checks.append(("writescope and a baseline complete", False))
    shared = [f"{policy} {rate / baselines[policy]:.2f}x" for policy, rate in sorted(same_policy.items())
              if policy in baselines]
    if shared:
        lines.append("  same expert policy (KV format and split alone), writescope over: " + ", ".join(shared))
    lines += [f"  check: {name}: {'yes' if ok else 'NO'}" for name, ok in checks]
    return lines


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gpu_check_summary.py FOLDER")
    folder = sys.argv[1]
    if not os.path.isdir(folder):
        print(f"gpu_check_summary.py: {folder} is not a folder (a gpu_check folder: scripts/gpu_check.sh)",
              file=sys.stderr)
        sys.exit(2)
    sections = [("machine", info_section), ("smoke", lambda f: tests_section(f, "smoke")),
                ("tests", lambda f: tests_section(f, "tests")), ("profile", profile_section),
                ("benchmarks", benchmark_section), ("host kernels", host_kernel_section), ("slice", slice_section)]
    for title, section in sections:
        try:
            lines = section(folder)
        except Exception as error:  # one damaged file must not hide the others' figures
            lines = [f"{title}: could not be read: {error!r}"]
        print("\n".join(lines))


if __name__ == "__main__":
    main()
