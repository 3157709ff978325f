#!/usr/bin/env bash
# make gpu-acceptance on a GPU machine whose python3 (3.12) has torch and nvidia-ml-py but not Ray, MLflow or
# Optuna, and no package index: those come from .gpu/site312.tar.xz, made on a machine with one (`pip download
# --only-binary=:all: --python-version 3.12` of ray[default,train,tune]==2.60.0 mlflow==3.17.2 optuna==5.0.0
# pydantic, `pip install --no-deps --target site`, less what the GPU image already has (numpy, pandas, pyarrow,
# scipy, scikit-learn, matplotlib, pillow), ray/jars, ray/rllib, ray/serve, ray/llm and mlflow/server/js;
# `tar cJf`). How benchmarks/gpu/h200-2026-11-26 was produced (then with OUT set by the machine's runner).
# Usage, from the repo root: GIT_SHA=<commit> bash benchmarks/gpu/acceptance_bundled.sh STAGES ROUNDS PARITY_STEPS LIMIT_S
# [more gpu_acceptance.py options, e.g. --set memory:space.compile=false --stage-timeout-s 240]
# Writes OUT (default /tmp/acceptance-out): results.jsonl (the repo's, with this run's entries appended) and acc.tgz.
set -u
OUT=${OUT:-/tmp/acceptance-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 GIT_SHA
T0=$(date +%s)
mkdir -p /tmp/site && tar xJf .gpu/site312.tar.xz -C /tmp/site || exit 9
export PYTHONPATH=/tmp/site:$PWD
echo "unpacked in $(( $(date +%s) - T0 )) s"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
nproc; free -g | head -2
python3 -c "import torch,ray,mlflow,optuna,pynvml,pydantic;print('torch',torch.__version__,'ray',ray.__version__,'mlflow',mlflow.__version__,'optuna',optuna.__version__,torch.cuda.get_device_name())" || exit 8
mkdir -p /tmp/acc
timeout "$4" python3 benchmarks/gpu_acceptance.py --out /tmp/acc --stages "$1" --rounds "$2" --parity-steps "$3" \
  --stage-timeout-s 300 "${@:5}" 2>&1 | tee /tmp/acc/acceptance.log
echo "acceptance rc=${PIPESTATUS[0]} at +$(( $(date +%s) - T0 )) s"
cp benchmarks/results.jsonl "$OUT/results.jsonl"
tar czf "$OUT/acc.tgz" -C /tmp/acc --exclude ./ray_results --exclude './parity-*/*.pt' . 2>/dev/null
ls -la "$OUT"
