"""Builds .whlfi/fi.tar.xz (FlashInfer 0.7.4 cut for the decode / prefill JIT, + what `import flashinfer` needs)
from wheels in WHEELS (default /tmp/fi/wheels). Not needed on the GPU machine; kept for reproducibility.

    mkdir -p /tmp/fi/wheels && cd /tmp/fi/wheels && pip download --no-deps --python-version 3.12 \
        --platform manylinux_2_28_x86_64 --only-binary=:all: <each wheel named in ALWAYS, OPTIONAL and NINJA below>
    python benchmarks/gpu/build_fi.py            # writes .whlfi/fi.tar.xz + MANIFEST.txt (OUT_DIR to change)

Tar layout (read by `bash benchmarks/gpu/peers.sh install_fi`):
  site/...        always unpacked into $SITE: flashinfer (cut), tvm_ffi (cp312)
  opt/<mod>/...   unpacked into $SITE only where <mod> does not import on the machine (pure Python)
  bin/ninja       unpacked to $SITE/bin/ninja only where no ninja is on PATH
"""
import io, lzma, os, sys, tarfile, zipfile, hashlib, time

WHEELS = os.environ.get("WHEELS", "/tmp/fi/wheels")
OUT = os.environ.get("OUT_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".whlfi"))
ALWAYS = ["flashinfer_python-0.7.4-py3-none-any.whl", "apache_tvm_ffi-0.1.15.post2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"]
# key module -> wheel; installed only where the key module is missing (typing_extensions: or lacks get_annotations)
OPTIONAL = {
    "requests": "requests-2.34.2-py3-none-any.whl",
    "urllib3": "urllib3-2.8.0-py3-none-any.whl",
    "idna": "idna-3.20-py3-none-any.whl",
    "charset_normalizer": "charset_normalizer-3.5.3-py3-none-any.whl",
    "certifi": "certifi-2026.10.19.post1-py3-none-any.whl",
    "pynvml": "nvidia_ml_py-13.615.71-py3-none-any.whl",
    "tqdm": "tqdm-4.70.1-py3-none-any.whl",
    "jinja2": "jinja2-3.1.6-py3-none-any.whl",
    "markupsafe": "markupsafe-3.0.4-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl",
    "filelock": "filelock-4.3.1-py3-none-any.whl",
    "typing_extensions": "typing_extensions-4.16.0-py3-none-any.whl",
}
NINJA = "ninja-1.13.2-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"


def keep_flashinfer(name: str) -> bool:
    p = name.split("/")
    if p[0] != "flashinfer":
        return p[0].endswith(".dist-info")  # flashinfer_python-0.7.4.dist-info (build_backend.py, b12x/: no)
    if len(p) > 2 and p[1] == "data":
        if p[2] in ("include", "cutlass", "cccl", "spdlog"):
            return True
        if p[2] == "csrc":
            return len(p) == 4  # the top-level csrc files (sources + jinja templates the JIT reads)
        return len(p) == 3  # data/*.py
    return not name.endswith(".cu")  # Python files and small data files; no kernel sources of other ops


def add(tf, name, data, mode=0o644):
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime = len(data), mode, 1764633600
    tf.addfile(ti, io.BytesIO(data))


def members():
    for w in ALWAYS:
        z = zipfile.ZipFile(os.path.join(WHEELS, w))
        for i in z.infolist():
            if i.is_dir() or (w.startswith("flashinfer") and not keep_flashinfer(i.filename)):
                continue
            yield "site/" + i.filename, z.read(i), (0o755 if i.filename.endswith(".so") else 0o644)
    for key, w in OPTIONAL.items():
        z = zipfile.ZipFile(os.path.join(WHEELS, w))
        for i in z.infolist():
            if not i.is_dir() and i.filename != "example.py":  # nvidia-ml-py ships a top-level example.py
                yield f"opt/{key}/" + i.filename, z.read(i), (0o755 if i.filename.endswith(".so") else 0o644)
    z = zipfile.ZipFile(os.path.join(WHEELS, NINJA))
    yield "bin/ninja", z.read("ninja-1.13.2.data/scripts/ninja"), 0o755


WHY = {
    "flashinfer": "FlashInfer, cut: all files outside data/ except *.cu kernel sources of other ops; data/{include,cutlass,cccl,spdlog}, data/*.py and the top-level data/csrc files (what the decode / prefill JIT reads)",
    "tvm_ffi": "apache-tvm-ffi, cp312 manylinux_2_28 binary (FlashInfer's JIT modules load through it), whole wheel",
    "requests": "imported at `import flashinfer` (flashinfer/artifacts.py)", "urllib3": "requests' dependency",
    "idna": "requests' dependency", "charset_normalizer": "requests' dependency (pure-Python wheel)",
    "certifi": "requests' dependency", "pynvml": "nvidia-ml-py: imported at `import flashinfer` (flashinfer/utils.py)",
    "tqdm": "imported at `import flashinfer` (flashinfer/autotuner)",
    "jinja2": "the JIT's templates (torch's dependency: normally already there)", "markupsafe": "jinja2's dependency (cp312; has a pure fallback)",
    "filelock": "flashinfer/jit/core.py (torch's dependency: normally already there)",
    "typing_extensions": "apache-tvm-ffi needs >= 4.13 (get_annotations); installed only where the machine's lacks it",
}


def manifest(dst, sizes, files):
    import re
    h = hashlib.sha256(open(dst, "rb").read()).hexdigest()
    L = [f"fi.tar.xz  {os.path.getsize(dst)} bytes ({os.path.getsize(dst) / 2**20:.2f} MiB), sha256 {h}",
         f"built by build_fi.py (this folder) from PyPI wheels in {WHEELS}; unpacked by `bash benchmarks/gpu/peers.sh install_fi`",
         "", "tar part                 package                           files   MB raw   what for"]
    wheels = {**{k: w for k, w in zip(("flashinfer", "tvm_ffi"), ALWAYS)}, **OPTIONAL}
    for k, w in wheels.items():
        part = ("site/" if k in ("flashinfer", "tvm_ffi") else f"opt/{k}/")
        name, ver = w.split("-")[:2]
        L.append(f"{part:24s} {name + ' ' + ver:32s} {files[k]:6d} {sizes[k] / 1e6:8.2f}   {WHY[k]}")
    L.append(f"{'bin/ninja':24s} {'ninja 1.13.2 (binary only)':32s} {1:6d} {sizes['ninja'] / 1e6:8.2f}   the JIT runs `ninja`; unpacked to $SITE/bin (append to PATH only where the machine has none)")
    L += ["", "site/ is always unpacked into $SITE; opt/<module>/ only where <module> does not import on the machine already",
          "(the machine's own copies are not shadowed); the only binary code is tvm_ffi (cp312) and markupsafe's optional speedup.",
          "Not included (imported only inside functions the project never calls, or already on the GPU machine):",
          "  cuda-python / cuda-bindings, cuda-tile, nvidia-cudnn-frontend, nvidia-cutlass-dsl, nccl4py, nccl-extensions,",
          "  click, tabulate (CLI), einops (flashinfer.testing), torch-c-dlpack-ext (its addons stop at torch 2.9; newer torch",
          "  has __dlpack_c_exchange_api__ itself); torch, numpy, packaging (on the machine).",
          "FlashInfer APIs the project calls: BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper (plan/run,",
          "  incl. use_cuda_graph=True; the sparse path is the decode wrapper with pages of one token): JIT = batch_decode (fa2)",
          "  and batch_prefill (fa3 on SM90, fa2 elsewhere) from data/csrc/*.{cu,cuh,jinja} + data/include, cutlass, cccl, spdlog."]
    open(os.path.join(OUT, "MANIFEST.txt"), "w").write("\n".join(L) + "\n")


def key_of(name):
    p = name.split("/")
    if p[0] == "opt":
        return p[1]
    if p[0] == "bin":
        return "ninja"
    return "flashinfer" if p[1].startswith("flashinfer") else "tvm_ffi"


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    dst = os.path.join(OUT, "fi.tar.xz")
    sizes, files = {}, {}
    for name, data, mode in members():
        k = key_of(name)
        sizes[k] = sizes.get(k, 0) + len(data)
        files[k] = files.get(k, 0) + 1
    if "--manifest-only" not in sys.argv:
        t = time.time()
        with tarfile.open(dst + ".tmp", "w:xz", preset=9 | lzma.PRESET_EXTREME, format=tarfile.PAX_FORMAT) as tf:
            for name, data, mode in members():
                add(tf, name, data, mode)
        os.replace(dst + ".tmp", dst)
        print(f"built in {time.time() - t:.0f} s")
    manifest(dst, sizes, files)
    print(open(os.path.join(OUT, "MANIFEST.txt")).read())
