#!/usr/bin/env bash
# Make .gpu/ (git-ignored through .git/info/exclude): what the GPU machine of the device tool
# needs to build llama-cpp-python with CUDA and run memagent there, with no network:
#   bash bench/gpu/bundle.sh            # here, with pip and the network of this machine
#   run(command="bash .gpu/run.sh", carry=[".gpu"], timeout_s=600)          # build, --version
#   run(command="bash .gpu/run.sh memagent version tests bench", carry=[".gpu"])  # at once after
# With --default-model, the default model (98 MB, over one call's 64 MiB) too, in two halves
# that travel in two calls of their own, back to back while the machine is warm (an ignored
# folder a call does not carry stays there):
#   run(command="bash .gpu/run.sh", carry=[".gpu"])                      # build
#   run(command="ls -l .gpu-model-1", carry=[".gpu-model-1"])            # half 1 travels
#   run(command="bash .gpu/run.sh model reading", carry=[".gpu-model-2"])  # half 2; join, bench
# The source release is cut to what a CUDA build reads (75 MB of vocabularies, docs, other
# backends and tools dropped: 4.9 MB); runtime wheels are those the image lacks (Python 3.12).
set -euo pipefail
cd "$(dirname "$0")/../.."
for ignored in /.gpu/ /.gpu-model-1/ /.gpu-model-2/; do
    grep -qx "$ignored" .git/info/exclude || echo "$ignored" >> .git/info/exclude
done
PY=${PY:-.venv/bin/python}
rm -rf .gpu && mkdir -p .gpu/whl .gpu/whl-build .gpu/whl-ifneeded .gpu/gitshim
cp bench/gpu/run.sh bench/gpu/pycheck.py bench/gpu/probe.py .gpu/
cp bench/gpu/git-shim .gpu/gitshim/git && chmod +x .gpu/gitshim/git
work=$(mktemp -d)
"$PY" -m pip download -q --no-deps --no-binary :all: -d "$work" llama-cpp-python==0.3.36
tar xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work"
src="$work/llama_cpp_python-0.3.36"
find "$src" -name .git -prune -exec rm -rf {} +
for dir in models docs examples tests benches gguf-py scripts media app pocs conversion \
        .github .devops; do
    rm -rf "$src/vendor/llama.cpp/$dir"
done
find "$src/vendor/llama.cpp/tools" -mindepth 1 -maxdepth 1 ! -name mtmd -exec rm -rf {} +
for backend in cann et hexagon metal openvino sycl virtgpu vulkan webgpu opencl zdnn zendnn; do
    rm -rf "$src/vendor/llama.cpp/ggml/src/ggml-$backend"
done
rm -rf "$src/docs" "$src/examples" "$src/tests" "$src/docker"
mv "$src" "$work/llama-cpp-python"
tar czf .gpu/llama-cpp-python.tar.gz -C "$work" llama-cpp-python
rm -rf "$work"
wheels=(cffi==2.1.1 cryptography==50.0.2 defusedxml==0.7.1 diskcache==5.6.3 ebooklib==0.20
        fpdf2==2.8.9 gguf==0.19.0 httpcore2==2.16.2 httpx2==2.16.2 huggingface_hub==2.4.0
        idna==3.20 platformdirs==4.14.8 pycparser==3.12 pypdf==7.1.1 tenacity==9.2.1
        truststore==0.10.5)
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64)
get() { "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$@"; }
get .gpu/whl "${wheels[@]}"
get .gpu/whl-build scikit-build-core==1.1.2
get .gpu/whl-ifneeded rich==15.0.0
# The tests' tiny model (tests/support/models.py), made here where the test material is.
"$PY" - <<'PYTHON'
import shutil, sys, tempfile
from pathlib import Path
sys.path.insert(0, "tests")
from support.models import build_tiny
folder = Path(tempfile.mkdtemp()) / "Tiny-Qwen2"
shutil.copy(build_tiny(folder, folder.parent / "tiny.Q4_1.gguf"), ".gpu/tiny.Q4_1.gguf")
PYTHON
if [ "${1:-}" = --default-model ]; then
    # The default model's GGUF in two halves; run.sh's stage `model` joins and checks them.
    model=$("$PY" -c 'from memagent_cli.models import resolve; print(resolve(None).path)')
    rm -rf .gpu-model-1 .gpu-model-2 && mkdir -p .gpu-model-1 .gpu-model-2
    half=$(( ($(stat -c %s "$model") + 1) / 2 ))
    head -c "$half" "$model" >.gpu-model-1/part
    tail -c +"$((half + 1))" "$model" >.gpu-model-2/part
    (cd "$(dirname "$model")" && sha256sum "$(basename "$model")") >.gpu/default-model.sha256
    du -sh .gpu-model-1 .gpu-model-2
fi
du -sh .gpu
