#!/usr/bin/env bash
# Set up the GPU machine for one batch of work (see the device tool's README): the MLIR bindings packed by
# ../shared/device/pack-mlir.sh into .devpkgs/, mgjit installed in place, a private cache. Source it:
#   source tools/gpu_session.sh && python3 -m pytest -q -m gpu tests
mkdir -p /tmp/site && tar -xJf .devpkgs/mlir-cp312.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/pip.log 2>&1 \
    || python3 -m pip install -q --no-deps -e . >>/tmp/pip.log 2>&1 || { cat /tmp/pip.log; return 1; }
export PYTHONUNBUFFERED=1 MGJIT_CACHE_DIR=/tmp/mgjit-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
