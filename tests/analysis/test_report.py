#!/usr/bin/python3
"""Tests of analysis/report.py on small results files written here (schema `writescope-results-1`).

Run with Debian's Python: /usr/bin/python3 tests/analysis/test_report.py
"""

import contextlib
import fcntl
import hashlib
import importlib.util
import io
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np

REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "analysis", "report.py")

MODELS = ("qwen3-30b-a3b", "mixtral-8x7b")
SYSTEMS = ("writescope", "ktransformers", "gpu-only")
CONTEXTS = (8192, 32768)
REPETITIONS = 2
STEPS, LAYERS = 4, 2
BATCH, VRAM = 1, 24 << 30
COMPONENTS = ("attention_gpu", "attention_cpu", "experts_gpu", "experts_cpu", "transfers", "other")
REGIONS = ("gpu_resident", "gpu_streamed", "cpu_resident", "cpu_streamed")
NOT_FIT_REASON = "KV cache of 32768 tokens does not fit in the 24 GiB VRAM budget"
BASE_TPS = {  # tokens/s at context 8192, repetition 0
    ("qwen3-30b-a3b", "writescope"): 41.0, ("qwen3-30b-a3b", "ktransformers"): 23.0,
    ("qwen3-30b-a3b", "gpu-only"): 29.0,
    ("mixtral-8x7b", "writescope"): 13.0, ("mixtral-8x7b", "ktransformers"): 7.1,
    ("mixtral-8x7b", "gpu-only"): 9.3,
}
SLOWDOWN = {"writescope": 1.3, "ktransformers": 2.9, "gpu-only": 3.7}  # from 8K to 32K
OLD_POLICY = {"writescope": "ktransformers"}  # expert_policy of complete runs; a baseline's is its own


def tokens_per_second(model, system, context, repetition):
    scale = SLOWDOWN[system] ** math.log(context / 8192, 4)
    return BASE_TPS[model, system] / scale + 0.7 * repetition  # additive, so averaging matters


def does_not_fit(system, context):
    return system == "gpu-only" and context == 32768


def run_specs():
    """Every run of the test file, as attribute dictionaries, as the harness wrote them before WriteScope ran
    once per expert policy: no system_comparison, pinned_budget_bytes, expert_policy on complete runs only."""
    specs = []
    for model in MODELS:
        for system in SYSTEMS:
            for context in CONTEXTS:
                for repetition in range(REPETITIONS):
                    fits = not does_not_fit(system, context)
                    policy = {"expert_policy": OLD_POLICY.get(system, system)} if fits else {}
                    specs.append(dict(model=model, model_label=model + " (test)", system=system, batch=BATCH,
                                      context=context, vram_budget_bytes=VRAM, host_budget_bytes=128 << 30,
                                      pinned_budget_bytes=16 << 30, repetition=repetition, seed=7 + repetition,
                                      status="complete" if fits else "does_not_fit",
                                      reason="" if fits else NOT_FIT_REASON, config=f"system: {system}\n", **policy))
    return specs


# Current schema: WriteScope runs once per baseline expert policy (system_comparison 0) and once with its own
# choice, hybrimoe, which no baseline has (system_comparison 1). Variants differ enough in tokens/s that
# averaging them, or pairing a variant with another baseline, changes every geometric mean.
VARIANTS = (("writescope", "fiddler", 0), ("writescope", "ktransformers", 0), ("writescope", "hybrimoe", 1),
            ("fiddler", "fiddler", 1), ("ktransformers", "ktransformers", 1), ("gpu-only", "gpu-only", 1))
VARIANT_TPS = {("writescope", "fiddler"): 31.0, ("writescope", "ktransformers"): 37.0,
               ("writescope", "hybrimoe"): 47.0, ("fiddler", "fiddler"): 19.0,
               ("ktransformers", "ktransformers"): 23.0, ("gpu-only", "gpu-only"): 29.0}
VARIANT_SLOWDOWN = {"writescope": 1.3, "fiddler": 2.3, "ktransformers": 2.9, "gpu-only": 3.7}
MODEL_SCALE = {"qwen3-30b-a3b": 1.0, "mixtral-8x7b": 0.31}
PINNED_GIB, HOST_GIB = 3, 60


def variant_tps(model, system, policy, context, repetition):
    scale = VARIANT_SLOWDOWN[system] ** math.log(context / 8192, 4)
    return MODEL_SCALE[model] * VARIANT_TPS[system, policy] / scale + 0.7 * repetition


def variant_specs():
    """Runs in the current schema; tokens_per_second is given per spec (see write_run)."""
    specs = []
    for model in MODELS:
        for system, policy, comparison in VARIANTS:
            for context in CONTEXTS:
                for repetition in range(REPETITIONS):
                    fits = not does_not_fit(system, context)
                    spec = dict(model=model, model_label=model + " (test)", system=system, batch=BATCH,
                                context=context, vram_budget_bytes=VRAM, host_budget_bytes=128 << 30,
                                pinned_limit_bytes=16 << 30, repetition=repetition, seed=7 + repetition,
                                status="complete" if fits else "does_not_fit",
                                reason="" if fits else NOT_FIT_REASON, config=f"system: {system}\n",
                                expert_policy=policy, system_comparison=comparison)
                    if fits:
                        spec.update(tokens_per_second=variant_tps(model, system, policy, context, repetition),
                                    pinned_bytes=PINNED_GIB << 30, host_bytes=HOST_GIB << 30)
                    specs.append(spec)
    return specs


def variant_geomean(model, policies, baseline, min_context=8192):
    """Geometric mean over contexts of the mean tokens/s of writescope's runs with `policies` (expert
    policies; more than one: what averaging its variants would give) over `baseline`'s."""
    def mean(system, policies, context):
        return np.mean([variant_tps(model, system, p, context, r) for p in policies for r in range(REPETITIONS)])
    ratios = [mean("writescope", policies, c) / mean(baseline, (baseline,), c) for c in CONTEXTS
              if c >= min_context and not does_not_fit(baseline, c)]
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def write_run(group, spec, rng):
    for name, value in spec.items():
        group.attrs[name] = np.int64(value) if isinstance(value, int) else value
    if spec["status"] != "complete":
        return
    tps = spec.get("tokens_per_second") or tokens_per_second(spec["model"], spec["system"], spec["context"],
                                                             spec["repetition"])
    step = spec["batch"] / tps
    group.attrs["tokens_per_second"] = tps
    group.attrs["mean_step_seconds"] = step
    group.attrs["layers"] = np.int64(LAYERS)
    group.attrs["attention_fmas_per_byte"] = 0.5 if spec["model"] == "qwen3-30b-a3b" else 1.0
    group.attrs["cpu_attention_gbps"] = 7.0 if spec["model"] == "qwen3-30b-a3b" else 9.5
    if spec["model"] == "qwen3-30b-a3b":  # the band's own rate; the other model's runs are as older files wrote them
        group.attrs["cpu_streamed_attention_gbps"] = 6.0
    group["step_seconds"] = np.full(STEPS, step)
    attention = step * 0.4 * (1.0 + 0.1 * rng.random(STEPS))
    group["attention_seconds"] = attention
    group["predicted_attention_seconds"] = attention * 1.1
    alpha = {"writescope": 0.3, "fiddler": 1.0, "ktransformers": 1.0, "gpu-only": 0.0}[spec["system"]]
    group["alpha"] = np.clip(alpha + 0.05 * rng.random((STEPS, LAYERS)), 0.0, 1.0)
    for i, name in enumerate(COMPONENTS):
        group[f"components/{name}"] = np.full((STEPS, LAYERS), step * (i + 1) / 40)
    for name in REGIONS:
        group[f"region_bytes/{name}"] = np.full(STEPS, 1e6)


# The machine profiles of the projection tests (hbm, pinned host->GPU, CPU DRAM read GB/s; G lane-FMAs/s): each
# roofline panel must draw its own.
PROFILE_RATES = {"a100-pcie4": (1300.0, 25.0, 150.0, 1100.0), "v100-pcie3": (800.0, 12.0, 100.0, 700.0)}


def profile_yaml(name):
    """A profile as MachineProfile::to_yaml writes it into /profiles/<name>/yaml."""
    hbm, pinned, dram, fma = PROFILE_RATES[name]
    return (f"name: {name}\nhas_gpu: true\ngpu:\n  hbm_gbps: {hbm:g}\n  launch_latency_us: 10\nlink:\n"
            f"  pinned_h2d_gbps: {pinned:g}\n  pinned_d2h_gbps: {pinned:g}\n  pageable_h2d_gbps: 7.9000000000000004\n"
            f"  latency_us: 10\ncpu:\n  threads: 32\n  dram_read_gbps: {dram:g}\n  path: avx2\n"
            f"  fma_glanes: {fma:g}\n  expert_gbps: 60\n  attention_gbps:\n"
            f"    qwen3-30b-a3b: {{1: 2.2999999999999998, 16: 25}}\n"
            f"sources:\n  cpu: \"assumed: dram_read_gbps: 1 fma_glanes: 2\"\n")


def write_results(path, specs, names=None, format_name="writescope-results-1", predicted=False):
    """A results file holding `specs` under /runs/<names[i]> (default r0, r1, ...); `predicted` marks the
    file as `writescope predict` writes one (its runs carry their own `predicted` and `profile`; /profiles
    holds each profile's YAML, /profile the first)."""
    names = names or [f"r{i}" for i in range(len(specs))]
    rng = np.random.default_rng(1)
    with h5py.File(path, "w") as root:
        root.attrs.update(format=format_name, experiment="report-test", config="name: report-test\n",
                          git_revision="0123abcd", kokkos_configuration="OpenMP", machine="cpu: test\n")
        profile = root.create_group("profile")
        profile.attrs.update(name="test-machine", has_gpu=np.int64(1), hbm_gbps=4800.0, pinned_h2d_gbps=50.0,
                             pageable_h2d_gbps=20.0, cpu_dram_read_gbps=200.0, cpu_fma_glanes=900.0,
                             cpu_gemv_gbps=180.0, cpu_threads=np.int64(32))
        if predicted:
            root.attrs["predicted"] = np.int64(1)
            priced = list(dict.fromkeys(spec["profile"] for spec in specs))
            hbm, pinned, dram, fma = PROFILE_RATES[priced[0]]
            profile.attrs.update(name=priced[0], hbm_gbps=hbm, pinned_h2d_gbps=pinned, cpu_dram_read_gbps=dram,
                                 cpu_fma_glanes=fma)
            for name in priced:
                root.create_group(f"profiles/{name}").attrs.update(name=name, yaml=profile_yaml(name))
        runs = root.create_group("runs")
        for name, spec in zip(names, specs):
            write_run(runs.create_group(name), spec, rng)


def expected_geomean(model, baseline, min_context=8192):
    """Geometric mean over contexts of mean-over-repetitions writescope tokens/s over `baseline`'s."""
    def mean(system, context):
        return np.mean([tokens_per_second(model, system, context, r) for r in range(REPETITIONS)])
    ratios = [mean("writescope", c) / mean(baseline, c) for c in CONTEXTS
              if c >= min_context and not does_not_fit(baseline, c)]
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def report_on(specs):
    """The report on a results file of `specs`: (the finished process, report.md's text, the files it wrote)."""
    with tempfile.TemporaryDirectory() as tmp:
        path, output = os.path.join(tmp, "results.h5"), os.path.join(tmp, "report")
        write_results(path, specs)
        result = run_report(path, output)
        markdown = ""
        if os.path.isfile(os.path.join(output, "report.md")):
            with open(os.path.join(output, "report.md"), encoding="utf-8") as md:
                markdown = md.read()
        return result, markdown, sorted(os.listdir(output)) if os.path.isdir(output) else []


def section(markdown, heading):
    """The text of the Markdown section whose heading starts with `heading`, up to the next heading."""
    return markdown.split(f"\n## {heading}", 1)[1].split("\n## ", 1)[0]


def run_report(path, output, *extra):
    env = dict(os.environ, MPLBACKEND="Agg", MPLCONFIGDIR=os.path.join(os.path.dirname(output), "mplconfig"))
    return subprocess.run([sys.executable, REPORT, path, "-o", output, *extra], capture_output=True, text=True,
                          env=env, timeout=300)


def folder_contents(folder):
    """{name: SHA-256 of its bytes} of every file in `folder` (a folder in it: None)."""
    contents = {}
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isdir(path):
            contents[name] = None
        else:
            with open(path, "rb") as file:
                contents[name] = hashlib.sha256(file.read()).hexdigest()
    return contents


def png_size(path):
    """(width, height) of a PNG file, or None when it is not one."""
    with open(path, "rb") as png:
        head = png.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def report_module():
    """A fresh instance of the module under test (tests may replace its functions)."""
    spec = importlib.util.spec_from_file_location("report", REPORT)
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    return report


def saved_figures(report, results, output):
    """{file name: figure} of every figure report.write_figures writes into `output`, each as save() left it."""
    figures, save = {}, report.save

    def keep(figure, path, runs):
        save(figure, path, runs)
        figures[os.path.basename(path)] = figure
    report.save = keep
    report.write_figures(results, output)
    return figures


class ReportOnFile:
    """A report of the results file `specs()` describes, written once per class (mixed into a TestCase)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.path = os.path.join(cls.tmp.name, "results.h5")
        write_results(cls.path, cls.specs())
        cls.output = os.path.join(cls.tmp.name, "report")
        cls.result = run_report(cls.path, cls.output)
        with open(os.path.join(cls.output, "report.md"), encoding="utf-8") as md:
            cls.markdown = md.read()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_exits_cleanly(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr)
        self.assertEqual(self.result.stderr, "")


class ReportOnCompleteFile(ReportOnFile, unittest.TestCase):
    specs = staticmethod(run_specs)

    def test_writes_every_figure(self):
        names = ["predicted_vs_measured.png", "roofline.png"]
        # Named by the model's label ("<preset> (test)" here): two configurations of one preset are two models.
        names += [f"{kind}_{model}_test.png" for kind in ("speedup", "alpha", "breakdown") for model in MODELS]
        for name in names:
            with self.subTest(name=name):
                path = os.path.join(self.output, name)
                self.assertTrue(os.path.isfile(path))
                self.assertGreater(os.path.getsize(path), 10000)
                width, height = png_size(path)
                self.assertGreater(min(width, height), 200)
                self.assertIn(f"]({name})", self.markdown)

    def test_runs_table_follows_the_settings(self):
        # The file holds each system's contexts in turn; the table goes context by context.
        rows = [line.split("|")[1:-1] for line in section(self.markdown, "Runs").splitlines()
                if line.startswith("|")][2:]
        order = [(cells[0].strip(), cells[4].strip()) for cells in rows]
        labels = {"8192": "8K", "32768": "32K"}
        expected = sorted(order, key=lambda key: (key[0], [labels[str(c)] for c in CONTEXTS].index(key[1])))
        self.assertEqual(order, expected)

    def test_geomean_speedups(self):
        # A file without system_comparison: every run stands for its system.
        table = section(self.markdown, "System against system")
        for model in MODELS:
            # gpu-only did not fit at 32K: one point, and one left out.
            for baseline, points, left_out in (("gpu-only", 1, 1), ("ktransformers", 2, 0)):
                with self.subTest(model=model, baseline=baseline):
                    row = (f"| {model} (test) | writescope | {baseline} | {expected_geomean(model, baseline):.2f} | "
                           f"{points} | {left_out} |")
                    self.assertIn(row, table)

    def test_same_policy_from_complete_runs_expert_policy(self):
        # Old files recorded expert_policy on complete runs, so the same-policy table still has its row.
        table = section(self.markdown, "KV format and split alone (same expert policy")
        for model in MODELS:
            with self.subTest(model=model):
                expected = expected_geomean(model, "ktransformers")
                self.assertIn(f"| {model} (test) | writescope (ktransformers experts) | ktransformers | {expected:.2f} "
                              f"| 2 | 0 |", table)
        self.assertNotIn("gpu-only", table)  # not a baseline whose expert policy WriteScope runs

    def test_min_context_restricts_geomean(self):
        output = os.path.join(self.tmp.name, "report-32k")
        self.assertEqual(run_report(self.path, output, "--min-context", "32768").returncode, 0)
        with open(os.path.join(output, "report.md"), encoding="utf-8") as md:
            markdown = md.read()
        expected = expected_geomean(MODELS[0], "ktransformers", 32768)
        self.assertIn(f"| {MODELS[0]} (test) | writescope | ktransformers | {expected:.2f} | 1 | 0 |", markdown)
        self.assertIn(f"| {MODELS[0]} (test) | writescope | gpu-only | n/a | 0 | 1 |", markdown)

    def test_contexts_all_below_min_context_are_named_not_left_as_empty_rows(self):
        output = os.path.join(self.tmp.name, "report-64k")
        result = run_report(self.path, output, "--min-context", "65536")
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(output, "report.md"), encoding="utf-8") as md:
            markdown = md.read()
        for heading, subject, baselines in (("KV format and split alone", "writescope (ktransformers experts)",
                                             ("ktransformers",)),
                                            ("System against system", "writescope", ("gpu-only", "ktransformers"))):
            text = section(markdown, heading)
            self.assertNotIn("| n/a | 0 | 0 |", text)
            for model in MODELS:
                for baseline in baselines:
                    with self.subTest(heading=heading, model=model, baseline=baseline):
                        self.assertIn(f"- {model} (test): {subject} and {baseline} have runs only at contexts 8K, "
                                      "32K, below `--min-context` (64K); give a smaller `--min-context` to include "
                                      "them.", text)

    def test_lists_runs_that_did_not_fit(self):
        self.assertIn("did not fit", self.markdown)
        self.assertIn(NOT_FIT_REASON, self.markdown)
        section = self.markdown.split("## Not run / did not fit", 1)[1]
        self.assertEqual(section.count(NOT_FIT_REASON), len(MODELS) * REPETITIONS)

    def test_header(self):
        for text in ("report-test", "0123abcd", "test-machine"):
            self.assertIn(text, self.markdown)

    def test_prediction_error(self):
        self.assertIn("| writescope | 10.0% |", self.markdown)


class PredictionErrors(unittest.TestCase):
    """The attention prediction's error per system: the median over its steps of |predicted - measured| /
    measured, steps without a measured time left out (the report's data gives every step the same 10%)."""

    def test_median_of_relative_errors(self):
        from types import SimpleNamespace
        report = report_module()
        measured = np.array([1.0, 2.0, 4.0, 1.0, 0.0])
        predicted = np.array([1.1, 1.6, 6.0, 1.05, 3.0])  # 0.1, 0.2 (under), 0.5, 0.05; the last unmeasured
        runs = [SimpleNamespace(system="writescope", measured=SimpleNamespace(
                    attention_seconds=measured, predicted_attention_seconds=predicted)),
                SimpleNamespace(system="fiddler", measured=None)]
        errors = report.prediction_errors(runs)
        self.assertEqual(set(errors), {"writescope"})
        median, steps = errors["writescope"]
        self.assertAlmostEqual(median, 0.15)  # the mean would be 0.2125, the largest 0.5
        self.assertEqual(steps, 4)


class ReportOnVariants(ReportOnFile, unittest.TestCase):
    """WriteScope once per baseline expert policy plus once with its own (the current schema)."""

    specs = staticmethod(variant_specs)

    def test_throughputs_tell_pairings_apart(self):
        # The construction the other tests rely on: every wrong choice of WriteScope runs (another variant, or
        # all of them averaged) gives another number.
        choices = (("fiddler",), ("ktransformers",), ("hybrimoe",), ("fiddler", "ktransformers", "hybrimoe"))
        for model in MODELS:
            for baseline in ("fiddler", "ktransformers", "gpu-only"):
                numbers = [f"{variant_geomean(model, policies, baseline):.2f}" for policies in choices]
                self.assertEqual(len(set(numbers)), len(choices), numbers)

    def test_same_policy_table(self):
        table = section(self.markdown, "KV format and split alone (same expert policy")
        self.assertIn("only the KV placement and the attention split differ", table)
        for model in MODELS:
            for baseline in ("fiddler", "ktransformers"):
                with self.subTest(model=model, baseline=baseline):
                    expected = variant_geomean(model, (baseline,), baseline)
                    self.assertIn(f"| {model} (test) | writescope ({baseline} experts) | {baseline} | {expected:.2f} "
                                  f"| 2 | 0 |", table)
        # No hybrimoe baseline ran, and gpu-only's expert policy is not one WriteScope runs.
        self.assertNotIn("hybrimoe", table)
        self.assertNotIn("gpu-only", table)

    def test_system_table_uses_system_comparison_runs(self):
        table = section(self.markdown, "System against system")
        for model in MODELS:
            for baseline, points in (("fiddler", 2), ("ktransformers", 2), ("gpu-only", 1)):
                with self.subTest(model=model, baseline=baseline):
                    expected = variant_geomean(model, ("hybrimoe",), baseline)
                    self.assertIn(f"| {model} (test) | writescope | {baseline} | {expected:.2f} | {points} | "
                                  f"{2 - points} | hybrimoe |", table)

    def test_runs_table_names_expert_policy_and_memory(self):
        tps = variant_tps(MODELS[0], "writescope", "fiddler", 8192, 0)
        self.assertIn(f"| {MODELS[0]} (test) | writescope (fiddler experts) | {BATCH} | 24 | 8K | 0 | complete | "
                      f"{tps:.2f} | {PINNED_GIB} | {HOST_GIB} |", self.markdown)
        # An incomplete run has no pinned_bytes or host_bytes: blank cells.
        self.assertIn(f"| {MODELS[0]} (test) | gpu-only | {BATCH} | 24 | 32K | 0 | does not fit | "
                      f"{NOT_FIT_REASON} |  |  |", self.markdown)


PROJECTED = "Projected (not measured)"
PROFILE_SCALE = {"a100-pcie4": 1.0, "v100-pcie3": 0.6}  # WriteScope's tokens/s relative to the baselines'


class ProjectedReport(ReportOnFile, unittest.TestCase):
    """A `writescope predict` file: every run priced on two GPU profiles."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.path = os.path.join(cls.tmp.name, "projected.h5")
        write_results(cls.path, cls.specs(), predicted=True)
        cls.output = os.path.join(cls.tmp.name, "report")
        cls.result = run_report(cls.path, cls.output)
        with open(os.path.join(cls.output, "report.md"), encoding="utf-8") as md:
            cls.markdown = md.read()

    @staticmethod
    def specs():
        specs = []
        for profile, scale in PROFILE_SCALE.items():
            for spec in variant_specs():
                spec = dict(spec, predicted=1, profile=profile)
                if "tokens_per_second" in spec and spec["system"] == "writescope":
                    spec["tokens_per_second"] *= scale
                specs.append(spec)
        return specs

    def expected_speedup(self, model, profile):
        """WriteScope (its own expert policy) over the fastest other system, geometric mean over contexts."""
        def mean(system, policy, context):
            scale = PROFILE_SCALE[profile] if system == "writescope" else 1.0
            return scale * np.mean([variant_tps(model, system, policy, context, r) for r in range(REPETITIONS)])
        ratios = []
        for c in CONTEXTS:
            best = max(mean(system, policy, c) for system, policy, comparison in VARIANTS
                       if system != "writescope" and not does_not_fit(system, c))
            ratios.append(mean("writescope", "hybrimoe", c) / best)
        return math.exp(sum(math.log(r) for r in ratios) / len(ratios))

    def test_exits_cleanly(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr)

    def test_every_heading_says_projected(self):
        headings = [line for line in self.markdown.splitlines() if line.startswith("#")]
        self.assertGreater(len(headings), 5)
        for heading in headings:
            self.assertIn(PROJECTED, heading)

    def test_speedup_over_the_best_baseline_beside_the_paper(self):
        rows = {}
        for line in section(self.markdown, f"{PROJECTED}: speedup over the best baseline").splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) == 7 and cells[0] in PROFILE_SCALE:
                rows[cells[0], cells[1]] = cells
        self.assertEqual(len(rows), len(PROFILE_SCALE) * len(MODELS))
        for (profile, model), cells in rows.items():
            self.assertEqual(model, f"{model.split(' on ')[0]} on {profile}")
            base = model.split(" (test)")[0]
            self.assertAlmostEqual(float(cells[2]), self.expected_speedup(base, profile), places=2)
            self.assertEqual(cells[5], "0")  # no system failed
            self.assertEqual(cells[6], "1.5–2.5×" if profile.startswith("a100") else "1.4–1.7×")
        # Beside the paper's claim the table says that neither column is a measurement.
        self.assertIn("Neither column was measured here.",
                      section(self.markdown, f"{PROJECTED}: speedup over the best baseline"))

    def test_a_projection_without_writescope_or_with_only_it_says_so(self):
        for kept, message in ((lambda system: system != "writescope", "The runs hold no writescope runs: nothing to "
                                                                       "compare."),
                              (lambda system: system == "writescope", "writescope is the only system in the runs: "
                                                                       "nothing to compare it with.")):
            with self.subTest(message=message), tempfile.TemporaryDirectory() as tmp:
                path, output = os.path.join(tmp, "projected.h5"), os.path.join(tmp, "report")
                write_results(path, [spec for spec in self.specs() if kept(spec["system"])], predicted=True)
                result = run_report(path, output)
                self.assertEqual(result.returncode, 0, result.stderr)
                with open(os.path.join(output, "report.md"), encoding="utf-8") as md:
                    text = section(md.read(), f"{PROJECTED}: speedup over the best baseline")
                self.assertIn(message, text)

    def test_each_profile_says_what_its_figures_rest_on(self):
        text = section(self.markdown, f"{PROJECTED}: what the profiles' figures rest on")
        for profile in PROFILE_SCALE:
            self.assertIn(f"- `{profile}`: cpu: assumed: dram_read_gbps: 1 fma_glanes: 2", text)

    def test_no_figure_calls_a_projection_measured(self):
        report = report_module()
        with tempfile.TemporaryDirectory() as tmp:
            figures = saved_figures(report, report.load(self.path), tmp)
        for name, figure in figures.items():
            texts = [figure._suptitle.get_text() if figure._suptitle else ""]
            for ax in figure.axes:
                texts += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
            for text in texts:
                with self.subTest(figure=name, text=text):
                    self.assertNotIn("measured", text.replace("not measured", ""))

    def test_one_projected_speedup_figure_per_profile_and_no_measurement_figures(self):
        for profile in PROFILE_SCALE:
            self.assertIsNotNone(png_size(os.path.join(self.output, f"projected_speedup_{profile}.png")))
        self.assertFalse(os.path.exists(os.path.join(self.output, "predicted_vs_measured.png")))
        self.assertNotIn("prediction error", self.markdown.lower())

    def test_contexts_all_below_min_context_are_named_not_called_missing(self):
        output = os.path.join(self.tmp.name, "report-64k")
        result = run_report(self.path, output, "--min-context", "65536")
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(output, "report.md"), encoding="utf-8") as md:
            text = section(md.read(), f"{PROJECTED}: speedup over the best baseline")
        self.assertNotIn("No setting where", text)
        # Each model left out of the table is named, on each profile.
        for model in MODELS:
            for profile in PROFILE_SCALE:
                self.assertIn(f"- {model} (test) on {profile}: writescope and another system both "
                              "fit only at contexts 8K, 32K, below `--min-context` (64K); give a smaller "
                              "`--min-context` to include them.", text)

    def test_the_roofline_has_a_projected_panel_per_profile(self):
        report = report_module()
        with tempfile.TemporaryDirectory() as tmp:
            axes = saved_figures(report, report.load(self.path), tmp)["roofline.png"].axes
        self.assertEqual([ax.get_title() for ax in axes],
                         [f"{PROJECTED}: Attention roofline of machine profile '{name}'" for name in PROFILE_RATES])
        for ax, (name, (hbm, pinned, dram, fma)) in zip(axes, PROFILE_RATES.items()):
            with self.subTest(profile=name):
                labels = [line.get_label() for line in ax.get_lines()]
                for rate in (f"CPU: min({dram:.4g} GB/s DRAM, {fma:.4g} G multiply-add/s ÷ I)",
                             f"PCIe pinned host→GPU {pinned:.4g} GB/s", f"GPU HBM {hbm:.4g} GB/s"):
                    self.assertIn(rate, labels)
                # Each panel's points are the runs priced on its profile, every model's.
                priced_on = {label.split(":")[0] for label in labels if " (test) on " in label}
                self.assertEqual(priced_on, {f"{model} (test) on {name}" for model in MODELS})
        self.assertIn("- [roofline.png](roofline.png): Roofline of each machine profile ('a100-pcie4', 'v100-pcie3'), "
                      "one panel each,", self.markdown)

    def test_runs_of_two_profiles_are_never_compared(self):
        # Each model appears once per profile in the system table, never pooled across machines.
        table = section(self.markdown, f"{PROJECTED}: system against system")
        for profile in PROFILE_SCALE:
            self.assertIn(f"on {profile}", table)

    def test_the_headline_follows_the_gpu_not_the_cpu_profile(self):
        report = report_module()
        self.assertEqual(report.paper_headline("v100-pcie3+cpu:a100-pcie4"), "1.4–1.7×")
        self.assertEqual(report.paper_headline("a100-pcie4+cpu:vm"), "1.5–2.5×")
        self.assertEqual(report.paper_headline("h200-pcie5"), "—")

    def test_a_file_mixing_predicted_and_measured_runs_is_refused(self):
        path = os.path.join(self.tmp.name, "mixed.h5")
        specs = variant_specs()
        specs[0] = dict(specs[0], predicted=1, profile="a100-pcie4")
        write_results(path, specs)
        result = run_report(path, os.path.join(self.tmp.name, "mixed-report"))
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("mixes predicted runs", result.stderr)
        self.assertNotIn("Traceback", result.stderr)


class EarlierReportInTheFolder(unittest.TestCase):
    """A report written over an earlier one removes the files the earlier one's manifest lists, and no others."""

    MANIFEST = ".writescope-report-files"
    LEFT = "files with the report's names as they were, since no .writescope-report-files says this script wrote them"

    @classmethod
    def setUpClass(cls):
        """A measured and a projected results file, and the files each one's report writes into a folder of its own
        (`fresh`, the manifest among them)."""
        cls.tmp = tempfile.TemporaryDirectory()
        cls.measured, cls.projected = (os.path.join(cls.tmp.name, name) for name in ("measured.h5", "projected.h5"))
        write_results(cls.measured, run_specs())
        write_results(cls.projected, ProjectedReport.specs(), predicted=True)
        cls.fresh = {}
        for path in (cls.measured, cls.projected):
            if run_report(path, path[:-3]).returncode != 0:
                raise AssertionError(f"no report of {path}")
            cls.fresh[path] = set(os.listdir(path[:-3]))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def folder(self, name, files=()):
        """A new folder `name` holding `files`, each a file that is not the report's."""
        output = os.path.join(self.tmp.name, name)
        os.makedirs(output)
        for file in files:
            with open(os.path.join(output, file), "w") as other:
                other.write("not the report's\n")
        return output

    def report(self, path, output):
        result = run_report(path, output)
        self.assertEqual(result.returncode, 0, result.stderr)
        return result.stdout

    def test_fresh_reports_differ_and_list_what_they_wrote(self):
        self.assertTrue(any(name.startswith("projected_speedup_") for name in self.fresh[self.projected]))
        self.assertIn("predicted_vs_measured.png", self.fresh[self.measured])
        for path, names in self.fresh.items():
            with self.subTest(path=os.path.basename(path)):
                with open(os.path.join(path[:-3], self.MANIFEST)) as listing:
                    lines = listing.read().splitlines()
                self.assertTrue(lines[0].startswith("# "))
                self.assertEqual(sorted(lines[1:]), sorted(names - {self.MANIFEST}))

    def test_measured_and_projected_reports_over_each_other(self):
        others = {"notes.txt", "speedup_notes.txt", "roofline.png.bak", "my_plot.png", "results.h5"}
        output = self.folder("report", others)
        os.makedirs(os.path.join(output, "alpha_folder.png"))  # a folder, whatever its name
        others.add("alpha_folder.png")
        earlier = set()
        for path in (self.projected, self.measured, self.projected):
            with self.subTest(path=os.path.basename(path)):
                stdout = self.report(path, output)
                self.assertEqual(set(os.listdir(output)), self.fresh[path] | others)
                stale = sorted(earlier - self.fresh[path])
                if stale:
                    self.assertEqual(stdout, f"report: {output}: removed {len(stale)} files of an earlier report that "
                                             f"this one does not write: {', '.join(stale)}\n")
                else:
                    self.assertEqual(stdout, "")
                earlier = self.fresh[path]

    def test_a_users_file_with_a_reports_name_stays(self):
        output = self.folder("report-mine", ["speedup_mine.png"])
        self.report(self.projected, output)
        stdout = self.report(self.measured, output)
        self.assertEqual(set(os.listdir(output)), self.fresh[self.measured] | {"speedup_mine.png"})
        with open(os.path.join(output, "speedup_mine.png")) as mine:
            self.assertEqual(mine.read(), "not the report's\n")
        self.assertNotIn("speedup_mine.png", stdout)

    def test_a_folder_without_a_manifest_keeps_its_report_like_files_and_says_why(self):
        # A report from before manifests, and a user's file beside it.
        output = self.folder("report-old", ["speedup_mine.png"])
        self.report(self.projected, output)
        os.remove(os.path.join(output, self.MANIFEST))
        stdout = self.report(self.measured, output)
        self.assertEqual(set(os.listdir(output)),
                         self.fresh[self.projected] | self.fresh[self.measured] | {"speedup_mine.png"})
        left = sorted((self.fresh[self.projected] - self.fresh[self.measured]) | {"speedup_mine.png"})
        self.assertEqual(stdout, f"report: {output}: left {len(left)} {self.LEFT}: {', '.join(left)}\n")

    def test_only_plain_report_files_the_manifest_lists_are_removed(self):
        output = self.folder("nested/report", ["notes.txt", "breakdown_old.png"])
        os.makedirs(os.path.join(output, "alpha_folder.png"))
        outside = os.path.join(self.tmp.name, "nested", "report.md")
        with open(outside, "w") as other:
            other.write("not the report's\n")
        os.symlink(outside, os.path.join(output, "speedup_link.png"))
        with open(os.path.join(output, self.MANIFEST), "w") as listing:
            listing.write("# an earlier report's\nnotes.txt\n../report.md\nalpha_folder.png\nspeedup_link.png\n"
                          "breakdown_old.png\n")
        stdout = self.report(self.measured, output)
        self.assertEqual(set(os.listdir(output)),
                         self.fresh[self.measured] | {"notes.txt", "alpha_folder.png", "speedup_link.png"})
        self.assertTrue(os.path.isfile(outside))
        self.assertEqual(stdout, f"report: {output}: removed 1 files of an earlier report that this one does not "
                                 "write: breakdown_old.png\n")

    def test_a_report_that_fails_partway_leaves_the_earlier_one_as_it_was(self):
        # A projected report whose roofline finds the disk full, over a measured one: nothing of the measured
        # report may go, and no projected figure may stay for the next report to leave beside its own.
        output = self.folder("report-failed")
        self.report(self.measured, output)
        before = folder_contents(output)
        report = report_module()

        def disk_full(*_):
            raise OSError(28, "No space left on device")
        report.plot_roofline = disk_full
        with contextlib.redirect_stderr(io.StringIO()) as stderr:
            self.assertEqual(report.main([self.projected, "-o", output]), 1)
        self.assertEqual(stderr.getvalue(), f"report: {output}: No space left on device\n")
        self.assertEqual(folder_contents(output), before)
        self.assertEqual(self.report(self.measured, output), "")
        self.assertEqual(set(os.listdir(output)), self.fresh[self.measured])

    def test_a_report_stopped_while_moving_in_leaves_no_file_the_next_would_keep(self):
        # A projected report over a measured one, stopped (Ctrl-C) as it moves report.md in: the folder's list
        # names both reports' files, so the next measured report leaves exactly its own.
        output = self.folder("report-stopped")
        self.report(self.measured, output)
        report = report_module()
        replace = os.replace

        def stopped_at_report_md(source, target):
            if os.path.basename(target) == "report.md":
                raise KeyboardInterrupt
            replace(source, target)
        report.os.replace = stopped_at_report_md
        try:
            with self.assertRaises(KeyboardInterrupt), contextlib.redirect_stderr(io.StringIO()):
                report.main([self.projected, "-o", output])
        finally:
            report.os.replace = replace
        self.assertTrue(any(name.startswith("projected_speedup_") for name in os.listdir(output)))
        self.assertIn("removed 14 files of an earlier report that this one does not write: ",
                      self.report(self.measured, output))
        self.assertEqual(set(os.listdir(output)), self.fresh[self.measured])

    def test_every_name_goes_through_the_list_of_the_reports_files(self):
        report = report_module()
        self.assertTrue(report.own_file("speedup_qwen3-30b-a3b_on_a100-pcie4-2.png"))
        for name in ("speedup_notes.txt", "roofline.png.bak", "my_plot.png", "speedup_.png", "sub/report.md",
                     report.MANIFEST):
            with self.subTest(name=name):
                self.assertFalse(report.own_file(name))
                with self.assertRaises(ValueError):
                    report.output_path("out", name)


HOST_ONLY_MACHINE = 'cpu_model: Test CPU\nhost_threads: 2\ngpu_name: ""\n'
GPU_MACHINE = 'cpu_model: Test CPU\nhost_threads: 16\ngpu_name: NVIDIA H200\n'


class HostOnlyNoteInFigures(unittest.TestCase):
    """A figure of measured runs from a host-only build says so in the image, as report.md's summary does: a PNG
    shown alone is not taken for GPU results. Projections and GPU runs carry no such note."""

    def notes(self, edit, specs=run_specs, predicted=False):
        """{figure file name: its host-only notes} of the report of `specs()` after `edit(root)`."""
        report = report_module()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "results.h5")
            write_results(path, specs(), predicted=predicted)
            with h5py.File(path, "r+") as root:
                edit(root)
            figures = saved_figures(report, report.load(path), tmp)
        self.assertIn("roofline.png", figures)
        return {name: [text.get_text() for text in figure.texts if "host-only" in text.get_text().lower()]
                for name, figure in figures.items()}

    def assert_every_figure_noted(self, notes):
        self.assertIn("predicted_vs_measured.png", notes)
        for name, texts in notes.items():
            with self.subTest(figure=name):
                self.assertEqual(texts, ["Host-only build: the systems' GPU work ran on the host. These are not GPU "
                                         "measurements."])

    def test_a_machine_setup_without_gpu(self):
        self.assert_every_figure_noted(self.notes(lambda root: root.attrs.update(machine=HOST_ONLY_MACHINE)))

    def test_a_profile_without_gpu(self):
        self.assert_every_figure_noted(self.notes(lambda root: root["profile"].attrs.update(has_gpu=np.int64(0))))

    def test_a_figure_notes_the_host_only_runs_it_shows(self):
        def edit(root):
            root.attrs["machine"] = HOST_ONLY_MACHINE
            for group in root["runs"].values():
                if group.attrs["system"] == "writescope":
                    group.attrs["machine"] = GPU_MACHINE
        notes = self.notes(edit)
        shown = sum(spec["model"] == MODELS[0] for spec in run_specs())
        host_only = shown - sum(spec["model"] == MODELS[0] and spec["system"] == "writescope" for spec in run_specs())
        # Runs of two setups are never compared, so no speedup figure; the breakdown draws on every run of a model.
        self.assertEqual(notes[f"breakdown_{MODELS[0]}_test.png"],
                         [f"{host_only} of the {shown} runs this figure draws on came from a host-only build (their "
                          "GPU work ran on the host): not GPU measurements."])
        self.assertEqual(notes[f"alpha_{MODELS[0]}_test.png"], [])  # writescope's runs only, all on the GPU machine

    def test_gpu_runs_and_projections_carry_none(self):
        for predicted in (False, True):
            with self.subTest(predicted=predicted):
                # A projection run on a host-only machine still prices GPU profiles: no run of it was measured.
                notes = self.notes(lambda root: root.attrs.update(machine=GPU_MACHINE if not predicted
                                                                  else HOST_ONLY_MACHINE),
                                   specs=ProjectedReport.specs if predicted else run_specs, predicted=predicted)
                self.assertEqual({name: texts for name, texts in notes.items() if texts}, {})


class GroupNamesAreOpaque(unittest.TestCase):
    def test_renamed_groups_give_the_same_report(self):
        for specs in (run_specs(), variant_specs()):
            with self.subTest(variants="system_comparison" in specs[0]):
                self.assert_same_report(specs)

    def assert_same_report(self, specs):
        with tempfile.TemporaryDirectory() as tmp:
            plain, renamed = os.path.join(tmp, "plain.h5"), os.path.join(tmp, "renamed.h5")
            write_results(plain, specs)
            # Misleading names, in reverse order: a group named after one run holds another.
            names = [f"{s['system']}-{s['context']}-{i}" for i, s in enumerate(specs)]
            write_results(renamed, specs[::-1], names=names)
            reports = []
            for path in (plain, renamed):
                output = path[:-3]
                result = run_report(path, output)
                self.assertEqual(result.returncode, 0, result.stderr)
                with open(os.path.join(output, "report.md"), encoding="utf-8") as md:
                    # The one line that names the file read.
                    reports.append(md.read().replace(f"`{os.path.abspath(path)}`", "`results file`"))
            self.assertEqual(reports[0], reports[1])


class ReportWithoutCompleteRuns(unittest.TestCase):
    def test_writes_summary_only(self):
        # Incomplete, so without expert_policy as the earlier harness wrote them.
        specs = [dict(s, status="does_not_fit", reason=NOT_FIT_REASON) for s in run_specs()[:3]]
        for spec in specs:
            del spec["expert_policy"]
        result, markdown, files = report_on(specs)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("No run completed", markdown)
        # With no speedup figure, nothing is said to be marked in one.
        self.assertIn("listed under [Not run / did not fit](#not-run--did-not-fit).", markdown)
        self.assertNotIn("in the speedup figures", markdown)
        # writescope runs without expert_policy (incomplete, old file): unknown, so left out and said so.
        self.assertIn("3 writescope runs do not record their expert policy", markdown)
        self.assertFalse([name for name in files if name.startswith(("speedup_", "alpha_"))])


class DamagedRuns(unittest.TestCase):
    """Runs whose contents no longer match their checksum are left out and named; runs without one are counted."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.path, self.output = os.path.join(self.tmp.name, "results.h5"), os.path.join(self.tmp.name, "report")

    def tearDown(self):
        self.tmp.cleanup()

    def report_of(self, edit):
        """The report of a file whose runs all carry checksums but the last (older than checksums), after `edit`."""
        sys.path.insert(0, os.path.dirname(REPORT))
        import report  # noqa: E402  (the module under test, for its checksum)
        write_results(self.path, run_specs())
        with h5py.File(self.path, "r+") as root:
            runs = root["runs"]
            for name in list(runs)[:-1]:
                runs[name].attrs["checksum"] = report.results_checksum(runs[name])
            edit(root)
        result = run_report(self.path, self.output)
        self.assertEqual(result.returncode, 0, result.stderr)
        return result

    def test_flags_damaged_runs(self):
        def damage(root):
            root["runs"]["r0"].attrs["context"] = np.int64(12345)

        result = self.report_of(damage)
        self.assertIn("/runs/r0: checksum mismatch", result.stderr)
        with open(os.path.join(self.output, "report.md"), encoding="utf-8") as md:
            markdown = md.read()
        self.assertIn("**1 damaged runs left out**", markdown)
        self.assertIn("1 runs carry no checksum", markdown)
        self.assertIn("`/runs/r0`: checksum mismatch", section(markdown, "Damaged runs"))
        self.assertNotIn("12345", markdown)

    def test_a_run_that_lost_its_checksum_is_damaged(self):
        # A file with config_canonical comes from a build that gives every run a checksum.
        def from_a_checksumming_build(root):
            root.attrs["config_canonical"] = "name: test\n"

        result = self.report_of(from_a_checksumming_build)
        with h5py.File(self.path, "r") as root:
            last = list(root["runs"])[-1]
        self.assertIn(f"/runs/{last}: no checksum, though the build that wrote this file gives every run one",
                      result.stderr)


def crashes_the_hdf5_library(path):
    """Whether reading everything in the file at `path` with plain h5py calls crashes the HDF5 library (in a
    child process with 1 GiB more address space than it holds, so that a damaged length fails instead of
    copying gigabytes; a loop in the library is not a crash)."""
    child = os.fork()
    if child == 0:
        try:
            import resource
            with open("/proc/self/statm") as statm:
                pages = int(statm.read().split()[0])
            limit = pages * os.sysconf("SC_PAGE_SIZE") + (1 << 30)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            signal.alarm(10)
            with h5py.File(path, "r") as root:
                report_module()._read_everything(root)  # the reads of the report's own scan, without the scan
        finally:
            os._exit(0)
    _, status = os.waitpid(child, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) != signal.SIGALRM


class DamageThatCrashesTheHdf5Library(unittest.TestCase):
    """A run damaged so that reading it crashes the HDF5 library is left out and named, as a checksum mismatch
    is; such damage outside the runs is one error naming it."""

    def test_a_crashing_run_is_left_out(self):
        with tempfile.TemporaryDirectory() as tmp:
            path, damaged_path = os.path.join(tmp, "results.h5"), os.path.join(tmp, "damaged.h5")
            write_results(path, run_specs()[:2])
            with h5py.File(path, "r") as root:
                header = h5py.h5o.get_info(root["runs"]["r0"].id).addr
            with open(path, "rb") as intact:
                original = intact.read()
            report = report_module()
            # 4-byte fields of the run's object header and what follows it, made huge.
            for at in range(header, min(len(original), header + 4096) - 4, 4):
                with open(damaged_path, "wb") as damaged:
                    damaged.write(original[:at] + b"\xff\xff\xff\x7f" + original[at + 4:])
                if not crashes_the_hdf5_library(damaged_path):
                    continue
                try:
                    crashing = report.crashing_objects(damaged_path)
                except report.InputError as error:
                    self.assertIn("is damaged so that the HDF5 library crashes reading", str(error))
                    continue
                if "/runs/r0" not in crashing:
                    continue
                result = run_report(damaged_path, os.path.join(tmp, "report"))
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertIn("/runs/r0: unreadable (the HDF5 library crashes reading it); left out of the report",
                              result.stderr)
                return
            self.skipTest("this HDF5 library crashes on no damage of the run's header tried")


class Provenance(unittest.TestCase):
    """The header names the builds and machine setups of the runs, each run's own where it records one."""

    def report_of(self, edit):
        with tempfile.TemporaryDirectory() as tmp:
            path, output = os.path.join(tmp, "results.h5"), os.path.join(tmp, "report")
            write_results(path, run_specs())
            with h5py.File(path, "r+") as root:
                edit(root)
            result = run_report(path, output)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(os.path.join(output, "report.md"), encoding="utf-8") as md:
                return md.read()

    def test_one_revision_and_machine(self):
        def edit(root):
            root.attrs["machine"] = 'cpu_model: Test CPU\nopenmp_environment: |\n  OMP_NUM_THREADS=2\n' \
                                    'host_threads: 16\ngpu_name: NVIDIA H200\n'
        markdown = self.report_of(edit)
        self.assertIn("- Git revision: `0123abcd`", markdown)
        self.assertIn("- Machine: Test CPU, 16 host threads, GPU NVIDIA H200", markdown)
        self.assertNotIn("host-only build", markdown)

    def test_runs_of_two_revisions_are_flagged(self):
        def edit(root):
            for name in ("r0", "r1", "r2"):
                root["runs"][name].attrs["git_revision"] = "feedbeef0001-dirty"
        markdown = self.report_of(edit)
        self.assertIn("**Runs of 2 git revisions**", markdown)
        self.assertIn("`feedbeef0001-dirty` (3 runs)", markdown)
        self.assertIn(f"`0123abcd` ({len(run_specs()) - 3} runs)", markdown)
        self.assertIn("**Built from a modified tree**", markdown)
        # A build since revisions name their modification (cmake/GitRevision.cmake).
        markdown = self.report_of(lambda root: root["runs"]["r0"].attrs.update(
            git_revision="feedbeef0001-dirty-0a1b2c3d4e5f"))
        self.assertIn("**Built from a modified tree**", markdown)

    def test_a_profile_without_gpu_says_what_its_runs_cannot_show(self):
        markdown = self.report_of(lambda root: root["profile"].attrs.update(has_gpu=np.int64(0)))
        self.assertIn("**The machine profile has no GPU**", markdown)
        self.assertIn("**WriteScope does not split here**", markdown)
        systems = sorted({spec["system"] for spec in run_specs()} - {"writescope", "moe-lightning"})
        self.assertIn(f"**The budgets are not equal here**: {', '.join(systems)} kept", markdown)

    def test_a_host_only_build_is_flagged_although_the_profile_has_a_gpu(self):
        def edit(root):
            root.attrs["machine"] = 'cpu_model: Test CPU\nhost_threads: 2\ngpu_name: ""\n'
            root["runs"]["r0"].attrs["machine"] = 'cpu_model: Test CPU\nhost_threads: 2\ngpu_name: NVIDIA H200\n'
        markdown = self.report_of(edit)
        self.assertIn(f"**{len(run_specs()) - 1} runs came from a host-only build**", markdown)
        self.assertIn("**Runs of 2 machine setups**", markdown)
        self.assertIn(f"`Test CPU, 2 host threads, no GPU (a host-only build)` ({len(run_specs()) - 1} runs)",
                      markdown)


    def test_what_reproduces_the_runs_is_in_the_report(self):
        """The results file, the experiment's config and the build and thread setup, measured or projected."""
        machine = ('cpu_model: Test CPU\ncpu_path: avx2\nhost_threads: 16\nopenmp_environment: |\n  '
                   'OMP_NUM_THREADS=16\n  OMP_PROC_BIND=spread\ngpu_name: NVIDIA H200\ncompiler: GNU 12.2.0\n'
                   'build_type: Release\n')
        for predicted in (False, True):
            with self.subTest(predicted=predicted), tempfile.TemporaryDirectory() as tmp:
                path, output = os.path.join(tmp, "results.h5"), os.path.join(tmp, "report")
                write_results(path, ProjectedReport.specs() if predicted else run_specs(), predicted=predicted)
                with h5py.File(path, "r+") as root:
                    root.attrs.update(machine=machine, config="# the sweep\nname: report-test\n")
                result = run_report(path, output)
                self.assertEqual(result.returncode, 0, result.stderr)
                with open(os.path.join(output, "report.md"), encoding="utf-8") as md:
                    markdown = md.read()
                self.assertIn(f"- Results file: `{os.path.abspath(path)}`\n", markdown)
                self.assertIn("- Build and threads: build_type `Release`, compiler `GNU 12.2.0`, cpu_path `avx2`, "
                              "openmp_environment `OMP_NUM_THREADS=16; OMP_PROC_BIND=spread`\n", markdown)
                heading = f"{PROJECTED}: experiment config" if predicted else "Experiment config"
                self.assertIn("The experiment's YAML as written (root attribute `config`):\n\n```yaml\n# the sweep\n"
                              "name: report-test\n```", section(markdown, heading))

    def test_runs_the_file_planned_but_lacks_are_counted(self):
        def edit(root):
            root.attrs["planned_runs"] = np.int64(len(run_specs()) + 3)
            root.attrs["shard"] = "1/3"
        markdown = self.report_of(edit)
        self.assertIn(f"**3 of the {len(run_specs()) + 3} planned runs are not in the file**", markdown)
        self.assertIn("**Shard 1/3** of the experiment", markdown)

        def complete(root):
            root.attrs["planned_runs"] = np.int64(len(run_specs()))
        markdown = self.report_of(complete)
        self.assertNotIn("planned runs are not in the file", markdown)
        self.assertNotIn("Shard", markdown)

    def test_a_file_of_complete_runs_that_lacks_planned_ones_says_so_under_not_run(self):
        with tempfile.TemporaryDirectory() as tmp:
            path, output = os.path.join(tmp, "results.h5"), os.path.join(tmp, "report")
            specs = [spec for spec in run_specs() if "tokens_per_second" in spec]
            write_results(path, specs)
            with h5py.File(path, "r+") as root:
                root.attrs["planned_runs"] = np.int64(len(specs) + 2)
            result = run_report(path, output)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(os.path.join(output, "report.md"), encoding="utf-8") as md:
                text = section(md.read(), "Not run")
        self.assertIn("Every run in the file completed; 2 planned runs are not in it (see the summary).", text)

    def test_runs_of_two_setups_are_never_compared(self):
        """A merge with --allow-different-machine can hold WriteScope's runs from one setup and the baselines'
        from another (here a Debug against a Release build): no speedup pairs them."""
        release = 'cpu_model: Test CPU\nhost_threads: 16\ngpu_name: NVIDIA H200\nbuild_type: Release\n'

        def edit(root):
            root.attrs["machine"] = release
            for name, group in root["runs"].items():
                if group.attrs["system"] == "writescope":
                    group.attrs["machine"] = release.replace("Release", "Debug")
        markdown = self.report_of(edit)
        writescope_runs = sum(spec["system"] == "writescope" for spec in run_specs())
        self.assertIn("**Runs of 2 machine setups**", markdown)
        self.assertIn(f"setup 1: `Test CPU, 16 host threads, GPU NVIDIA H200` ({writescope_runs} runs); setup 2: "
                      f"`Test CPU, 16 host threads, GPU NVIDIA H200` ({len(run_specs()) - writescope_runs} runs)",
                      markdown)
        self.assertIn("they differ in `build_type`. Every figure and table compares runs of one setup only.",
                      markdown)
        report = report_module()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "results.h5")
            write_results(path, run_specs())
            with h5py.File(path, "r+") as root:
                edit(root)
            runs = report.load(path).runs
        rows = report.geomean_rows(runs, 0)
        self.assertTrue(rows)
        for model, subject, baseline, mean, points, left_out, _ in rows:
            self.assertEqual((subject, mean, points, left_out), ("writescope", None, 0, 0), (model, baseline))


    def test_runs_of_other_host_attention_choices_are_another_setup(self):
        """Each process measures its CPU attention's choices per model: runs of a resume that took others (4-30%
        apart) are another setup, never compared with the file's."""
        machine = 'cpu_model: Test CPU\nhost_threads: 16\ngpu_name: NVIDIA H200\nhost_attention_choices: |\n  {}\n'

        def edit(root):
            root.attrs["machine"] = machine.format("m: head-major avx512_bf16, next pass into l2, passes of 64 tokens")
            for name, group in root["runs"].items():
                if group.attrs["system"] == "writescope":
                    group.attrs["machine"] = machine.format(
                        "m: head-major avx512_bf16, next pass into l1, passes of 32 tokens")
        markdown = self.report_of(edit)
        self.assertIn("**Runs of 2 machine setups**", markdown)
        self.assertIn("they differ in `host_attention_choices`.", markdown)


class ResultsFileBeingWritten(unittest.TestCase):
    def test_a_writers_lock_is_warned_of(self):
        """`writescope run` holds <results>.lock while it writes: runs missing from the report may still come."""
        with tempfile.TemporaryDirectory() as tmp:
            path, output = os.path.join(tmp, "results.h5"), os.path.join(tmp, "report")
            write_results(path, run_specs())
            with open(path + ".lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                result = run_report(path, output)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertEqual(result.stderr, f"report: {path}: another process is writing this results file ({path}"
                                            ".lock is locked): runs missing from the report may still come\n")
            with open(os.path.join(output, "report.md"), encoding="utf-8") as md:
                self.assertIn("- **The file was still being written** (its `.lock` was held): runs missing here may "
                              "still come; report again when the sweep is done.", section(md.read(), "Summary"))
            result = run_report(path, output)  # the writer is gone
            self.assertEqual((result.returncode, result.stderr), (0, ""))


class RooflineFigure(unittest.TestCase):
    def test_the_band_rate_is_drawn_where_the_profile_gives_one(self):
        """A square for the band's own rate (qwen3 here); none for runs of files written before it."""
        report = report_module()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "results.h5")
            write_results(path, run_specs())
            results = report.load(path)
            figures = []
            report.save = lambda figure, *_: figures.append(figure)
            report.plot_roofline([(results.profile, report.complete(results.runs))], os.path.join(tmp, "roofline.png"))
        labels = [line.get_label() for line in figures[0].axes[0].get_lines()]
        self.assertIn("qwen3-30b-a3b (test): 7 GB/s in the profile", labels)
        self.assertIn("qwen3-30b-a3b (test): 6 GB/s over the pinned band in the profile", labels)
        self.assertIn("mixtral-8x7b (test): 9.5 GB/s in the profile", labels)
        self.assertFalse([label for label in labels if label.startswith("mixtral-8x7b") and "band" in label], labels)


    def test_runs_of_two_setups_are_drawn_apart(self):
        """Each setup's runs reach their own rate: one point per setup and model, never a mean over both."""
        release = 'cpu_model: Test CPU\nhost_threads: 16\ngpu_name: NVIDIA H200\nbuild_type: Release\n'
        report = report_module()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "results.h5")
            write_results(path, run_specs())
            with h5py.File(path, "r+") as root:
                root.attrs["machine"] = release
                for group in root["runs"].values():
                    if group.attrs["system"] == "writescope":
                        group.attrs["machine"] = release.replace("Release", "Debug")
            runs = report.complete(report.load(path).runs)
            axes = saved_figures(report, report.load(path), tmp)["roofline.png"].axes
        reached = {line.get_label().split(":")[0]: line.get_ydata()[0] for line in axes[0].get_lines()
                   if line.get_label().endswith("reached in the runs")}
        expected = {f"{model} (test), machine setup {setup}": np.mean(
                        [run.measured.achieved_cpu_gbps for run in runs
                         if run.model_label == f"{model} (test)" and run.setup_label == f"setup {setup}"])
                    for model in MODELS for setup in (1, 2)}
        self.assertEqual(set(reached), set(expected))
        for label, rate in expected.items():
            self.assertAlmostEqual(reached[label], rate, msg=label)


class SpeedupFigureWithoutWriteScope(unittest.TestCase):
    def test_each_system_over_the_baseline_has_a_colour_of_its_own(self):
        """Without WriteScope every line is "X over gpu-only": coloured by X, not all by gpu-only."""
        report = report_module()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "results.h5")
            write_results(path, [s for s in variant_specs() if s["system"] != "writescope"])
            runs = [run for run in report.load(path).runs if run.model == MODELS[0]]
            figures = []
            report.save = lambda figure, *_: figures.append(figure)
            report.plot_speedup(MODELS[0], runs, report.system_colours(runs), os.path.join(tmp, "speedup.png"))
        lines = {line.get_label(): line.get_color() for line in figures[0].axes[0].get_lines()
                 if " over " in line.get_label()}
        self.assertEqual(set(lines), {"fiddler over gpu-only", "ktransformers over gpu-only"})
        self.assertEqual(len(set(lines.values())), 2, lines)


class SpeedupLinesBreakWhereAContextHasNoValue(unittest.TestCase):
    """A speedup line is not drawn across a context without a value (ktransformers failed at 16K): that would
    read as a measured speedup there."""

    @staticmethod
    def specs():
        specs = []
        for context, ktransformers_tps in ((8192, 10.0), (16384, None), (32768, 5.0)):
            specs += [SpeedupPairing.spec("writescope", 20.0, context=context),
                      SpeedupPairing.spec("ktransformers", ktransformers_tps, context=context),
                      SpeedupPairing.spec("fiddler", 8.0, context=context)]
        return specs

    def line(self, predicted, figure, label):
        """(xdata, ydata) of the line `label` in the first panel of `figure` of the report of specs()."""
        report = report_module()
        specs = [dict(spec, predicted=1, profile="a100-pcie4") for spec in self.specs()] if predicted else self.specs()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "results.h5")
            write_results(path, specs, predicted=predicted)
            figures = saved_figures(report, report.load(path), tmp)
        lines = [line for line in figures[figure].axes[0].get_lines() if line.get_label() == label]
        self.assertEqual(len(lines), 1, [line.get_label() for line in figures[figure].axes[0].get_lines()])
        return list(lines[0].get_xdata()), list(lines[0].get_ydata())

    def assert_gap_in_the_middle(self, xdata, ydata, first, last):
        self.assertEqual(xdata, [8192, 16384, 32768])
        self.assertAlmostEqual(ydata[0], first)
        self.assertTrue(math.isnan(ydata[1]), ydata)
        self.assertAlmostEqual(ydata[2], last)

    def test_measured_speedup(self):
        self.assert_gap_in_the_middle(*self.line(False, "speedup_qwen3-30b-a3b.png", "writescope over ktransformers"),
                                      2.0, 4.0)

    def test_projected_speedup_over_the_best_baseline(self):
        # At 16K the fastest baseline is unknown (ktransformers failed, fiddler completed).
        self.assert_gap_in_the_middle(*self.line(True, "projected_speedup_a100-pcie4.png",
                                                 "qwen3-30b-a3b on a100-pcie4, batch 1, VRAM 24 GiB"), 2.0, 2.5)


class SpeedupPanelWithoutAPair(unittest.TestCase):
    def test_says_so_in_the_panel_and_writes_nothing_on_stderr(self):
        """WriteScope alone at batch 8: its panel has no line, so no legend (matplotlib would warn) but a note."""
        specs = [SpeedupPairing.spec("writescope", 20.0), SpeedupPairing.spec("gpu-only", 10.0),
                 SpeedupPairing.spec("writescope", 30.0, batch=8)]
        result, _, files = report_on(specs)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "")
        self.assertIn("speedup_qwen3-30b-a3b.png", files)
        report = report_module()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "results.h5")
            write_results(path, specs)
            axes = saved_figures(report, report.load(path), tmp)["speedup_qwen3-30b-a3b.png"].axes
        self.assertIsNotNone(axes[0].get_legend())
        self.assertIsNone(axes[1].get_legend())
        self.assertEqual([text.get_text() for text in axes[1].texts],
                         ["No speedup: no two systems completed runs at one context here."])


class SpeedupPairing(unittest.TestCase):
    """Which runs a speedup pairs: the same model label, batch, VRAM budget and context, over the repetitions
    both systems completed; points where one side did not complete are counted as left out."""

    @staticmethod
    def spec(system, tps, label="qwen3-30b-a3b", batch=BATCH, vram=VRAM, context=8192, repetition=0):
        """A run; tps None: failed."""
        spec = dict(model="qwen3-30b-a3b", model_label=label, system=system, batch=batch, context=context,
                    vram_budget_bytes=vram, host_budget_bytes=128 << 30, pinned_limit_bytes=16 << 30,
                    repetition=repetition, seed=7, status="complete" if tps else "failed",
                    reason="" if tps else "CUDA error: out of memory", config=f"system: {system}\n",
                    expert_policy=system, system_comparison=1)
        if tps:
            spec.update(tokens_per_second=tps, pinned_bytes=PINNED_GIB << 30, host_bytes=HOST_GIB << 30)
        return spec

    def rows(self, specs, min_context=0, edit=None):
        """{(model label, baseline): (geometric mean, points, left out)} of the system-against-system table;
        `edit(root)` changes the written file first."""
        report = report_module()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "results.h5")
            write_results(path, specs)
            if edit:
                with h5py.File(path, "r+") as root:
                    edit(root)
            runs = report.load(path).runs
        return {(model, baseline): (None if mean is None else round(mean, 9), points, left_out)
                for model, _, baseline, mean, points, left_out, _ in report.geomean_rows(runs, min_context)}

    def test_batch_and_vram_budget_are_part_of_the_setting(self):
        # 2x at batch 1 and 1x at batch 8; 4x at a second VRAM budget. Pairing across either gives other ratios.
        specs = [self.spec("writescope", 20.0), self.spec("gpu-only", 10.0),
                 self.spec("writescope", 30.0, batch=8), self.spec("gpu-only", 30.0, batch=8),
                 self.spec("writescope", 40.0, vram=VRAM // 2), self.spec("gpu-only", 10.0, vram=VRAM // 2)]
        self.assertEqual(self.rows(specs)["qwen3-30b-a3b", "gpu-only"], (round(8.0 ** (1 / 3), 9), 3, 0))

    def test_two_configurations_of_one_preset_are_two_models(self):
        specs = [self.spec("writescope", 30.0), self.spec("gpu-only", 10.0),
                 self.spec("writescope", 10.0, label="qwen3-30b-a3b (4 layers)"),
                 self.spec("gpu-only", 10.0, label="qwen3-30b-a3b (4 layers)")]
        rows = self.rows(specs)
        self.assertAlmostEqual(rows["qwen3-30b-a3b", "gpu-only"][0], 3.0)
        self.assertAlmostEqual(rows["qwen3-30b-a3b (4 layers)", "gpu-only"][0], 1.0)
        self.assertEqual(len(rows), 2)

    def test_only_repetitions_both_completed_are_compared(self):
        # gpu-only's repetition 1 failed: WriteScope's repetition 1 (20 tokens/s) has nothing to pair with.
        specs = [self.spec("writescope", 10.0), self.spec("writescope", 20.0, repetition=1),
                 self.spec("gpu-only", 10.0), self.spec("gpu-only", None, repetition=1)]
        self.assertEqual(self.rows(specs)["qwen3-30b-a3b", "gpu-only"], (1.0, 1, 0))

    def test_a_point_one_system_did_not_complete_is_counted_as_left_out(self):
        # WriteScope 3x at 8K; gpu-only failed at 32K (both repetitions): one point, one left out.
        specs = [self.spec("writescope", 30.0), self.spec("gpu-only", 10.0),
                 self.spec("writescope", 20.0, context=32768), self.spec("gpu-only", None, context=32768)]
        self.assertEqual(self.rows(specs)["qwen3-30b-a3b", "gpu-only"], (3.0, 1, 1))
        self.assertEqual(self.rows(specs, min_context=32768)["qwen3-30b-a3b", "gpu-only"], (None, 0, 1))

    def test_a_point_split_between_two_setups_is_left_out(self):
        # WriteScope failed at 32K on the first setup and a resume on another measured it there: its pair with
        # gpu-only's 32K run spans two setups, so it is no point, and left out (it vanished from the count).
        specs = [self.spec("writescope", 30.0), self.spec("gpu-only", 10.0),
                 self.spec("writescope", 20.0, context=32768), self.spec("gpu-only", 10.0, context=32768)]
        def retried_elsewhere(root):
            root.attrs["machine"] = "cpu_model: Test CPU\nbuild_type: Release\n"
            for group in root["runs"].values():
                if group.attrs["system"] == "writescope" and group.attrs["context"] == 32768:
                    group.attrs["machine"] = "cpu_model: Test CPU\nbuild_type: Debug\n"
        self.assertEqual(self.rows(specs, edit=retried_elsewhere)["qwen3-30b-a3b", "gpu-only"], (3.0, 1, 1))

    def test_a_run_the_machines_memory_refused_is_not_called_one_that_does_not_fit(self):
        # `does_not_fit` with a "host memory:" reason: the budgets may hold it; resume measures it again.
        specs = [self.spec("writescope", 30.0), self.spec("gpu-only", 10.0), self.spec("gpu-only", 10.0, batch=8),
                 self.spec("writescope", None, batch=8)]
        specs[-1].update(status="does_not_fit", reason="host memory: the run needs 90 GiB, 12 GiB are free")
        result, markdown, _ = report_on(specs)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("4 runs: 3 complete, 0 did not fit, 0 failed, 1 not run for want of the machine's free "
                      "memory", markdown)
        self.assertIn("repetition 0: not run: the machine's free memory was short — host memory: the run needs",
                      markdown)
        self.assertNotIn("does not fit", section(markdown, "Runs"))

    def test_the_best_baseline_of_a_projection_is_unknown_where_one_failed(self):
        report = report_module()
        Run = report.Run
        def run(system, tps):
            return Run(model="m", model_label="m", system=system, batch=1, context=8192, vram_budget_bytes=VRAM,
                       repetition=0, status="complete" if tps else "failed", reason="", expert_policy=system,
                       system_comparison=True, measured=report.Measurements(**{
                           name: (tps if name == "tokens_per_second" else None)
                           for name in report.Measurements.__dataclass_fields__}) if tps else None,
                       predicted=True, profile="p")
        points = report.best_baseline_speedups([run("writescope", 30.0), run("ktransformers", 10.0),
                                                run("fiddler", 15.0)])
        self.assertEqual([speedup for _, _, speedup in points["p"]], [2.0])  # over the faster, fiddler
        points = report.best_baseline_speedups([run("writescope", 30.0), run("ktransformers", 10.0),
                                                run("hybrimoe", None)])
        self.assertEqual([speedup for _, _, speedup in points["p"]], [None])

    def test_a_projection_where_writescope_does_not_fit_is_left_out_not_dropped(self):
        # WriteScope 2x at 16K, does not fit at 128K where MoE-Lightning runs: one point and one left out, as the
        # measured tables count it (dropped, the table read 2x over one point and nothing left out).
        report = report_module()
        def run(system, context, tps):
            return report.Run(model="m", model_label="m", system=system, batch=1, context=context,
                              vram_budget_bytes=VRAM, repetition=0, status="complete" if tps else "does_not_fit",
                              reason="", expert_policy=system, system_comparison=True,
                              measured=report.Measurements(**{
                                  name: (tps if name == "tokens_per_second" else None)
                                  for name in report.Measurements.__dataclass_fields__}) if tps else None,
                              predicted=True, profile="p")
        runs = [run("writescope", 16384, 20.0), run("moe-lightning", 16384, 10.0),
                run("writescope", 131072, None), run("moe-lightning", 131072, 5.0)]
        points = report.best_baseline_speedups(runs)
        self.assertEqual([(context, speedup) for _, context, speedup in points["p"]], [(16384, 2.0), (131072, None)])
        lines = report.projected_section(runs, 0)
        self.assertIn("| p | m | 2.00 | 2.00–2.00 | 1 | 1 |", "\n".join(lines))
        # Neither side at a context: nothing to compare, nothing left out.
        points = report.best_baseline_speedups(runs[:2] + [run("writescope", 65536, None),
                                                           run("moe-lightning", 65536, None)])
        self.assertEqual([context for _, context, _ in points["p"]], [16384])


class InvalidInput(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "results.h5")
        self.output = os.path.join(self.tmp.name, "report")

    def tearDown(self):
        self.tmp.cleanup()

    def assert_rejected(self, *fragments):
        result = run_report(self.path, self.output)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
        self.assertTrue(result.stderr.startswith(f"report: {self.path}: "), result.stderr)
        for fragment in fragments:
            self.assertIn(fragment, result.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.output, "report.md")))

    def test_missing_file(self):
        self.assert_rejected("no such file")

    def test_a_folder_as_results_and_an_empty_output_are_named(self):
        os.makedirs(self.path)
        self.assert_rejected("is a folder; give a results file written by `writescope run` or `predict`")
        os.rmdir(self.path)
        write_results(self.path, run_specs())
        env = dict(os.environ, MPLBACKEND="Agg", MPLCONFIGDIR=os.path.join(self.tmp.name, "mplconfig"))
        result = subprocess.run([sys.executable, REPORT, self.path, "-o", ""], capture_output=True, text=True,
                                env=env, timeout=300)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stderr.strip(), "report: -o must name the folder the report is written into")

    def test_an_option_given_twice_is_refused(self):
        for extra in (("-o", self.output + "-second"), ("--min-context", "0", "--min-context", "8192")):
            result = run_report(self.path, self.output, *extra)
            self.assertEqual(result.returncode, 2, result.stderr)
            self.assertIn(f"{extra[0]} given twice", result.stderr)
            self.assertFalse(os.path.exists(self.output + "-second"))

    def test_output_is_a_file(self):
        write_results(self.path, run_specs())
        with open(self.output, "w") as text:
            text.write("not a folder\n")
        result = run_report(self.path, self.output)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr.strip(),
                         f"report: {self.output}: is a file; -o names the folder the report is written into")

    def test_not_hdf5(self):
        with open(self.path, "w") as text:
            text.write("format: writescope-results-1\n")
        self.assert_rejected("not an HDF5 file")

    def test_wrong_format(self):
        write_results(self.path, run_specs(), format_name="writescope-results-0")
        self.assert_rejected("/: attribute 'format'", "writescope-results-0")

    def test_missing_format(self):
        write_results(self.path, run_specs())
        with h5py.File(self.path, "a") as root:
            del root.attrs["format"]
        self.assert_rejected("/: missing attribute 'format'")

    def test_missing_runs(self):
        write_results(self.path, run_specs())
        with h5py.File(self.path, "a") as root:
            del root["runs"]
        self.assert_rejected("/: missing group 'runs'")

    def test_missing_system(self):
        write_results(self.path, run_specs())
        with h5py.File(self.path, "a") as root:
            del root["runs/r3"].attrs["system"]
        self.assert_rejected("/runs/r3: missing attribute 'system'")

    def test_a_run_copied_under_another_name(self):
        # The copy's checksum holds (it does not cover the group's name): the means would count the run twice.
        write_results(self.path, run_specs())
        with h5py.File(self.path, "a") as root:
            root.copy("runs/r3", "runs/zz-copy")
        self.assert_rejected("/runs/zz-copy: the same run as /runs/r3 (", "repetition 1)", "writescope verify")

    def test_missing_dataset(self):
        write_results(self.path, run_specs())
        with h5py.File(self.path, "a") as root:
            del root["runs/r1/alpha"]
        self.assert_rejected("/runs/r1: missing dataset 'alpha'")

    def test_wrong_attribute_type(self):
        write_results(self.path, run_specs())
        with h5py.File(self.path, "a") as root:
            root["runs/r2"].attrs["context"] = "long"
        self.assert_rejected("/runs/r2: attribute 'context' must be an integer")

    # Numbers no measurement gives, whether or not a checksum covers them: one line naming the run and the field.
    def test_impossible_settings_and_measurements(self):
        for change, fragments in [
                (lambda run: run.attrs.__setitem__("batch", np.int64(-4)),
                 ("attribute 'batch' is -4, expected a positive integer",)),
                (lambda run: run.attrs.__setitem__("system", "vllm"),
                 ("attribute 'system' is 'vllm', expected one of writescope, fiddler",)),
                (lambda run: run.attrs.__setitem__("tokens_per_second", 1e6),
                 ("attribute 'tokens_per_second' is 1e+06, but batch x steps / the sum of step_seconds is",)),
                (lambda run: run.attrs.__setitem__("tokens_per_second", math.inf),
                 ("attribute 'tokens_per_second' must be positive and finite",)),
                (lambda run: run["step_seconds"].__setitem__(0, np.nan),
                 ("/step_seconds: holds values that are not positive finite seconds",)),
                (lambda run: run["alpha"].__setitem__((0, 0), 2.0), ("/alpha: holds CPU shares outside [0, 1]",)),
                (lambda run: run["components/transfers"].__setitem__((0, 0), -1.0),
                 ("/components/transfers: holds values that are not non-negative finite seconds",))]:
            with self.subTest(fragments[0]):
                shutil.rmtree(self.output, ignore_errors=True)  # a report a failed case wrote
                write_results(self.path, run_specs())
                with h5py.File(self.path, "a") as root:
                    change(root["runs/r1"])
                self.assert_rejected("/runs/r1", *fragments)

    def test_attention_intensity_must_be_positive_and_finite(self):
        # The roofline divides by it; a zero or NaN dropped the model's point without a word.
        for value in (0.0, -1.0, math.nan, math.inf):
            with self.subTest(value=value):
                shutil.rmtree(self.output, ignore_errors=True)
                write_results(self.path, run_specs())
                with h5py.File(self.path, "a") as root:
                    root["runs/r1"].attrs["attention_fmas_per_byte"] = value
                self.assert_rejected("/runs/r1: attribute 'attention_fmas_per_byte' must be positive and finite "
                                     f"(multiply-adds per KV byte), got {value:g}")


if __name__ == "__main__":
    unittest.main()
