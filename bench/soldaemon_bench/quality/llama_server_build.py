"""Build llama.cpp's ``llama-server`` for the CPU it runs on, and cache it.

The peer the bench compares against is llama.cpp as its users run it: its own
``llama-server`` behind llama.vscode (see ``llama_vscode.py``). The source is
the llama.cpp tree that llama-cpp-python 0.3.36 vendors (the sdist on PyPI,
fetched with ``pip download``; nothing else is downloaded: the web UI's
prebuilt assets, CURL and OpenSSL are switched off).

The flags are explicit, never ``-march=native`` (a native build crashed on a
CI CPU before): AVX-512 with VNNI/BF16/VBMI where ``/proc/cpuinfo`` lists them,
the portable AVX2 build otherwise. Only the ``llama-server`` target is built,
``-j2`` under ``nice``. The binary lands in
``~/.cache/soldaemon/llama-server/<key>/`` (``SOLDAEMON_CACHE_DIR`` moves
the root), the key being the sdist's version and hash plus the flags; a
``build.json`` beside it records the flags, the CPU flags seen and the
``--version`` output, and every report names them.

Command line: ``python -m soldaemon_bench.quality.llama_server_build`` builds (or
finds) it and prints the binary's path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
# The sdist's sha256: pip checks it (--require-hashes) before the sdist's
# build backend runs for its metadata, and a cached copy is checked again.
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

# Always on: a release build of the server only, statically linked, nothing
# fetched at build time (no web UI download, no curl/openssl).
BASE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_NATIVE=OFF",
)
# The AVX-512 build needs these /proc/cpuinfo flags (GGML_AVX512 compiles
# with -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw).
AVX512_BASE = ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")
# Optional AVX-512 extensions: cpuinfo flag -> GGML option.
AVX512_EXTRAS = (("avx512_vnni", "GGML_AVX512_VNNI"), ("avx512_bf16", "GGML_AVX512_BF16"),
                 ("avx512vbmi", "GGML_AVX512_VBMI"))
AVX2_BASE = ("avx2", "fma", "f16c")
# Intel's AMX tiles stay off even where /proc/cpuinfo lists them: this
# llama.cpp's AMX kernels die of SIGILL at their first tile instruction
# (``tilezero`` in ``tinygemm_kernel_amx``, at the server's warm-up) on a
# Xeon KVM guest whose kernel grants the tile state (a C test of
# ldtilecfg/tilezero there ran): the tile config ends up invalid and the
# worker threads never ask for the state (llama.cpp PR 26954, open). A
# ``-march=native`` build crashes the same way, so llama.cpp's users on such
# a CPU run without AMX. AVX-VNNI (-mavxvnni) is on where listed, as in a
# native build.
AMX_EXTRAS = (("amx_tile", "GGML_AMX_TILE"), ("amx_int8", "GGML_AMX_INT8"), ("amx_bf16", "GGML_AMX_BF16"))


class BuildError(RuntimeError):
    """The server could not be built or does not run; the message says which step."""


@dataclass(frozen=True)
class ServerBinary:
    """A built, verified ``llama-server``."""

    path: Path            # the executable
    flags: tuple[str, ...]  # the CPU-dependent cmake flags it was built with
    version: str          # first line of ``llama-server --version`` (llama.cpp build)
    cpu_flags: tuple[str, ...]  # the avx* flags /proc/cpuinfo listed at build time

    def describe(self) -> str:
        """One line for reports: version and the ISA flags."""
        isa = " ".join(f.removeprefix("-D") for f in self.flags)
        return (f"llama-server of llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}'s llama.cpp (version {self.version}; "
                f"{isa})")


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The ``flags`` of the first CPU in ``/proc/cpuinfo`` (or the text given)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def isa_flags(flags: frozenset[str]) -> tuple[str, ...]:
    """The GGML cmake flags matched to a CPU's cpuinfo ``flags``.

    AVX-512 (with the VNNI/BF16/VBMI extensions present) when the base
    AVX-512 set is there; the portable AVX2+FMA+F16C build when AVX2 is
    (either with AVX-VNNI where listed); otherwise nothing beyond
    ``GGML_NATIVE=OFF`` (ggml's generic build). AMX never (see
    :data:`AMX_EXTRAS`)."""
    out: list[str] = []
    if all(f in flags for f in AVX2_BASE):
        out += ["-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"]
        out.append("-DGGML_BMI2=ON" if "bmi2" in flags else "-DGGML_BMI2=OFF")
        out.append(f"-DGGML_AVX_VNNI={'ON' if 'avx_vnni' in flags else 'OFF'}")
        if all(f in flags for f in AVX512_BASE):
            out.append("-DGGML_AVX512=ON")
            out += [f"-D{opt}={'ON' if cpu in flags else 'OFF'}" for cpu, opt in AVX512_EXTRAS]
        else:
            out.append("-DGGML_AVX512=OFF")
    out += [f"-D{opt}=OFF" for _, opt in AMX_EXTRAS]
    return tuple(out)


def cache_root() -> Path:
    """The daemon's cache folder (``~/.cache/soldaemon``; ``SOLDAEMON_CACHE_DIR`` moves it)."""
    from soldaemon import paths

    return paths.cache_dir()


def fetch_sdist(root: Path) -> Path:
    """The llama-cpp-python sdist, downloaded once with pip into
    ``root/sdist``, its sha256 :data:`SDIST_SHA256` (pip refuses another
    file before running any of its code). Raises BuildError when the
    download fails or a file of another hash is there (it is removed)."""
    target = root / "sdist" / SDIST_NAME
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="sol-sdist-") as tmp:
            pinned = Path(tmp, "requirements.txt")
            pinned.write_text(f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} --hash=sha256:{SDIST_SHA256}\n")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--require-hashes", "-r", str(pinned), "-d", str(target.parent)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not target.is_file():
            raise BuildError(f"pip download of llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} failed "
                             f"(rc {proc.returncode}): {proc.stderr.strip()[-500:]}")
    found = _sha256(target)
    if found != SDIST_SHA256:
        target.unlink()
        raise BuildError(f"{target} has sha256 {found}, not the pinned {SDIST_SHA256}; removed")
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_key(sdist_sha: str, flags: tuple[str, ...]) -> str:
    """The cache folder name: llama-cpp-python version, sdist hash, flag hash."""
    flag_hash = hashlib.sha256(" ".join(BASE_FLAGS + flags).encode()).hexdigest()[:10]
    return f"{LLAMA_CPP_PYTHON_VERSION}-{sdist_sha[:12]}-{flag_hash}"


def check_binary(path: Path) -> str:
    """Run ``path --version``; its llama.cpp version line, or BuildError."""
    try:
        proc = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{path} --version did not run: {exc}") from exc
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise BuildError(f"{path} --version exited {proc.returncode} (an illegal "
                         f"instruction is -4/132): {text[-400:]}")
    lines = [ln for ln in text.splitlines() if ln.startswith("version:")]
    return lines[0].removeprefix("version:").strip() if lines else text.splitlines()[0]


def _load_cached(folder: Path) -> ServerBinary | None:
    meta_path, exe = folder / "build.json", folder / "llama-server"
    if not (meta_path.is_file() and exe.is_file()):
        return None
    meta = json.loads(meta_path.read_text())
    return ServerBinary(exe, tuple(meta["flags"]), meta["version"], tuple(meta["cpu_flags"]))


def build_server(*, jobs: int = 2, log=None) -> ServerBinary:
    """The cached ``llama-server`` for this CPU, built first if missing.

    Afterwards ``<cache>/llama-server/<key>/llama-server`` exists, ran
    ``--version`` successfully, and ``build.json`` beside it records the flags.
    Raises BuildError naming the failing step (download, cmake, compile, run)."""
    say = log or (lambda msg: print(msg, file=sys.stderr))
    root = cache_root()
    seen = cpu_flags()
    flags = isa_flags(seen)
    sdist = fetch_sdist(root)
    folder = root / "llama-server" / build_key(_sha256(sdist), flags)
    cached = _load_cached(folder)
    if cached is not None:
        check_binary(cached.path)
        return cached
    if shutil.which("cmake") is None:
        raise BuildError("cmake is not installed (apt-get install cmake g++)")
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llama-server-build-", dir=folder) as tmp:
        src = _unpack_llama_cpp(sdist, Path(tmp))
        build_dir = Path(tmp) / "build"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        configure = ["cmake", "-S", str(src), "-B", str(build_dir), *generator, *BASE_FLAGS, *flags]
        compile_ = ["nice", "-n", "10", "cmake", "--build", str(build_dir),
                    "--target", "llama-server", "-j", str(jobs)]
        for step, cmd in (("configure", configure), ("compile", compile_)):
            say(f"llama-server build ({step}): {' '.join(cmd)}")
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise BuildError(f"llama-server {step} failed (rc {proc.returncode}): "
                                 f"{(proc.stdout + proc.stderr).strip()[-1500:]}")
        built = build_dir / "bin" / "llama-server"
        if not built.is_file():
            raise BuildError(f"the build finished but {built} is missing")
        version = check_binary(built)
        shutil.copy2(built, folder / "llama-server")
    avx = sorted(f for f in seen if f.startswith("avx"))
    meta = {"flags": list(flags), "base_flags": list(BASE_FLAGS), "version": version, "cpu_flags": avx,
            "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
            "build_seconds": round(time.monotonic() - started, 1)}
    (folder / "build.json").write_text(json.dumps(meta, indent=2) + "\n")
    say(f"llama-server built in {meta['build_seconds']} s: {folder / 'llama-server'}")
    return ServerBinary(folder / "llama-server", flags, version, tuple(avx))


def _unpack_llama_cpp(sdist: Path, dest: Path) -> Path:
    """Extract ``vendor/llama.cpp`` of the sdist into ``dest``; its root."""
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise BuildError(f"{sdist.name} holds no {prefix}")
        tar.extractall(dest, members=members, filter="data")
    return dest / prefix


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--cmake-args", action="store_true",
                        help="only print the GGML flags for this CPU (scripts/test.sh passes them to "
                             "llama-cpp-python's build as CMAKE_ARGS); needs nothing but the standard library")
    args = parser.parse_args(argv)
    if args.cmake_args:
        print(" ".join(("-DGGML_NATIVE=OFF", *isa_flags(cpu_flags()))))
        return 0
    try:
        binary = build_server(jobs=args.jobs)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(binary.path)
    print(binary.describe(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
