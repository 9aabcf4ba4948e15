#!/usr/bin/env bash
# Train Qwen2.5-7B-Instruct against the empathy-gym simulated user with today's verl (agent
# loop), RLVER's settings. Usage: agents/verl/run.sh ppo|grpo [hydra overrides ...]
#   e.g. agents/verl/run.sh grpo trainer.nnodes=4 trainer.logger='[console,wandb]'
# Needs: pip install "verl[vllm]" (0.9.x) and pip install -e ".[verl]" (empathy-gym), GPUs, and
# for the default loop the simulated user's OpenAI-compatible server (EMPATHY_USER_BASE_URL,
# EMPATHY_USER_MODEL; see agent_loop.yaml). EMPATHY_AGENT_LOOP=empathy_dialogue_inprocess
# builds the user inside the agent-loop workers instead. Not run by us: see README.md here.
set -euo pipefail
algo=${1:?usage: agents/verl/run.sh ppo|grpo [hydra overrides ...]}
shift
case "$algo" in ppo|grpo) ;; *) echo "unknown algorithm '$algo': use ppo or grpo" >&2; exit 2 ;; esac
root=$(cd "$(dirname "$0")/../.." && pwd)
export EMPATHY_DATA_DIR=${EMPATHY_DATA_DIR:-$root/data/empathy_gym}
export EMPATHY_AGENT_LOOP_CONFIG=${EMPATHY_AGENT_LOOP_CONFIG:-$root/agents/verl/agent_loop.yaml}
export EMPATHY_AGENT_LOOP=${EMPATHY_AGENT_LOOP:-empathy_dialogue}
if [ ! -f "$EMPATHY_DATA_DIR/train.parquet" ]; then
  # One row per RLVER profile; an LLM user writes each opening line once, here.
  python3 -m empathy_gym.integrations.verl prepare --config "$EMPATHY_AGENT_LOOP_CONFIG" \
    --name "$EMPATHY_AGENT_LOOP" --out "$EMPATHY_DATA_DIR" --seed 0 --val-size 32
fi
exec python3 -m verl.trainer.main_ppo --config-path="$root/agents/verl" \
  --config-name="rlver_$algo" "$@"
