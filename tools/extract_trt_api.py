#!/usr/bin/env python3
"""Read the Python API names of TensorRT 10 and 11 out of NVIDIA's binding wheels (no GPU, no TensorRT libs).

    python tools/extract_trt_api.py                 # writes tests/engines/data/trt_api_<version>.txt
    python tools/extract_trt_api.py --wheels DIR    # use wheels already in DIR (else pip downloads them)

The bindings are a pybind11 extension, ``tensorrt_bindings/tensorrt.so``: every class, method, property and
enum member is registered by passing its name as a C string, which the compiler loads with a RIP-relative
``lea`` from ``.text``. So the names are the NUL-terminated identifiers in ``.rodata`` that some ``lea``
points at (a plain ``strings`` misses short names that the linker merged into the tail of longer ones, e.g.
``name`` inside ``node_name``). Names defined in the wheel's ``__init__.py`` (``__version__``, ``nptype``,
...) are added.

Enum members of the same enum are registered one after another; for the enums the engines use, the file also
records the run of consecutive UPPER_CASE names around an anchor member (a superset of that enum's members
where the compiler placed two enums' registrations side by side), so ``BuilderFlag.FP16`` can be checked
rather than just ``FP16`` (``DataType.INT8`` keeps the bare name alive in 11).

Output: provenance header (wheel file name + sha256), ``[enum NAME]`` sections, then ``[names]``.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import re
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSIONS = ("10.16.1.11", "11.4.0.106")
PACKAGE = "tensorrt_cu13_bindings"
OUT_DIR = Path(__file__).resolve().parent.parent / "tests" / "engines" / "data"
IDENT = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")
UPPER = re.compile(r"[A-Z][A-Z0-9_]*")
LEA = re.compile(rb"[\x48\x4c]\x8d[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]")  # lea r64, [rip + disp32]
# enum (as the engines name it) -> a member present in every version, found in exactly one run
ENUM_ANCHORS = {
    "BuilderFlag": "GPU_FALLBACK",
    "NetworkDefinitionCreationFlag": "STRONGLY_TYPED",
    "ILogger.Severity": "VERBOSE",
    "DataType": "HALF",
    "MemoryPoolType": "WORKSPACE",
    "TensorIOMode": "INPUT",
}


def elf_sections(data: bytes) -> dict[str, tuple[int, int, int]]:
    """name -> (virtual address, file offset, size) of an ELF64 little-endian file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not an ELF64 little-endian file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_offset = headers[shstrndx][4]
    out = {}
    for name_off, _type, _flags, addr, offset, size in headers:
        start = strtab_offset + name_off
        name = data[start : data.index(b"\0", start)].decode()
        out[name] = (addr, offset, size)
    return out


def lea_identifiers(data: bytes) -> list[str]:
    """Identifiers in .rodata referenced by RIP-relative lea in .text, in code order."""
    sections = elf_sections(data)
    text_addr, text_off, text_size = sections[".text"]
    ro_addr, ro_off, ro_size = sections[".rodata"]
    text = data[text_off : text_off + text_size]
    names = []
    for match in LEA.finditer(text):
        i = match.start()
        (disp,) = struct.unpack_from("<i", text, i + 3)
        target = text_addr + i + 7 + disp
        if not ro_addr <= target < ro_addr + ro_size:
            continue
        start = ro_off + target - ro_addr
        end = data.find(b"\0", start, start + 256)
        if end > start and IDENT.fullmatch(data[start:end]):
            names.append(data[start:end].decode())
    return names


def enum_runs(ordered: list[str]) -> dict[str, list[str]]:
    runs: list[list[str]] = []
    current: list[str] = []
    for name in ordered:
        if UPPER.fullmatch(name):
            current.append(name)
        else:
            if current:
                runs.append(current)
            current = []
    if current:
        runs.append(current)
    out = {}
    for enum, anchor in ENUM_ANCHORS.items():
        hits = [run for run in runs if anchor in run]
        if len(hits) != 1:
            raise SystemExit(f"anchor {anchor} of {enum} is in {len(hits)} runs; pick another anchor")
        out[enum] = sorted(set(hits[0]))
    return out


def init_names(source: str) -> set[str]:
    """Top-level names an ``__init__.py`` defines, and attributes it assigns on classes
    (``Logger.Severity``)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif isinstance(target, ast.Attribute):
                    names.add(target.attr)
    return names


def download(version: str, dest: Path) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--implementation", "cp",
        "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "-d", str(dest),
        f"{PACKAGE}=={version}",
    ]  # fmt: skip
    subprocess.run(cmd, check=True)
    return find_wheel(dest, version)


def find_wheel(folder: Path, version: str) -> Path:
    wheels = sorted(folder.glob(f"{PACKAGE}-{version}-*.whl"))
    if not wheels:
        raise FileNotFoundError(f"no {PACKAGE}-{version} wheel in {folder}")
    return wheels[0]


def extract(wheel: Path, version: str) -> str:
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    with zipfile.ZipFile(wheel) as z:
        so = z.read("tensorrt_bindings/tensorrt.so")
        init = z.read("tensorrt_bindings/__init__.py").decode()
    ordered = lea_identifiers(so)
    names = set(ordered) | init_names(init)
    lines = [
        f"# TensorRT {version} Python API names, read by tools/extract_trt_api.py (do not edit by hand)",
        f"# wheel: {wheel.name}",
        f"# sha256: {digest}",
        "# method: identifiers in .rodata referenced by RIP-relative lea from .text",
        "#         of tensorrt_bindings/tensorrt.so (pybind11 registration names)",
        "#         + names defined in tensorrt_bindings/__init__.py",
    ]
    for enum, members in enum_runs(ordered).items():
        lines += ["", f"[enum {enum}]", *members]
    lines += ["", "[names]", *sorted(names)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--wheels", type=Path, help="folder with the wheels (default: pip download into a temp dir)"
    )
    p.add_argument("--out", type=Path, default=OUT_DIR, help=f"output folder (default {OUT_DIR})")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for version in VERSIONS:
            wheel = find_wheel(args.wheels, version) if args.wheels else download(version, Path(tmp))
            text = extract(wheel, version)
            target = args.out / f"trt_api_{version}.txt"
            target.write_text(text)
            print(f"{target}: {text.count(chr(10))} lines from {wheel.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
