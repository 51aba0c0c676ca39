#!/usr/bin/env bash
# The GPU checks as one prepared run on the lent device machine (15 minutes of device time
# per session, start-up included). Here first: benchmarks/device/wheels.sh. Then a device
# run with carry [".whl"], each mode alone, most important first:
#   bash benchmarks/device/gpu_session.sh tests            the CUDA tests (~30 s)
#   bash benchmarks/device/gpu_session.sh learning 480     RECIPE from scratch for 480 s
#   bash benchmarks/device/gpu_session.sh sweep 400        RECIPES side by side
#   bash benchmarks/device/gpu_session.sh throughput       frames/s at 1024 and 4096 envs
# A recipe is a config file (config/navrl.toml: NavRL's full task, the default;
# config/navrl-static.toml: its static form; config/navrl-original.toml: NavRL's settings)
# plus EXTRA, a few KEY=VALUE overrides. CHECK=1 only loads each recipe's configs (no
# device needed); DEV=cpu runs the same steps here at small sizes (a smoke run).
# Results land in $OUT, each step's file written as it ends, so a run stopped at its limit
# still returns the rest. A daemon whose log is silent for STALL_S seconds is stopped with
# its threads' tracebacks in its log (three daemons once hung before their first iteration).
set -uo pipefail
MODE=${1:-learning}
DEV=${DEV:-cuda}
RECIPE=${RECIPE:-config/navrl.toml}
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if [ "$DEV" = cpu ]; then  # the same steps at sizes a CPU finishes in their limits
  SMALL=${SMALL-"env.num_envs=16 env.navigation.num_maps=2 env.num_obstacles=60 env.navigation.map_levels=[0,10,20,30,40,60] eval.num_obstacles=40 ppo.rollout_length=8 ppo.epochs=1 ppo.minibatches=2 eval.num_envs=8 eval.max_steps=40"}
  THROUGHPUT_SIZES=${THROUGHPUT_SIZES-"env.num_envs=32 env.num_obstacles=60 env.num_dynamic_obstacles=8 ppo.rollout_length=8 ppo.epochs=1 ppo.minibatches=2 eval.max_steps=40"}
  FINAL_DRONES=${FINAL_DRONES:-0} STALL_S=${STALL_S:-0} MARGIN=${MARGIN:-900} LIMIT_SCALE=${LIMIT_SCALE:-8} ITERS=${ITERS:-6} EVAL_EVERY=${EVAL_EVERY:-3}
else
  SMALL=${SMALL:-} THROUGHPUT_SIZES=${THROUGHPUT_SIZES:-}
  # the final evaluations with 256 drones: a verdict good to ~+-0.025, not 64's ~+-0.05
  FINAL_DRONES=${FINAL_DRONES:-256} STALL_S=${STALL_S:-180} MARGIN=${MARGIN:-150} LIMIT_SCALE=${LIMIT_SCALE:-1}
fi
if [ -d .whl ] && [ "$DEV" != cpu ]; then  # once per machine, under a lock
  (
    flock 9
    [ -e /tmp/site/.installed ] || {
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && touch /tmp/site/.installed
    }
  ) 9> /tmp/site.lock || exit 1
  export PYTHONPATH=/tmp/site:$PWD:$PWD/examples
else
  export PYTHONPATH=$PWD:$PWD/examples
fi
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/session.log"; }
step() {  # step NAME SECONDS OUTFILE CMD...: a bounded step, its stdout into OUTFILE ("-": none)
  local name=$1 limit=$(($2 * LIMIT_SCALE)) out=$3; shift 3
  log "start $name (limit ${limit}s)"
  if [ "$out" = - ]; then
    timeout "$limit" "$@" >> "$OUT/session.log" 2>&1
  else
    timeout "$limit" "$@" > "$OUT/$out" 2>> "$OUT/session.log"
  fi
  log "end $name rc=$?"
}
[ -n "${CHECK:-}" ] || {
  [ "$DEV" = cpu ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch, tensordict, torchrl, navrl_daemon; print(sys.version); \
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available()); \
print('tensordict', tensordict.__version__, 'torchrl', torchrl.__version__)"
} >> "$OUT/session.log" 2>&1 || { log "environment check failed"; exit 1; }
# shellcheck disable=SC2206  # EXTRA and SMALL are meant to split into words
extra=($SMALL ${EXTRA:-})
learning() {  # learning TAG BUDGET CONFIG KEY=VALUE...: one benchmarks/learning.py
  local tag=$1 budget=$2 config=$3; shift 3
  [ -f "$config" ] || { log "no recipe file $config"; return 2; }
  timeout $(((budget + MARGIN) * LIMIT_SCALE)) python3 benchmarks/learning.py \
    ${CHECK:+--check-config} --config "$config" --budget-s "$budget" --stall-s "$STALL_S" \
    --final-drones "$FINAL_DRONES" ${FRAMES:+--frames "$FRAMES"} \
    ${KEEP:+--keep-state "$KEEP/$tag"} ${RESUME:+--resume} "${fork[@]}" \
    --out "$WORK/$tag.json" "run.device=$DEV" "$@" "${extra[@]}" > "$WORK/$tag.out" 2>&1
}
fork=()
if [ -n "${FORK:-}" ]; then  # FORK=SRC@ITER: each recipe starts as a fork of kept run SRC
  if [ -z "${KEEP:-}" ] || [ -n "${RESUME:-}" ]; then log "FORK=SRC@ITER needs KEEP and no RESUME"; exit 2; fi
  [ "${FORK%@*}" != "$FORK" ] || { log "FORK=$FORK: expected SRC@ITER"; exit 2; }
  fork=(--fork-from "${FORK%@*}" --fork-at "${FORK##*@}")
fi
case $MODE in
tests)  # -v names each test as it starts; a hung one writes its tracebacks after 60 s
  step tests 100 gpu_tests.log python3 -m pytest -v --tb=short -rfE -o faulthandler_timeout=60 \
    -p no:cacheprovider -k "${PYTEST_K:-cuda}" \
    tests/rl/test_captured_rollout.py tests/rl/test_evaluation.py tests/rl/test_fast_update.py \
    tests/env/test_masked_reset.py tests/stages/test_trainer_stream.py
  ;;
learning)  # RECIPE from scratch at its own size (config/navrl.toml: NavRL's 1024 envs)
  budget=${2:-480} WORK=$OUT
  log "start learning $RECIPE (budget ${budget}s)"
  learning learning "$budget" "$RECIPE"
  log "end learning rc=$?"
  ;;
sweep)  # RECIPES: FILE[@SEED] entries, one learning.py each, side by side; at the CPU's
  # 256 envs x 128 steps unless EXTRA says otherwise. KEEP=DIR keeps each state dir as
  # DIR/TAG; RESUME=1 goes on with them; FORK=SRC@ITER forks each from kept run SRC.
  budget=${2:-400} WORK=${WORK:-/tmp/sweep}
  rm -rf "$WORK" && mkdir -p "$WORK"
  # shellcheck disable=SC2086  # the entries are meant to split into words
  set -- ${RECIPES:-$RECIPE}
  # No more torch threads per process than the cores hold (CPUS, default nproc), at most
  # two: two 2-thread daemons on a 2-core CPU took 2.6-5.8x as long per iteration as two
  # 1-thread ones. TORCH_THREADS wins.
  per=$((${CPUS:-$(nproc)} / $#))
  threads=${TORCH_THREADS:-$((per >= 2 ? 2 : 1))}
  for entry in "$@"; do
    config=${entry%@*} seeded=() tag=$(basename "${entry%@*}" .toml)
    [ "$config" != "$entry" ] && tag=${tag}_s${entry##*@} seeded=("run.seed=${entry##*@}")
    [ -f "$config" ] || { log "no recipe file $config"; exit 2; }
    log "start recipe $tag (budget ${budget}s)"
    learning "$tag" "$budget" "$config" env.num_envs=256 ppo.rollout_length=128 \
      "run.torch_threads=$threads" "${seeded[@]}" &
  done
  wait
  log "recipes ended: $(cd "$WORK" && echo *)"
  tar czf "$OUT/sweep.tgz" -C "$(dirname "$WORK")" "$(basename "$WORK")"
  ;;
throughput)  # frames/s end to end at NavRL's scale (config/navrl-original.toml) and at
  # 4096 envs: eager, captured steps, lag 0 and 1, evaluations on; where a rollout's time goes
  config=config/navrl-original.toml
  # shellcheck disable=SC2086  # the sizes are meant to split into words
  step throughput_1024 160 - python3 benchmarks/throughput.py --device "$DEV" --config $config \
    --warmup 4 --iterations "${ITERS:-55}" --repeats 1 --eval-interval "${EVAL_EVERY:-25}" \
    --variants eager_lag0@8,cuda_graph_lag0,cuda_graph_lag1,cuda_graph_lag0_eval \
    --run-timeout $((60 * LIMIT_SCALE)) --out "$OUT/throughput_1024_gpu.json" $THROUGHPUT_SIZES
  # shellcheck disable=SC2086
  step collect 85 collect_profile_gpu.json python3 benchmarks/collect_profile.py \
    --device "$DEV" --config $config --repeats 5 $THROUGHPUT_SIZES
  [ "$DEV" = cpu ] || step throughput_4096 120 - python3 benchmarks/throughput.py --device "$DEV" \
    --config $config --warmup 4 --iterations "${ITERS:-30}" --repeats 1 \
    --variants eager_lag0@6,cuda_graph_lag0,cuda_graph_lag1 --run-timeout 45 \
    --out "$OUT/throughput_4096_gpu.json" env.num_envs=4096
  ;;
*) log "unknown mode $MODE"; exit 2 ;;
esac
log "done"
