#!/usr/bin/python3
"""Tests of analysis/report.py on small results files written here (schema `writescope-results-1`).

Run with Debian's Python: /usr/bin/python3 tests/analysis/test_report.py
"""

import math
import os
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


def tokens_per_second(model, system, context, repetition):
    scale = SLOWDOWN[system] ** math.log(context / 8192, 4)
    return BASE_TPS[model, system] / scale + 0.7 * repetition  # additive, so averaging matters


def does_not_fit(system, context):
    return system == "gpu-only" and context == 32768


def run_specs():
    """Every run of the test file, as attribute dictionaries."""
    specs = []
    for model in MODELS:
        for system in SYSTEMS:
            for context in CONTEXTS:
                for repetition in range(REPETITIONS):
                    fits = not does_not_fit(system, context)
                    specs.append(dict(model=model, model_label=model + " (test)", system=system, batch=BATCH,
                                      context=context, vram_budget_bytes=VRAM, host_budget_bytes=128 << 30,
                                      repetition=repetition, seed=7 + repetition,
                                      status="complete" if fits else "does_not_fit",
                                      reason="" if fits else NOT_FIT_REASON, config=f"system: {system}\n"))
    return specs


def write_run(group, spec, rng):
    for name, value in spec.items():
        group.attrs[name] = np.int64(value) if isinstance(value, int) else value
    if spec["status"] != "complete":
        return
    tps = tokens_per_second(spec["model"], spec["system"], spec["context"], spec["repetition"])
    step = BATCH / tps
    group.attrs["tokens_per_second"] = tps
    group.attrs["mean_step_seconds"] = step
    group.attrs["layers"] = np.int64(LAYERS)
    group.attrs["attention_fmas_per_byte"] = 0.5 if spec["model"] == "qwen3-30b-a3b" else 1.0
    group.attrs["cpu_attention_gbps"] = 7.0 if spec["model"] == "qwen3-30b-a3b" else 9.5
    group["step_seconds"] = np.full(STEPS, step)
    attention = step * 0.4 * (1.0 + 0.1 * rng.random(STEPS))
    group["attention_seconds"] = attention
    group["predicted_attention_seconds"] = attention * 1.1
    alpha = {"writescope": 0.3, "ktransformers": 1.0, "gpu-only": 0.0}[spec["system"]]
    group["alpha"] = np.clip(alpha + 0.05 * rng.random((STEPS, LAYERS)), 0.0, 1.0)
    for i, name in enumerate(COMPONENTS):
        group[f"components/{name}"] = np.full((STEPS, LAYERS), step * (i + 1) / 40)
    for name in REGIONS:
        group[f"region_bytes/{name}"] = np.full(STEPS, 1e6)


def write_results(path, specs, names=None, format_name="writescope-results-1"):
    """A results file holding `specs` under /runs/<names[i]> (default r0, r1, ...)."""
    names = names or [f"r{i}" for i in range(len(specs))]
    rng = np.random.default_rng(1)
    with h5py.File(path, "w") as root:
        root.attrs.update(format=format_name, experiment="report-test", config="name: report-test\n",
                          git_revision="0123abcd", kokkos_configuration="OpenMP", machine="cpu: test\n")
        profile = root.create_group("profile")
        profile.attrs.update(name="test-machine", has_gpu=np.int64(1), hbm_gbps=4800.0, pinned_h2d_gbps=50.0,
                             pageable_h2d_gbps=20.0, cpu_dram_read_gbps=200.0, cpu_fma_glanes=900.0,
                             cpu_gemv_gbps=180.0, cpu_threads=np.int64(32))
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


def run_report(path, output, *extra):
    env = dict(os.environ, MPLBACKEND="Agg", MPLCONFIGDIR=os.path.join(os.path.dirname(output), "mplconfig"))
    return subprocess.run([sys.executable, REPORT, path, "-o", output, *extra], capture_output=True, text=True,
                          env=env, timeout=300)


def png_size(path):
    """(width, height) of a PNG file, or None when it is not one."""
    with open(path, "rb") as png:
        head = png.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


class ReportOnCompleteFile(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.path = os.path.join(cls.tmp.name, "results.h5")
        write_results(cls.path, run_specs())
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

    def test_writes_every_figure(self):
        names = ["predicted_vs_measured.png", "roofline.png"]
        names += [f"{kind}_{model}.png" for kind in ("speedup", "alpha", "breakdown") for model in MODELS]
        for name in names:
            with self.subTest(name=name):
                path = os.path.join(self.output, name)
                self.assertTrue(os.path.isfile(path))
                self.assertGreater(os.path.getsize(path), 10000)
                width, height = png_size(path)
                self.assertGreater(min(width, height), 200)
                self.assertIn(f"]({name})", self.markdown)

    def test_geomean_speedups(self):
        for model in MODELS:
            for baseline in ("gpu-only", "ktransformers"):
                with self.subTest(model=model, baseline=baseline):
                    row = f"| {model} | writescope | {baseline} | {expected_geomean(model, baseline):.2f} |"
                    self.assertIn(row, self.markdown)

    def test_min_context_restricts_geomean(self):
        output = os.path.join(self.tmp.name, "report-32k")
        self.assertEqual(run_report(self.path, output, "--min-context", "32768").returncode, 0)
        with open(os.path.join(output, "report.md"), encoding="utf-8") as md:
            markdown = md.read()
        expected = expected_geomean(MODELS[0], "ktransformers", 32768)
        self.assertIn(f"| {MODELS[0]} | writescope | ktransformers | {expected:.2f} | 1 |", markdown)
        self.assertIn(f"| {MODELS[0]} | writescope | gpu-only | n/a | 0 |", markdown)

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


class GroupNamesAreOpaque(unittest.TestCase):
    def test_renamed_groups_give_the_same_report(self):
        specs = run_specs()
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
                    reports.append(md.read())
            self.assertEqual(reports[0], reports[1])


class ReportWithoutCompleteRuns(unittest.TestCase):
    def test_writes_summary_only(self):
        specs = [dict(s, status="does_not_fit", reason=NOT_FIT_REASON) for s in run_specs()[:3]]
        with tempfile.TemporaryDirectory() as tmp:
            path, output = os.path.join(tmp, "results.h5"), os.path.join(tmp, "report")
            write_results(path, specs)
            result = run_report(path, output)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(os.path.join(output, "report.md"), encoding="utf-8") as md:
                markdown = md.read()
            self.assertIn("No run completed", markdown)
            self.assertFalse([name for name in os.listdir(output) if name.startswith(("speedup_", "alpha_"))])


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


if __name__ == "__main__":
    unittest.main()
