#!/usr/bin/python3
"""Speedup report of a WriteScope results file (schema `writescope-results-1`).

Reads datasets and attributes only (never group names) and writes PNG figures
plus `report.md` into the output folder:

    /usr/bin/python3 analysis/report.py results/quick.h5 -o results/report
"""

import argparse
import fcntl
import math
import os
import re
import select
import shutil
import signal
import stat
import struct
import sys
import tempfile
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace

try:
    import h5py
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
    import numpy as np  # noqa: E402
    from matplotlib.ticker import MaxNLocator, NullLocator  # noqa: E402
    from matplotlib.transforms import blended_transform_factory  # noqa: E402
except ImportError as missing:
    # Another interpreter first on PATH (a virtual environment, pyenv) often lacks them.
    sys.exit(f"report: {sys.executable} has no module '{missing.name}'; run the report with the Python that has "
             "h5py, matplotlib and numpy (Debian: /usr/bin/python3 with python3-h5py, python3-matplotlib, "
             "python3-numpy)")

FORMAT = "writescope-results-1"
SUBJECT = "writescope"
FALLBACK_BASELINE = "gpu-only"
EXPERT_BASELINES = ("fiddler", "ktransformers", "hybrimoe")  # the baselines whose expert policy WriteScope can run
STATUSES = ("complete", "does_not_fit", "failed")
SYSTEMS = (SUBJECT, "fiddler", "ktransformers", "moe-lightning", "hybrimoe", "gpu-only")  # experiments/systems.hpp
NOT_RUN_MARKERS = {"does_not_fit": "x", "failed": "v", "memory_short": "v"}
# A run the machine's free memory refused (`does_not_fit`, reason "host memory: ..."): its budgets may hold it, and
# `writescope run` measures it again on resume; never shown as one that does not fit.
MEMORY_SHORT = "host memory:"
COMPONENT_ORDER = ("attention_gpu", "attention_cpu", "experts_gpu", "experts_cpu", "transfers", "other")
PROJECTED = "Projected (not measured)"  # the title of every figure and table of a `writescope predict` file
# The paper's headline (seed abstract): WriteScope over the best baseline, by GPU.
PAPER_HEADLINE = {"a100": "1.5–2.5×", "v100": "1.4–1.7×"}


class InputError(Exception):
    """The results file does not follow the schema; `where` is an HDF5 object path."""

    def __init__(self, where, message):
        super().__init__(f"{where}: {message}" if where else message)


# ---------------------------------------------------------------- reading


@dataclass(frozen=True)
class Profile:
    name: str
    has_gpu: bool
    hbm_gbps: float
    pinned_h2d_gbps: float
    cpu_dram_read_gbps: float
    cpu_fma_glanes: float
    sources: tuple = ()  # ((section, what its figures rest on), ...) where the profile says


@dataclass(frozen=True)
class Measurements:
    """What a complete run measured; arrays are (steps) or (steps, layers)."""

    tokens_per_second: float
    attention_fmas_per_byte: float
    cpu_attention_gbps: float
    predicted_attention_seconds: np.ndarray
    attention_seconds: np.ndarray
    alpha: np.ndarray
    components: dict
    achieved_cpu_gbps: float  # KV bytes the CPU read / its attention seconds; nan without CPU attention
    pinned_bytes: int | None = None  # None in files written before the attribute existed
    host_bytes: int | None = None
    # The profile's rate over the pinned band (token-major); None in files written before the band had its own.
    cpu_streamed_attention_gbps: float | None = None


# The fields that make a machine setup, as machine_setup_differences (framework/machine.cpp) compares them.
SETUP_FIELDS = ("cpu_model", "cpu_paths", "cpu_path", "logical_cpus", "host_threads", "openmp_environment",
                "thread_placement", "memory_bytes", "huge_pages", "dram_read_load_bytes", "gpu_name",
                "gpu_memory_bytes", "gpu_compute_capability", "kokkos_version", "enabled_exec_spaces", "compiler",
                "build_type", "host_attention_choices")
NOT_RECORDED = "(not recorded)"
# The fields of a setup that rebuild and rerun it, beyond Machine.describe()'s, which report.md names.
BUILD_FIELDS = ("build_type", "compiler", "kokkos_version", "cpu_path", "openmp_environment", "thread_placement")


@dataclass(frozen=True)
class Machine:
    """What a report says of a recorded machine setup (MachineDescription::to_yaml)."""

    cpu_model: str
    host_threads: str
    gpu_name: str | None  # "": a host-only build; None: not recorded
    setup: tuple = ()  # ((field, value), ...) over SETUP_FIELDS: runs of one setup compare systems only

    def describe(self):
        gpu = ("GPU not recorded" if self.gpu_name is None else
               f"GPU {self.gpu_name}" if self.gpu_name else "no GPU (a host-only build)")
        return f"{self.cpu_model or 'CPU not recorded'}, {self.host_threads or '?'} host thread{'' if self.host_threads == 1 else 's'}, {gpu}"


def read_machine(text):
    """The Machine of a recorded setup's top-level `key: value` lines and literal blocks (`key: |`)."""
    fields, block = {}, None
    for line in text.splitlines():
        if block is not None and (line[:1] in (" ", "\t") or not line):  # yaml-cpp leaves a block's blank lines bare
            fields[block] = (fields[block] + "\n" if fields[block] else "") + line.strip()
            continue
        block = None
        match = re.match(r"([A-Za-z_]\w*):(?: (.*))?$", line)
        if match:
            value = (match.group(2) or "").strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            elif value in ("|", "|-", "|+"):
                block, value = match.group(1), ""
            fields[match.group(1)] = value
    return Machine(fields.get("cpu_model", ""), fields.get("host_threads", ""), fields.get("gpu_name"),
                   tuple((name, fields.get(name, NOT_RECORDED)) for name in SETUP_FIELDS))


@dataclass(frozen=True)
class Run:
    model: str
    model_label: str
    system: str
    batch: int
    context: int
    vram_budget_bytes: int
    repetition: int
    status: str
    reason: str
    expert_policy: str | None  # None: a writescope run of a file that did not record it
    system_comparison: bool  # stands for its system in the system-against-system comparison
    measured: Measurements | None = None  # a predicted run's figures are projections, not measurements
    predicted: bool = False  # priced by `writescope predict` on `profile`, not measured
    profile: str = ""
    git_revision: str = ""  # the build that wrote the run (the file's where the run does not say)
    machine: Machine | None = None  # the setup that ran it; None where the file does not record one
    setup_label: str = ""  # "setup N" where the file's runs come from several setups (label_setups)
    # Measured on a host-only build (the profile has no GPU, or the run's machine setup records none): the
    # systems' GPU work ran on the host. report.md's summary and every figure of the run say so.
    host_only: bool = False

    @property
    def setting(self):
        """Runs of one setting differ only in system, expert policy, context and repetition: runs of two
        machine setups are never compared."""
        return (self.model_label, self.batch, self.vram_budget_bytes, self.setup_label)

    @property
    def label(self):
        """The system, with the expert policy for WriteScope's runs (it runs several)."""
        if self.system == SUBJECT and self.expert_policy:
            return f"{self.system} ({self.expert_policy} experts)"
        return self.system

    def sort_key(self):
        m = self.measured
        numbers = [m.tokens_per_second, m.pinned_bytes, m.host_bytes] if m else [0.0, None, None]
        return (self.model, self.setting, self.system, self.expert_policy or "", not self.system_comparison,
                self.context, self.repetition, self.status, self.reason, [-1 if n is None else n for n in numbers])


@dataclass(frozen=True)
class Results:
    experiment: str
    git_revision: str
    profile: Profile
    runs: list
    profiles: dict = field(default_factory=dict)  # {name: Profile}: every profile a projection priced runs with
    damaged: list = field(default_factory=list)  # [(run group, why)]: left out of every figure and table
    unverified: int = 0  # runs written before runs carried checksums
    predicted: bool = False  # every run is a projection (`writescope predict`)
    planned_runs: int | None = None  # the runs the file is to hold; None in files that do not say
    shard: str = ""  # "K/N": the file of one shard (`writescope run --shard`)
    being_written: bool = False  # a writer held the file's lock when it was read: more runs may come
    path: str = ""  # the results file, absolute
    config: tuple = ()  # (root attribute, the experiment's YAML) that reproduces the runs; () where none


def _as_string(value):
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _as_int(value):
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    return None


def _as_float(value):
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    return None


ATTRIBUTE_KINDS = {str: (_as_string, "a string"), int: (_as_int, "an integer"), float: (_as_float, "a number")}


def attribute(obj, name, kind):
    """The scalar attribute `name` of `obj`, converted to `kind` (str, int or float)."""
    if name not in obj.attrs:
        raise InputError(obj.name, f"missing attribute '{name}'")
    convert, description = ATTRIBUTE_KINDS[kind]
    value = convert(obj.attrs[name])
    if value is None:
        raise InputError(obj.name, f"attribute '{name}' must be {description}")
    return value


def optional_attribute(obj, name, kind, default):
    """Like attribute(), but `default` when `obj` lacks `name` (files written before it existed)."""
    return attribute(obj, name, kind) if name in obj.attrs else default


def member(group, name, kind):
    """The member `name` of `group`, which must be an h5py.Group or h5py.Dataset."""
    obj = group.get(name)
    what = "group" if kind is h5py.Group else "dataset"
    if obj is None:
        raise InputError(group.name, f"missing {what} '{name}'")
    if not isinstance(obj, kind):
        raise InputError(obj.name, f"is not a {what}")
    return obj


def dataset(group, name, shape):
    """A numeric dataset of `group` as float64, checked against `shape`."""
    obj = member(group, name, h5py.Dataset)
    if obj.dtype.kind not in "iuf":
        raise InputError(obj.name, "is not numeric")
    if obj.shape != shape:
        raise InputError(obj.name, f"has shape {obj.shape}, expected {shape}")
    return obj[()].astype(np.float64)


def read_profile(root):
    group = member(root, "profile", h5py.Group)
    profile = Profile(
        name=attribute(group, "name", str),
        has_gpu=attribute(group, "has_gpu", int) != 0,
        hbm_gbps=attribute(group, "hbm_gbps", float),
        pinned_h2d_gbps=attribute(group, "pinned_h2d_gbps", float),
        cpu_dram_read_gbps=attribute(group, "cpu_dram_read_gbps", float),
        cpu_fma_glanes=attribute(group, "cpu_fma_glanes", float),
    )
    return checked_profile(group, profile)


def checked_profile(group, profile):
    for name in ("cpu_dram_read_gbps", "cpu_fma_glanes"):
        if not getattr(profile, name) > 0:
            raise InputError(group.name, f"attribute '{name}' must be positive")
    return profile


def _yaml_scalar(text):
    """A one-line YAML scalar as MachineProfile::to_yaml writes it: plain, or double-quoted with escapes."""
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return re.sub(r'\\(.)', r"\1", text[1:-1])
    return text


def read_projection_profile(group):
    """A `/profiles/<name>` entry of a projection: only `name` and `yaml` (MachineProfile::to_yaml, whose
    sections are maps indented by two spaces), so the rates come from the YAML."""
    values, section = {}, ""
    for line in attribute(group, "yaml", str).splitlines():
        match = re.match(r"( *)([A-Za-z_]\w*):(.*)$", line)
        if not match:
            continue
        indent, key, value = len(match.group(1)), match.group(2), match.group(3).strip()
        if indent == 0:
            section = "" if value else key
            values[key] = value
        elif indent == 2 and section:
            values[f"{section}.{key}"] = value

    def rate(key, required):
        if key not in values and not required:
            return 0.0
        try:
            return float(values.get(key, ""))
        except ValueError:
            raise InputError(group.name, f"attribute 'yaml' gives no number for '{key}'") from None

    has_gpu = values.get("has_gpu") == "true"
    sources = tuple((key.split(".", 1)[1], _yaml_scalar(value)) for key, value in values.items()
                    if key.startswith("sources."))
    return checked_profile(group, Profile(
        name=attribute(group, "name", str),
        has_gpu=has_gpu,
        hbm_gbps=rate("gpu.hbm_gbps", has_gpu),
        pinned_h2d_gbps=rate("link.pinned_h2d_gbps", has_gpu),
        cpu_dram_read_gbps=rate("cpu.dram_read_gbps", True),
        cpu_fma_glanes=rate("cpu.fma_glanes", True),
        sources=sources,
    ))


def read_projection_profiles(root):
    """{name: Profile} of every profile under /profiles, by name."""
    group = member(root, "profiles", h5py.Group)
    profiles = sorted((read_projection_profile(member(group, name, h5py.Group)) for name in group),
                      key=lambda profile: profile.name)
    return {profile.name: profile for profile in profiles}


def seconds(group, name, shape, positive=False):
    """dataset() of seconds: finite, and positive (or at least 0)."""
    values = dataset(group, name, shape)
    if not np.all(np.isfinite(values) & ((values > 0) if positive else (values >= 0))):
        raise InputError(f"{group.name}/{name}",
                         f"holds values that are not {'positive' if positive else 'non-negative'} finite seconds")
    return values


def read_measurements(group, batch):
    """The attributes and datasets only complete runs have, checked against each other (a run whose checksum
    matches may still hold numbers no measurement gives)."""
    steps_dataset = member(group, "attention_seconds", h5py.Dataset)
    if len(steps_dataset.shape) != 1 or steps_dataset.shape[0] == 0:
        raise InputError(steps_dataset.name, f"has shape {steps_dataset.shape}, expected (steps) with steps > 0")
    steps = steps_dataset.shape[0]
    layers = attribute(group, "layers", int)
    components = member(group, "components", h5py.Group)
    tokens_per_second = attribute(group, "tokens_per_second", float)
    if not (math.isfinite(tokens_per_second) and tokens_per_second > 0):
        raise InputError(group.name, "attribute 'tokens_per_second' must be positive and finite")
    step_seconds = seconds(group, "step_seconds", (steps,), positive=True)
    from_steps = batch * steps / step_seconds.sum()
    if not math.isclose(tokens_per_second, from_steps, rel_tol=1e-6):
        raise InputError(group.name, f"attribute 'tokens_per_second' is {tokens_per_second:.6g}, but batch x steps / "
                                     f"the sum of step_seconds is {from_steps:.6g}")
    alpha = dataset(group, "alpha", (steps, layers))
    if not np.all((alpha >= 0) & (alpha <= 1)):  # NaN fails both
        raise InputError(f"{group.name}/alpha", "holds CPU shares outside [0, 1]")
    components_read = {name: seconds(components, name, (steps, layers)) for name in components}
    # The roofline places the model's points at this intensity (a log axis): no attention has none.
    fmas_per_byte = attribute(group, "attention_fmas_per_byte", float)
    if not (math.isfinite(fmas_per_byte) and fmas_per_byte > 0):
        raise InputError(group.name, "attribute 'attention_fmas_per_byte' must be positive and finite (multiply-adds "
                                     f"per KV byte), got {fmas_per_byte:g}")
    return Measurements(
        tokens_per_second=tokens_per_second,
        attention_fmas_per_byte=fmas_per_byte,
        cpu_attention_gbps=attribute(group, "cpu_attention_gbps", float),
        predicted_attention_seconds=seconds(group, "predicted_attention_seconds", (steps,)),
        attention_seconds=seconds(group, "attention_seconds", (steps,)),
        alpha=alpha,
        components=components_read,
        achieved_cpu_gbps=achieved_cpu_rate(group, steps, components_read),
        pinned_bytes=optional_attribute(group, "pinned_bytes", int, None),
        host_bytes=optional_attribute(group, "host_bytes", int, None),
        cpu_streamed_attention_gbps=optional_attribute(group, "cpu_streamed_attention_gbps", float, None),
    )


def achieved_cpu_rate(group, steps, components):
    """GB/s of KV the CPU's attention read, from region_bytes and the attention_cpu component."""
    if "region_bytes" not in group or "attention_cpu" not in components:
        return float("nan")
    regions = member(group, "region_bytes", h5py.Group)
    cpu_bytes = sum(dataset(regions, name, (steps,)).sum() for name in ("cpu_resident", "cpu_streamed")
                    if name in regions)
    seconds = components["attention_cpu"].sum()
    return float(cpu_bytes / seconds / 1e9) if cpu_bytes > 0 and seconds > 0 else float("nan")


def read_run(group, file_revision, file_machine, file_profile):
    status = attribute(group, "status", str)
    if status not in STATUSES:
        raise InputError(group.name, f"attribute 'status' is '{status}', expected one of {', '.join(STATUSES)}")
    system = attribute(group, "system", str)
    if system not in SYSTEMS:
        raise InputError(group.name, f"attribute 'system' is '{system}', expected one of {', '.join(SYSTEMS)}")
    settings = {name: attribute(group, name, int) for name in ("batch", "context", "vram_budget_bytes", "repetition")}
    for name, value in settings.items():
        if value < (0 if name == "repetition" else 1):
            raise InputError(group.name, f"attribute '{name}' is {value}, expected "
                                         f"{'at least 0' if name == 'repetition' else 'a positive integer'}")
    system_comparison = optional_attribute(group, "system_comparison", int, 1)
    if system_comparison not in (0, 1):
        raise InputError(group.name, f"attribute 'system_comparison' is {system_comparison}, expected 0 or 1")
    # Older files wrote expert_policy on complete runs only; a baseline's is its own, WriteScope's unknown.
    expert_policy = optional_attribute(group, "expert_policy", str, None if system == SUBJECT else system)
    predicted = optional_attribute(group, "predicted", int, 0) == 1
    profile = optional_attribute(group, "profile", str, "")
    # A projection prices each run on one of several machine profiles: the model on that machine is what
    # its figures and tables compare, never runs of two machines.
    on = f" on {profile}" if predicted else ""
    machine = read_machine(attribute(group, "machine", str)) if "machine" in group.attrs else file_machine
    return Run(
        model=attribute(group, "model", str) + on,
        model_label=attribute(group, "model_label", str) + on,
        system=system,
        batch=settings["batch"],
        context=settings["context"],
        vram_budget_bytes=settings["vram_budget_bytes"],
        repetition=settings["repetition"],
        status=status,
        reason=attribute(group, "reason", str),
        expert_policy=expert_policy,
        system_comparison=system_comparison == 1,
        measured=read_measurements(group, settings["batch"]) if status == "complete" else None,
        predicted=predicted,
        profile=profile,
        git_revision=optional_attribute(group, "git_revision", str, file_revision),
        machine=machine,
        host_only=not predicted and (not file_profile.has_gpu or (machine is not None and machine.gpu_name == "")),
    )


def setup_of(run):
    return run.machine.setup if run.machine else None


def label_setups(runs):
    """`runs`, each labelled "setup N" (in order of first appearance) where they come from several machine
    setups (`--allow-different-machine`), so that no setting pairs runs of two setups."""
    order = list(dict.fromkeys(setup_of(run) for run in runs))
    if len(order) < 2:
        return runs
    return [replace(run, setup_label=f"setup {order.index(setup_of(run)) + 1}") for run in runs]


# ---------------------------------------------------------------- checksums


def _attribute_bytes(value):
    """An attribute as ResultsGroup::checksum serialises it (framework/results_store.cpp)."""
    if isinstance(value, (str, bytes)):
        data = value.encode() if isinstance(value, str) else value
        return b"s" + struct.pack("<Q", len(data)) + data
    array = np.asarray(value).ravel()
    if array.dtype.kind in "iu":
        return b"i" + struct.pack("<Q", array.size) + array.astype("<i8").tobytes()
    return b"f" + struct.pack("<Q", array.size) + array.astype("<f8").tobytes()


def _dataset_bytes(dataset):
    kind, size = dataset.dtype.kind, dataset.dtype.itemsize
    if kind == "f":
        code, dtype = (b"f", "<f4") if size == 4 else (b"d", "<f8")
    elif kind in "iu":
        code, dtype = (b"i", "<i4") if size == 4 else (b"l", "<i8") if kind == "i" else (b"u", "<u8")
    else:
        raise InputError(dataset.name, f"dataset of type {dataset.dtype} in a run")
    values = np.asarray(dataset[()], dtype=dtype)
    return (b"D" + code + struct.pack("<Q", len(dataset.shape)) +
            b"".join(struct.pack("<Q", d) for d in dataset.shape) + values.tobytes())


def results_checksum(group):
    """"crc32:xxxxxxxx" of everything in `group` but its own checksum attribute, as `writescope` computes it."""
    items = []

    def walk(g, prefix):
        for name in g.attrs:
            if not (prefix == "" and name == "checksum"):
                items.append(((prefix + "@" + name).encode(), _attribute_bytes(g.attrs[name])))
        for name, child in g.items():
            if isinstance(child, h5py.Group):
                walk(child, prefix + name + "/")
            else:
                items.append(((prefix + name).encode(), _dataset_bytes(child)))

    walk(group, "")
    crc = 0
    for key, data in sorted(items):
        crc = zlib.crc32(key + b"\0" + data, crc)
    return f"crc32:{crc:08x}"


def run_damage(group):
    """Why a run group cannot be trusted ("" if it can, or if it predates checksums): as `writescope verify`."""
    try:
        if "checksum" not in group.attrs:
            # Runs carry checksums since files carry config_canonical: in such a file a run without one lost it.
            if "config_canonical" in group.file.attrs:
                return "no checksum, though the build that wrote this file gives every run one"
            return ""
        stored, now = _as_string(group.attrs["checksum"]), results_checksum(group)
    except (OSError, KeyError, ValueError, TypeError, InputError) as error:
        return f"unreadable ({error})"
    return "" if stored == now else f"checksum mismatch (stored {stored}, contents {now})"


# Seconds without progress after which a scan's child counts as hung.
SCAN_STALL_SECONDS = 120


def _read_everything(obj):
    """Reads every attribute of `obj` and, in a group, every member: as the report does, with no checks."""
    for name in obj.attrs:
        obj.attrs[name]
    if isinstance(obj, h5py.Group):
        for name in obj:
            _read_everything(obj[name])
    else:
        obj[()]


def _scan_in_child(path, skip, out):
    """The child's walk (writescope's ResultsReader walks the same way): names each object on the pipe `out`
    before reading it and says "done" at the end; errors are the report's business, only a crash matters here."""
    def say(line):
        os.write(out, (line + "\n").encode("utf-8", "surrogateescape"))

    def attempt(body):
        try:
            body()
        except Exception:  # noqa: BLE001  (any error is the real reader's to report)
            pass

    def walk_root():
        say("/")
        with h5py.File(path, "r") as root:
            for name in root.attrs:
                attempt(lambda name=name: root.attrs[name])
            for name in root:
                top = "/" + name
                say(top)

                def walk_top(name=name, top=top):
                    obj = root[name]
                    if not isinstance(obj, h5py.Group):
                        obj[()]
                        return
                    for attr in obj.attrs:
                        attempt(lambda attr=attr: obj.attrs[attr])
                    for member in list(obj):
                        if top + "/" + member in skip:
                            continue
                        say(top + "/" + member)
                        attempt(lambda member=member: _read_everything(obj[member]))
                        say(top)
                attempt(walk_top)
            say("/")  # closing the file: a crash there is the whole file's
    attempt(walk_root)
    say("done")


CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGFPE, signal.SIGILL}


def _scan_once(path, skip):
    """One child's walk skipping `skip`: None when it finished, or could not tell (it could not start, was
    stopped from outside or hung: said on stderr), else (the last object it named, the signal it died of)."""
    def unchecked(why):
        print(f"report: {path}: not checked for damage that crashes the HDF5 library ({why}); read as it is",
              file=sys.stderr)

    try:
        read_end, write_end = os.pipe()
    except OSError as error:
        unchecked(f"no pipe: {error.strerror}")
        return None
    try:
        child = os.fork()
    except OSError as error:
        os.close(read_end)
        os.close(write_end)
        unchecked(f"no child process: {error.strerror}")
        return None
    if child == 0:
        os.close(read_end)
        try:
            _scan_in_child(path, skip, write_end)
        finally:
            os._exit(0)  # no atexit handlers or flushes of the parent's state
    os.close(write_end)
    received, last, done, stalled = b"", "/", False, False
    try:
        while True:
            ready, _, _ = select.select([read_end], [], [], SCAN_STALL_SECONDS)
            if not ready:
                stalled = True
                os.kill(child, signal.SIGKILL)
                break
            chunk = os.read(read_end, 4096)
            if not chunk:
                break
            received += chunk
            *lines, received = received.split(b"\n")
            for line in lines:
                text = line.decode("utf-8", "surrogateescape")
                if text == "done":
                    done = True
                else:
                    last = text
    finally:
        os.close(read_end)
        _, status = os.waitpid(child, 0)
    if done:
        return None
    if not stalled and os.WIFSIGNALED(status) and os.WTERMSIG(status) in CRASH_SIGNALS:
        return last, signal.Signals(os.WTERMSIG(status)).name
    unchecked(f"its reading stopped responding for {SCAN_STALL_SECONDS} s" if stalled
              else f"its reading was stopped by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
              else "its reading ended early")
    return None


def crashing_objects(path):
    """Members of the root's groups ("/runs/<run>") whose reading crashes the HDF5 library (libhdf5 1.10 copies
    some damaged lengths unchecked and dies of a segmentation fault), found by reading the file in a child
    process; InputError where such damage lies outside them."""
    most_objects = 64
    crashing = set()
    while True:
        found = _scan_once(path, crashing)
        if found is None:
            return crashing
        at, why = found
        if at.count("/") != 2 or len(crashing) >= most_objects:
            where = "its root group" if at == "/" else at
            raise InputError("", f"is damaged so that the HDF5 library crashes reading {where} ({why}); nothing in "
                                 "it can be read safely")
        crashing.add(at)


def being_written(path):
    """Whether a process holds the results file's `<path>.lock` (a `writescope run` still writing it), looked at
    as results_file_being_written (framework/results_store.cpp) looks: a shared lock taken for a moment."""
    try:
        descriptor = os.open(os.path.realpath(path) + ".lock", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # never written by a ResultsStore, or not readable: no writer to tell of
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(descriptor)


def load(path):
    """Everything the report needs from the results file at `path`."""
    if not os.path.exists(path):
        raise InputError("", "no such file")
    if os.path.isdir(path):
        raise InputError("", "is a folder; give a results file written by `writescope run` or `predict`")
    if not os.path.isfile(path) or not h5py.is_hdf5(path):
        raise InputError("", "not an HDF5 file")
    writing = being_written(path)  # before reading: a writer that ends meanwhile may have added runs
    crashing = crashing_objects(path)
    for damaged_object in sorted(crashing):
        if not damaged_object.startswith("/runs/"):  # what the report reads besides the runs
            raise InputError(damaged_object, "is damaged so that the HDF5 library crashes reading it")
    try:
        with h5py.File(path, "r") as root:
            found = attribute(root, "format", str)
            if found != FORMAT:
                raise InputError(root.name, f"attribute 'format' is '{found}', expected '{FORMAT}'")
            runs = member(root, "runs", h5py.Group)
            intact, damaged = [], []
            for name in runs:
                if f"/runs/{name}" in crashing:
                    damaged.append((f"/runs/{name}", "unreadable (the HDF5 library crashes reading it)"))
                    continue
                group = member(runs, name, h5py.Group)
                damage = run_damage(group)
                if damage:
                    damaged.append((group.name, damage))
                else:
                    intact.append(group)
            predicted = optional_attribute(root, "predicted", int, 0) == 1
            file_revision = attribute(root, "git_revision", str)
            file_machine = read_machine(attribute(root, "machine", str)) if "machine" in root.attrs else None
            profile = read_profile(root)
            labelled = label_setups([read_run(group, file_revision, file_machine, profile) for group in intact])
            refuse_repeated_runs(intact, labelled)
            read = sorted(labelled, key=Run.sort_key)
            kinds = {run.predicted for run in read} | {predicted}
            if len(kinds) > 1:
                raise InputError(root.name, "mixes predicted runs (`writescope predict`) and measured runs; a "
                                            "projection is never compared with a measurement in one report")
            return Results(
                experiment=attribute(root, "experiment", str),
                git_revision=file_revision,
                profile=profile,
                runs=read,
                profiles=read_projection_profiles(root) if predicted else {profile.name: profile},
                damaged=damaged,
                unverified=sum("checksum" not in group.attrs for group in intact),
                predicted=predicted,
                planned_runs=optional_attribute(root, "planned_runs", int, None),
                shard=optional_attribute(root, "shard", str, ""),
                being_written=writing,
                path=os.path.abspath(path),
                config=next(((name, attribute(root, name, str)) for name in ("config", "config_canonical")
                             if name in root.attrs), ()),
            )
    except OSError as error:
        raise InputError("", f"cannot read: {error}") from None


def refuse_repeated_runs(groups, runs):
    """InputError where two groups hold the same run (a group copied under another name: its checksum does
    not cover its name), which the means would count twice; `writescope verify` names such a group."""
    first = {}
    for group, run in zip(groups, runs):
        key = (run.model_label, run.system, run.expert_policy, run.system_comparison, run.batch, run.context,
               run.vram_budget_bytes, run.repetition, run.setup_label, run.profile)
        if key in first:
            raise InputError(group.name, f"the same run as {first[key]} ({run.model_label}, {run.label}, batch "
                                         f"{run.batch}, context {run.context}, VRAM budget {run.vram_budget_bytes}, "
                                         f"repetition {run.repetition}); remove the copy (`writescope verify` "
                                         "names it)")
        first[key] = group.name


# ---------------------------------------------------------------- analysis


def complete(runs):
    return [run for run in runs if run.measured]


def system_runs(runs):
    """The runs that stand for their system: WriteScope's same-expert-policy variants left out."""
    return [run for run in runs if run.system_comparison]


def throughputs(runs):
    """{(setting, system, context): {repetition: tokens/s}} of the complete runs; `runs` must hold one
    variant per system (system_runs(), or one expert policy's), else WriteScope's variants are mixed."""
    grouped = {}
    for run in complete(runs):
        grouped.setdefault((run.setting, run.system, run.context), {})[run.repetition] = \
            run.measured.tokens_per_second
    return grouped


def paired_speedup(subject, baseline):
    """Mean tokens/s of `subject` over `baseline`'s ({repetition: tokens/s} each), over the repetitions both
    completed, so that a repetition one system lost does not tilt the ratio; None where they share none."""
    shared = sorted(subject.keys() & baseline.keys())
    if not shared:
        return None
    return float(np.mean([subject[r] for r in shared]) / np.mean([baseline[r] for r in shared]))


def comparisons(runs):
    """(subject, baseline) system pairs: `writescope` over every other system when present,
    else every system over `gpu-only` (or the first system alphabetically)."""
    systems = sorted({run.system for run in runs})
    if SUBJECT in systems:
        return [(SUBJECT, baseline) for baseline in systems if baseline != SUBJECT]
    baseline = FALLBACK_BASELINE if FALLBACK_BASELINE in systems else systems[0]
    return [(subject, baseline) for subject in systems if subject != baseline]


def speedups(throughput, subject, baseline):
    """[(setting, context, speedup)] wherever both systems completed a repetition of the same number
    (throughput: throughputs())."""
    points = []
    for (setting, system, context), tps in sorted(throughput.items()):
        base = throughput.get((setting, baseline, context))
        if system == subject and base and (speedup := paired_speedup(tps, base)) is not None:
            points.append((setting, context, speedup))
    return points


def geomean(runs, subject, baseline, min_context):
    """(geometric-mean speedup of `subject` over `baseline` at contexts >= min_context or None, points,
    points left out): a point is a setting and context; one is left out where both systems have runs there
    but not a repetition both completed (one did not fit or failed), or have them only on two machine
    setups while they are compared at that setting on one (a run that failed, retried by a resume on
    another setup: else neither a point nor left out)."""
    points = [(setting, context, s) for setting, context, s in speedups(throughputs(runs), subject, baseline)
              if context >= min_context]
    values = [s for _, _, s in points]
    ran = [{(run.setting, run.context) for run in runs if run.system == system and run.context >= min_context}
           for system in (subject, baseline)]
    def across_setups(pairs):  # Run.setting ends in the setup
        return {(setting[:-1], context) for setting, context in pairs}
    compared = {setting[:-1] for setting, _ in ran[0] & ran[1]}
    shared = {(setting, context) for setting, context in across_setups(ran[0]) & across_setups(ran[1])
              if setting in compared}
    left_out = len(shared - across_setups((setting, context) for setting, context, _ in points))
    return (math.exp(np.mean(np.log(values))) if values else None), len(values), left_out


def expert_policies(runs, system):
    """The expert policies of `system`'s complete runs, comma-separated ('unknown' where not recorded)."""
    return ", ".join(sorted({run.expert_policy or "unknown" for run in complete(runs) if run.system == system}))


def geomean_rows(runs, min_context):
    """System against system, over system_runs(): [(model, subject, baseline, geometric mean or None,
    number of points, points left out, the subject's expert policies)]."""
    rows = []
    for model, model_runs in by_model(system_runs(runs)).items():
        for subject, baseline in comparisons(model_runs):
            rows.append((model, subject, baseline, *geomean(model_runs, subject, baseline, min_context),
                         expert_policies(model_runs, subject)))
    return rows


def same_policy_rows(runs, min_context):
    """WriteScope run with baseline B's expert policy over B, for each B of EXPERT_BASELINES with complete
    runs: [(model, B, geometric mean or None, number of points, points left out)]. WriteScope runs whose
    expert policy is unknown are in no row."""
    rows = []
    for model, model_runs in by_model(runs).items():
        if not any(run.system == SUBJECT for run in model_runs):
            continue
        for baseline in EXPERT_BASELINES:
            if not any(run.system == baseline for run in complete(model_runs)):
                continue
            rows.append((model, baseline, *geomean(same_policy_runs(model_runs, baseline), SUBJECT, baseline,
                                                   min_context)))
    return rows


def same_policy_runs(runs, baseline):
    """`baseline`'s runs and WriteScope's with its expert policy."""
    return [run for run in runs if run.system == baseline or (run.system == SUBJECT and run.expert_policy == baseline)]


def unpaired_note(model, runs, subject, baseline, min_context, subject_label=None):
    """Why a geometric mean of `subject` over `baseline` (their runs in `runs`) has no point and none left out:
    every context where both have runs lies below `--min-context`, or they have none at one setting."""
    ran = [{(run.setting, run.context) for run in runs if run.system == system} for system in (subject, baseline)]
    contexts = sorted({context for _, context in ran[0] & ran[1]})
    pair = f"{cell(model)}: {subject_label or subject} and {baseline}"
    if not contexts:
        return (f"- {pair} have no runs at one setting and context (batch, VRAM budget, machine setup): nothing "
                "to compare.")
    return (f"- {pair} have runs only at contexts {', '.join(context_label(c) for c in contexts)}, below "
            f"`--min-context` ({context_label(min_context)}); give a smaller `--min-context` to include them.")


def prediction_errors(runs):
    """{system: (median relative error of the attention prediction, steps)} over complete runs."""
    errors = {}
    for run in complete(runs):
        measured = run.measured.attention_seconds
        predicted = run.measured.predicted_attention_seconds
        valid = measured > 0
        errors.setdefault(run.system, []).extend(np.abs(predicted[valid] - measured[valid]) / measured[valid])
    return {system: (float(np.median(values)), len(values)) for system, values in sorted(errors.items()) if values}


def best_baseline_speedups(runs):
    """{profile: [(setting, context, speedup or None)]}: WriteScope (its own expert policy) over the fastest
    other system at equal setting and context (the lowest paired speedup), wherever WriteScope and another
    system completed; None where another system failed there, so that the fastest is unknown (one that did
    not fit is no contender), and where WriteScope did not fit or failed and another system completed (a
    loss, not a gap: left out, as the measured tables count it)."""
    points = {}
    for profile in sorted({run.profile for run in runs}):
        profile_runs = system_runs([run for run in runs if run.profile == profile])
        failed = {(run.setting, run.context) for run in profile_runs
                  if run.system != SUBJECT and run.status == "failed"}
        throughput = throughputs(profile_runs)
        subject_ran = {(run.setting, run.context) for run in profile_runs if run.system == SUBJECT}
        lowest, subject_lost = {}, set()
        for (setting, system, context), tps in throughput.items():
            if system == SUBJECT:
                continue
            subject = throughput.get((setting, SUBJECT, context))
            if subject and (speedup := paired_speedup(subject, tps)) is not None:
                lowest[(setting, context)] = min(lowest.get((setting, context), math.inf), speedup)
            elif not subject and (setting, context) in subject_ran:
                subject_lost.add((setting, context))
        unknown = failed | subject_lost
        points[profile] = sorted(((setting, context,
                                   None if (setting, context) in unknown else lowest[setting, context])
                                  for setting, context in lowest.keys() | subject_lost), key=lambda p: p[:2])
    return points


def paper_headline(profile):
    """The paper's headline range for the GPU a profile names, or an em dash."""
    gpu_machine = profile.split("+cpu:")[0].lower()  # `--cpu-from` appends the CPU's profile
    return next((text for gpu, text in PAPER_HEADLINE.items() if gpu in gpu_machine), "—")


def component_seconds(run):
    """{component: mean over steps of the sum over layers} of a complete run."""
    return {name: float(values.sum(axis=1).mean()) for name, values in run.measured.components.items()}


def breakdown_context(runs):
    """Largest context where every system of `runs` completed, else the largest with any complete run."""
    systems = {run.system for run in runs}
    done = {(run.context, run.system) for run in complete(runs)}
    contexts = sorted({context for context, _ in done}, reverse=True)
    everyone = [c for c in contexts if all((c, system) in done for system in systems)]
    return (everyone or contexts)[0]


def by_model(runs):
    """{model label: runs}: two configurations of one preset (`{preset: x, layers: 4}` beside `{preset: x}`)
    are two models."""
    grouped = {}
    for run in runs:
        grouped.setdefault(run.model_label, []).append(run)
    return dict(sorted(grouped.items()))


def by_setting(runs):
    grouped = {}
    for run in runs:
        grouped.setdefault(run.setting, []).append(run)
    return dict(sorted(grouped.items()))


# ---------------------------------------------------------------- formatting


def context_label(tokens):
    if tokens >= 1 << 20 and tokens % (1 << 20) == 0:
        return f"{tokens >> 20}M"
    if tokens >= 1 << 10 and tokens % (1 << 10) == 0:
        return f"{tokens >> 10}K"
    return str(tokens)


def setting_title(setting):
    label, batch, vram, setup = setting
    return f"{label}, batch {batch}, VRAM {vram / 2**30:.3g} GiB" + (f", machine {setup}" if setup else "")


# Every file the report writes: the fixed names, and '<prefix>_<model or profile>.png' of file_names. Every path
# goes through output_path, which refuses any other name, so a manifest entry outside these names is not the
# report's and is never removed.
OWN_FILES = ("report.md", "predicted_vs_measured.png", "roofline.png")
FIGURE_PREFIXES = ("speedup", "alpha", "breakdown", "projected_speedup")
OWN_FIGURE = re.compile(rf"(?:{'|'.join(FIGURE_PREFIXES)})_[A-Za-z0-9._-]+\.png")
# The files the last report wrote into its folder, one a line: the next report removes those and nothing else,
# since a user's own file may carry one of the report's names.
MANIFEST = ".writescope-report-files"
MANIFEST_HEADING = "# The files analysis/report.py wrote into this folder; its next report here removes them first."
# The folder inside the output folder that a report is written into before it replaces the earlier one.
STAGING_PREFIX = ".writescope-report-staging-"


def own_file(name):
    return name in OWN_FILES or OWN_FIGURE.fullmatch(name) is not None


def output_path(output, name):
    if not own_file(name):
        raise ValueError(f"'{name}' is not among the report's file names (OWN_FILES, FIGURE_PREFIXES)")
    return os.path.join(output, name)


def is_plain_file(path):
    """A regular file, not a link (whose target the report never wrote) nor a folder."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def report_like_files(output, names):
    """Those of `names` that could be the report's: plain files directly in `output` with own_file names."""
    return sorted(name for name in set(names) if own_file(name) and is_plain_file(os.path.join(output, name)))


def earlier_report_files(output):
    """(listed, unlisted): the report-like files the earlier report's manifest lists, or, in a folder without
    one, its report-like files, which no manifest says this script wrote (a report from before manifests, or a
    user's files): those stay as they are."""
    manifest = os.path.join(output, MANIFEST)
    if not is_plain_file(manifest):
        return [], report_like_files(output, os.listdir(output))
    with open(manifest, encoding="utf-8", errors="replace") as listing:
        return report_like_files(output, (line.strip() for line in listing if not line.startswith("#"))), []


def replace_earlier_report(output, staging, written):
    """Moves this report's files `written` and its manifest from `staging`, where they were written whole, into
    `output`, and removes the files the earlier report's manifest lists that this one does not write again, so
    that none of its figures stays beside this report's. Returns earlier_report_files()."""
    removed, unlisted = earlier_report_files(output)
    # First a list of both reports' files: a move or removal that fails (or a Ctrl-C) then leaves no file of
    # either that the next report would not remove. report.md goes last, once every figure it names is in.
    union = os.path.join(staging, MANIFEST + ".both")
    write_manifest(union, sorted(set(removed) | set(written)))
    os.replace(union, os.path.join(output, MANIFEST))
    for name in written:
        if name != "report.md":
            os.replace(os.path.join(staging, name), output_path(output, name))
    for name in removed:
        if name not in written:
            os.remove(os.path.join(output, name))
    os.replace(os.path.join(staging, "report.md"), output_path(output, "report.md"))
    os.replace(os.path.join(staging, MANIFEST), os.path.join(output, MANIFEST))
    return removed, unlisted


def write_manifest(path, written):
    """Lists `written`, the files a report wrote, in `path`, for the next report in its folder
    (replace_earlier_report)."""
    with open(path, "w", encoding="utf-8") as listing:
        listing.write("".join(f"{line}\n" for line in [MANIFEST_HEADING, *written]))


def file_names(models, prefix):
    """{model: '<prefix>_<sanitised model>.png'}, distinct even when sanitising collides."""
    names = {}
    for model in models:
        stem = f"{prefix}_{re.sub(r'[^A-Za-z0-9._-]+', '_', model).strip('_') or 'model'}"
        name, count = f"{stem}.png", 1
        while name in names.values():
            count += 1
            name = f"{stem}-{count}.png"
        names[model] = name
    return names


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return lines


def status_text(status):
    return status.replace("_", " ")


def outcome(run):
    """The run's status, or "memory_short" for a run the machine's free memory refused (MEMORY_SHORT)."""
    return "memory_short" if run.status == "does_not_fit" and run.reason.startswith(MEMORY_SHORT) else run.status


def outcome_text(run):
    return "not run: the machine's free memory was short" if outcome(run) == "memory_short" else status_text(run.status)


# ---------------------------------------------------------------- figures


def system_colours(runs):
    systems = sorted({run.system for run in runs})
    palette = plt.get_cmap("tab10").colors
    return {system: palette[i % len(palette)] for i, system in enumerate(systems)}


_projected = False  # set by write_figures for a file of predicted runs


def titled(text):
    """A figure title; a projection's says so first."""
    return f"{PROJECTED}: {text}" if _projected else text


def subplot_grid(count, title):
    columns = min(count, 3)
    rows = math.ceil(count / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.6 * columns, 4.4 * rows), squeeze=False)
    for unused in axes.flat[count:]:
        unused.set_visible(False)
    figure.suptitle(titled(title))
    return figure, list(axes.flat[:count])


def host_only_note(runs):
    """What a figure of `runs` says of those from a host-only build (Run.host_only), as report.md does; ""
    when none is."""
    host_only = sum(run.host_only for run in runs)
    if not host_only:
        return ""
    if host_only == len(runs):
        return "Host-only build: the systems' GPU work ran on the host. These are not GPU measurements."
    return (f"{host_only} of the {len(runs)} runs this figure draws on came from a host-only build (their GPU "
            "work ran on the host): not GPU measurements.")


def save(figure, path, runs):
    """Writes `figure`, which shows `runs`; a PNG may be seen alone, so it carries the host-only note itself."""
    figure.tight_layout()
    note = host_only_note(runs)
    if note:
        figure.text(0.5, 1.0, note, ha="center", va="bottom", color="tab:red", fontweight="bold")
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)


def context_axis(ax, contexts):
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts)
    ax.set_xticklabels([context_label(c) for c in contexts])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(contexts) / 1.4, max(contexts) * 1.4)
    ax.set_xlabel("context length (tokens per sequence)")


def mark_not_run(ax, runs, colours):
    """An x (did not fit) or v (failed) near the bottom of `ax` per system and context that did not complete."""
    along_bottom = blended_transform_factory(ax.transData, ax.transAxes)
    systems = sorted({run.system for run in runs})
    labelled = set()
    for run in runs:
        if run.measured:
            continue
        label = f"{run.system}: {outcome_text(run)}"
        ax.plot([run.context], [0.05 + 0.06 * systems.index(run.system)], transform=along_bottom,
                linestyle="none", marker=NOT_RUN_MARKERS[outcome(run)], markersize=9, color=colours[run.system],
                label=None if label in labelled else label)
        labelled.add(label)


def with_gaps(contexts, values):
    """`values` ({context: speedup or None}) at each of `contexts`, NaN where there is none: the line breaks
    there instead of running straight across a context it has no value at."""
    return [math.nan if values.get(context) is None else values[context] for context in contexts]


def plot_speedup(model, runs, colours, path):
    throughput = throughputs(runs)
    settings = by_setting(runs)
    figure, axes = subplot_grid(len(settings), f"Decode throughput speedup, {model}")
    for ax, (setting, setting_runs) in zip(axes, settings.items()):
        contexts = sorted({run.context for run in setting_runs})
        drawn = False
        for subject, baseline in comparisons(runs):
            points = {c: s for st, c, s in speedups(throughput, subject, baseline) if st == setting}
            if points:
                # One line per baseline over WriteScope, else one per system over the one baseline.
                colour = colours[baseline] if subject == SUBJECT else colours[subject]
                ax.plot(contexts, with_gaps(contexts, points), marker="o", color=colour,
                        label=f"{subject} over {baseline}")
                drawn = True
        mark_not_run(ax, setting_runs, colours)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_ylim(0, max(ax.get_ylim()[1], 1.1))
        context_axis(ax, contexts)
        ax.set_ylabel("speedup (ratio of tokens/s)")
        ax.set_title(setting_title(setting), fontsize="medium")
        if not drawn:
            # A setting where one system ran alone (WriteScope alone at batch 8, say): an empty panel would
            # read as a figure that failed to draw.
            ax.text(0.5, 0.5, "No speedup: no two systems completed runs at one context here.",
                    transform=ax.transAxes, ha="center", va="center", wrap=True)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    save(figure, path, runs)


def plot_alpha(model, runs, path):
    settings = by_setting(runs)
    figure, axes = subplot_grid(len(settings), f"{SUBJECT} CPU share α of the attention KV bytes, {model}")
    for ax, (setting, setting_runs) in zip(axes, settings.items()):
        for context in sorted({run.context for run in setting_runs}):
            trajectories = [run.measured.alpha.mean(axis=1) for run in setting_runs if run.context == context]
            steps = min(len(t) for t in trajectories)
            mean = np.mean([t[:steps] for t in trajectories], axis=0)
            ax.plot(np.arange(1, steps + 1), mean, marker=".", label=f"context {context_label(context)}")
        ax.set_ylim(-0.03, 1.03)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("decode step")
        ax.set_ylabel("α, mean over layers (0 = GPU, 1 = CPU)")
        ax.set_title(setting_title(setting), fontsize="medium")
        ax.legend(fontsize="small")
    save(figure, path, runs)


def ordered_components(names):
    return [c for c in COMPONENT_ORDER if c in names] + sorted(set(names) - set(COMPONENT_ORDER))


def plot_breakdown(model, runs, path):
    settings = {s: r for s, r in by_setting(runs).items() if complete(r)}
    figure, axes = subplot_grid(len(settings), f"Time per decode step by component, {model}")
    palette = plt.get_cmap("tab10").colors
    for ax, (setting, setting_runs) in zip(axes, settings.items()):
        context = breakdown_context(setting_runs)
        chosen = [run for run in complete(setting_runs) if run.context == context]
        systems = sorted({run.system for run in chosen})
        seconds = {s: [component_seconds(run) for run in chosen if run.system == s] for s in systems}
        names = ordered_components({name for run in chosen for name in run.measured.components})
        bottom = np.zeros(len(systems))
        for i, name in enumerate(names):
            heights = np.array([np.mean([r.get(name, 0.0) for r in seconds[s]]) for s in systems])
            ax.bar(systems, heights, bottom=bottom, label=name, color=palette[i % len(palette)])
            bottom += heights
        ax.set_xlabel("system")
        ax.set_ylabel("seconds per step (summed over layers)")
        ax.set_title(f"{setting_title(setting)}, context {context_label(context)}", fontsize="medium")
        ax.tick_params(axis="x", labelrotation=20)
        ax.legend(fontsize="small")
    save(figure, path, runs)


def plot_predictions(runs, colours, path):
    """False when no step has positive predicted and measured times."""
    figure, ax = plt.subplots(figsize=(6.4, 5.6))
    everything = []
    for system in sorted({run.system for run in runs}):
        chosen = [run.measured for run in runs if run.system == system]
        predicted = np.concatenate([m.predicted_attention_seconds for m in chosen])
        measured = np.concatenate([m.attention_seconds for m in chosen])
        positive = (predicted > 0) & (measured > 0)
        if positive.any():
            ax.scatter(predicted[positive], measured[positive], s=12, alpha=0.7, color=colours[system], label=system)
            everything += [predicted[positive], measured[positive]]
    if not everything:
        plt.close(figure)
        return False
    values = np.concatenate(everything)
    line = [values.min() / 1.5, values.max() * 1.5]
    ax.plot(line, line, color="grey", linestyle="--", linewidth=0.8, label="y = x")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted attention time per step (s)")
    ax.set_ylabel("measured attention time per step (s)")
    ax.set_title(titled("Roofline prediction vs measurement of attention"))
    ax.legend(fontsize="small")
    save(figure, path, runs)
    return True


def roofline_points(runs, rate):
    """{label: (mean lane-FMAs per byte, mean of rate(measurements))} over complete runs where it is known, one
    per model and machine setup (labelled by its setup where the runs come from several): no figure pools runs
    of two setups."""
    grouped = {}
    for run in runs:
        value = rate(run.measured)
        if np.isfinite(value):
            label = f"{run.model_label}, machine {run.setup_label}" if run.setup_label else run.model_label
            grouped.setdefault(label, []).append((run.measured.attention_fmas_per_byte, value))
    return {label: tuple(np.mean(values, axis=0)) for label, values in sorted(grouped.items())}


def plot_roofline(panels, path):
    """One roofline per (profile, its complete runs) of `panels`, one below the other."""
    figure, axes = plt.subplots(len(panels), 1, figsize=(10, 5.2 * len(panels)), squeeze=False)
    for ax, (profile, runs) in zip(axes.flat, panels):
        draw_roofline(ax, profile, runs)
    save(figure, path, [run for _, runs in panels for run in runs])


def draw_roofline(ax, profile, runs):
    points = {k: (x, y) for k, (x, y) in roofline_points(runs, lambda m: m.cpu_attention_gbps).items()
              if x > 0 and y > 0}
    achieved = {k: (x, y) for k, (x, y) in roofline_points(runs, lambda m: m.achieved_cpu_gbps).items()
                if x > 0 and y > 0}
    dram, fma = profile.cpu_dram_read_gbps, profile.cpu_fma_glanes
    ridge = fma / dram
    xs = [ridge] + [x for x, _ in points.values()] + [x for x, _ in achieved.values()]
    intensity = np.geomspace(min(xs) / 16, max(xs) * 16, 200)
    ax.plot(intensity, np.minimum(dram, fma / intensity), color="black",
            label=f"CPU: min({dram:.4g} GB/s DRAM, {fma:.4g} G multiply-add/s ÷ I)")
    if profile.pinned_h2d_gbps > 0:
        ax.axhline(profile.pinned_h2d_gbps, color="tab:orange", linestyle="--",
                   label=f"PCIe pinned host→GPU {profile.pinned_h2d_gbps:.4g} GB/s")
    if profile.has_gpu and profile.hbm_gbps > 0:
        ax.axhline(profile.hbm_gbps, color="tab:green", linestyle="--", label=f"GPU HBM {profile.hbm_gbps:.4g} GB/s")
    band = roofline_points(runs, lambda m: math.nan if m.cpu_streamed_attention_gbps is None
                           else m.cpu_streamed_attention_gbps)
    for index, (label, (x, y)) in enumerate(points.items()):
        ax.plot([x], [y], marker="o", linestyle="none", color=f"C{index}",
                label=f"{label}: {y:.4g} GB/s in the profile")
        # The band's token-major kernel, where the profile gives it a rate of its own.
        if label in band and not math.isclose(band[label][1], y, rel_tol=5e-3):
            ax.plot([band[label][0]], [band[label][1]], marker="s", linestyle="none", color=f"C{index}",
                    label=f"{label}: {band[label][1]:.4g} GB/s over the pinned band in the profile")
        if label in achieved:
            ax.plot([achieved[label][0]], [achieved[label][1]], marker="x", markersize=9, linestyle="none",
                    color=f"C{index}", label=f"{label}: {achieved[label][1]:.4g} GB/s "
                                              f"{'priced in the projection' if _projected else 'reached in the runs'}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity I (multiply-adds per KV byte)")
    ax.set_ylabel("attainable KV read rate (GB/s)")
    ax.set_title(titled(f"Attention roofline of machine profile '{profile.name}'"))
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))


def plot_projected_speedup(profile, points, contexts, path):
    """`points` as best_baseline_speedups() gives them; `contexts`: {setting: every context it has runs at}."""
    figure, ax = plt.subplots(figsize=(7.2, 4.8))
    for setting in sorted({setting for setting, _, speedup in points if speedup is not None}):
        line = {context: speedup for s, context, speedup in points if s == setting}
        ax.plot(contexts[setting], with_gaps(contexts[setting], line), marker="o", label=setting_title(setting))
    context_axis(ax, sorted({context for setting_contexts in contexts.values() for context in setting_contexts}))
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_ylabel(f"{SUBJECT} speedup over the best baseline (×)")
    ax.set_title(titled(f"speedup vs context on {profile}"), fontsize="medium")
    ax.legend(fontsize="small")
    save(figure, path, ())  # a projection's: no run of it was measured


def write_figures(results, output):
    """Writes every figure that has data; returns [(file name, caption)]."""
    global _projected
    _projected = results.predicted
    runs = results.runs
    written = []
    if results.predicted:
        profiles = best_baseline_speedups(runs)
        names = file_names(profiles, "projected_speedup")
        for profile, points in profiles.items():
            if any(speedup is not None for _, _, speedup in points):  # None: another system failed there
                settings = by_setting(run for run in runs if run.profile == profile)
                contexts = {setting: sorted({run.context for run in setting_runs})
                            for setting, setting_runs in settings.items()}
                plot_projected_speedup(profile, points, contexts, output_path(output, names[profile]))
                written.append((names[profile], f"{PROJECTED}: {SUBJECT} over the fastest other system vs context "
                                                f"on profile '{profile}', one line per model and setting."))
    colours = system_colours(runs)
    models = by_model(runs)
    speedup_names, alpha_names, breakdown_names = (file_names(models, p) for p in ("speedup", "alpha", "breakdown"))
    for model, all_model_runs in models.items():
        # WriteScope's same-expert-policy variants would be averaged with its own choice per system and context.
        model_runs = system_runs(all_model_runs)
        throughput = throughputs(model_runs)
        pairs = comparisons(model_runs)
        if any(speedups(throughput, s, b) for s, b in pairs):
            plot_speedup(model, model_runs, colours, output_path(output, speedup_names[model]))
            baselines = ", ".join(sorted({b for _, b in pairs}))
            subjects = ", ".join(sorted({s for s, _ in pairs}))
            written.append((speedup_names[model], f"{model}: speedup of {subjects} over {baselines} vs context "
                                                  "length; x and v mark runs that did not fit or failed."))
        subject_runs = [run for run in complete(model_runs) if run.system == SUBJECT]
        if subject_runs:
            plot_alpha(model, subject_runs, output_path(output, alpha_names[model]))
            written.append((alpha_names[model], f"{model}: {SUBJECT}'s CPU share α per step, one line per context "
                                                f"({SUBJECT}'s own expert policy)."))
        if complete(model_runs):
            plot_breakdown(model, model_runs, output_path(output, breakdown_names[model]))
            written.append((breakdown_names[model], f"{model}: time per step by component at the largest context "
                                                    "most systems completed (devices overlap, so bars may exceed "
                                                    "the step time)."))
    if not results.predicted and plot_predictions(complete(runs), colours,
                                                  output_path(output, "predicted_vs_measured.png")):
        written.append(("predicted_vs_measured.png", "Predicted vs measured attention time of every measured step."))
    # A projection prices runs on several profiles: one panel per profile, with the runs priced on it.
    if results.predicted:
        panels = [(profile, [run for run in complete(runs) if run.profile == name])
                  for name, profile in results.profiles.items()]
    else:
        panels = [(results.profile, complete(runs))]
    plot_roofline(panels, output_path(output, "roofline.png"))
    names = ", ".join(f"'{profile.name}'" for profile, _ in panels)
    whose = f"each machine profile ({names}), one panel each," if len(panels) > 1 else f"machine profile {names}"
    written.append(("roofline.png", f"Roofline of {whose} with each model's CPU attention rate (circles: "
                                    "CpuResident's head-major blocks; squares: the pinned band's token-major "
                                    "blocks, where the profile rates them apart)."))
    return written


# ---------------------------------------------------------------- report.md


def gib(value):
    return "" if value is None else f"{value / 2**30:.3g}"


def run_rows(runs):
    """One row a run, by setting and context (the file holds them in the order they were written)."""
    rows = []
    for run in sorted(runs, key=lambda r: (r.model_label, r.vram_budget_bytes, r.batch, r.context, r.repetition)):
        m = run.measured
        result = f"{m.tokens_per_second:.2f}" if m else run.reason
        rows.append((run.model_label, run.label, run.batch, gib(run.vram_budget_bytes), context_label(run.context),
                     run.repetition, outcome_text(run), result, gib(m and m.pinned_bytes),
                     gib(m and m.host_bytes)))
    return rows


BEING_WRITTEN = ("- **The file was still being written** (its `.lock` was held): runs missing here may still come; "
                 "report again when the sweep is done.")


def summary_lines(results, min_context):
    runs = results.runs
    counts = {status: sum(outcome(run) == status for run in runs) for status in STATUSES + ("memory_short",)}
    memory_short = (f", {counts['memory_short']} not run for want of the machine's free memory (their budgets may "
                    "hold them: `writescope run` measures them again on resume)" if counts["memory_short"] else "")
    lines = [f"- {len(runs)} runs: {counts['complete']} complete, {counts['does_not_fit']} did not fit, "
             f"{counts['failed']} failed{memory_short}."]
    if results.being_written:
        lines.append(BEING_WRITTEN)
    missing = missing_runs(results)
    if missing > 0:
        lines.append(f"- **{missing} of the {results.planned_runs} planned runs are not in the file** (a run "
                     "stopped before them, or `writescope merge --allow-missing` left them out): the tables and "
                     "figures compare fewer points than the experiment has.")
    if results.shard:
        lines.append(f"- **Shard {results.shard}** of the experiment: the other shards' runs are in their own files "
                     "(`writescope merge` joins them).")
    if results.damaged:
        lines.append(f"- **{len(results.damaged)} damaged runs left out** (their contents do not match their "
                     "checksums): see [Damaged runs](#damaged-runs); `writescope run` measures them again.")
    if results.unverified:
        lines.append(f"- {results.unverified} runs carry no checksum (written by an older WriteScope) and were "
                     "taken as they are.")
    if not complete(runs):
        lines.append("- No run completed, so there are no speedup, α, breakdown or prediction figures.")
    if counts["does_not_fit"] or counts["failed"] or counts["memory_short"]:
        lines.append("- Runs that did not fit, failed or were not run are listed under [Not run / did not "
                     "fit](#not-run--did-not-fit)" + (" and marked x (did not fit) or v (failed, or not run for want "
                                                      "of free memory) in the speedup figures." if complete(runs)
                                                      else "."))
    lines.append(f"- Speedups compare mean tokens/s over the repetitions both systems completed at equal model, "
                 f"batch, VRAM budget, context and machine setup; points where one of them did not fit or failed "
                 f"are counted under \"left out\"; "
                 f"the geometric means use contexts ≥ {context_label(min_context)}. The speedup, α and breakdown "
                 f"figures show {SUBJECT} with its own expert policy, as the system-against-system table does.")
    return lines


def mean_text(mean):
    return "n/a" if mean is None else f"{mean:.2f}"


def same_policy_section(runs, min_context):
    lines = [f"{SUBJECT} with a baseline's expert policy over that baseline at equal setting and context: the same "
             "experts on the same devices, so only the KV placement and the attention split differ.", ""]
    rows, unpaired = [], []
    models = by_model(runs)
    for model, baseline, mean, count, left_out in same_policy_rows(runs, min_context):
        subject = f"{SUBJECT} ({baseline} experts)"
        if count or left_out:
            rows.append((model, subject, baseline, mean_text(mean), count, left_out))
        else:
            unpaired.append(unpaired_note(model, same_policy_runs(models[model], baseline), SUBJECT, baseline,
                                          min_context, subject))
    if rows:
        lines += table(("model", "system", "baseline", "geomean speedup (×)", "points", "left out"), rows)
    elif not unpaired:
        lines.append(f"No {SUBJECT} and {', '.join(EXPERT_BASELINES)} runs to compare.")
    lines += ([""] if rows and unpaired else []) + unpaired
    unknown = sum(run.system == SUBJECT and run.expert_policy is None for run in runs)
    if unknown:
        lines += ["", f"{unknown} {SUBJECT} runs do not record their expert policy (a file written before "
                      "`expert_policy` was on every run) and are not in this table."]
    return lines


def geomean_section(runs, min_context):
    lines = [f"Each system as it runs: {SUBJECT} with its own expert policy (runs with `system_comparison` = 1).", ""]
    rows, unpaired = [], []
    models = by_model(system_runs(runs))
    for model, subject, baseline, mean, count, left_out, policies in geomean_rows(runs, min_context):
        if count or left_out:
            rows.append((model, subject, baseline, mean_text(mean), count, left_out, policies))
        else:
            unpaired.append(unpaired_note(model, models[model], subject, baseline, min_context))
    if not rows and not unpaired:
        return lines + ["No system pairs to compare."]
    if rows:
        lines += table(("model", "system", "baseline", "geomean speedup (×)", "points", "left out",
                        "system's expert policy"), rows)
    return lines + ([""] if rows and unpaired else []) + unpaired


def prediction_section(runs):
    errors = prediction_errors(complete(runs))
    if not errors:
        return ["No complete run with measured attention time."]
    rows = [(system, f"{100 * median:.1f}%", steps) for system, (median, steps) in errors.items()]
    return table(("system", "median relative error", "steps"), rows)


def missing_runs(results):
    """Planned runs of the experiment that are not in the file (neither read nor left out as damaged)."""
    return max(0, (results.planned_runs or 0) - len(results.runs) - len(results.damaged))


def not_run_section(runs, absent=0):
    """`absent`: planned runs that are not in the file at all (missing_runs)."""
    missing = [run for run in runs if not run.measured]
    if not missing:
        return [f"Every run in the file completed; {absent} planned runs are not in it (see the summary)."
                if absent else "Every run completed."]
    return [f"- {cell(run.model_label)}, {run.label}, batch {run.batch}, context {context_label(run.context)}, "
            f"repetition {run.repetition}: {outcome_text(run)} — {cell(run.reason) or 'no reason given'}"
            for run in missing]


def projected_section(runs, min_context):
    systems = {run.system for run in runs}
    if SUBJECT not in systems:
        return [f"The runs hold no {SUBJECT} runs: nothing to compare."]
    if systems == {SUBJECT}:
        return [f"{SUBJECT} is the only system in the runs: nothing to compare it with."]
    rows, below = [], []
    by_profile = best_baseline_speedups(runs)
    for profile, points in by_profile.items():
        for model in sorted({setting[0] for setting, _, _ in points}):
            at = [v for setting, context, v in points if setting[0] == model and context >= min_context]
            values = [v for v in at if v is not None]  # None: the fastest unknown, or WriteScope did not complete
            if at:
                rows.append((profile, model, mean_text(math.exp(np.mean(np.log(values))) if values else None),
                             f"{min(values):.2f}–{max(values):.2f}" if values else "n/a", len(values),
                             len(at) - len(values), paper_headline(profile)))
            else:
                contexts = sorted({context for setting, context, _ in points if setting[0] == model})
                below.append(f"- {cell(model)}: {SUBJECT} and another system both fit only at "
                             f"contexts {', '.join(context_label(c) for c in contexts)}, below `--min-context` "
                             f"({context_label(min_context)}); give a smaller `--min-context` to include them.")
    if not rows and not below:
        return [f"No setting where {SUBJECT} and another system both fit."]
    lines = table(("profile", "model", "geomean speedup (×)", "range (×)", "points",
                   f"left out (a baseline failed, or {SUBJECT} did not complete)",
                   "paper's headline"), rows) if rows else []
    # Side by side, the two columns would read as a reproduction: neither is a measurement here.
    if any(row[-1] != "—" for row in rows):
        lines += ["", "The speedups are projected from each profile's roofline; the paper's headline is the "
                      "paper's published claim for its own machines. Neither column was measured here."]
    return lines + ([""] if rows and below else []) + below


def counted(counts):
    """`a` (3 runs), `b` (1 runs), most runs first."""
    return ", ".join(f"`{name}` ({n} runs)" for name, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def build_lines(machine, whose):
    """The BUILD_FIELDS `machine` records, on one line; none where it records none."""
    fields = dict(machine.setup)
    recorded = [f"{name} `{cell('; '.join(fields[name].splitlines()))}`" for name in BUILD_FIELDS
                if fields.get(name, NOT_RECORDED) not in (NOT_RECORDED, "")]
    return [f"- Build and threads{whose}: {', '.join(recorded)}"] if recorded else []


def config_section(results):
    """The experiment's YAML that reproduces the runs, in a fenced block."""
    if not results.config:
        return ["The results file records no experiment config."]
    name, text = results.config
    fence = "`" * max([3] + [len(ticks) + 1 for ticks in re.findall("`+", text)])  # longer than any in the YAML
    what = "as written" if name == "config" else "re-emitted without comments"
    return [f"The experiment's YAML {what} (root attribute `{name}`):", "", f"{fence}yaml", text.rstrip("\n"), fence]


def provenance_lines(results):
    """What reproduces the runs (the results file; the builds and machine setups that wrote them), and a
    warning where builds or setups differ."""
    revisions = Counter(run.git_revision for run in results.runs) or Counter({results.git_revision: 0})
    setups = {}  # {label: [machine or None, runs]}, in order of first appearance
    for run in results.runs:
        setups.setdefault(run.setup_label, [run.machine, 0])[1] += 1
    lines = [f"- Results file: `{cell(results.path)}`"]
    if len(revisions) == 1:
        lines.append(f"- Git revision: `{next(iter(revisions))}`")
    else:
        lines.append(f"- **Runs of {len(revisions)} git revisions**: {counted(revisions)}; their figures compare "
                     "builds as well as systems.")
    if any(re.search(r"-dirty(-[0-9a-f]+)?$", revision) for revision in revisions):
        lines.append("- **Built from a modified tree** (`-dirty`, with a hash of the modification where recorded): "
                     "the revision alone does not rebuild these binaries.")
    if len(setups) == 1:
        machine = next(iter(setups.values()))[0]
        if machine is not None:
            ran = "Machine the projection ran on" if results.predicted else "Machine"
            lines += [f"- {ran}: {machine.describe()}", *build_lines(machine, "")]
    elif setups:
        described = "; ".join(f"{label}: `{machine.describe() if machine else 'not recorded'}` ({n} runs)"
                              for label, (machine, n) in setups.items())
        recorded = [dict(machine.setup) for machine, _ in setups.values() if machine is not None]
        differing = [name for name in SETUP_FIELDS if len({m.get(name) for m in recorded}) > 1]
        lines.append(f"- **Runs of {len(setups)} machine setups** (`--allow-different-machine`, or other host "
                     f"attention choices): {described}"
                     + (f"; they differ in {', '.join(f'`{name}`' for name in differing)}" if differing else "")
                     + ". Every figure and table compares runs of one setup only.")
        for label, (machine, _) in setups.items():
            lines += build_lines(machine, f" of {label}") if machine else []
    return lines


def report_markdown(results, figures, min_context):
    if results.predicted:
        return projected_markdown(results, figures, min_context)
    lines = [f"# WriteScope report: {results.experiment}", "",
             f"- Experiment: `{results.experiment}`"]
    lines += provenance_lines(results)
    lines += [f"- Machine profile: `{results.profile.name}`", "", "## Summary", ""]
    if not results.profile.has_gpu:
        lines += ["- **The machine profile has no GPU**: the runs came from a host-only build, where the "
                  "systems' GPU work ran on the host too. The figures check the pipeline; speedups between "
                  "CPU-GPU policies need a GPU machine.",
                  "- **WriteScope does not split here**: with no GPU in the profile its plan gives every KV "
                  "block to the CPU (alpha = 1), so these runs exercise its write policy, the split step and "
                  "feedback, not a CPU-GPU split (the host tests run that split with a GPU profile)."]
        # Every baseline but MoE-Lightning (no KV in VRAM) keeps KV in the VRAM pool, host memory here.
        vram_kv = sorted({run.system for run in results.runs} - {SUBJECT, "moe-lightning"})
        if vram_kv:
            lines += [f"- **The budgets are not equal here**: {', '.join(vram_kv)} kept their VRAM budget's share "
                      "of KV in the host build's stand-in for VRAM (host memory, outside the host budget), while "
                      f"{SUBJECT}, planning for no GPU, kept all of its KV within the host budget."]
    elif host_only := sum(run.host_only for run in results.runs):
        lines += [f"- **{host_only} runs came from a host-only build**: their machine setup records no GPU, "
                  f"although profile `{results.profile.name}` describes a GPU machine. The systems planned "
                  "for that machine and ran their GPU work on the host: the figures check the pipeline, "
                  "they are not that machine's speedups."]
    lines += summary_lines(results, min_context)
    contexts = f"geometric-mean speedup, contexts ≥ {context_label(min_context)}"
    lines += ["", f"## KV format and split alone (same expert policy; {contexts})", ""]
    lines += same_policy_section(results.runs, min_context)
    lines += ["", f"## System against system ({contexts})", ""]
    lines += geomean_section(results.runs, min_context)
    lines += ["", "## Attention prediction error", "",
              f"Median of |predicted − measured| / measured attention time per step. {SUBJECT}'s prediction is "
              "its scheduler's, whose rates follow the steps it has measured (online feedback); the other systems' "
              "is the profile's roofline as calibrated, so theirs shows how far the profile is from this machine.", ""]
    lines += prediction_section(results.runs)
    lines += ["", "## Figures", ""]
    lines += [f"- [{name}]({name}): {caption}" for name, caption in figures]
    lines += ["", "## Runs", ""]
    lines += table(("model", "system", "batch", "VRAM (GiB)", "context", "repetition", "status",
                    "tokens/s or reason", "pinned (GiB)", "host (GiB)"), run_rows(results.runs))
    lines += ["", "## Not run / did not fit", ""]
    lines += not_run_section(results.runs, missing_runs(results))
    if results.damaged:
        lines += ["", "## Damaged runs", ""]
        lines += [f"- `{name}`: {cell(why)}" for name, why in results.damaged]
    lines += ["", "## Experiment config", ""]
    lines += config_section(results)
    return "\n".join(lines) + "\n"


def projected_markdown(results, figures, min_context):
    """The report of a `writescope predict` file: every heading says it is a projection."""
    profiles = ", ".join(f"`{p}`" for p in sorted({run.profile for run in results.runs}))
    contexts = f"geometric-mean speedup, contexts ≥ {context_label(min_context)}"
    lines = [f"# {PROJECTED}: WriteScope report: {results.experiment}", "",
             f"**{PROJECTED}.** Every figure and table below is a roofline projection by `writescope predict`: "
             "each system's own placement and scheduling decisions, priced with the rates of the machine profiles "
             f"{profiles}; no kernel ran. Compare it with measurements only through `writescope predict --compare`.",
             "",
             f"- Experiment: `{results.experiment}`"]
    lines += provenance_lines(results) + ([BEING_WRITTEN] if results.being_written else [])
    lines += ["", f"## {PROJECTED}: what the profiles' figures rest on", ""]
    for name in sorted({run.profile for run in results.runs}):
        profile = results.profiles.get(name)
        sources = "; ".join(f"{section}: {text}" for section, text in profile.sources) if profile else ""
        lines.append(f"- `{name}`: {sources or 'the profile states no sources'}")
    lines += ["",
             f"## {PROJECTED}: speedup over the best baseline ({contexts})", "",
             f"{SUBJECT} with its own expert policy over the fastest other system at each setting and context, "
             "beside the paper's headline for that GPU.", ""]
    lines += projected_section(results.runs, min_context)
    lines += ["", f"## {PROJECTED}: KV format and split alone (same expert policy; {contexts})", ""]
    lines += same_policy_section(results.runs, min_context)
    lines += ["", f"## {PROJECTED}: system against system ({contexts})", ""]
    lines += geomean_section(results.runs, min_context)
    lines += ["", f"## {PROJECTED}: figures", ""]
    lines += [f"- [{name}]({name}): {caption}" for name, caption in figures]
    lines += ["", f"## {PROJECTED}: runs", ""]
    lines += table(("model", "system", "batch", "VRAM (GiB)", "context", "repetition", "status",
                    "projected tokens/s or reason", "pinned (GiB)", "host (GiB)"), run_rows(results.runs))
    lines += ["", f"## {PROJECTED}: did not fit", ""]
    lines += not_run_section(results.runs, missing_runs(results))
    lines += ["", f"## {PROJECTED}: experiment config", ""]
    lines += config_section(results)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- command line


def non_negative(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


class Once(argparse.Action):
    """An option given twice is an error (argparse keeps the last silently: `-o a -o b` wrote only b)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest + "_given", False):
            parser.error(f"{option_string} given twice")
        setattr(namespace, self.dest + "_given", True)
        setattr(namespace, self.dest, values)


def parse_arguments(argv):
    parser = argparse.ArgumentParser(prog="report", description=__doc__.splitlines()[0])
    parser.add_argument("results", help="results HDF5 file written by `writescope run`")
    parser.add_argument("-o", "--output", required=True, action=Once, help="folder for report.md and the figures")
    parser.add_argument("--min-context", type=non_negative, default=8192, action=Once,
                        help="smallest context in the geometric-mean table (default 8192)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_arguments(argv)
    if not args.output.strip():
        print("report: -o must name the folder the report is written into", file=sys.stderr)
        return 2
    try:
        results = load(args.results)
    except InputError as error:
        print(f"report: {args.results}: {error}", file=sys.stderr)
        return 2
    if results.being_written:
        print(f"report: {args.results}: another process is writing this results file ({args.results}.lock is "
              "locked): runs missing from the report may still come", file=sys.stderr)
    for name, why in results.damaged:
        print(f"report: {args.results}: {name}: {why}; left out of the report", file=sys.stderr)
    try:
        os.makedirs(args.output, exist_ok=True)
        # The whole report is written into a folder of its own inside the output folder (one file system, so
        # moving it in is a rename) before anything of the earlier report goes: a report that fails partway
        # leaves the folder as it was.
        staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=args.output)
        try:
            figures = write_figures(results, staging)
            with open(output_path(staging, "report.md"), "w", encoding="utf-8") as out:
                out.write(report_markdown(results, figures, args.min_context))
            written = ["report.md", *(name for name, _ in figures)]
            write_manifest(os.path.join(staging, MANIFEST), written)
            removed, unlisted = replace_earlier_report(args.output, staging, written)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as error:
        why = error.strerror or str(error)
        if os.path.exists(args.output) and not os.path.isdir(args.output):
            why = "is a file; -o names the folder the report is written into"
        print(f"report: {args.output}: {why}", file=sys.stderr)
        return 1
    # Files this report wrote again were replaced; the others would have been stale.
    gone = [name for name in removed if name not in written]
    if gone:
        print(f"report: {args.output}: removed {len(gone)} files of an earlier report that this one does not "
              f"write: {', '.join(gone)}")
    kept = [name for name in unlisted if name not in written]
    if kept:
        print(f"report: {args.output}: left {len(kept)} files with the report's names as they were, since no "
              f"{MANIFEST} says this script wrote them: {', '.join(kept)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
