#!/usr/bin/env bash
# The GPU checks and benchmarks, in groups sized (docs/log/benchmarks.md, 2026-11-26) so that each fits
# one 10-minute device call and two fit a session's 15 minutes of device time:
#   benchmarks/gpu.sh train      # tests/models/test_gpu.py (cuDNN attention); learner update: 0.5B
#                                # (XLA, then cuDNN attention), 1.5B with remat, 1.5B packed
#                                # (MemAgent-shaped rows, Triton attention) beside one row a
#                                # sequence (cuDNN)
#   benchmarks/gpu.sh decode7b   # decode on the 7B shape
#   benchmarks/gpu.sh small      # decode on the 0.5B shape, the memory loop
#   benchmarks/gpu.sh kernels    # the Triton kernels' speed: the ragged decode read against
#                                # the dense one (0.5B, 7B); packed 0.5B updates (Triton
#                                # attention) against one row a sequence (cuDNN)
# A session runs `train` first (the correctness tests), then the group the last GPU session in
# BENCHMARKS.md did not reach.
# Runs from the repository root with the machine's python3 (jax with CUDA, flax, optax, orbax,
# transformers, torch; no install: the package is put on PYTHONPATH). Each step's log goes to
# $LOGS (default: $OUT where the device tool sets it, else ./gpu_logs); each step has its own
# time limit so that one slow step leaves the others their turn.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
LOGS=${LOGS:-${OUT:-gpu_logs}}
mkdir -p "$LOGS"
status=0

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $LOGS/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit}s): $*"
    timeout "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] || { echo "=== $name exited $rc"; status=1; }
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
python3 -c "import jax, flax, optax, orbax.checkpoint as o, torch, transformers as t; \
print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__, 'optax', \
optax.__version__, 'torch', torch.__version__, 'transformers', t.__version__)"

case "${1:-}" in
decode7b)
    # Writing the random 15 GB checkpoint takes ~100 s and each batch size's warm-up compiles
    # the prefill at every row count up to it (13-47 s), so three batch sizes, not five.
    step decode_7b 500 python3 benchmarks/decode.py --preset qwen2.5-7b --dtype bfloat16 \
        --batch-sizes 1,16,64 --bandwidth-gb 4 --repeats 3 --large-batch 64
    ;;
small)
    step decode_0.5b 200 python3 benchmarks/decode.py --preset qwen2.5-0.5b --dtype bfloat16 \
        --batch-sizes 1,8,64 --bandwidth-gb 4 --repeats 3 --large-batch 64
    # Batch 8's warm-up alone takes ~80 s (the prefill at 1-8 rows for each length bucket), so
    # batch 32 does not fit beside it.
    step memory_loop 230 python3 benchmarks/memory_loop.py --hidden 896 --layers 24 \
        --heads 14 --kv-heads 2 --lengths 16384,65536 --batch-sizes 1,8 --max-batch-tokens 524288 \
        --peer-lengths 16384 --peer-batch-sizes 1,8 --prefill-rows 8
    step memory_loop_dot_product 120 python3 benchmarks/memory_loop.py --hidden 896 \
        --layers 24 --heads 14 --kv-heads 2 --lengths 16384 --batch-sizes 8 \
        --peer-batch-sizes "" --prefill-rows 8 --attention dot_product --profile
    ;;
kernels)
    # 16 slots, as a GPU of the 7B gpu8 config holds (128 over 8)
    step decode_ragged 330 python3 benchmarks/decode_ragged.py --presets qwen2.5-0.5b,qwen2.5-7b \
        --dtype bfloat16 --slots 16 --bandwidth-gb 4
    # MemAgent-shaped rows at an eighth of their lengths, the 7B GPU config's plan
    step train_packed 240 python3 benchmarks/train_step.py --preset qwen2.5-0.5b \
        --dtype bfloat16 --memagent 64 --scale 8 --attention cudnn --no-torch --repeats 2 \
        --matmul-size 8192
    ;;
train)
    step test_gpu 200 env JAX_PLATFORMS=cuda python3 -m pytest -q tests/models/test_gpu.py
    step train_0.5b 120 python3 benchmarks/train_step.py --preset qwen2.5-0.5b \
        --dtype bfloat16 --rows 16 --prompt-len 768 \
        --response-len 256 --micro-batch-rows 4 --repeats 3 --matmul-size 8192
    step train_0.5b_cudnn 120 python3 benchmarks/train_step.py --preset qwen2.5-0.5b \
        --dtype bfloat16 --rows 16 --prompt-len 768 \
        --response-len 256 --micro-batch-rows 4 --repeats 3 --matmul-size 8192 \
        --attention cudnn --no-torch
    step train_1.5b 140 python3 benchmarks/train_step.py --preset qwen2.5-1.5b \
        --dtype bfloat16 --rows 16 --prompt-len 768 \
        --response-len 256 --micro-batch-rows 4 --repeats 3 --matmul-size 8192 --remat full
    # the update as the GPU configs run it (packed rows), at an eighth of MemAgent's lengths
    step train_packed_1.5b 200 python3 benchmarks/train_step.py --preset qwen2.5-1.5b \
        --dtype bfloat16 --memagent 32 --scale 8 --attention cudnn --no-torch --repeats 2 \
        --matmul-size 8192
    ;;
*)
    echo "usage: benchmarks/gpu.sh train|decode7b|small|kernels" >&2
    exit 2
    ;;
esac
exit $status
