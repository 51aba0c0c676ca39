#!/usr/bin/env bash
# Every GPU check of issues #8, #13, #22 and #23 as one prepared run on the lent device machine
# (15 minutes of device time per session, start-up included: see docs/throughput.md).
#
# Here first:  benchmarks/device/wheels.sh
# Then device run, timeout_s 590, carry [".whl", "carry"], command:
#   bash benchmarks/device/gpu_session.sh throughput     (issue #22, ~9 min)
#   bash benchmarks/device/gpu_session.sh update         (issue #8's update paths, ~3 min)
#   bash benchmarks/device/gpu_session.sh learning 400   (issues #13/#23, budget in s, ~9.7 min)
#   bash benchmarks/device/gpu_session.sh sweep 330      (issue #23: recipes side by side, ~9.5 min)
#   bash benchmarks/device/gpu_session.sh streams        (issue #22: pipeline.trainer_stream, ~3 min)
#   bash benchmarks/device/gpu_session.sh compile        (issue #22: ppo.compile, update and end to end, ~6 min)
#   bash benchmarks/device/gpu_session.sh tests          (the CUDA tests alone, ~30 s)
# Modes can share the machine (the wheels install once, under a lock), as on 2026-12-04:
#   bash benchmarks/device/gpu_session.sh tests & RECIPES="NAME@1 NAME@2" FRAMES=20000000 \
#     bash benchmarks/device/gpu_session.sh sweep 380 & bash benchmarks/device/gpu_session.sh learning 380; wait
# where all three daemons hung before their first iteration and nothing came back
# (docs/learning.md, session 32). Until that is understood: `tests` alone first, then one
# mode at a time; STALL_S (below) ends a stalled daemon with its tracebacks in $OUT.
# Results land in $OUT (at most 8 files come back); steps run most important first, and
# each writes its file as it ends (throughput.py rewrites its JSON after every variant),
# so a run stopped at its limit still returns the rest.
set -uo pipefail
MODE=${1:-throughput}
DEV=${DEV:-cuda}                  # DEV=cpu: a smoke run here (small sizes, see below)
CONFIG=${CONFIG:-config/navrl.toml}
# A loaded CPU smoke run may need longer limits (LIMIT_SCALE=8). The tests step runs the
# cases whose id has "cuda" in it (PYTEST_K: another -k expression; the CPU cases run in CI).
LIMIT_SCALE=${LIMIT_SCALE:-1}
if [ "$DEV" = cpu ]; then          # the same steps at sizes a CPU finishes in their limits
  small="env.num_obstacles=60 env.num_dynamic_obstacles=8 ppo.rollout_length=8 ppo.epochs=1"
  SIZE_1024=${SIZE_1024:-"env.num_envs=32 $small ppo.minibatches=2 eval.max_steps=40"}
  SIZE_4096=${SIZE_4096:-"env.num_envs=64 $small ppo.minibatches=2 eval.max_steps=40"}
  LIDAR_ENVS=${LIDAR_ENVS:-"32 64"}
  ITERS=${ITERS:-6} EVAL_EVERY=${EVAL_EVERY:-3}  # evaluations inside the short window
  FINAL_DRONES=${FINAL_DRONES:-0}  # learning.py's final evaluations: eval.num_envs drones
  FAST=${FAST:-fused}              # compile mode: the update path a CPU has (no cuda_graph)
  # A learning recipe's time after its budget: the daemon's stop waits for an evaluation in
  # flight (~200 s at 350 pillars on the 2-core CPU), then learning.py evaluates the export.
  MARGIN=${MARGIN:-900}
  STALL_S=${STALL_S:-0} STOP_WAIT_S=${STOP_WAIT_S:-600}  # learning.py's defaults
else
  SIZE_1024=${SIZE_1024:-""}
  SIZE_4096=${SIZE_4096:-"env.num_envs=4096"}
  LIDAR_ENVS=${LIDAR_ENVS:-"1024 4096"}
  ITERS=${ITERS:-} EVAL_EVERY=${EVAL_EVERY:-25}
  # learning.py's final evaluations (export, NavRL's checkpoint, held-out maps) with 256
  # drones: a verdict good to ~+-0.025 instead of 64 drones' ~+-0.05 (their cost on a GPU is
  # not measured yet; on the 2-core CPU 2.6-4.2x that of 64 drones)
  FINAL_DRONES=${FINAL_DRONES:-256}
  MARGIN=${MARGIN:-150}
  # A daemon whose log is silent for STALL_S is stalled: learning.py writes its threads'
  # tracebacks into its log (SIGUSR2) and stops it, so a start-up that hangs (2026-12-04:
  # three daemons side by side never reached their first iteration in 9 minutes) comes
  # back as a traceback, not as a call that ran out its time. A stop may take STOP_WAIT_S.
  STALL_S=${STALL_S:-180} STOP_WAIT_S=${STOP_WAIT_S:-90}
fi
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if [ -d .whl ] && [ "$DEV" != cpu ]; then
  # Once per machine, under a lock: two modes side by side (`sweep ... & learning ...`)
  # share one /tmp/site, and a second install would replace files the first one imports.
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
step() {  # step NAME SECONDS OUTFILE CMD...: a bounded step, its stdout into OUTFILE
  local name=$1 limit=$(($2 * LIMIT_SCALE)) out=$3; shift 3  # OUTFILE "-": writes its own
  log "start $name (limit ${limit}s)"
  if [ "$out" = - ]; then
    timeout "$limit" "$@" >> "$OUT/session.log" 2>&1
  else
    timeout "$limit" "$@" > "$OUT/$out" 2>> "$OUT/session.log"
  fi
  log "end $name rc=$?"
}
[ -n "${CHECK:-}" ] || {  # CHECK=1 (recipes' configs only) needs no device
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch, tensordict, torchrl, navrl_daemon; print(sys.version); \
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available()); \
print('tensordict', tensordict.__version__, 'torchrl', torchrl.__version__)"
} >> "$OUT/session.log" 2>&1 || { log "environment check failed"; exit 1; }

# Local hops (env.spawn = "local"): start anywhere free among the pillars, goal 4-16 m away,
# 900-step episodes (many more episode ends, so levels move faster); the evaluation stays
# NavRL's crossing at eval.max_steps = 2200. Promoted as NavRL's spawns would be.
HOPS_STAGE='{name = "hops", spawn = "local", goal_distance = [4.0, 16.0], max_episode_length = 900, promote = {reach_goal = 0.6, collision = 0.35, evals = 2}}'
# Long hops: goals 4-40 m (1400-step episodes), so the policy also sees the goal distances
# of NavRL's 48 m crossing (the state's d_xy is in metres, not normalised).
LONG_HOPS_STAGE='{name = "long hops", spawn = "local", goal_distance = [4.0, 40.0], max_episode_length = 1400, promote = {reach_goal = 0.6, collision = 0.35, evals = 2}}'
# Long hops that end once the drone has held its goal for 64 steps (env.reach_hold): no
# hovering out the episode, so more flights per frame and levels that move at every hop.
LONG_HOPS_HOLD_STAGE='{name = "long hops", spawn = "local", goal_distance = [4.0, 40.0], max_episode_length = 1400, reach_hold = 64, promote = {reach_goal = 0.6, collision = 0.35, evals = 2}}'
# The same with a quarter of the episodes crossings of the field (env.crossing_share), in
# episodes long enough for a crossing.
CROSS_HOLD_STAGE=${LONG_HOPS_HOLD_STAGE/max_episode_length = 1400,/max_episode_length = 2200, crossing_share = 0.25,}
# Long hops with the hold until the crossing's reach is 0.3 in two evaluations in a row, then
# crossings of the field only (env.spawn = "crossing", still at the envs' density levels):
# the long cruise the hops lack (docs/learning.md, session 9).
HOPS_TO_CROSS_STAGE=${LONG_HOPS_HOLD_STAGE/reach_goal = 0.6, collision = 0.35/reach_goal = 0.3, collision = 0.7}
# The same hops until the crossing's reach is 0.5 (collision at most 0.5) twice: with
# ppo.mirror the 0.3 came at ~2.5 M frames, before the hops had climbed the density levels
# (docs/learning.md, sessions 15 and 16).
HOPS_TO_HALF_STAGE=${LONG_HOPS_HOLD_STAGE/reach_goal = 0.6, collision = 0.35/reach_goal = 0.5, collision = 0.5}
for stage in "$HOPS_TO_CROSS_STAGE" "$HOPS_TO_HALF_STAGE"; do  # a substitution that missed
  [ "$stage" != "$LONG_HOPS_HOLD_STAGE" ] || { echo "gpu_session.sh: stage rule not replaced" >&2; exit 2; }
done
# The crossings as a curriculum's last stage (no promotion): crossings at the envs' levels to the end.
CROSSINGS_LAST_STAGE='{name = "crossings", spawn = "crossing", max_episode_length = 2200, reach_hold = 64}'
CROSSINGS_STAGE="${CROSSINGS_LAST_STAGE%\}}, promote = {reach_goal = 0.6, collision = 0.35, evals = 2}}"
# The crossings until the crossing's reach is 0.5 twice, then crossings with every env on its
# whole map (env.min_level at the top level: NavRL's density only) to the end: no stage of
# NavRL's border spawns, after which the crossing fell in three runs (docs/learning.md,
# session 12: the fork at the plateau that trained at 350 pillars only).
CROSSINGS_TO_TOP_STAGE=${CROSSINGS_STAGE/reach_goal = 0.6, collision = 0.35/reach_goal = 0.5, collision = 0.5}
LEVELS=${LEVELS:-[0, 50, 100, 175, 250, 350]}  # the per-env density levels (env.map_levels)
GUARDS=(ppo.target_kl=0.05 ppo.feature_extractor_max_grad_norm=5.0)  # the update's guards, loose
# the rates' line to 0.1x at 20 M frames stopped at 18 M (0.189x) and held there (_hold)
HELD_RATES=(ppo.lr_schedule=linear ppo.schedule_frames=18022400 ppo.lr_final_fraction=0.189)
# _dense: 16 maps of 450 pillars with a level above NavRL's 350, evaluations at 350
DENSE_MAPS=(env.num_maps=16 "env.map_levels=${LEVELS%]}, 450]" env.num_obstacles=450
  eval.num_obstacles=350)
cuda_tests() {  # the CUDA tests: captured rollouts (the learning recipes' envs among them)
  # and evaluations, the lag-1 capture in another thread, the update paths, masked resets
  # -v names each test as it starts, so a test that hangs is named; faulthandler_timeout
  # writes its threads' tracebacks after 60 s; --tb=short keeps a failure's cause short.
  step tests 100 gpu_tests.log python3 -m pytest -v --tb=short -rfE -o faulthandler_timeout=60 \
    -p no:cacheprovider -k "${PYTEST_K:-cuda}" \
    tests/rl/test_captured_rollout.py tests/rl/test_evaluation.py tests/rl/test_fast_update.py \
    tests/env/test_masked_reset.py
}
case $MODE in
tests)  # the CUDA tests alone (~30 s), e.g. beside a learning run and a sweep
  cuda_tests
  ;;
throughput)
  # Issue #22: the CUDA tests, then end to end at NavRL's 1024
  # envs and at 4096 (eager, captured update only, both captured; lag 0 and 1; evaluation
  # every 25 iterations on and off), where a rollout's time goes per collection path
  # (captured vs op by op, masked vs indexed reset: what `auto` picks), the LiDAR's share.
  cuda_tests
  step throughput_1024 160 - python3 benchmarks/throughput.py \
    --device $DEV --config $CONFIG --warmup 4 --iterations ${ITERS:-55} --repeats 1 \
    --variants eager_lag0@8,cuda_graph_lag0,cuda_graph_lag1,cuda_graph_lag0_eval,update_graph_lag0@12 \
    --eval-interval $EVAL_EVERY --run-timeout $((60 * LIMIT_SCALE)) --out "$OUT/throughput_1024_gpu.json" $SIZE_1024
  step collect 85 collect_profile_gpu.json python3 benchmarks/collect_profile.py \
    --device $DEV --config $CONFIG --repeats 5 --table "$OUT/collect_ops_gpu.txt" $SIZE_1024
  step throughput_4096 120 - python3 benchmarks/throughput.py \
    --device $DEV --config $CONFIG --warmup 4 --iterations ${ITERS:-30} --repeats 1 \
    --variants eager_lag0@6,cuda_graph_lag0,cuda_graph_lag1,cuda_graph_lag0_eval \
    --eval-interval $EVAL_EVERY --run-timeout $((45 * LIMIT_SCALE)) --out "$OUT/throughput_4096_gpu.json" $SIZE_4096
  step lidar 50 - python3 benchmarks/lidar_share.py --device $DEV \
    --config $CONFIG --num-envs $LIDAR_ENVS --out "$OUT/lidar_share_gpu.json"
  ;;
streams)
  # pipeline.trainer_stream (issue #22, ~3 min): its CUDA tests (lag 0 = the run without it;
  # lag 1 runs), then lag 1 with and without it at 1024 and 4096 envs.
  step tests 60 gpu_tests.log python3 -m pytest -q -p no:cacheprovider -k "${PYTEST_K:-cuda}" \
    tests/stages/test_trainer_stream.py
  step streams_1024 85 - python3 benchmarks/throughput.py \
    --device $DEV --config $CONFIG --warmup 4 --iterations ${ITERS:-20} --repeats 1 \
    --variants cuda_graph_lag0,cuda_graph_lag1,cuda_graph_lag1_streams \
    --run-timeout $((35 * LIMIT_SCALE)) --out "$OUT/streams_1024_gpu.json" $SIZE_1024
  step streams_4096 60 - python3 benchmarks/throughput.py \
    --device $DEV --config $CONFIG --warmup 4 --iterations ${ITERS:-16} --repeats 1 \
    --variants cuda_graph_lag1,cuda_graph_lag1_streams \
    --run-timeout $((35 * LIMIT_SCALE)) --out "$OUT/streams_4096_gpu.json" $SIZE_4096
  ;;
compile)
  # ppo.compile (issue #22, ~6 min): its CUDA test; the update alone (ppo_update.py,
  # cuda_graph with and without it, 1024 and 4096 envs, 5 repeats); then end to end at lag 1
  # with the trainer's stream, without and with it, one after the other on this machine.
  # Each daemon compiles at its first update (inductor's cache makes the later ones quick).
  step tests 150 gpu_tests.log python3 -m pytest -q -p no:cacheprovider \
    -k "${PYTEST_K:-compiled and cuda}" tests/rl/test_fast_update.py
  step ppo_update 150 ppo_update_compiled_gpu.json python3 benchmarks/ppo_update.py \
    --devices $DEV --num-envs ${UPDATE_ENVS:-1024 4096} --repeats 5 \
    --paths ${FAST:-cuda_graph} ${FAST:-cuda_graph}_compiled
  for envs in 1024 4096; do
    size=$SIZE_1024 && [ $envs = 4096 ] && size=$SIZE_4096
    for compiled in false true; do
      # shellcheck disable=SC2086  # the sizes are meant to split into words
      step "e2e_${envs}_compile_$compiled" 100 - python3 benchmarks/throughput.py \
        --device $DEV --config $CONFIG --warmup 4 --iterations ${ITERS:-16} --repeats 1 \
        --variants cuda_graph_lag1_streams --run-timeout $((90 * LIMIT_SCALE)) \
        --out "$OUT/compile_${compiled}_${envs}_gpu.json" $size ppo.compile=$compiled \
        ppo.update_path=${FAST:-cuda_graph}  # the report's config too (auto: eager on a CPU)
    done
  done
  ;;
update)
  # Issue #8's update paths and the reset modes op by op (the 2026-11-27 H100 run).
  step ppo_update 90 ppo_update_gpu.json python3 benchmarks/ppo_update.py \
    --devices $DEV --num-envs 1024 4096 --repeats 5
  step reset_modes 45 reset_modes_gpu.json python3 benchmarks/reset_modes.py \
    --device $DEV --config $CONFIG --repeats 7 --episode-lengths 50,2200
  ;;
learning)
  # NavRL's full task from scratch (issue #23), evals every 25 iterations at the
  # curriculum's stage on the training maps; learning.py then evaluates the final export on
  # 16 held-out maps too. RECIPE=levels: 16 maps, pillars as per-env density
  # levels (each env moves up a level after reaching its goal, down after a collision:
  # no global jump), moving obstacles in two curriculum stages; RECIPE=stages: issue #13's
  # six global stages; RECIPE=hops: local hops (4-16 m) with levels first (docs/learning.md),
  # then the moving obstacles; RECIPE=long_hops: the same with hops of 4-40 m;
  # RECIPE=long_hops_hold (ahead of long_hops on two seeds): long hops ended after
  # 64 steps at the goal; RECIPE=hops_then_cross: those hops until NavRL's crossing is
  # reached by 0.3, then crossings of the field only at the envs' density levels (the
  # best CPU fork so far, docs/learning.md session 9), then the moving obstacles;
  # RECIPE=hops_then_cross_mirror: the same with ppo.mirror, every minibatch also
  # trained reflected across the goal direction (session 14 on the CPU: NavRL's crossing
  # at 0.5-0.6 from 2.9 M frames, where hops_then_cross's static form reached that at ~9 M);
  # RECIPE=bar5_then_cross_mirror (default): the same with the hops until the crossing's
  # 0.5 twice (the best CPU recipe, sessions 16-17: 0.69 and 0.60 on two seeds over
  # 5.7-9.4 M frames against 0.52 and 0.37 with the 0.3) and the update's two guards set
  # loose (ppo.target_kl = 0.05, ppo.feature_extractor_max_grad_norm = 5: session 17's
  # collapse on seed 1 was one update that moved the policy far);
  # RECIPE=dense: the best CPU recipe, the sweep's
  # long_hops_hold_mb4_bar5_then_cross_mirror_stay_guard_r128_hold_dense (level with NavRL's
  # checkpoint at 20 M frames on the static task, docs/learning.md sessions 29-31), with the
  # moving obstacles after its crossings: 16 maps of 450 pillars with a level above NavRL's
  # 350 and evaluations at 350, the hops to the crossing's 0.5, then crossings with 0, 40
  # slow and NavRL's 80 moving obstacles (crossing spawns to the end: four CPU runs lost
  # crossing reach after NavRL's border spawns), ppo.mirror, the guards, 4 minibatches and
  # the rates' line to 0.189x at 18 M frames, then held. NavRL's 32-step rollouts at 1024
  # envs are the CPU recipe's 32,768 frames per update (128 steps x 256 envs).
  # RECIPE=dense_const (default since session 37): the same at NavRL's constant rates (below).
  # EXTRA: more KEY=VALUE overrides (e.g. for a CPU smoke run). CHECK=1: learning.py only
  # loads the recipe's configs and prints its stages (learning_gpu.log), nothing runs.
  budget=${2:-400}
  levels=$LEVELS
  dynamic='{name = "slow dynamic", num_dynamic_obstacles = 40, dynamic_speed_range = [0.3, 0.8], promote = {reach_goal = 0.6, collision = 0.4, evals = 2}}, {name = "navrl"}'
  case ${RECIPE:=dense_const} in
  levels)
    curriculum="[{name = \"static\", num_dynamic_obstacles = 0, promote = {reach_goal = 0.6, collision = 0.35, evals = 2}}, $dynamic]"
    recipe=(env.num_maps=16 "env.map_levels=$levels")
    ;;
  stages)
    curriculum="[{name = \"100 pillars\", num_obstacles = 100, num_dynamic_obstacles = 0, promote = {reach_goal = 0.6, collision = 0.3, evals = 2}}, {name = \"175 pillars\", num_obstacles = 175, num_dynamic_obstacles = 0, promote = {reach_goal = 0.6, collision = 0.3, evals = 2}}, {name = \"250 pillars\", num_obstacles = 250, num_dynamic_obstacles = 0, promote = {reach_goal = 0.6, collision = 0.35, evals = 2}}, {name = \"350 pillars\", num_dynamic_obstacles = 0, promote = {reach_goal = 0.6, collision = 0.35, evals = 2}}, $dynamic]"
    recipe=()
    ;;
  hops)  # local hops among the pillars with per-env levels, then NavRL's spawns (see sweep)
    curriculum="[${HOPS_STAGE%\}}, num_dynamic_obstacles = 0}, {name = \"static\", num_dynamic_obstacles = 0, promote = {reach_goal = 0.6, collision = 0.35, evals = 2}}, $dynamic]"
    recipe=(env.num_maps=16 "env.map_levels=$levels" eval.max_steps=2200)
    ;;
  long_hops | long_hops_hold)  # hops of 4-40 m (held at the goal: long_hops_hold), as hops
    stage=$LONG_HOPS_STAGE && [ "$RECIPE" = long_hops_hold ] && stage=$LONG_HOPS_HOLD_STAGE
    curriculum="[${stage%\}}, num_dynamic_obstacles = 0}, {name = \"static\", num_dynamic_obstacles = 0, promote = {reach_goal = 0.6, collision = 0.35, evals = 2}}, $dynamic]"
    recipe=(env.num_maps=16 "env.map_levels=$levels" eval.max_steps=2200)
    ;;
  hops_then_cross | hops_then_cross_mirror)  # the hops to the crossing's 0.3, then
    # crossings only, then moving obstacles (with ppo.mirror: hops_then_cross_mirror)
    curriculum="[${HOPS_TO_CROSS_STAGE%\}}, num_dynamic_obstacles = 0}, ${CROSSINGS_STAGE%\}}, num_dynamic_obstacles = 0}, $dynamic]"
    recipe=(env.num_maps=16 "env.map_levels=$levels" eval.max_steps=2200)
    [ "$RECIPE" = hops_then_cross_mirror ] && recipe+=(ppo.mirror=true)
    ;;
  bar5_then_cross_mirror)  # the hops to the crossing's 0.5, crossings, moving obstacles
    curriculum="[${HOPS_TO_HALF_STAGE%\}}, num_dynamic_obstacles = 0}, ${CROSSINGS_STAGE%\}}, num_dynamic_obstacles = 0}, $dynamic]"
    recipe=(env.num_maps=16 "env.map_levels=$levels" eval.max_steps=2200 ppo.mirror=true
      "${GUARDS[@]}")
    ;;
  dense | dense_const)  # the CPU's best (above), moving obstacles after its crossings;
    # dense_const at NavRL's constant learning rates instead of the line held from 18 M
    # frames: a fork of seed 3 onto NavRL's moving obstacles learnt them faster at NavRL's
    # rates than at the held 0.189x (+0.09 / +0.07 held out on 256 drones after 5.5 M
    # frames; docs/learning.md, session 37), and in this recipe the moving obstacles come
    # after the crossings' promotion, so most of a GPU run's frames are theirs.
    # The moving-obstacle stages keep every env at 250 pillars or more (min_level 4 of the
    # default LEVELS): without a floor their collisions sent the envs down to 0-175 pillars
    # within 2 M frames, where they forgot the dense static task; with the floor the same
    # fork flew NavRL's full task +0.09 better after 4.2 M frames (256 drones; a floor at
    # 350 collapsed to no goal reached; docs/learning.md, session 38)
    crossings='spawn = "crossing", max_episode_length = 2200, reach_hold = 64'
    moving="$crossings, min_level = 4"
    slow="{name = \"slow dynamic crossings\", $moving, num_dynamic_obstacles = 40, dynamic_speed_range = [0.3, 0.8], promote = {reach_goal = 0.6, collision = 0.4, evals = 2}}"
    curriculum="[${HOPS_TO_HALF_STAGE%\}}, num_dynamic_obstacles = 0}, ${CROSSINGS_STAGE%\}}, num_dynamic_obstacles = 0}, $slow, {name = \"navrl crossings\", $moving}]"
    rates=("${HELD_RATES[@]}") && [ "$RECIPE" = dense_const ] && rates=(ppo.lr_schedule=constant)
    recipe=("${DENSE_MAPS[@]}" eval.max_steps=2200 ppo.minibatches=4 "${rates[@]}"
      ppo.mirror=true "${GUARDS[@]}")
    ;;
  *) log "unknown RECIPE ${RECIPE}"; exit 2 ;;
  esac
  # shellcheck disable=SC2206  # EXTRA is meant to split into words
  extra=(${EXTRA:-})
  step learning $((budget + 180)) learning_gpu.log python3 benchmarks/learning.py \
    ${CHECK:+--check-config} --budget-s "$budget" --stall-s "$STALL_S" --stop-wait-s "$STOP_WAIT_S" --eval-every 25 --config $CONFIG --final-drones "$FINAL_DRONES" \
    --navrl-checkpoint carry/navrl_checkpoint.pt --out "$OUT/learning_gpu.json" \
    run.device=$DEV "env.curriculum=${CURRICULUM:-$curriculum}" "${recipe[@]}" "${extra[@]}"
  ;;
sweep)
  # Issue #23's CPU goal measured on the GPU (curves per frame do not depend on the device):
  # NavRL's static task (350 pillars, no moving obstacles, NavRL's crossing evaluated on the
  # training maps and on 16 held-out maps every 25 iterations) at 256 envs, one recipe per
  # benchmarks/learning.py process, all side by side (at 256 envs one process leaves most of
  # the GPU idle: its update is launch-bound). RECIPES picks them (default: stages,
  # long_hops, long_hops_hold, long_hops_hold_mb4 and long_hops_hold_lrlin; levels, hops,
  # hops_flat, hops_kl, long_hops_hold_mb4_vclip, long_hops_hold_mb4_cross and the learning
  # rates of long_hops_hold_mb4_{lrlin,lrfast,lrlow}, long_hops_hold_mb4_then_cross (hops,
  # then crossings of the field, with lrlin's schedule) and long_hops_hold_mb4_then_cross_top
  # (the same, then crossings with every env at 350 pillars) and long_hops_hold_mb4_then_cross_clip2
  # (then_cross with PPO's clip at 0.2) and long_hops_hold_mb4_then_cross_mirror (then_cross
  # with ppo.mirror) and long_hops_hold_mb4_then_cross_mirror_stay (the same, crossings to the
  # end) and long_hops_hold_mb4_bar5_then_cross_mirror_stay (the same, the hops to the
  # crossing's 0.5) and long_hops_hold_mb4_bar5_then_cross_mirror_stay_sep (the same with
  # ppo.separate_critic) and long_hops_hold_mb4_bar5_then_cross_mirror_stay_guard (the same
  # with ppo.target_kl = 0.05 and ppo.feature_extractor_max_grad_norm = 5) and
  # long_hops_hold_mb4_bar5_then_cross_mirror_stay_guard_carry (the same with
  # env.stage_switch = "episodes") and long_hops_hold_mb4_bar5_then_cross_mirror_stay_guard_r64
  # (the same with ppo.rollout_length = 64) and its _hold twin (the rates held from 18 M
  # frames on) and long_hops_hold_mb4_bar5_then_cross_mirror_stay_guard_r128_hold (the
  # _hold twin with 128-step rollouts) and its _dense twin (training maps of 450 pillars, a
  # density level above NavRL's 350, evaluations at 350) on request; NAME@SEED runs a recipe
  # with run.seed = SEED, so one sweep can hold several seeds of it). EVAL_EVERY: iterations
  # between evaluations (25; 3 with DEV=cpu). FRAMES: each recipe also stops at this many frames (the CPU
  # goal's 20 M). EXTRA: more KEY=VALUE overrides for every recipe (e.g. for a
  # CPU smoke run). KEEP=DIR keeps each recipe's state dir as DIR/TAG (a new folder;
  # checkpoints for diagnose.py); with RESUME=1 each recipe goes on with its run kept there
  # (learning.py --resume: same recipe, overrides and FRAMES; the budget is this sitting's).
  # FORK=SRC@ITER: each recipe starts as a fork of the kept run SRC at its checkpoint of
  # iteration ITER (learning.py --fork-from SRC --fork-at ITER, into KEEP/TAG): a lever
  # against its control on the same frames. Needs KEEP; not with RESUME.
  # The results come back as one sweep.tgz (learning.py writes 3 files per
  # recipe; WORK=DIR writes them there instead of /tmp/sweep, which a sweep empties first;
  # CHECK=1: each learning.py only checks its recipe's configs). The processes share the GPU by time slices: on an H200 six of them made
  # ~13k frames/s each (2026-11-28, docs/learning.md; their rollouts ran op by op then, a
  # capture failure fixed since), so fewer recipes get more frames each.
  budget=${2:-330}
  levels=$LEVELS
  recipes=${RECIPES:-stages long_hops long_hops_hold long_hops_hold_mb4 long_hops_hold_lrlin}
  # Each process two CPU threads (session 9's setting), not torch's default of one per
  # core for every daemon side by side; what that default costs there is not measured.
  # Fewer where the recipes would hold more threads than the machine has cores (CPUS,
  # default nproc): two daemons of two threads each on the 2-core CPU took 2.6-5.8x as
  # long per iteration as two of one thread (session 39, docs/learning.md). TORCH_THREADS
  # wins.
  # shellcheck disable=SC2086  # the recipes are meant to split into words
  set -- $recipes
  per=$((${CPUS:-$(nproc)} / $#))
  threads=${TORCH_THREADS:-$((per >= 2 ? 2 : 1))}
  static=(run.device=$DEV env.num_envs=256 env.num_dynamic_obstacles=0 eval.num_envs=64
    eval.max_steps=2200 eval.held_out_seed=1000 "run.torch_threads=$threads")
  # shellcheck disable=SC2206  # EXTRA is meant to split into words
  extra=(${EXTRA:-})
  mapped=(env.num_maps=16 "env.map_levels=$levels")  # 16 maps, per-env density levels
  then_static=', {name = "navrl static"}]'  # a curriculum's last stage: NavRL's spawns
  hold=("${mapped[@]}" "env.curriculum=[$LONG_HOPS_HOLD_STAGE$then_static")
  lin20=(ppo.lr_schedule=linear ppo.schedule_frames=20000000)  # lrs to 0.1x at 20 M frames
  work=${WORK:-/tmp/sweep} && rm -rf "$work" && mkdir -p "$work"
  fork=()
  if [ -n "${FORK:-}" ]; then
    [ -n "${KEEP:-}" ] && [ -z "${RESUME:-}" ] || { log "FORK=SRC@ITER needs KEEP and no RESUME"; exit 2; }
    [ "${FORK%@*}" != "$FORK" ] || { log "FORK=$FORK: expected SRC@ITER"; exit 2; }
    fork=(--fork-from "${FORK%@*}" --fork-at "${FORK##*@}")
  fi
  for entry in $recipes; do
    name=${entry%@*} tag=$entry seeded=()  # NAME@SEED: the recipe with run.seed = SEED
    if [ "$name" != "$entry" ]; then tag=${name}_s${entry#*@} seeded=("run.seed=${entry#*@}"); fi
    case $name in
    stages)  # issue #13's global stages, the CPU baseline of docs/learning.md
      recipe=("env.curriculum=[{name = \"100\", num_obstacles = 100, promote = {reach_goal = 0.6, collision = 0.3, evals = 2}}, {name = \"175\", num_obstacles = 175, promote = {reach_goal = 0.6, collision = 0.3, evals = 2}}, {name = \"250\", num_obstacles = 250, promote = {reach_goal = 0.6, collision = 0.35, evals = 2}}, {name = \"350\"}]") ;;
    levels)  # per-env density levels on 16 maps, NavRL's border spawns throughout
      recipe=("${mapped[@]}") ;;
    hops)  # short local hops among the pillars with per-env levels, then NavRL's spawns
      recipe=("${mapped[@]}" "env.curriculum=[$HOPS_STAGE$then_static") ;;
    hops_flat)  # the same hops at the whole map from the start (no levels)
      recipe=(env.num_maps=16 "env.curriculum=[$HOPS_STAGE$then_static") ;;
    hops_kl)  # hops with levels, learning rates set by the KL rule (not in the default set)
      recipe=("${mapped[@]}" 'ppo.lr_schedule="kl_adaptive"' "env.curriculum=[$HOPS_STAGE$then_static") ;;
    long_hops)  # hops to goals 4-40 m away with levels, then NavRL's spawns
      recipe=("${mapped[@]}" "env.curriculum=[$LONG_HOPS_STAGE$then_static") ;;
    long_hops_hold)  # long hops that end after 64 steps at the goal (env.reach_hold)
      recipe=("${hold[@]}") ;;
    long_hops_hold_mb4)  # the same in 4 minibatches of 2,048 frames (NavRL's minibatch size)
      recipe=("${hold[@]}" ppo.minibatches=4) ;;
    long_hops_hold_lrlin)  # the same with every lr decaying linearly to 0.1x at 20 M frames
      recipe=("${hold[@]}" "${lin20[@]}") ;;
    long_hops_hold_mb4_cross)  # the hold in 4 minibatches, a quarter of the episodes crossings
      recipe=("${mapped[@]}" ppo.minibatches=4 "env.curriculum=[$CROSS_HOLD_STAGE$then_static") ;;
    long_hops_hold_mb4_lrlin)  # the hold in 4 minibatches, every lr linear to 0.1x at 20 M frames
      recipe=("${hold[@]}" ppo.minibatches=4 "${lin20[@]}") ;;
    long_hops_hold_mb4_lrfast)  # the same falling faster: to 0.05x at 10 M frames, then held
      recipe=("${hold[@]}" ppo.minibatches=4 ppo.lr_schedule=linear ppo.schedule_frames=10000000
        ppo.lr_final_fraction=0.05) ;;
    long_hops_hold_mb4_lrlow)  # the hold in 4 minibatches at a constant 0.4x of NavRL's lr
      recipe=("${hold[@]}" ppo.minibatches=4 ppo.actor_lr=2e-4 ppo.feature_extractor_lr=2e-4) ;;
    long_hops_hold_mb4_then_cross)  # the hold in 4 minibatches, then crossings only
      recipe=("${mapped[@]}" ppo.minibatches=4 "${lin20[@]}"
        "env.curriculum=[$HOPS_TO_CROSS_STAGE, $CROSSINGS_STAGE$then_static") ;;
    long_hops_hold_mb4_then_cross_top)  # then_cross, and from the crossing's 0.5 on crossings
      # with every env at 350 pillars (the top level) to the end
      top="min_level = $(($(tr -cd , <<<"$levels" | wc -c)))"  # the last index of $levels
      recipe=("${mapped[@]}" ppo.minibatches=4 "${lin20[@]}"
        "env.curriculum=[$HOPS_TO_CROSS_STAGE, $CROSSINGS_TO_TOP_STAGE, {name = \"crossings at the top\", spawn = \"crossing\", max_episode_length = 2200, reach_hold = 64, $top}]") ;;
    long_hops_hold_mb4_then_cross_clip2)  # then_cross with PPO's ratio clip at 0.2 (NavRL
      # 0.1): ahead late in both forks of session 13 (docs/learning.md), never from scratch
      recipe=("${mapped[@]}" ppo.minibatches=4 "${lin20[@]}" ppo.clip_ratio=0.2
        "env.curriculum=[$HOPS_TO_CROSS_STAGE, $CROSSINGS_STAGE$then_static") ;;
    long_hops_hold_mb4_then_cross_mirror)  # then_cross with every minibatch also trained
      # reflected left-right across the goal direction (ppo.mirror; session 14's fork)
      recipe=("${mapped[@]}" ppo.minibatches=4 "${lin20[@]}" ppo.mirror=true
        "env.curriculum=[$HOPS_TO_CROSS_STAGE, $CROSSINGS_STAGE$then_static") ;;
    long_hops_hold_mb4_then_cross_mirror_stay)  # then_cross_mirror with crossings as the last
      # stage: NavRL's spawns never come (four runs lost crossing reach after them)
      recipe=("${mapped[@]}" ppo.minibatches=4 "${lin20[@]}" ppo.mirror=true
        "env.curriculum=[$HOPS_TO_CROSS_STAGE, $CROSSINGS_LAST_STAGE]") ;;
    long_hops_hold_mb4_bar5_then_cross_mirror_stay)  # then_cross_mirror_stay with the hops
      # until the crossing's 0.5 (not 0.3)
      recipe=("${mapped[@]}" ppo.minibatches=4 "${lin20[@]}" ppo.mirror=true
        "env.curriculum=[$HOPS_TO_HALF_STAGE, $CROSSINGS_LAST_STAGE]") ;;
    long_hops_hold_mb4_bar5_then_cross_mirror_stay_guard)  # the same with the update's two
      # guards set loose (ppo.target_kl, ppo.feature_extractor_max_grad_norm): they act on
      # an update far off the usual (session 17's collapse was one), not on the usual ones
      recipe=("${mapped[@]}" ppo.minibatches=4 "${lin20[@]}" ppo.mirror=true "${GUARDS[@]}"
        "env.curriculum=[$HOPS_TO_HALF_STAGE, $CROSSINGS_LAST_STAGE]") ;;
    long_hops_hold_mb4_bar5_then_cross_mirror_stay_guard_carry)  # the same with the
      # switch to crossings carrying the hops in flight (env.stage_switch = "episodes")
      recipe=("${mapped[@]}" ppo.minibatches=4 "${lin20[@]}" ppo.mirror=true "${GUARDS[@]}"
        env.stage_switch=episodes
        "env.curriculum=[$HOPS_TO_HALF_STAGE, $CROSSINGS_LAST_STAGE]") ;;
    long_hops_hold_mb4_bar5_then_cross_mirror_stay_guard_r64 | \
      long_hops_hold_mb4_bar5_then_cross_mirror_stay_guard_r64_hold | \
      long_hops_hold_mb4_bar5_then_cross_mirror_stay_guard_r128_hold | \
      long_hops_hold_mb4_bar5_then_cross_mirror_stay_guard_r128_hold_dense | \
      long_hops_hold_mb4_bar5_then_cross_mirror_stay_guard_r128_hold_dense_maps256)
      # The guarded recipe with twice the batch per update (ppo.rollout_length = 64: 16,384
      # frames at 256 envs, 4 minibatches of 4,096; half the update steps per frame);
      # _r128: four times (128-step rollouts, 32,768 frames per update).
      # _hold: lin20's line stopped at 18 M frames (0.189x) and held there, the schedule's
      # last 0.09x being where seed 1 fell twice (docs/learning.md, sessions 24 and 25).
      # _dense: maps of 450 pillars with a level above NavRL's 350 (an env that reaches its
      # goal at 350 goes on to fly 450), evaluated at 350 (eval.num_obstacles).
      # _maps256: the same on 256 maps (one per env at 256 envs, each map drawn once),
      # evaluated on the 16 maps _dense evaluates on (eval.num_maps = 16).
      rates=("${lin20[@]}") rollout=64 maps=("${mapped[@]}")
      case $name in *_hold | *_hold_dense*) rates=("${HELD_RATES[@]}") ;; esac
      case $name in *_r128*) rollout=128 ;; esac
      case $name in  # a later override of a key wins (learning.py's KEY=VALUE)
      *_dense) maps=("${DENSE_MAPS[@]}") ;;
      *_dense_maps256) maps=("${DENSE_MAPS[@]}" env.num_maps=256 eval.num_maps=16) ;;
      esac
      recipe=("${maps[@]}" ppo.minibatches=4 "${rates[@]}" ppo.mirror=true "${GUARDS[@]}"
        "ppo.rollout_length=$rollout"
        "env.curriculum=[$HOPS_TO_HALF_STAGE, $CROSSINGS_LAST_STAGE]") ;;
    long_hops_hold_mb4_bar5_then_cross_mirror_stay_sep)  # the same with the critic on a
      # feature extractor of its own (ppo.separate_critic)
      recipe=("${mapped[@]}" ppo.minibatches=4 "${lin20[@]}" ppo.mirror=true ppo.separate_critic=true
        "env.curriculum=[$HOPS_TO_HALF_STAGE, $CROSSINGS_LAST_STAGE]") ;;
    long_hops_hold_mb4_vclip)  # the hold in 4 minibatches, the critic's value clip off
      recipe=("${hold[@]}" ppo.minibatches=4 ppo.value_clip=1000000) ;;
    *) log "unknown recipe $name"; exit 2 ;;
    esac
    log "start recipe $tag (budget ${budget}s)"
    timeout $(((budget + MARGIN) * LIMIT_SCALE)) python3 benchmarks/learning.py ${CHECK:+--check-config} --budget-s "$budget" \
      --stall-s "$STALL_S" --stop-wait-s "$STOP_WAIT_S" ${FRAMES:+--frames "$FRAMES"} ${KEEP:+--keep-state "$KEEP/$tag"} ${RESUME:+--resume} "${fork[@]}" --eval-every "$EVAL_EVERY" --config $CONFIG \
      --final-drones "$FINAL_DRONES" --navrl-checkpoint carry/navrl_checkpoint.pt --out "$work/$tag.json" "${static[@]}" "${recipe[@]}" "${seeded[@]}" "${extra[@]}" \
      > "$work/$tag.out" 2>&1 &
  done
  wait
  log "recipes ended: $(ls $work | tr '\n' ' ')"
  tar czf "$OUT/sweep.tgz" -C "$(dirname "$work")" "$(basename "$work")"
  ;;
*) log "unknown mode $MODE"; exit 2 ;;
esac
log done
