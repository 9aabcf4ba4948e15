#!/usr/bin/env bash
# Train Qwen2.5-7B-Instruct against the empathy-gym simulated user with verl 0.7.1, RLVER's
# settings. Usage: agents/verl/v0.7/run.sh ppo|grpo [hydra overrides ...]
#   e.g. agents/verl/v0.7/run.sh grpo trainer.nnodes=4 trainer.logger='[console,wandb]'
# Needs: pip install "verl[vllm]==0.7.1" and pip install -e ".[verl]" (empathy-gym), GPUs,
# and the simulated user's OpenAI-compatible server (EMPATHY_USER_BASE_URL, EMPATHY_USER_MODEL;
# see interaction.yaml). Not run by us: see agents/verl/README.md.
set -euo pipefail
algo=${1:?usage: agents/verl/v0.7/run.sh ppo|grpo [hydra overrides ...]}
shift
case "$algo" in ppo|grpo) ;; *) echo "unknown algorithm '$algo': use ppo or grpo" >&2; exit 2 ;; esac
root=$(cd "$(dirname "$0")/../../.." && pwd)
export EMPATHY_DATA_DIR=${EMPATHY_DATA_DIR:-$root/data/empathy_gym}
export EMPATHY_INTERACTION_CONFIG=${EMPATHY_INTERACTION_CONFIG:-$root/agents/verl/v0.7/interaction.yaml}
if [ ! -f "$EMPATHY_DATA_DIR/train.parquet" ]; then
  # One row per RLVER profile; the LLM user writes each opening line once, here.
  python3 -m empathy_gym.integrations.verl prepare --config "$EMPATHY_INTERACTION_CONFIG" \
    --out "$EMPATHY_DATA_DIR" --seed 0 --val-size 32
fi
exec python3 -m verl.trainer.main_ppo --config-path="$root/agents/verl/v0.7" \
  --config-name="rlver_$algo" "$@"
