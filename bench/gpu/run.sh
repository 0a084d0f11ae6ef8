#!/usr/bin/env bash
# memagent on the GPU machine (H100/H200, no network): build llama-cpp-python 0.3.36 with
# CUDA from the trimmed source carried in .gpu/, install the carried wheels, run memagent.
#
# Made into .gpu/ by bench/gpu/bundle.sh; run from the repo root, with carry: [".gpu"]:
#   bash .gpu/run.sh                  # default: probe wheels buildtools cuda src build memagent version
#   bash .gpu/run.sh all              # the default, then tests and bench
#   bash .gpu/run.sh memagent version tests   # a warm machine that built it already
#   bash .gpu/run.sh ... crash cxx    # a crash taken apart (probe.py), and the libstdc++ check
#   bash .gpu/run.sh model reading    # the default model's halves joined, bench/reading.py
# Any subset runs: each start re-derives the environment (PYTHONPATH, CUDA paths, ...) from
# what earlier calls left in /tmp, and skips what is already there (FORCE_BUILD=1 rebuilds).
#
# Settings (environment): JOBS (16), CUDA_ARCH (90), BUILD_TIMEOUT (seconds for the build,
# 540: the device tool kills a call at its timeout_s, losing the summary), EXTRA_CMAKE_ARGS,
# KEEP_GOING=1 (go on after a failed stage), FORCE_BUILD=1.
# Back in $OUT: gpu.log (everything), build.log (pip -v of the build), version.json,
# stages.tsv (seconds per stage), checks.txt (requirements and imports).

cd "$(dirname "$0")/.." || exit 1
REPO=$PWD
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu.log") 2>&1
TEE_PID=$!
set -x
set -o pipefail

JOBS=${JOBS:-$(nproc)}
CUDA_ARCH=${CUDA_ARCH:-90}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-540}
SITE=/tmp/site                      # carried wheels and the built llama-cpp-python
BUILDTOOLS=/tmp/buildtools          # scikit-build-core, only if the image's is too old
SRC_DIR=/tmp/llama-cpp-python       # the trimmed sdist, unpacked
BUILD_DIR=/tmp/llama-build          # scikit-build-core's build-dir: a rerun is incremental
CUDA_FIX_ROOT=/tmp/cudaroot         # a copy of the toolkit with cuBLAS and libcuda added
VENV=/tmp/venv                      # python with bin/memagent beside it, for the tests
STATE=/tmp/memagent-gpu.env         # exports that later stages and later calls need
TARBALL=.gpu/llama-cpp-python.tar.gz

ORIG_PATH=$PATH ORIG_CUDA_HOME=${CUDA_HOME:-} ORIG_CUDA_PATH=${CUDA_PATH:-}
[ -f "$STATE" ] && . "$STATE"
export PYTHONPATH="$SITE:$REPO${BUILDTOOLS_ON:+:$BUILDTOOLS}"
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

remember() {  # remember NAME VALUE: export it now and for later stages and calls
    export "$1=$2"
    sed -i "/^export $1=/d" "$STATE" 2>/dev/null
    printf 'export %s=%q\n' "$1" "$2" >>"$STATE"
}

pip_target() {  # pip_target DIR WHEEL...: the README's offline install
    local dir=$1; shift
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$dir" "$@"
}

# ---------------------------------------------------------------------------- stages

stage_probe() {
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
    nproc; free -g; df -h /tmp "$REPO"
    command -v python3; python3 -VV; python3 -m pip --version
    cmake --version | head -1; ninja --version
    command -v nvcc && nvcc --version | tail -2
    gcc --version | head -1
    command -v git || echo "no git here: the build uses .gpu/gitshim"
    python3 -m pip list 2>/dev/null | grep -iE '^(scikit[-_]build[-_]core|cmake|ninja|typer|rich|click|numpy|huggingface[-_]hub|hf[-_]xet|tiktoken|tokenizers|lxml|psutil|jinja2|anyio|idna|h11|typing[-_]extensions|packaging|pathspec|pytest|pytest-xdist|pillow|nvidia-cublas.*|nvidia-cuda-runtime.*|cuda-toolkit|hatchling) '
    du -sh .gpu/* 2>/dev/null
    true
}

stage_wheels() {
    mkdir -p "$SITE"
    pip_target "$SITE" .gpu/whl/*.whl || return 1
    # Wheels carried only in case the image's version is below memagent's requirement.
    local extra
    extra=$(python3 .gpu/pycheck.py needed .gpu/whl-ifneeded/*.whl) || return 1
    if [ -n "$extra" ]; then pip_target "$SITE" $extra || return 1; fi
    ls "$SITE"
}

stage_buildtools() {
    # pyproject: scikit-build-core[pyproject]>=0.9.2; --no-build-isolation uses the image's.
    if python3 .gpu/pycheck.py satisfied 'scikit-build-core>=0.9.2'; then
        return 0
    fi
    pip_target "$BUILDTOOLS" .gpu/whl-build/*.whl || return 1
    remember BUILDTOOLS_ON 1
    export PYTHONPATH="$PYTHONPATH:$BUILDTOOLS"
    python3 .gpu/pycheck.py satisfied 'scikit-build-core>=0.9.2'
}

cuda_toolkit_root() {  # the toolkit nvcc belongs to (/usr/local/bin/nvcc may be a wrapper)
    local d  # as the image has it: not the copy an earlier run made ($CUDA_FIX_ROOT)
    for d in "$ORIG_CUDA_HOME" "$ORIG_CUDA_PATH" /usr/local/cuda; do
        [ -n "$d" ] && [ "$(readlink -f "$d")" != "$CUDA_FIX_ROOT" ] && [ -x "$d/bin/nvcc" ] \
            && [ -f "$d/bin/nvcc.profile" ] && { readlink -f "$d"; return 0; }
    done
    d=$(PATH=$ORIG_PATH nvcc -dryrun -E -x cu /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -1)
    [ -n "$d" ] && readlink -f "$d/.."
}

nv_wheel_dir() {  # where a pip wheel (nvidia-cublas: nvidia/cu13/) put cublas_v2.h
    local found
    found=$(python3 -c '
import glob, os, sys
for base in sys.path:
    for d in sorted(glob.glob(os.path.join(base, "nvidia", "*"))):
        if os.path.exists(os.path.join(d, "include", "cublas_v2.h")):
            print(d); raise SystemExit
')
    [ -n "$found" ] || found=$(find / -xdev -path /proc -prune -o -name cublas_v2.h \
        -path '*/include/*' -print 2>/dev/null | head -1 | xargs -r dirname | xargs -r dirname)
    echo "$found"
}

first_with() {  # first_with FILE DIR...: the first DIR holding FILE
    local file=$1 d; shift
    for d in "$@"; do [ -e "$d/$file" ] && { echo "$d"; return 0; }; done
    return 1
}

stage_cuda() {
    # ggml-cuda links CUDA::cudart, CUDA::cublas (and cublasLt) and CUDA::cuda_driver. An
    # image whose toolkit comes from pip wheels (as on the CPU machine here) may hold no
    # cuBLAS and no libcuda stub beside nvcc; torch's nvidia-cublas wheel has cuBLAS
    # (nvidia/cu13/{include,lib}, versioned .so only) and the driver has libcuda.so.1.
    # Then a copy of the toolkit gets links to them, and the build points at that copy.
    local root inc lib nv drv
    sed -i '/^export \(CUDA_ROOT\|CUDA_LIB\|NV_LIB\|CUDA_NO_VMM\)=/d' "$STATE" 2>/dev/null
    unset CUDA_ROOT CUDA_LIB NV_LIB CUDA_NO_VMM
    root=$(cuda_toolkit_root) || { echo "no CUDA toolkit (nvcc) found"; return 1; }
    inc=$(first_with cuda_runtime.h "$root/include" "$root/targets/x86_64-linux/include")
    lib=$(first_with libcudart.so "$root/lib64" "$root/lib" "$root/targets/x86_64-linux/lib")
    echo "toolkit $root include $inc lib $lib"
    [ -n "$inc" ] && [ -n "$lib" ] || { echo "no cuda_runtime.h or libcudart.so under $root"; return 1; }
    drv_ok() { [ -e "$1/libcuda.so" ] || [ -e "$1/stubs/libcuda.so" ]; }
    if [ -e "$inc/cublas_v2.h" ] && [ -e "$lib/libcublas.so" ] && [ -e "$lib/libcublasLt.so" ] \
        && { drv_ok "$lib" || ldconfig -p | grep -q 'libcuda\.so '; }; then
        remember CUDA_ROOT "$root"
    else
        nv=${NV_WHEEL_DIR:-$(nv_wheel_dir)}
        echo "cuBLAS from: ${nv:-nowhere}"
        [ -n "$nv" ] || { echo "no cublas_v2.h on this machine: cannot build ggml-cuda"; return 1; }
        rm -rf "$CUDA_FIX_ROOT"
        cp -a "$root" "$CUDA_FIX_ROOT" || return 1
        inc=${inc/#$root/$CUDA_FIX_ROOT}; lib=${lib/#$root/$CUDA_FIX_ROOT}
        local d
        for d in "$inc" "$lib"; do  # a link out of the copy would add files to the original
            case "$(readlink -f "$d")" in
                "$CUDA_FIX_ROOT"/*) ;;
                *) local real; real=$(readlink -f "$d"); rm "$d" && cp -a "$real" "$d" || return 1 ;;
            esac
        done
        local f base
        for f in "$nv"/include/*; do
            [ -e "$inc/$(basename "$f")" ] || ln -s "$f" "$inc/"
        done
        for f in "$nv"/lib/lib*.so*; do
            [ -e "$lib/$(basename "$f")" ] || ln -s "$f" "$lib/"
        done
        for base in libcublas libcublasLt; do  # linker names: the wheel has only .so.13
            [ -e "$lib/$base.so" ] || ln -s "$(ls "$lib/$base".so.[0-9]* | head -1)" "$lib/$base.so"
        done
        if ! drv_ok "$lib"; then
            drv=${CUDA_DRIVER_LIB:-$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')}
            if [ -z "$drv" ]; then
                local dirs="${LD_LIBRARY_PATH//:/ } /usr/local/nvidia/lib64 /usr/local/nvidia/lib"
                dirs="$dirs /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib/wsl/lib"
                for d in $dirs; do
                    [ -e "$d/libcuda.so.1" ] && { drv="$d/libcuda.so.1"; break; }
                done
            fi
            if [ -n "$drv" ]; then
                mkdir -p "$lib/stubs" && ln -sf "$drv" "$lib/stubs/libcuda.so"
            else
                echo "no libcuda.so.1 found: building with GGML_CUDA_NO_VMM=ON (no driver link)"
                remember CUDA_NO_VMM 1
            fi
        fi
        remember CUDA_ROOT "$CUDA_FIX_ROOT"
        remember NV_LIB "$nv/lib"
    fi
    remember CUDA_LIB "$lib"
    ls -la "$CUDA_ROOT/bin/nvcc" "$inc/cublas_v2.h" "$lib"/libcublas*.so* "$lib"/libcudart.so* "$lib"/stubs 2>&1
    "$CUDA_ROOT/bin/nvcc" --version | tail -1
}

cuda_env() {  # what building with and running against the toolkit needs
    [ -n "${CUDA_ROOT:-}" ] && [ "${CUDA_ENV_DONE:-}" != "$CUDA_ROOT" ] || return 0
    CUDA_ENV_DONE=$CUDA_ROOT
    export CUDAToolkit_ROOT="$CUDA_ROOT" CUDA_HOME="$CUDA_ROOT" CUDA_PATH="$CUDA_ROOT"
    export CUDACXX="$CUDA_ROOT/bin/nvcc" PATH="$CUDA_ROOT/bin:$PATH"
    export LD_LIBRARY_PATH="$CUDA_LIB${NV_LIB:+:$NV_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

stage_src() {
    local sum
    sum=$(sha256sum "$TARBALL" | cut -d' ' -f1) || return 1
    if [ "$(cat "$SRC_DIR/.carried-sha256" 2>/dev/null)" = "$sum" ]; then
        echo "source already unpacked at $SRC_DIR"; return 0
    fi
    rm -rf "$SRC_DIR" && mkdir -p "$SRC_DIR" &&
        tar -xzf "$TARBALL" -C "$SRC_DIR" --strip-components=1 &&
        echo "$sum" >"$SRC_DIR/.carried-sha256"
}

cmake_args() {
    echo "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH -DLLAVA_BUILD=off" \
        "-DCUDAToolkit_ROOT=$CUDA_ROOT -DCMAKE_CUDA_COMPILER=$CUDA_ROOT/bin/nvcc" \
        "${CUDA_NO_VMM:+-DGGML_CUDA_NO_VMM=ON} ${EXTRA_CMAKE_ARGS:-}"
}

stage_build() {
    local stamp="$SITE/llama_cpp/.built-from"
    local want="$(cat "$SRC_DIR/.carried-sha256") $(cmake_args)"
    if [ -z "${FORCE_BUILD:-}" ] && [ -e "$SITE/llama_cpp/lib/libggml-cuda.so" ] \
        && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        echo "llama-cpp-python already built with CUDA in $SITE"; return 0
    fi
    export CMAKE_ARGS="$(cmake_args)" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
    chmod +x "$REPO/.gpu/gitshim/git"  # in case the copy lost its mode
    # No .git travels: the shim answers CMake's three git questions as the sdist's git does.
    # PYTHONPATH: only scikit-build-core's fallback, not /tmp/site or this checkout.
    PATH="$REPO/.gpu/gitshim:$PATH" PYTHONPATH="${BUILDTOOLS_ON:+$BUILDTOOLS}" \
        timeout -k 20 "$BUILD_TIMEOUT" \
        python3 -m pip install -v --no-index --no-build-isolation --no-deps --no-cache-dir --no-compile \
        --upgrade --target "$SITE" --config-settings=build-dir="$BUILD_DIR" "$SRC_DIR" \
        >"$OUT/build.log" 2>&1
    local rc=$?
    grep -E 'CUDA|cuBLAS|ggml commit|error|Error' "$OUT/build.log" | grep -v '^ *\[' | head -60
    tail -25 "$OUT/build.log"
    [ $rc -eq 124 ] && echo "build stopped at BUILD_TIMEOUT=$BUILD_TIMEOUT s; run again on this warm machine to continue it"
    [ $rc -eq 0 ] || return $rc
    echo "$want" >"$stamp"
    ls -la "$SITE/llama_cpp/lib"
    ldd "$SITE/llama_cpp/lib/libggml-cuda.so" | grep -E 'cublas|cudart|libcuda|not found'
    true
}

stage_memagent() {
    # memagent runs from this checkout: PYTHONPATH has the repo root, and the registry is
    # the checkout's models/registry.toml (memagent_cli/models/registry.py looks there
    # first), so no `pip install -e .` (its backend, hatchling, is not in the image).
    # The tests start `memagent` beside sys.executable (tests/support/command.py): a venv
    # gives one, seeing /tmp/site, this checkout and the image's packages, in that order.
    local sp
    if [ ! -x "$VENV/bin/python3" ]; then
        python3 -m venv --without-pip "$VENV" || return 1
    fi
    sp=$("$VENV/bin/python3" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    {
        echo "import site; site.addsitedir('$SITE')"
        echo "$REPO"
        python3 -c 'import site; [print(f"import site; site.addsitedir({d!r})") for d in site.getsitepackages()]'
    } >"$sp/memagent_gpu.pth"
    cat "$sp/memagent_gpu.pth"
    printf '#!%s\nimport sys\nfrom memagent_cli.cli import main\nsys.exit(main())\n' \
        "$VENV/bin/python3" >"$VENV/bin/memagent"
    chmod +x "$VENV/bin/memagent"
    {
        python3 .gpu/pycheck.py report
        python3 .gpu/pycheck.py imports --llama
        "$VENV/bin/python3" .gpu/pycheck.py imports --llama
    } 2>&1 | tee "$OUT/checks.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ]
}

stage_version() {
    python3 -m memagent_cli --version || return 1
    python3 -m memagent_cli --version --json >"$OUT/version.json" || return 1
    "$VENV/bin/memagent" --version | head -3
    python3 - "$OUT/version.json" <<'EOF'
import json, sys
info = json.load(open(sys.argv[1]))
gpus = [d for d in info["devices"] if d["kind"] != "CPU"]
print("llama_cpp_python", info["llama_cpp_python"], "ggml", info["ggml"], info["ggml_commit"])
print("gpu_offload", info["gpu_offload"], "amx", info["amx"], "weights:", info["weights"])
for d in info["devices"]:
    print(f"  {d['kind']:5} {d['name']}: {d['description']} {d['free']/2**30:.1f}/{d['total']/2**30:.1f} GiB free")
sys.exit(0 if info["gpu_offload"] and gpus else 1)
EOF
}

stage_tests() {
    # The model tests on the tiny model (carried: .gpu/tiny.Q4_1.gguf), every layer offloaded
    # where a test leaves --gpu-layers to its default. Conversion tests need test material
    # that is not here.
    export MEMAGENT_TEST_TINY_MODEL=$REPO/.gpu/tiny.Q4_1.gguf
    timeout 240 "$VENV/bin/python3" -m pytest -m "model and not real_model" -q -p no:cacheprovider \
        -n 4 -rf --durations=15 -k "not convert and not pull and not none_with_it" tests/ 2>&1 | tee "$OUT/tests.log" | tail -40
    return 0
}

stage_bench() {
    # Which round sizes give a token its logits bit for bit, with all layers on the GPU.
    MEMAGENT_MODEL=$REPO/.gpu/tiny.Q4_1.gguf timeout 120 "$VENV/bin/python3" bench/widths.py \
        --gpu-layers 99 --threads 4 --out "$OUT/widths-gpu.json" 2>&1 | tail -40
    MEMAGENT_MODEL=$REPO/.gpu/tiny.Q4_1.gguf timeout 120 "$VENV/bin/python3" bench/widths.py \
        --gpu-layers 0 --threads 8 --out "$OUT/widths-cpu.json" 2>&1 | tail -20
    return 0
}

stage_model() {
    # The default model, carried in two halves by two calls (bundle.sh --default-model),
    # joined and checked against the sha256 taken where it was split.
    local name sum
    read -r sum name <"$REPO/.gpu/default-model.sha256" || return 1
    cat "$REPO/.gpu-model-1/part" "$REPO/.gpu-model-2/part" >"/tmp/$name" || return 1
    echo "$sum  /tmp/$name" | sha256sum -c - || return 1
    remember DEFAULT_MODEL "/tmp/$name"
}

stage_reading() {
    # The four ways of reading one document (bench/reading.py) on the default model, every
    # layer on the GPU: the figures of docs/performance.md's GPU section, kept in $OUT.
    # READING_ARGS replaces "--reading-only" (e.g. "--quick --reading-only" for a smoke run).
    [ -n "${DEFAULT_MODEL:-}" ] || { echo "no default model: run the stage model first"; return 1; }
    timeout 420 "$VENV/bin/python3" bench/reading.py --model "$DEFAULT_MODEL" --gpu-layers 99 \
        ${READING_ARGS:---reading-only} --out "$OUT/reading-gpu.json" >"$OUT/reading-gpu.log" 2>&1
    local rc=$?
    grep -v '^llama_\|^print_info\|^load\|^ggml_' "$OUT/reading-gpu.log" | tail -45
    return $rc
}

stage_crash() {
    # `memagent ask` on the tiny model, then its pieces one at a time (.gpu/probe.py), each
    # with and without Python's faulthandler; under gdb, the native stack of a crash.
    local model=$REPO/.gpu/tiny.Q4_1.gguf doc=/tmp/probe-doc.txt py=$VENV/bin/python3
    python3 -c "print('The vault code is 4711. ' * 300)" >"$doc"
    local ask=(ask "$doc" "What is the vault code?" --model "$model" --chunk-tokens 256
               --memory-tokens 32 --temperature 0 --no-reuse)
    try() {
        local name=$1; shift
        echo "----- $name: $*"
        timeout 90 "$@" >"$OUT/crash-$name.out" 2>"$OUT/crash-$name.err"
        echo "----- $name: rc=$?"
        grep -v '^llama_model_loader: - \|^print_info' "$OUT/crash-$name.err" | tail -30
    }
    try ask "$VENV/bin/memagent" "${ask[@]}"
    try ask-ngl0 "$VENV/bin/memagent" "${ask[@]}" -ngl 0
    try ask-nocrash "$py" -c 'import sys; from memagent_cli import crash
crash.install = lambda: None
from memagent_cli.cli import main
sys.argv[0] = "memagent"; sys.exit(main())' "${ask[@]}"
    local mode
    for mode in backend llama raw raw-noextra; do
        try "$mode" "$py" .gpu/probe.py "$mode" "$model"
        try "$mode-fh" "$py" -X faulthandler .gpu/probe.py "$mode" "$model"
        try "$mode-crash" "$py" .gpu/probe.py "$mode" "$model" --crash
    done
    if command -v gdb >/dev/null; then
        try gdb timeout 120 gdb -q -batch -ex 'set pagination off' -ex run -ex bt \
            -ex 'info threads' --args "$py" -m memagent_cli "${ask[@]}" --verbose
    else
        echo "no gdb here"
    fi
    return 0
}

stage_cxx() {
    # Which copy of libstdc++'s functions llama.cpp binds to, with numpy imported first (as
    # memagent does) and with memagent's backends imported first; then `memagent ask`.
    # Everything goes to $OUT/cxx.txt.
    local model=$REPO/.gpu/tiny.Q4_1.gguf doc=/tmp/probe-doc.txt py=$VENV/bin/python3
    local lib=$SITE/llama_cpp/lib sym=_ZNSo9_M_insertIlEERSoT_
    python3 -c "print('The vault code is 4711. ' * 300)" >"$doc"
    { set +x; } 2>/dev/null
    {
        echo "== std:: functions libggml-cuda exports: $(nm -D --defined-only "$lib"/libggml-cuda.so* | grep -c ' [TWV] _ZNS')"
        nm -D --defined-only "$lib"/libggml-cuda.so* | grep "$sym"
        local first
        for first in "" numpy memagent_cli.backends "numpy, memagent_cli.backends"; do
            echo "== import ${first:-nothing} first, then load raw"
            LD_DEBUG=bindings LD_DEBUG_OUTPUT=/tmp/bind timeout 60 "$py" -c "import sys, runpy
${first:+import $first}
sys.argv = ['probe', 'raw', '$model']
runpy.run_path('.gpu/probe.py', run_name='__main__')" 2>&1 | grep -v '^llama_model_loader\|^print_info\|^create_tensor\|^load_tensors\|^llama_context\|^ggml_cuda' | tail -4
            echo "rc=${PIPESTATUS[0]}"
            grep -h "libllama.*$sym" /tmp/bind.* | head -2; rm -f /tmp/bind.*
        done
        local ask=(ask "$doc" "What is the vault code?" --model "$model" --chunk-tokens 256
                   --memory-tokens 32 --temperature 0 --no-reuse)
        echo "== memagent ask (all layers on the GPU)"
        timeout 90 "$VENV/bin/memagent" "${ask[@]}" 2>/tmp/ask.err; echo "rc=$?"; tail -5 /tmp/ask.err
        echo "== memagent ask -ngl 0"
        timeout 90 "$VENV/bin/memagent" "${ask[@]}" -ngl 0 2>/tmp/ask.err; echo "rc=$?"; tail -5 /tmp/ask.err
        echo "== memagent ask --json, twice: equal?"
        timeout 90 "$VENV/bin/memagent" "${ask[@]}" --json >/tmp/a1.json 2>/dev/null
        timeout 90 "$VENV/bin/memagent" "${ask[@]}" --json >/tmp/a2.json 2>/dev/null
        python3 -c 'import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
print("replies equal:", a["reply"] == b["reply"], repr(a["reply"][:80]))' /tmp/a1.json /tmp/a2.json
    } 2>&1 | tee "$OUT/cxx.txt"
    set -x
    return 0
}

stage_cfgcheck() {  # not in the default list: CMake configure only, with the build's args
    rm -rf /tmp/cfgcheck
    PATH="$REPO/.gpu/gitshim:$PATH" cmake -S "$SRC_DIR" -B /tmp/cfgcheck -G Ninja \
        $(cmake_args) -DSKBUILD_PLATLIB_DIR=/tmp/cfgcheck/platlib >"$OUT/cfgcheck.log" 2>&1
    local rc=$?
    grep -E 'CUDA|cuBLAS|ggml commit|Error|error' "$OUT/cfgcheck.log" | head -30
    return $rc
}

# ---------------------------------------------------------------------------- driver

DEFAULT_STAGES="probe wheels buildtools cuda src build memagent version"
[ $# -eq 0 ] && set -- $DEFAULT_STAGES
[ "$*" = all ] && set -- $DEFAULT_STAGES tests bench

START=$SECONDS
FAILED=""
: >"$OUT/stages.tsv"
for stage in "$@"; do
    cuda_env
    t0=$SECONDS
    echo "===== stage $stage ($(date -u +%H:%M:%S), ${t0}s in)"
    "stage_$stage"
    rc=$?
    dt=$((SECONDS - t0))
    printf '%s\t%s\t%s\n' "$stage" "$dt" "$rc" >>"$OUT/stages.tsv"
    echo "===== stage $stage: rc=$rc in ${dt}s"
    if [ $rc -ne 0 ]; then
        FAILED="$FAILED $stage"
        [ -n "${KEEP_GOING:-}" ] || break
    fi
done
set +x
echo "===== stages (seconds, rc):"
column -t "$OUT/stages.tsv" 2>/dev/null || cat "$OUT/stages.tsv"
echo "===== total $((SECONDS - START))s; failed:${FAILED:- none}"
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null
[ -z "$FAILED" ]
