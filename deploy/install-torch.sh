#!/bin/sh
# Installs PyTorch into the image's Python for the torch backend (deploy/Dockerfile's TORCH build argument).
#   install-torch.sh ""                  nothing (the numpy backend needs no torch)
#   install-torch.sh cpu                 torch==$TORCH_VERSION, the CPU build, from $TORCH_INDEX/cpu
#   install-torch.sh cuda                torch==$TORCH_VERSION from the default index: PyPI's Linux wheel, a CUDA
#                                        build that brings the CUDA runtime as nvidia-* wheels (several GB)
#   install-torch.sh cu126               the CUDA build from $TORCH_INDEX/cu126 (any cuNNN PyTorch publishes)
#   install-torch.sh "REQUIREMENT ..."   pip arguments as given, e.g. a CPU wheel from a local directory:
#                                        "torch==2.13.0+cpu --find-links http://127.0.0.1:8765/"
# Environment: TORCH_VERSION (default 2.13.0), TORCH_INDEX (default https://download.pytorch.org/whl).
# Anything but cuda and cuNNN must stay a CPU build: pip first resolves what it would install (a dry run that
# reads the wheels' metadata) and the script refuses, before downloading them, if that includes nvidia-* wheels.
set -eu
torch=${1:-}
version=${TORCH_VERSION:-2.13.0}
index=${TORCH_INDEX:-https://download.pytorch.org/whl}
# shellcheck disable=SC2086
case "$torch" in
    "") exit 0 ;;
    cpu) set -- "torch==$version" --index-url "$index/cpu" ;;
    cuda) set -- "torch==$version" ;;
    cu[0-9]*) set -- "torch==$version" --index-url "$index/$torch" ;;
    *) set -- $torch ;;  # several pip arguments: split on purpose
esac
case "$torch" in
    cuda | cu[0-9]*) ;;
    *)
        pip install --no-cache-dir --dry-run --quiet --report /tmp/torch-plan.json "$@"
        cuda=$(python3 -c 'import json, sys
plan = json.load(open("/tmp/torch-plan.json"))["install"]
print(" ".join(p["metadata"]["name"] for p in plan if p["metadata"]["name"].lower().startswith("nvidia-")))')
        rm -f /tmp/torch-plan.json
        if [ -n "$cuda" ]; then
            echo "install-torch.sh: '$torch' resolves to a CUDA build (it needs $cuda); for a CPU image use" \
                "TORCH=cpu or a +cpu wheel, for a GPU image TORCH=cuda or TORCH=cuNNN" >&2
            exit 1
        fi
        ;;
esac
pip install --no-cache-dir "$@"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
