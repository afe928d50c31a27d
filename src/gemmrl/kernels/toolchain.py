"""The toolchain of every native CUDA build: nvcc, the CUDA home, the target arch, CUTLASS's headers, ptxas's
report, the first error of a build log and the hash that keys a build cache.

Three builders use it, each keeping what it builds and what goes into its cache key:
  ``cuda_source``     nvcc to a shared object loaded with ctypes (raw CUDA candidates; the cutlass_sm90,
                      tiny_gemm and wgmma_gemm families build through it);
  ``cuda_l2_import``  a torch extension per CUDA-L2 kernel file (torch's builder runs nvcc);
  ``vendor``          csrc/vendor_blas.cu against cuBLAS.

What they share:
  nvcc         :func:`find_nvcc` ($GEMMRL_NVCC, $CUDA_HOME/bin, $CUDA_PATH/bin, PATH, /usr/local/cuda/bin),
               :func:`nvcc_version_text` (``nvcc --version``'s output) and :func:`nvcc_version` (``13.0.88``)
  CUDA home    :func:`cuda_home`, the root torch's extension builder compiles with
  arch         :func:`arch_for` (``90a`` on Hopper): an explicit arch, else ``$GEMMRL_CUDA_ARCH``, else the GPU's;
               :func:`gencode`, its nvcc flag
  headers      :func:`cutlass_include_dirs` / :func:`cutlass_version` (:class:`CutlassNotFound` says how to get
               them), :func:`include_dirs` / :func:`include_version` (named include sets and what of them keys a build)
  reports      :class:`Ptxas` (``-Xptxas -v``: registers, spills, shared memory, performance warnings),
               :func:`parse_build_log` and :func:`log_head` (the first error of a failed build, structured)
  keys         :func:`digest`, the hash of a build's inputs

Importing this module imports no torch and runs nothing; torch is imported only by :func:`cuda_home` and by
:func:`arch_for` when it has to ask the GPU.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

DEFAULT_CUDA_ROOTS = ("/usr/local/cuda",)
ARCH_ENV = "GEMMRL_CUDA_ARCH"
ARCH_ENV_ALIAS = "GEMMRL_IMPORT_ARCH"  # the older name of ARCH_ENV, still read (see arch_for)
CUTLASS_HINT = ("CUTLASS headers not found: `pip install nvidia-cutlass` (or gemmrl[cutlass]) or set CUTLASS_DIR "
                "to a CUTLASS checkout (v4.2, the one holding include/cutlass/cutlass.h)")


class CutlassNotFound(RuntimeError):
    """The source includes CUTLASS/CuTe but no headers were found; the message says how to get them."""


# ---------------------------------------------------------------------------------------------------------
# nvcc and the CUDA home
# ---------------------------------------------------------------------------------------------------------
def find_nvcc(env: Mapping[str, str] | None = None) -> str:
    """The first executable nvcc of $GEMMRL_NVCC, $CUDA_HOME/bin, $CUDA_PATH/bin, the ``PATH`` and the
    ``DEFAULT_CUDA_ROOTS``' bin (``env``: os.environ unless given); '' if there is none."""
    env = os.environ if env is None else env
    tried = []
    if env.get("GEMMRL_NVCC"):
        tried.append(env["GEMMRL_NVCC"])
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            tried.append(os.path.join(env[var], "bin", "nvcc"))
    which = shutil.which("nvcc", path=env.get("PATH", ""))
    if which:
        tried.append(which)
    tried += [os.path.join(r, "bin", "nvcc") for r in DEFAULT_CUDA_ROOTS]
    for p in tried:
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return ""


@lru_cache(maxsize=None)
def nvcc_version_text(nvcc: str) -> str:
    """``nvcc --version``'s output, stripped (once per nvcc path and process). Raises OSError or
    subprocess.SubprocessError where ``nvcc`` cannot run."""
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()


def nvcc_version(nvcc: str) -> str:
    """nvcc's version (``13.0.88``), else the last 80 characters of what ``nvcc --version`` printed."""
    out = nvcc_version_text(nvcc)
    m = re.search(r"release [\d.]+, V([\d.]+)", out)
    return m.group(1) if m else out[-80:]


def cuda_home() -> str:
    """The CUDA root torch's extension builder uses; when torch has none (a CPU build of torch), the same guesses
    torch makes: $CUDA_HOME / $CUDA_PATH, the nvcc on PATH, /usr/local/cuda. '' if none holds bin/nvcc and
    include/cuda_runtime.h."""
    from torch.utils import cpp_extension  # torch: seconds of start-up, and only torch-extension builds ask

    if cpp_extension.CUDA_HOME:
        return cpp_extension.CUDA_HOME
    guesses = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        guesses += [str(Path(nvcc).parent.parent), str(Path(nvcc).resolve().parent.parent)]
    guesses += list(DEFAULT_CUDA_ROOTS)
    for home in filter(None, guesses):
        if (Path(home) / "bin" / "nvcc").exists() and (Path(home) / "include" / "cuda_runtime.h").exists():
            return home
    return ""


# ---------------------------------------------------------------------------------------------------------
# the target arch
# ---------------------------------------------------------------------------------------------------------
def normalize_arch(arch: str) -> str:
    """``sm_90a``, ``9.0a`` and ``90a`` are all ``90a``."""
    return arch.replace(".", "").replace("sm_", "")


def arch_for(device: int | None = None, *, arch: str | None = None) -> str:
    """The arch to build for, as ``-gencode`` takes it: ``arch`` when given; else ``$GEMMRL_CUDA_ARCH`` (which
    lets a machine with no GPU compile); else ``$GEMMRL_IMPORT_ARCH``, the older name of the same setting, still
    read here (and only here) so that existing setups keep working; else the compute capability of ``device``
    (torch): ``90a`` for 9.0 (the 'a' target carries the wgmma/TMA instructions SM90 kernels need; likewise for
    later majors), ``80`` for 8.0. Spellings like ``sm_90a`` or ``9.0a`` are read as ``90a``."""
    given = arch or os.environ.get(ARCH_ENV) or os.environ.get(ARCH_ENV_ALIAS)
    if given:
        return normalize_arch(given)
    import torch  # torch: seconds of start-up, and only a build with no arch given asks the GPU

    if not torch.cuda.is_available():
        raise RuntimeError(f"no CUDA device to take the arch from: set {ARCH_ENV} (e.g. 90a) or pass arch=")
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}{minor}" + ("a" if major >= 9 else "")


def gencode(arch: str) -> str:
    """nvcc's flag for SASS of ``arch`` (``90a``), and nothing else (no PTX)."""
    return f"-gencode=arch=compute_{arch},code=sm_{arch}"


# ---------------------------------------------------------------------------------------------------------
# headers
# ---------------------------------------------------------------------------------------------------------
def cutlass_include_dirs() -> list[Path]:
    """CUTLASS's ``include`` and ``tools/util/include``: from the installed ``cutlass_library`` package
    (the nvidia-cutlass wheel ships them under ``source/``), else ``$CUTLASS_DIR``; else
    :class:`CutlassNotFound` saying how to get them."""
    try:
        import cutlass_library  # noqa: PLC0415 - optional dependency (nvidia-cutlass), may be missing

        root = Path(cutlass_library.__file__).resolve().parent / "source"
        if (root / "include" / "cutlass" / "cutlass.h").is_file():
            return [root / "include", root / "tools" / "util" / "include"]
    except ImportError:
        pass
    env = os.environ.get("CUTLASS_DIR")
    if env:
        root = Path(env).expanduser()
        if (root / "include" / "cutlass" / "cutlass.h").is_file():
            return [root / "include", root / "tools" / "util" / "include"]
        raise CutlassNotFound(f"CUTLASS_DIR={env} has no include/cutlass/cutlass.h. " + CUTLASS_HINT)
    raise CutlassNotFound(CUTLASS_HINT)


def cutlass_version(dirs: Sequence[Path]) -> str:
    """``major.minor.patch@<include dir>`` of the CUTLASS in ``dirs[0]`` ('' for no dirs): what of CUTLASS keys an
    imported kernel's build."""
    if not dirs:
        return ""
    vh = dirs[0] / "cutlass" / "version.h"
    ver = re.findall(r"#define\s+CUTLASS_(MAJOR|MINOR|PATCH)\s+(\d+)", vh.read_text()) if vh.is_file() else []
    return ".".join(v for _, v in ver) + "@" + str(dirs[0])


def include_dirs(names: Iterable[str]) -> list[str]:
    """Include dirs for named sets: ``"cutlass"`` is :func:`cutlass_include_dirs` (raises
    :class:`CutlassNotFound`), anything else a directory (made absolute)."""
    out: list[str] = []
    for n in names:
        if n == "cutlass":
            out += [str(p) for p in cutlass_include_dirs()]
        else:
            out.append(str(Path(n).resolve()))
    return out


def include_version(dirs: Sequence[str]) -> str:
    """What of the include dirs goes into a cache key: CUTLASS's version.h, else the dir paths. A dir inside the
    ``nvidia-cutlass`` wheel (its tools/util headers) counts by its path within the wheel, so that objects built
    where the wheel sits elsewhere (a carried build cache) still hit."""
    parts = []
    for d in dirs:
        vh = Path(d) / "cutlass" / "version.h"
        pp = Path(d).parts
        if vh.is_file():
            parts.append(hashlib.sha256(vh.read_bytes()).hexdigest()[:12])
        elif "cutlass_library" in pp:
            parts.append("/".join(pp[pp.index("cutlass_library"):]))
        else:
            parts.append(d)
    return ";".join(parts)


# ---------------------------------------------------------------------------------------------------------
# reports: ptxas, build logs
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ptxas:
    """What ``-Xptxas -v`` reported for a build: kernels compiled, the most registers one uses, spill bytes stored
    and loaded (summed over kernels), the most static shared memory one uses, and ptxas's "Potential Performance
    Loss" notes (e.g. C7510: wgmma serialized), which cost a Hopper kernel dearly."""

    kernels: int = 0
    max_registers: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    smem_bytes: int = 0
    perf_warnings: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> "Ptxas":
        regs = [int(x) for x in re.findall(r"ptxas info\s*: Used (\d+) registers", text)]
        stores = sum(int(x) for x in re.findall(r"(\d+) bytes spill stores", text))
        loads = sum(int(x) for x in re.findall(r"(\d+) bytes spill loads", text))
        smem = [int(x) for x in re.findall(r"ptxas info\s*: Used \d+ registers[^\n]*?(\d+) bytes smem", text)]
        perf = sorted(set(re.findall(r"\((C\d+)\) Potential Performance Loss: ([^']*?)(?: in the function|$)", text,
                                     re.M)))
        return cls(len(regs), max(regs, default=0), stores, loads, max(smem, default=0),
                   tuple(f"{code}: {msg.strip()}" for code, msg in perf))

    def as_record(self, smem: bool = True) -> dict[str, Any]:
        """Plain data, ``perf_warnings`` a list; ``smem=False`` leaves ``smem_bytes`` out (the ``ptxas`` record of
        an imported kernel's build, ``cuda_l2_import``, has no shared memory)."""
        d: dict[str, Any] = {"kernels": self.kernels, "max_registers": self.max_registers,
                             "spill_store_bytes": self.spill_store_bytes, "spill_load_bytes": self.spill_load_bytes}
        if smem:
            d["smem_bytes"] = self.smem_bytes
        d["perf_warnings"] = list(self.perf_warnings)
        return d


_ERR_NVCC = re.compile(r"^(?P<file>[^\s(][^(\n]*)\((?P<line>\d+)\): (?:catastrophic )?error\b[^:\n]*: (?P<msg>.*)$", re.M)
_ERR_GCC = re.compile(r"^(?P<file>[^\s:][^:\n]*):(?P<line>\d+):(?:\d+:)? (?:fatal )?error: (?P<msg>.*)$", re.M)
_ERR_LINK = re.compile(r"^(?P<msg>.*(?:\bld(?:\.\w+)?: |collect2|undefined reference|cannot find -l).*)$", re.M)
_ERR_ANY = re.compile(r"^(?P<msg>.*\berror\b.*)$", re.M | re.I)


def parse_build_log(text: str, build_dir: str | Path = "", source: str = "") -> dict[str, Any]:
    """First error in a build log: ``stage`` (compile | link | build), ``file``, ``line``, ``message``.
    Paths to the copied kernel (``kernel.cu``) in ``build_dir`` are reported as ``source``; the generated
    ``binding.cpp`` of an imported kernel is marked as generated."""
    hits = []
    for rx, stage in ((_ERR_NVCC, "compile"), (_ERR_GCC, "compile"), (_ERR_LINK, "link")):
        m = rx.search(text)
        if m:
            hits.append((m.start(), stage, m))
    if not hits:
        m = _ERR_ANY.search(text)
        return {"stage": "build", "file": source or None, "line": None,
                "message": (m.group("msg").strip() if m else "build failed (no error line in the log)")[:500]}
    _, stage, m = min(hits, key=lambda h: h[0])
    gd = m.groupdict()
    file = gd.get("file")
    if file and Path(file).name == "kernel.cu" and (not build_dir or str(build_dir) in file or not os.path.isabs(file)):
        file = source or file
    elif file and Path(file).name == "binding.cpp":
        file = f"{Path(build_dir) / 'binding.cpp'} (generated)" if build_dir else "binding.cpp (generated)"
    return {"stage": stage, "file": file if stage == "compile" else (source or None),
            "line": int(gd["line"]) if gd.get("line") else None, "message": gd["msg"].strip()[:500]}


def log_head(text: str, n: int = 30) -> str:
    """``n`` lines of compiler output from a build log, starting a few lines before the first error (from
    the top when there is none), without ninja's long command lines."""
    keep = [ln[:300] for ln in text.splitlines()
            if ln.strip() and not re.match(r"^\[\d+/\d+\] ", ln) and len(ln) < 2000]
    first = next((i for i, ln in enumerate(keep) if re.search(r"\berror\b|cannot find|undefined reference", ln)), 0)
    start = max(0, first - 3)
    return "\n".join(keep[start:start + n])


# ---------------------------------------------------------------------------------------------------------
# cache keys
# ---------------------------------------------------------------------------------------------------------
def digest(parts: Iterable[str], length: int) -> str:
    """The key of a build cache entry: sha256 over ``parts``, each followed by a 0x1f separator (so that moving
    text from one part to the next changes the key), as hex, its first ``length`` characters. What goes into the
    parts is the builder's: every input that changes the built object."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\x1f")
    return h.hexdigest()[:length]


__all__ = ["DEFAULT_CUDA_ROOTS", "ARCH_ENV", "ARCH_ENV_ALIAS", "CUTLASS_HINT", "CutlassNotFound", "find_nvcc",
           "nvcc_version_text", "nvcc_version", "cuda_home", "normalize_arch", "arch_for", "gencode",
           "cutlass_include_dirs", "cutlass_version", "include_dirs", "include_version", "Ptxas", "parse_build_log",
           "log_head", "digest"]
